"""The LM head's product for the tree path's decode steps with its weight reordered once per call for oneDNN.

Why: at a decode batch of 2-8 rows the head (``[rows, d] x [V, d]^T``, 49,152 x 576 for SmolLM2) is the largest
product of a step, and ``torch.nn.functional.linear`` (MKL's sgemm, which repacks the weight at every call) reads
its 113 MB at ~3 GB/s on the AVX2 host where the triad moves 16.7: 34.5 ms a step at 8 rows, 31 at 2 rows, 15.6 at
1 (a matrix-vector product). oneDNN's inner product on a weight reordered once into its own blocked layout
(``torch.ops.mkldnn._reorder_linear_weight``, what inductor's freezing does for a frozen linear) runs the same
product in 22.5 ms at 8 rows and 14.5 at 2 (measured 2026-12-07, 1 thread, CPU-seconds, 3 rounds;
``benchmarks/gap_levers.py``, docs/distill_speed.md "Closing the gaps"); a lone row keeps the matrix-vector
product, which was as fast. The reorder costs ~0.13 CPU-s, done once per :meth:`LLMPolicy.generate
<agents.llm.generation.policy.LLMPolicy.generate>` batch (the weights may change between calls; nothing is kept).

Exactness: the same product in another summation order: the logits differ from the forward's by ~1e-6 relative
(2.3e-6 absolute on unit-scale test logits); on the 6-layer SmolLM2 decoding 8 rows of 96 tokens the sampled
tokens were the same and the log-probs differed by at most 3.0e-5, inside the tree path's 1e-4 against
:func:`agents.llm.generation.policy.sequence_logprobs` (its summation order already differs from one forward's).
Used only for a plain fp32 :class:`torch.nn.Linear` head on the CPU with oneDNN present, of at least
:data:`MIN_HEAD_BYTES`; anything else keeps the module's own forward. The prefill's heads and every training or
scoring forward are untouched.

Why a size floor: the reorder is paid once per batch and a step saves the difference between the two products, so
on a small head the gain is marginal at best. Measured on the AVX2 host (1 thread, CPU-seconds, 8 rows, load ~2;
2026-12-07, four runs): a 4,096 x 128 head (the tiny experiments' 2 MiB) saves 0.02-0.07 ms a step, a small share
of a tiny model's decode step, and breaks even after 19 to 270 steps depending on the run (its 64-token cap
decodes at most 64); from 8 MiB up the head breaks even in 2-10 steps (49,152 x 576, 108 MiB: 8-9). So below the
floor nothing measurable is given up, and the decode stays bit for bit the plain product's, as before the packed
head existed. The record: ``python benchmarks/gap_levers.py --parts heads``
(``results/limits/gap_levers_body_heads.json``: the last of those runs, 19 steps at 2 MiB, 2-8 from 8 MiB up).
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch

REORDER_BATCH = 8  # the batch the reorder is tuned for; measured at 1-16 rows it beats sgemm at every size
MIN_HEAD_BYTES = 4 * 2**20  # heads smaller than this keep the plain product (module doc: the reorder does not pay)


def applicable(head, min_bytes: int | None = None) -> bool:
    """Whether ``head`` is a head this product stands in for: exactly a :class:`torch.nn.Linear`, fp32, on the
    CPU, its weight at least ``min_bytes`` (default :data:`MIN_HEAD_BYTES`), no forward hooks replacing it (its
    hooks still run: the module's ``__call__`` is kept), oneDNN built in."""
    if type(head) is not torch.nn.Linear or head.weight.dtype != torch.float32 or head.weight.device.type != "cpu":
        return False
    if head.weight.numel() * head.weight.element_size() < (MIN_HEAD_BYTES if min_bytes is None else min_bytes):
        return False
    if torch.is_autocast_enabled("cpu") or not torch.backends.mkldnn.is_available():
        return False
    return hasattr(torch.ops.mkldnn, "_reorder_linear_weight") and hasattr(torch.ops.mkldnn, "_linear_pointwise")


@contextlib.contextmanager
def packed_head(model, enabled: bool = True, min_bytes: int | None = None) -> Iterator[bool]:
    """Inside the block the model's output embedding computes its product on a once-reordered copy of its
    weight (for no-grad fp32 calls of 2 rows or more; any other call, or one after the weight changed in place,
    keeps the plain product); yields whether it may (not for a head under ``min_bytes``, default
    :data:`MIN_HEAD_BYTES`). The copy is made at the first call it serves and dropped on exit."""
    head = model.get_output_embeddings() if enabled and hasattr(model, "get_output_embeddings") else None
    if head is None or not applicable(head, min_bytes) or "forward" in vars(head):
        yield False
        return
    weight, bias = head.weight, head.bias
    plain = head.forward
    version = weight._version
    packed: list = []  # the reordered weight, made at the first call it serves (none if the block makes none)

    def forward(x: torch.Tensor) -> torch.Tensor:
        if (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)) or x.dtype != torch.float32 \
                or weight._version != version or torch.is_autocast_enabled("cpu") or x.numel() == x.shape[-1]:
            return plain(x)  # (one row: a matrix-vector product, as fast as the reordered weight's)
        if not packed:
            try:
                with torch.no_grad():
                    packed.append(torch.ops.mkldnn._reorder_linear_weight(weight.detach(), REORDER_BATCH))
            except RuntimeError:  # an op this build does not run: the plain head from now on
                packed.append(None)
        if packed[0] is None:
            return plain(x)
        return torch.ops.mkldnn._linear_pointwise(x, packed[0], None if bias is None else bias.detach(),
                                                  "none", [], "")

    head.forward = forward
    try:
        yield True
    finally:
        del head.forward


__all__ = ["packed_head", "applicable", "REORDER_BATCH", "MIN_HEAD_BYTES"]
