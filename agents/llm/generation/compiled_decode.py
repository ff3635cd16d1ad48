"""A compiled decode step for :class:`agents.llm.generation.policy.LLMPolicy`'s tree path
(``LLMPolicy(compile_decode=True)``, off by default): the lean step's operations
(:mod:`agents.llm.generation.lean_decode`) run through ``torch.compile`` (inductor, CPU), which fuses the element-wise
work of a layer (RMSNorm, RoPE, SiLU-and-multiply, residual adds) into generated C++ loops and drops the Python of ~20
modules per layer.

Static shapes. The KV cache is the tree path's preallocated buffer (:class:`agents.llm.generation.tree_generation.
BufferLayer`, ``[rows, kv_heads, width, head]``, fixed for a call until rows leave). Writing the new column and
attending over the filled columns is one opaque custom op (``memenv::decode_attention``, as vLLM keeps its
attention out of the compiled graph): it mutates the buffers in place (no functional copy of the cache) and
reads the step's column from the mask's width, so the graph sees no shape that changes from step to step. The
rows dimension and the buffer width are marked dynamic: one graph serves every batch size >= 2 and every call's
width, one more serves a lone row (torch specialises a size of 1). Prefill stays eager (its lengths vary).

Exactness. The matrix products are the same kernels; what changes is the element-wise arithmetic inductor fuses
(it keeps fused intermediates in fp32 where the eager ops round each to the model's dtype, and may reorder a
row's reduction in RMSNorm), so the logits agree with the eager step to float rounding, not bit for bit. The
log-probs recorded are still the ones the tokens were sampled with; the test checks greedy tokens equal and
log-probs within a bound derived from fp32 rounding, and the records' round trip (RCE <= 1e-4).

Fallback: a model :func:`agents.llm.generation.lean_decode.known` refuses keeps the model's forward; a compilation that
fails (no C++ compiler, an unsupported module such as an adapter that breaks the graph) warns once and runs the
same step eagerly (the lean step's arithmetic, bit for bit), never stopping the run; so does a graph whose first
output disagrees with the eager step's (:meth:`CompiledStep._checked`).

Measured (``benchmarks/rollout_throughput.py --engines bh``, SmolLM2-135M, fp32, 1 thread, all the calls of one
GRPO update, side by side, 3 rounds, under load): decode tokens per CPU-second 1.12 +- 0.04x the eager step's,
greedy tokens identical; compiling the two graphs cost 108 CPU-s of the process with a cold inductor cache (16
wall-s warm), about 19 updates' saving, so it is off by default (docs/real_models.md).
"""

from __future__ import annotations

import os
import time
import warnings
from typing import Callable

import torch

from agents.llm.generation.lean_decode import decoder_layer, known


@torch.library.custom_op("memenv::decode_attention", mutates_args=("key_buffer", "value_buffer"))
def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_buffer: torch.Tensor,
                     value_buffer: torch.Tensor, mask: torch.Tensor, full: torch.Tensor, scale: float) -> torch.Tensor:
    """One decode step's attention: write ``k``, ``v`` (``[n, kv_heads, 1, head]``) at column ``width - 1`` of the
    buffers, ``width`` = ``mask``'s (bool ``[n, width]``, the rows' filled columns plus this one), then attend
    ``q`` (``[n, heads, 1, head]``) over those columns as transformers' SDPA integration does for a one-token
    query (``full``: no masked column, attend without a mask). Returns ``[n, heads, 1, head]``."""
    n, heads, _, head = q.shape
    kv_heads, column = k.shape[1], mask.shape[1] - 1
    key_buffer[:, :, column:column + 1] = k
    value_buffer[:, :, column:column + 1] = v
    keys, values = key_buffer[:, :, :column + 1], value_buffer[:, :, :column + 1]
    sdpa = torch.nn.functional.scaled_dot_product_attention
    if bool(full):
        extra = {"enable_gqa": True} if heads > kv_heads else {}
        out = sdpa(q, keys, values, attn_mask=None, dropout_p=0.0, scale=scale, is_causal=False, **extra)
    else:
        if heads > kv_heads:  # transformers' pack_gqa for a one-token query
            q = q.reshape(n, kv_heads, heads // kv_heads, head)
        out = sdpa(q, keys, values, attn_mask=mask[:, None, None, :], dropout_p=0.0, scale=scale, is_causal=False)
    return out.reshape(n, heads, 1, head)


@decode_attention.register_fake
def _(q, k, v, key_buffer, value_buffer, mask, full, scale):
    return torch.empty_like(q)


def _body(model) -> Callable:
    """The step with the cache as explicit buffers: ``(ids, positions, mask (bool), full, keys, values) ->
    logits``."""
    inner = model.model
    if model.config.model_type == "llama":
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
    else:
        from transformers.models.qwen2.modeling_qwen2 import apply_rotary_pos_emb
    attn = [layer.self_attn for layer in inner.layers]

    def body(ids, positions, mask, full, keys, values):
        hidden = inner.embed_tokens(ids)
        cos, sin = inner.rotary_emb(hidden, position_ids=positions)
        for layer, att, key_buffer, value_buffer in zip(inner.layers, attn, keys, values):
            def attend(q, k, v, att=att, key_buffer=key_buffer, value_buffer=value_buffer):
                return decode_attention(q, k, v, key_buffer, value_buffer, mask, full, att.scaling)

            hidden = decoder_layer(layer, hidden, cos, sin, apply_rotary_pos_emb, attend)
        hidden = inner.norm(hidden)
        return model.lm_head(hidden[:, -1:, :])[:, -1]

    return body


def inductor_patches() -> dict:
    """inductor's settings for the step: never freeze (the weights are graph inputs, so a training step's in-place
    update is read, not a stale copy); and no FX graph cache while ``ATEN_CPU_CAPABILITY`` overrides the CPU's
    vector ISA. Why: that cache's key leaves the ISA out (torch 2.13), so a graph generated for AVX512 (its loops
    stepping 16 floats) was served under ``ATEN_CPU_CAPABILITY=avx2`` and rebuilt with 8-float vectors: NaN
    logits and every token wrong (measured on this AVX512 host; a fresh cache directory, or the cache off, gave
    the eager tokens). Without the override the ISA is the machine's own and the cache stays on (16 s warm
    against minutes cold)."""
    patches = {"freezing": False}
    if os.environ.get("ATEN_CPU_CAPABILITY"):
        patches["fx_graph_cache"] = False
    return patches


class CompiledStep:
    """``step(ids [n, 1], positions [n, 1], mask [n, width] (0/1), layers) -> logits [n, V]``, the signature of
    :func:`agents.llm.generation.lean_decode.lean_step`, through ``torch.compile`` (compiled on the first call; a failure
    warns once and the step runs eagerly from then on). ``compiles`` counts the graphs compiled so far (one per
    distinct shape specialisation, a recompile adds one); ``compile_s`` the wall seconds of the calls that
    compiled; ``fallback`` the error that turned compilation off, if any."""

    def __init__(self, model, backend: str = "inductor") -> None:
        if backend not in ("inductor", "aot_eager", "eager"):
            raise ValueError(f"compiled decode: backend must be 'inductor', 'aot_eager' or 'eager', got {backend!r}")
        self.eager = _body(model)
        self.compiles, self.compile_s, self.fallback = 0, 0.0, None

        def counting(gm, example_inputs):
            self.compiles += 1
            if backend == "eager":
                return gm
            if backend == "aot_eager":  # the traced ATen graph, run op by op: no C++ (the tests' fast path)
                from torch._dynamo.backends.debugging import aot_eager

                return aot_eager(gm, example_inputs)
            from torch._inductor.compile_fx import compile_fx

            return compile_fx(gm, example_inputs, config_patches=inductor_patches())

        self.compiled = torch.compile(self.eager, backend=counting, fullgraph=True, dynamic=None)

    def __call__(self, ids, positions, mask, layers) -> torch.Tensor:
        if any(layer.length != mask.shape[1] - 1 for layer in layers):
            raise RuntimeError(f"compiled decode: mask of {mask.shape[1]} columns for a cache of {layers[0].length}")
        full = mask.all()
        mask = mask.bool()
        keys = [layer.key_buffer for layer in layers]
        values = [layer.value_buffer for layer in layers]
        args = (ids, positions, mask, full, keys, values)
        if self.fallback is None:
            for t in (ids, positions, mask, *keys, *values):
                torch._dynamo.maybe_mark_dynamic(t, 0)
            torch._dynamo.maybe_mark_dynamic(mask, 1)
            for t in (*keys, *values):
                torch._dynamo.maybe_mark_dynamic(t, 2)
            before, start = self.compiles, time.perf_counter()
            try:
                logits = self.compiled(*args)
            except Exception as error:  # noqa: BLE001 - any compiler failure: warn and run eagerly
                self.fallback = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
                warnings.warn(f"compile_decode: torch.compile failed ({self.fallback}); decoding eagerly",
                              RuntimeWarning, stacklevel=2)
                logits = self.eager(*args)
            if self.compiles > before:
                self.compile_s += time.perf_counter() - start
                logits = self._checked(logits, args)
        else:
            logits = self.eager(*args)
        for layer in layers:
            layer.length += 1
            layer._views()
        return logits


    def _checked(self, logits: torch.Tensor, args) -> torch.Tensor:
        """A newly compiled graph's first output against the eager step's on the same inputs: on a disagreement
        beyond rounding, warn once and decode eagerly from then on (what it caught: an inductor graph served from a
        cache made for another vector ISA, NaN logits; :func:`inductor_patches`).
        The eager step rewrites this step's cache column with its own keys and values, so nothing stale stays."""
        eager = self.eager(*args)
        scale = max(1.0, eager.abs().max().item())
        worst = (logits - eager).abs().max().item()
        if torch.isfinite(logits).all() and worst <= 1e-3 * scale:
            return logits
        self.fallback = f"the compiled step disagrees with the eager one (max logit difference {worst:.3g})"
        warnings.warn(f"compile_decode: {self.fallback}; decoding eagerly", RuntimeWarning, stacklevel=3)
        return eager


def compiled_step(model, backend: str = "inductor") -> CompiledStep | None:
    """A :class:`CompiledStep` for ``model``, or None when it is not one the lean step knows
    (:func:`agents.llm.generation.lean_decode.known`)."""
    return CompiledStep(model, backend) if known(model) else None
