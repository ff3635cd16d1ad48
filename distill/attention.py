"""Attention back-ends of the packed forwards: what a :class:`distill.packing.PackedBatch` gives the model body
under each attention implementation (:func:`attention_inputs`), their registration with transformers, and the
forward itself (:func:`hidden_states`).

transformers (5.x) passes a 4D mask through unchanged (``masking_utils._preprocess_mask_arguments``); a 2D mask
or a KV cache would leak across packed sequences, so the model body is always called with the 4D mask and
``use_cache=False``.

Attention backends (:func:`hidden_states`, ``backend="auto"``): on CPU ``sdpa`` with the explicit mask (the
reference), except for ``prefix_tree`` batches, whose rows hold whole tries: there ``sdpa_blocks``.
``backend="sdpa_blocks"`` (CPU or GPU, exact, tested against the reference, gradients included) runs transformers'
sdpa once per query block of :func:`attention_blocks` (a branch attends its prefix and itself; in a prefix tree,
each chain of the trie attends the chains above it, :func:`distill.packing.tree_pieces`) instead of over the whole
row, so packed rows cost sum(n x (context + n)) attention, not row length^2: the fastest CPU choice for long packed
rows (``benchmarks/teacher_packing.py``). On CUDA: ``flash_attention_2`` varlen for padded / padding-free batches of
a bf16/fp16 model when ``flash_attn`` is installed, else ``torch_varlen`` (PyTorch's own flash varlen kernel,
``torch.nn.attention.varlen``, through the same boundaries; on CPU it runs :func:`varlen_reference`, exact and
slow), else ``flex_attention`` with a block mask built from the same ids (any packing; for a prefix tree from
``tree_end``), else sdpa with the 4D mask. ``torch_varlen`` also runs the shared prefix and prefix tree layouts when
asked (:func:`varlen_plan`: each branch's keys are its prefix gathered before it); ``auto`` leaves those to flex
until ``benchmarks/gpu_check.py`` has run it on a GPU.

Nothing depends on transformers inferring sequence boundaries from ``position_ids``: transformers 5.x does that
only for a one-row batch (``modeling_flash_attention_utils._is_packed_sequence``) and otherwise runs plain causal
attention over each whole row, so every sequence packed behind another would attend it. The varlen backends get
the boundaries explicitly (:func:`varlen_boundaries`: ``cu_seq_lens_q/k`` over the rows flattened into one
token stream, one entry per sequence, plus ``max_length_q/k``), which transformers' flash path hands to
``flash_attn_varlen_func`` as they are; flex_attention gets a :class:`BlockMask` of :func:`flex_mask_mod`, the
rule of the 4D mask as a function. :func:`attention_inputs` is the one place that decides what a backend gets.
``tests/test_packed_attention.py`` runs transformers' own flash path on CPU with a plain-torch varlen kernel
(:func:`register_varlen_attention`) and flex_attention in eager mode, multi-row, against the dense reference,
and shows that the old inputs (no boundaries) leak. The CUDA kernels themselves (flash-attn, compiled flex) did
not run on the CPU-only machines this was written on: ``benchmarks/gpu_check.py`` is their check.
"""

from __future__ import annotations

import contextlib
import importlib.util
from dataclasses import dataclass

import torch

from distill import check_attention_backend
from distill.packing import PackedBatch, tree_pieces

SDPA_BLOCKS = "sdpa_blocks"  # attention implementation registered by register_block_attention
#: Packings whose every sequence is one contiguous run of a row that attends only itself (causally): what a
#: varlen kernel (``cu_seqlens``) can express. A shared prefix / prefix tree needs flex_attention or sdpa.
VARLEN_PACKINGS = ("padded", "sorted_padded", "padding_free")
#: Attention implementations that take sequence boundaries as ``cu_seq_lens_q/k`` + ``max_length_q/k`` kwargs
#: (transformers' flash paths); :func:`register_varlen_attention` adds more.
VARLEN_IMPLEMENTATIONS = {"flash_attention_2", "flash_attention_3", "flash_attention_4"}
TORCH_VARLEN = "torch_varlen"  # PyTorch's own flash varlen kernel (torch.nn.attention.varlen): register_torch_varlen


def model_body(model):
    """The transformer body (returns hidden states) of a transformers causal LM."""
    body = getattr(model, "model", None)
    if body is None:
        body = getattr(model, "base_model", None)
    if body is None or body is model:
        raise TypeError(f"{type(model).__name__} has no .model / .base_model body: not a transformers causal LM?")
    return body


def _attn_impl(model) -> str:
    return str(getattr(model.config, "_attn_implementation", None) or "eager")


def select_backend(model, batch: PackedBatch, backend: str = "auto") -> str:
    """The attention implementation :func:`hidden_states` will use for ``batch`` (see the module doc)."""
    check_attention_backend(backend, "backend")
    if backend != "auto":
        return backend
    param = next(model.parameters())
    if param.device.type != "cuda":
        # a prefix tree's rows hold whole tries: the dense mask would pay O(row length^2) for mostly hidden keys
        return SDPA_BLOCKS if batch.method == "prefix_tree" else "sdpa"
    if batch.method in VARLEN_PACKINGS and param.dtype in (torch.float16, torch.bfloat16):
        if importlib.util.find_spec("flash_attn") is not None:
            return "flash_attention_2"
        if torch_varlen_available():
            return TORCH_VARLEN
    if importlib.util.find_spec("torch.nn.attention.flex_attention") is not None:
        return "flex_attention"
    return "sdpa"


@contextlib.contextmanager
def _attention_implementation(model, name: str):
    old = _attn_impl(model)
    if name == old or (name == "sdpa" and not old.startswith(("flash", "flex", SDPA_BLOCKS)) and not is_varlen(old)):
        yield old  # sdpa-like (e.g. sdpa_float32) and eager implementations take the explicit mask
        return
    model.set_attn_implementation(name)
    try:
        yield name
    finally:
        model.set_attn_implementation(old)


def attention_blocks(batch: PackedBatch) -> list[list[tuple[int, int, int, int]]]:
    """Per row, the query blocks of ``batch`` that attend independently: ``(a, b, p0, p1)`` = queries
    ``a..b-1`` attend keys ``p0..p1-1`` (their shared prefix; empty when ``p0 == p1``) and, causally, ``a..b-1``;
    ``p0 == -1`` marks padding (output zero, never scored). Together the blocks tile each row."""
    out = []
    unit, seq, pref = batch.unit_ids.tolist(), batch.seq_ids.tolist(), batch.is_prefix.tolist()
    for u_row, s_row, p_row in zip(unit, seq, pref):
        blocks: list[tuple[int, int, int, int]] = []
        prefix_of: dict[int, tuple[int, int]] = {}
        a = 0
        L = len(s_row)
        while a < L:
            b = a + 1
            if u_row[a] < 0:  # padding: one block for the run
                while b < L and u_row[b] < 0:
                    b += 1
                blocks.append((a, b, -1, -1))
            else:
                while b < L and s_row[b] == s_row[a]:
                    b += 1
                if p_row[a]:
                    prefix_of[u_row[a]] = (a, b)
                    blocks.append((a, b, a, a))
                else:
                    p0, p1 = prefix_of.get(u_row[a], (a, a))
                    blocks.append((a, b, p0, p1))
            a = b
        out.append(blocks)
    return out


@dataclass
class _BlockPlan:
    """How :func:`_sdpa_blocks_attention` runs one row: the block sizes (they tile the row, for one ``split``)
    and per block ``(indices of the blocks it attends in full before itself, additive mask or None)``; an empty
    tuple: the block attends only itself, causally; ``None`` entries are padding."""

    sizes: list[int]
    blocks: list[tuple[tuple[int, ...], torch.Tensor | None] | None]


def _context_mask(masks: dict, n: int, p: int, dtype, device) -> torch.Tensor:
    """``[1, 1, n, p + n]`` additive mask: ``p`` context keys in full, then the block itself causally."""
    if (n, p) not in masks:
        allowed = torch.ones(n, p + n, dtype=torch.bool, device=device)
        allowed[:, p:] = torch.ones(n, n, dtype=torch.bool, device=device).tril()
        masks[n, p] = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill(
            ~allowed, torch.finfo(dtype).min)[None, None]
    return masks[n, p]


def _block_plans(batch: PackedBatch, dtype: torch.dtype, device) -> list[_BlockPlan]:
    """Per row, the plan of :func:`attention_blocks` (of :func:`tree_pieces` for a prefix tree), with each
    branch's ``[1, 1, n, context + n]`` additive mask made once per forward (not once per layer)."""
    plans = []
    masks: dict[tuple[int, int], torch.Tensor] = {}  # (n, context) -> mask: equal shapes share one tensor
    if batch.tree_end is not None:
        for pieces in tree_pieces(batch):
            plan = _BlockPlan([b - a for a, b, _ in pieces], [])
            for a, b, ancestors in pieces:
                if ancestors is None:
                    plan.blocks.append(None)
                elif not ancestors:
                    plan.blocks.append(((), None))
                else:
                    context = sum(plan.sizes[k] for k in ancestors)
                    plan.blocks.append((ancestors, _context_mask(masks, b - a, context, dtype, device)))
            plans.append(plan)
        return plans
    for blocks in attention_blocks(batch):
        start_of = {a: k for k, (a, _, _, _) in enumerate(blocks)}
        plan = _BlockPlan([b - a for a, b, _, _ in blocks], [])
        for a, b, p0, p1 in blocks:
            if p0 < 0:
                plan.blocks.append(None)
            elif p1 == p0:
                plan.blocks.append(((), None))
            else:
                plan.blocks.append(((start_of[p0],), _context_mask(masks, b - a, p1 - p0, dtype, device)))
        plans.append(plan)
    return plans


def _sdpa_blocks_attention(module, query, key, value, attention_mask, *, memenv_blocks=None, **kwargs):
    """Exact packed attention on CPU without the dense mask's O(L^2): each query block attends its prefix (for a
    prefix tree: the pieces of its path from the root) and, causally, itself (:func:`attention_blocks`,
    :func:`tree_pieces`), through transformers' own sdpa per block.

    Rows are cut into their blocks with one ``unbind`` + ``split`` (not one slice per block): the backward of a
    slice writes a zero tensor of the whole input per block, which made the backward O(blocks x row length)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if memenv_blocks is None:
        raise RuntimeError("sdpa_blocks attention needs the batch's blocks: call distill.attention.hidden_states")
    if query.device.type == "cpu" and torch.is_autocast_enabled("cpu"):
        # under a CPU bf16 autocast (PPOConfig.train_autocast) attention runs in fp32, as SFT's does
        # (agents.llm.models.local.use_float32_attention): the CPU kernels are several times slower in bf16
        with torch.autocast("cpu", enabled=False):
            return _sdpa_blocks_attention(module, query.float(), key.float(), value.float(), attention_mask,
                                          memenv_blocks=memenv_blocks, **kwargs)
    heads, head_dim = query.shape[1], value.shape[-1]
    rows = []
    for plan, q_row, k_row, v_row in zip(memenv_blocks, query.unbind(0), key.unbind(0), value.unbind(0)):
        qs, ks, vs = (t.split(plan.sizes, dim=1) for t in (q_row, k_row, v_row))
        pieces = []
        contexts: dict[tuple[int, ...], tuple[torch.Tensor, torch.Tensor]] = {}  # siblings share one concat
        for k, block in enumerate(plan.blocks):
            if block is None:  # padding: zero output, never scored
                pieces.append(query.new_zeros(1, plan.sizes[k], heads, head_dim))
                continue
            ancestors, mask = block
            q = qs[k][None]
            if not ancestors:
                out, _ = sdpa_attention_forward(module, q, ks[k][None], vs[k][None], None, is_causal=True, **kwargs)
            else:
                if ancestors not in contexts:
                    contexts[ancestors] = ((ks[ancestors[0]], vs[ancestors[0]]) if len(ancestors) == 1 else
                                           (torch.cat([ks[i] for i in ancestors], dim=1),
                                            torch.cat([vs[i] for i in ancestors], dim=1)))
                kc, vc = contexts[ancestors]
                kk = torch.cat([kc, ks[k]], dim=1)[None]
                vv = torch.cat([vc, vs[k]], dim=1)[None]
                out, _ = sdpa_attention_forward(module, q, kk, vv, mask, is_causal=False, **kwargs)
            pieces.append(out)
        rows.append(torch.cat(pieces, dim=1))
    return torch.cat(rows, dim=0), None


def _no_mask(*args, **kwargs):
    """The mask builder of ``sdpa_blocks``: none (its attention takes the blocks, and transformers would
    otherwise build a dense ``[R, 1, L, L]`` causal/packed mask per forward only to have it ignored)."""
    return None


def register_block_attention() -> str:
    """Register the ``sdpa_blocks`` attention implementation with transformers (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(SDPA_BLOCKS, _sdpa_blocks_attention)
    AttentionMaskInterface.register(SDPA_BLOCKS, _no_mask)
    return SDPA_BLOCKS


def register_varlen_attention(name: str, function) -> str:
    """Register ``function`` (transformers' attention signature) as attention implementation ``name`` that,
    like flash-attention, takes the batch's sequence boundaries as ``cu_seq_lens_q/k`` and ``max_length_q/k``
    kwargs (:func:`attention_inputs`) and no mask; transformers builds it the flash path's mask (none for
    unpadded rows). Used by the tests to run transformers' own flash path with a plain-torch varlen kernel."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    AttentionInterface.register(name, function)
    AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS["flash_attention_2"])
    VARLEN_IMPLEMENTATIONS.add(name)
    return name


def varlen_reference(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=None, max_seqlen_k=None, *,
                     causal: bool = True, scale: float | None = None) -> torch.Tensor:
    """Plain-torch varlen attention with flash-attn's contract: ``q [T, Hq, D]``, ``k/v [T, Hk, D]`` (grouped
    query heads share a key-value head), sequence ``i`` = rows ``cu[i]:cu[i + 1]``, causal aligned bottom-right;
    softmax in float32, output in ``q``'s dtype. Exact and slow (a loop over the sequences): the CPU stand-in of
    the CUDA kernel in :func:`register_torch_varlen` and the tests' reference kernel."""
    out = torch.empty_like(q)
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    rep = q.shape[1] // k.shape[1]
    default = q.shape[-1] ** -0.5
    for i in range(len(cq) - 1):
        qi, ki, vi = q[cq[i]:cq[i + 1]], k[ck[i]:ck[i + 1]], v[ck[i]:ck[i + 1]]
        if rep > 1:
            ki, vi = ki.repeat_interleave(rep, dim=1), vi.repeat_interleave(rep, dim=1)
        n, m = qi.shape[0], ki.shape[0]
        scores = torch.einsum("nhd,mhd->hnm", qi.float(), ki.float()) * (scale if scale is not None else default)
        if causal:
            allowed = torch.arange(m, device=q.device)[None, :] <= torch.arange(n, device=q.device)[:, None] + (m - n)
            scores = scores.masked_fill(~allowed, float("-inf"))
        out[cq[i]:cq[i + 1]] = torch.einsum("hnm,mhd->nhd", scores.softmax(-1), vi.float()).to(q.dtype)
    return out


def varlen_plan(batch: PackedBatch, device=None) -> dict:
    """The ``torch_varlen`` inputs of ``batch``, any packing: one varlen sequence per query block of
    :func:`attention_blocks` (per trie chain of :func:`tree_pieces` for a prefix tree), whose keys are its
    context (the shared prefix / the chains on its path from the root, in full) followed by the block itself.
    Queries stay where they are (the blocks tile each row, so ``cu_seq_lens_q`` cuts the flattened rows);
    ``memenv_kv_index`` gathers each block's keys from the flattened rows, ``cu_seq_lens_k`` cuts the gathered
    keys; with the kernel's causal mask aligned bottom-right, query ``t`` of a block with context ``c`` sees
    keys ``0 .. c + t``: its context and itself causally, exactly the 4D mask. Packings without a shared prefix
    need no gather (:func:`varlen_boundaries`, ``memenv_kv_index`` None)."""
    dev = device if device is not None else batch.input_ids.device
    if batch.tree_end is None and not bool(batch.is_prefix.any()):
        return {**varlen_boundaries(batch, dev), "memenv_kv_index": None}
    R, L = batch.input_ids.shape
    q_cuts, k_cuts, pieces_of_index, max_q, max_k = [0], [0], [], 0, 0
    rows = tree_pieces(batch) if batch.tree_end is not None else attention_blocks(batch)
    for r, blocks in enumerate(rows):
        base = r * L
        for block in blocks:
            a, b = block[0], block[1]
            if batch.tree_end is not None:
                ancestors = block[2] or ()
                context = [(blocks[k][0], blocks[k][1]) for k in ancestors]
            else:
                p0, p1 = block[2], block[3]
                context = [(p0, p1)] if p0 >= 0 and p1 > p0 else []
            spans = context + [(a, b)]
            pieces_of_index += [(base + c0, base + c1) for c0, c1 in spans]
            n_keys = sum(c1 - c0 for c0, c1 in spans)
            q_cuts.append(base + b)
            k_cuts.append(k_cuts[-1] + n_keys)
            max_q, max_k = max(max_q, b - a), max(max_k, n_keys)
    index = torch.cat([torch.arange(c0, c1, dtype=torch.long) for c0, c1 in pieces_of_index]).to(dev)
    as_int = lambda v: torch.tensor(v, dtype=torch.int32, device=dev)  # noqa: E731
    return {"cu_seq_lens_q": as_int(q_cuts), "cu_seq_lens_k": as_int(k_cuts), "max_length_q": int(max_q),
            "max_length_k": int(max_k), "memenv_kv_index": index}


def _torch_varlen_attention(module, query, key, value, attention_mask, scaling=None, dropout: float = 0.0, *,
                            cu_seq_lens_q=None, cu_seq_lens_k=None, max_length_q=None, max_length_k=None,
                            memenv_kv_index=None, **kwargs):
    """transformers' attention signature over :func:`varlen_plan`: the rows flattened into one token stream
    (keys gathered per block by ``memenv_kv_index`` when blocks share a context), then PyTorch's flash varlen
    kernel on CUDA (``torch.nn.attention.varlen.varlen_attn``, causal aligned bottom-right, GQA; fp16/bf16; no
    ``flash_attn`` package needed) or :func:`varlen_reference` elsewhere."""
    if cu_seq_lens_q is None or cu_seq_lens_k is None:
        raise RuntimeError("torch_varlen attention needs the batch's sequence boundaries (cu_seq_lens_q/k): call "
                           "distill.attention.hidden_states")
    if dropout:
        raise ValueError("torch_varlen attention has no dropout (the packed forwards run with attention dropout 0)")
    B, H, L, D = query.shape
    Hk = key.shape[1]
    q = query.transpose(1, 2).reshape(B * L, H, D)
    k = key.transpose(1, 2).reshape(B * L, Hk, D)
    v = value.transpose(1, 2).reshape(B * L, Hk, value.shape[-1])
    if memenv_kv_index is not None:
        k, v = k.index_select(0, memenv_kv_index), v.index_select(0, memenv_kv_index)
    if q.is_cuda:
        from torch.nn.attention.varlen import varlen_attn

        out = varlen_attn(q, k, v, cu_seq_lens_q, cu_seq_lens_k, int(max_length_q), int(max_length_k), scale=scaling,
                          window_size=(-1, 0), enable_gqa=Hk != H)
    else:
        out = varlen_reference(q, k, v, cu_seq_lens_q, cu_seq_lens_k, causal=True, scale=scaling)
    return out.reshape(B, L, H, -1), None


def register_torch_varlen() -> str:
    """Register :data:`TORCH_VARLEN` (:func:`_torch_varlen_attention`) as a varlen implementation (idempotent)."""
    return register_varlen_attention(TORCH_VARLEN, _torch_varlen_attention)


def torch_varlen_available() -> bool:
    """PyTorch ships its varlen flash kernel (``torch.nn.attention.varlen``, torch >= 2.9)."""
    return importlib.util.find_spec("torch.nn.attention.varlen") is not None


def is_varlen(impl: str) -> bool:
    """True when attention implementation ``impl`` takes ``cu_seqlens`` boundaries (flash-attention varlen)."""
    return impl in VARLEN_IMPLEMENTATIONS


def sequence_runs(batch: PackedBatch) -> list[list[tuple[int, int]]]:
    """Per row, ``(start, end)`` column runs that tile it: one per packed sequence, one per padding run (padding
    attends only padding, never scored). Raises a ValueError for layouts a varlen kernel cannot express (a
    shared prefix or a prefix tree, whose branches attend columns outside their own run)."""
    if batch.method not in VARLEN_PACKINGS or batch.tree_end is not None or bool(batch.is_prefix.any()):
        raise ValueError(f"flash-attention varlen cannot express a {batch.method} batch (a branch attends a shared "
                         f"prefix outside its own run): use flex_attention, sdpa or sdpa_blocks; varlen takes "
                         f"{', '.join(VARLEN_PACKINGS)}")
    out = []
    for u_row, s_row in zip(batch.unit_ids.tolist(), batch.seq_ids.tolist()):
        runs, a, L = [], 0, len(s_row)
        while a < L:
            b = a + 1
            if u_row[a] < 0:
                while b < L and u_row[b] < 0:
                    b += 1
            else:
                while b < L and s_row[b] == s_row[a]:
                    b += 1
            runs.append((a, b))
            a = b
        out.append(runs)
    return out


def varlen_boundaries(batch: PackedBatch, device=None) -> dict:
    """The kwargs transformers' flash path passes to ``flash_attn_varlen_func`` for ``batch``: ``cu_seq_lens_q``
    = ``cu_seq_lens_k`` (int32, the cumulative run lengths of :func:`sequence_runs` over the rows flattened into
    one token stream, row after row: ``[0, ..., R x L]``) and ``max_length_q`` = ``max_length_k`` (the longest
    run, a Python int). With them transformers reshapes query/key/value to ``[R x L, heads, dim]`` and runs the
    varlen kernel (``_flash_attention_forward``'s "padding free" case); it needs ``attention_mask=None``."""
    R, L = batch.input_ids.shape
    cuts, longest = [0], 0
    for k, runs in enumerate(sequence_runs(batch)):
        for a, b in runs:
            cuts.append(k * L + b)
            longest = max(longest, b - a)
    cu = torch.tensor(cuts, dtype=torch.int32, device=device if device is not None else batch.input_ids.device)
    return {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": int(longest), "max_length_k": int(longest)}


def flex_mask_mod(batch: PackedBatch):
    """``mask_mod(b, h, q, kv)`` of flex_attention for ``batch``: exactly its 4D mask's rule (the module doc;
    for a prefix tree ``kv <= q < tree_end[b, kv]``)."""
    unit, seq, pref, end = batch.unit_ids, batch.seq_ids, batch.is_prefix, batch.tree_end

    if end is not None:
        def mask_mod(b, h, q, kv):
            return (kv <= q) & (q < end[b, kv])
    else:
        def mask_mod(b, h, q, kv):
            return (kv <= q) & (unit[b, q] == unit[b, kv]) & ((seq[b, q] == seq[b, kv]) | pref[b, kv])
    return mask_mod


def flex_block_mask(batch: PackedBatch):
    """The :class:`torch.nn.attention.flex_attention.BlockMask` of :func:`flex_mask_mod` on the batch's device."""
    from torch.nn.attention.flex_attention import create_block_mask

    R, L = batch.input_ids.shape
    return create_block_mask(flex_mask_mod(batch), B=R, H=None, Q_LEN=L, KV_LEN=L, device=batch.input_ids.device)


def attention_inputs(model, batch: PackedBatch, impl: str) -> dict:
    """What the model body gets besides ids and positions under attention implementation ``impl``: the one
    place that decides it. Varlen (flash): ``attention_mask=None`` and :func:`varlen_boundaries`; flex: the
    :func:`flex_block_mask`; ``sdpa_blocks``: no mask and the block plans; sdpa / eager (and sdpa-like
    registered implementations): the explicit 4D mask, additive."""
    dtype = next(model.parameters()).dtype
    device = batch.input_ids.device
    if impl == TORCH_VARLEN:
        return {"attention_mask": None, **varlen_plan(batch, device)}
    if is_varlen(impl):
        return {"attention_mask": None, **varlen_boundaries(batch, device)}
    if impl == "flex_attention":
        return {"attention_mask": flex_block_mask(batch)}
    if impl == SDPA_BLOCKS:
        return {"attention_mask": None, "memenv_blocks": _block_plans(batch, dtype, device)}
    # An additive float mask, made once per forward: eager attention adds it to the scores, and PyTorch's CPU
    # sdpa kernel would otherwise convert a bool mask to this in every layer (measured: 7% of a teacher pass).
    mask = batch.attention_mask
    return {"attention_mask": torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(
        ~mask, torch.finfo(dtype).min)}


def hidden_states(model, batch: PackedBatch, backend: str = "auto") -> torch.Tensor:
    """Last hidden states ``[R, L, d]`` of ``model``'s body for ``batch``: explicit positions, the attention
    inputs of :func:`attention_inputs` for the backend (never boundaries left to be guessed), no cache."""
    body = model_body(model)
    device = next(model.parameters()).device
    if batch.input_ids.device != device:
        batch = batch.to(device)
    impl = select_backend(model, batch, backend)
    if impl == TORCH_VARLEN:
        register_torch_varlen()
    if is_varlen(impl):
        if impl != TORCH_VARLEN:  # transformers' flash path takes no key gather: no shared prefix
            sequence_runs(batch)  # a layout it cannot express fails here, before the implementation is switched
        dtype = next(model.parameters()).dtype
        half = dtype in (torch.float16, torch.bfloat16)
        if not half and (impl.startswith("flash_attention") or (impl == TORCH_VARLEN and device.type == "cuda")):
            raise ValueError(f"backend {impl} computes in float16/bfloat16 only; the model is {dtype}: load it "
                             "with dtype='bfloat16' (or use flex_attention / sdpa)")
    if impl == SDPA_BLOCKS:
        register_block_attention()
    with _attention_implementation(model, impl) as active:
        out = body(input_ids=batch.input_ids, position_ids=batch.position_ids, use_cache=False,
                   **attention_inputs(model, batch, active))
    return out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
