"""Pack reconstructed token sequences into batches, score the sampled tokens, and unpack per record.

Five packings of :class:`distill.reconstruct.TokenSequence` (each scored token keeps exactly the context it had
when sampled, so every packing reproduces the records' log-probs: the RCE check, :func:`rce`):

- ``"padded"``: one sequence per row, right-padded to the longest row of its batch; rows taken in the order
  given (what a per-invocation trainer does).
- ``"padding_free"``: several sequences per row, placed first-fit-decreasing into rows of ``row_len`` tokens,
  positions reset per sequence, block-diagonal causal mask.
- ``"shared_prefix"``: the sequences of one episode (same ``(rollout_id, episode_id)``) or one GRPO group (same
  ``(rollout_id, group)``) keep one copy of their longest common prefix; each branch sees that prefix and
  itself, its positions continuing after it. The prefix never covers a scored token (it stops at the earliest
  segment start), so the logit predicting a branch's first sampled token may sit in the shared prefix. Units
  (a prefix with its branches) longer than ``row_len`` are split into several units, each with its own prefix
  copy, then placed first-fit-decreasing like padding-free.
- ``"sorted_padded"``: padded rows taken longest first, so each batch holds rows of like length (the best a
  per-invocation trainer can do without packing; the honest baseline of ``benchmarks/teacher_packing.py``).
- ``"prefix_tree"``: the sequences of one episode / GRPO group form a trie over their ``(id, position)`` pairs:
  every common prefix, at any depth, is run once (a GRPO group's identical first prompts, its task block, the
  memory an invocation repeats from the one before it, even identical first action tokens), and each token
  attends exactly the tokens on its path from the root, its position the one it had in its own sequence. The
  trie is laid out depth-first, so each subtree is a contiguous run of columns and the whole mask is one id per
  token, ``tree_end`` (the end of its subtree): ``i`` may attend ``j`` iff ``j <= i < tree_end[j]``. Tries larger
  than the row length are cut into several (consecutive sequences in lexicographic order, each cut with its
  own copy of their prefix), then placed first-fit-decreasing. A scored logit may sit on a shared node: records
  that share a context share its logit.

Sizes: ``row_len`` caps a row (default: the longest sequence, or the longest shared-prefix unit, so nothing is
split and shorter ones fill the gaps), ``token_budget`` caps one forward pass (rows x row length), so all
methods run forwards of the same size. A sequence longer than ``row_len`` gets a row of its own. On CPU a dense
mask costs O(row length^2) attention whatever it masks, so long rows pay for attention they do not use; the
block-sparse CUDA backends do not.

Masks: every batch carries an explicit ``[R, 1, L, L]`` bool mask (True = may attend); a prefix tree's is
built from ``tree_end`` (above), every other from three per-token ids: ``unit_ids`` (a prefix with its
branches, or one plain sequence), ``seq_ids`` (one branch or sequence) and ``is_prefix``; token i may attend j
iff ``j <= i`` and ``unit[i] == unit[j]`` and (``seq[i] == seq[j]`` or ``is_prefix[j]``). Padding tokens each
form their own unit, so they attend only to themselves (a fully masked query row would give NaN in sdpa).
transformers (5.x) passes a 4D mask through unchanged (``masking_utils._preprocess_mask_arguments``); a 2D mask
or a KV cache would leak across packed sequences, so the model body is always called with the 4D mask and
``use_cache=False``.

Attention backends (:func:`hidden_states`, ``backend="auto"``): on CPU ``sdpa`` with the explicit mask (the
reference), except for ``prefix_tree`` batches, whose rows hold whole tries: there ``sdpa_blocks``.
``backend="sdpa_blocks"`` (CPU or GPU, exact, tested against the reference, gradients included) runs
transformers' sdpa once per query block of :func:`attention_blocks` (a branch attends its prefix and itself;
in a prefix tree, each chain of the trie attends the chains above it, :func:`tree_pieces`) instead of over the
whole row, so packed rows cost sum(n x (context + n)) attention, not row length^2: the fastest CPU choice for
long packed rows (``benchmarks/teacher_packing.py``). On CUDA: ``flash_attention_2`` varlen for padded /
padding-free batches of a bf16/fp16 model when ``flash_attn`` is installed, else ``torch_varlen`` (PyTorch's
own flash varlen kernel, ``torch.nn.attention.varlen``, through the same boundaries; on CPU it runs
:func:`varlen_reference`, exact and slow), else ``flex_attention`` with a block mask built from the same ids (any
packing; for a prefix tree from ``tree_end``), else sdpa with the 4D mask. ``torch_varlen`` also runs the shared
prefix and prefix tree layouts when asked (:func:`varlen_plan`: each branch's keys are its prefix gathered
before it); ``auto`` leaves those to flex until ``benchmarks/gpu_check.py`` has run it on a GPU.

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
from collections import defaultdict
from dataclasses import dataclass, fields
from typing import Sequence

import torch

from agents.llm.records import tokenizer_fingerprint
from distill import check_attention_backend
from distill.reconstruct import TokenSequence, episode_key, reconstruct

PACKINGS = ("padded", "padding_free", "shared_prefix", "sorted_padded", "prefix_tree")
SDPA_BLOCKS = "sdpa_blocks"  # attention implementation registered by register_block_attention
#: Packings whose every sequence is one contiguous run of a row that attends only itself (causally): what a
#: varlen kernel (``cu_seqlens``) can express. A shared prefix / prefix tree needs flex_attention or sdpa.
VARLEN_PACKINGS = ("padded", "sorted_padded", "padding_free")
#: Attention implementations that take sequence boundaries as ``cu_seq_lens_q/k`` + ``max_length_q/k`` kwargs
#: (transformers' flash paths); :func:`register_varlen_attention` adds more.
VARLEN_IMPLEMENTATIONS = {"flash_attention_2", "flash_attention_3", "flash_attention_4"}
TORCH_VARLEN = "torch_varlen"  # PyTorch's own flash varlen kernel (torch.nn.attention.varlen): register_torch_varlen


@dataclass
class PackedBatch:
    """One forward pass worth of packed sequences and where their sampled tokens sit.

    ``rows/cols/targets/record_index/token_index`` list the scored (action) tokens in record order, then token
    order; ``cols`` is the column of the logit that predicts the token (``start + t - 1`` of its sequence)."""

    input_ids: torch.Tensor  # [R, L] long
    position_ids: torch.Tensor  # [R, L] long
    attention_mask: torch.Tensor  # [R, 1, L, L] bool, True = may attend
    rows: torch.Tensor  # [N] long
    cols: torch.Tensor  # [N] long
    targets: torch.Tensor  # [N] long: the sampled ids
    record_index: torch.Tensor  # [N] long
    token_index: torch.Tensor  # [N] long
    unit_ids: torch.Tensor  # [R, L] long (see the module doc; -1 - column for padding)
    seq_ids: torch.Tensor  # [R, L] long
    is_prefix: torch.Tensor  # [R, L] bool
    method: str = "padded"
    n_tokens: int = 0  # real (non-padding) tokens
    tree_end: torch.Tensor | None = None  # [R, L] long, prefix_tree only: end column (exclusive) of each subtree

    def to(self, device) -> "PackedBatch":
        return PackedBatch(**{f.name: (v.to(device) if isinstance(v, torch.Tensor) else v)
                              for f in fields(self) for v in [getattr(self, f.name)]})

    @property
    def n_slots(self) -> int:
        """Tokens run through the model, padding included."""
        return int(self.input_ids.numel())


@dataclass
class _Unit:
    """Sequences laid out together: an optional shared prefix, then one branch per sequence."""

    prefix: int  # shared prefix length (0: none)
    members: list[int]  # indices into the sequences
    length: int


# --------------------------------------------------------------------------------------------- masks
def build_mask(unit_ids: torch.Tensor, seq_ids: torch.Tensor, is_prefix: torch.Tensor) -> torch.Tensor:
    """``[R, 1, L, L]`` bool mask from the per-token ids (the rule of the module doc)."""
    L = unit_ids.shape[-1]
    causal = torch.ones(L, L, dtype=torch.bool, device=unit_ids.device).tril()
    same_unit = unit_ids[:, :, None] == unit_ids[:, None, :]
    visible = (seq_ids[:, :, None] == seq_ids[:, None, :]) | is_prefix[:, None, :]
    return (causal & same_unit & visible)[:, None]


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


# --------------------------------------------------------------------------------------------- layout
def _share_key(seq: TokenSequence, records) -> tuple:
    r = records[seq.segments[0].record] if (records is not None and seq.segments) else None
    if r is None:
        return ("all",)
    rollout, episode = episode_key(r)
    return ("group", rollout, r.group) if r.group is not None else ("episode", rollout, episode)


def _clusters(members: list[int], sequences, min_prefix: int) -> list[tuple[int, list[int]]]:
    """Split one group into ``(prefix length, members)`` clusters that share a prefix.

    Members are sorted by their ids, so sequences with long common prefixes are neighbours; a neighbour joins
    the current cluster when that does not lower the tokens saved (``(k - 1) x prefix``). The shareable part of
    a sequence stops before its earliest scored token and before its last token."""
    def shareable(i: int) -> list[int]:
        s = sequences[i]
        return s.input_ids[:min([len(s) - 1] + [seg.start for seg in s.segments])]

    out: list[tuple[int, list[int]]] = []
    current: list[int] = []
    p = 0
    for i in sorted(members, key=lambda i: sequences[i].input_ids):
        ids = shareable(i)
        if not current:
            current, p = [i], len(ids)
            continue
        q = _common_prefix(shareable(current[0])[:p], ids)
        if q >= max(1, min_prefix) and len(current) * q >= (len(current) - 1) * p:
            current.append(i)
            p = q
        else:
            out.append((p, current))
            current, p = [i], len(ids)
    if current:
        out.append((p, current))
    return out


def _units(sequences: Sequence[TokenSequence], method: str, row_len: int, records, min_prefix: int) -> list[_Unit]:
    if method != "shared_prefix":
        return [_Unit(0, [i], len(s)) for i, s in enumerate(sequences)]
    groups: dict[tuple, list[int]] = defaultdict(list)
    for i, s in enumerate(sequences):
        groups[_share_key(s, records)].append(i)
    units = []
    for members in groups.values():
        for p, cluster in _clusters(members, sequences, min_prefix):
            if len(cluster) < 2:
                units.append(_Unit(0, cluster, len(sequences[cluster[0]])))
                continue
            # split the branches (longest first) into units that fit in a row, each with its own prefix copy
            split: list[_Unit] = []
            current: list[int] = []
            length = p
            for i in sorted(cluster, key=lambda i: -len(sequences[i])):
                branch = len(sequences[i]) - p
                if current and length + branch > row_len:
                    split.append(_Unit(p, current, length))
                    current, length = [], p
                current.append(i)
                length += branch
            split.append(_Unit(p, current, length))
            units += [u if len(u.members) > 1 else _Unit(0, u.members, len(sequences[u.members[0]])) for u in split]
    return units


def _first_fit_decreasing(units: list[_Unit], row_len: int) -> list[list[_Unit]]:
    rows: list[list[_Unit]] = []
    free: list[int] = []
    for u in sorted(units, key=lambda u: -u.length):
        for k, room in enumerate(free):
            if u.length <= room:
                rows[k].append(u)
                free[k] -= u.length
                break
        else:
            rows.append([u])
            free.append(max(0, row_len - u.length))
    return rows


def _layout_row(units: list[_Unit], sequences, next_unit: int, next_seq: int):
    """Token lists of one row and, per (sequence index, original column), the row column."""
    ids, pos, unit_ids, seq_ids, is_prefix = [], [], [], [], []
    where: dict[int, tuple[int, int]] = {}  # sequence -> (row offset of its prefix, row offset of its branch)
    for u in units:
        p = u.prefix
        first = sequences[u.members[0]]
        if p:
            ids += first.input_ids[:p]
            pos += first.position_ids[:p]
            unit_ids += [next_unit] * p
            seq_ids += [next_seq] * p
            is_prefix += [True] * p
            next_seq += 1
        prefix_at = len(ids) - p
        for i in u.members:
            s = sequences[i]
            where[i] = (prefix_at, len(ids))
            n = len(s) - p
            ids += s.input_ids[p:]
            pos += s.position_ids[p:]
            unit_ids += [next_unit] * n
            seq_ids += [next_seq] * n
            is_prefix += [False] * n
            next_seq += 1
        next_unit += 1
    return (ids, pos, unit_ids, seq_ids, is_prefix), where, next_unit, next_seq


def _stack_rows(rows, pad_id) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """``(input_ids, position_ids, unit_ids, n_tokens)``: ``[R, L]`` tensors of rows whose first three columns
    are token ids, positions and unit ids; padding gets the pad id and a distinct negative unit per column
    (so a padding token sees only itself)."""
    L = max(len(r[0]) for r in rows)
    R = len(rows)
    input_ids = torch.full((R, L), int(pad_id), dtype=torch.long)
    position_ids = torch.zeros((R, L), dtype=torch.long)
    unit_ids = (-1 - torch.arange(L, dtype=torch.long)).repeat(R, 1)
    n_tokens = 0
    for k, (ids, pos, units, *_) in enumerate(rows):
        n = len(ids)
        n_tokens += n
        input_ids[k, :n] = torch.tensor(ids, dtype=torch.long)
        position_ids[k, :n] = torch.tensor(pos, dtype=torch.long)
        unit_ids[k, :n] = torch.tensor(units, dtype=torch.long)
    return input_ids, position_ids, unit_ids, n_tokens


def _scored_fields(scored: list[tuple]) -> dict[str, torch.Tensor]:
    """The scored-position fields of a :class:`PackedBatch` from ``(record, t, row, col, target)`` tuples, in
    (record, t) order."""
    scored.sort()
    cols = list(zip(*scored)) if scored else [[]] * 5
    as_long = lambda v: torch.tensor(list(v), dtype=torch.long)  # noqa: E731
    return dict(rows=as_long(cols[2]), cols=as_long(cols[3]), targets=as_long(cols[4]),
                record_index=as_long(cols[0]), token_index=as_long(cols[1]))


def _make_batch(rows, wheres, unit_members, sequences, method, pad_id) -> PackedBatch:
    input_ids, position_ids, unit_ids, n_tokens = _stack_rows(rows, pad_id)
    seq_ids = unit_ids.clone()
    is_prefix = torch.zeros_like(unit_ids, dtype=torch.bool)
    for k, (ids, _, _, seqs, pref) in enumerate(rows):
        seq_ids[k, :len(ids)] = torch.tensor(seqs, dtype=torch.long)
        is_prefix[k, :len(ids)] = torch.tensor(pref, dtype=torch.bool)
    scored = []  # (record, t, row, col, target)
    for k, where in enumerate(wheres):
        for i, (prefix_at, branch_at) in where.items():
            s = sequences[i]
            p = unit_members[k][i]
            for seg in s.segments:
                for t in range(seg.length):
                    j = seg.start + t - 1  # original column of the predicting logit
                    col = prefix_at + j if j < p else branch_at + (j - p)
                    scored.append((seg.record, t, k, col, s.input_ids[seg.start + t]))
    return PackedBatch(
        input_ids=input_ids, position_ids=position_ids, attention_mask=build_mask(unit_ids, seq_ids, is_prefix),
        **_scored_fields(scored), unit_ids=unit_ids, seq_ids=seq_ids, is_prefix=is_prefix, method=method,
        n_tokens=n_tokens,
    )


# --------------------------------------------------------------------------------------------- prefix tree
def build_tree_mask(tree_end: torch.Tensor) -> torch.Tensor:
    """``[R, 1, L, L]`` bool mask of a prefix-tree layout: query ``i`` may attend key ``j`` iff ``j <= i <
    tree_end[j]``, i.e. iff ``j`` is ``i`` itself or one of its ancestors (a subtree is the contiguous run of
    columns ``j .. tree_end[j] - 1``)."""
    L = tree_end.shape[-1]
    col = torch.arange(L, device=tree_end.device)
    return ((col[None, :, None] >= col[None, None, :]) & (col[None, :, None] < tree_end[:, None, :]))[:, None]


def _pair_prefix(a: TokenSequence, b: TokenSequence) -> int:
    """Length of the common prefix of two sequences, ids and positions both equal."""
    n = min(len(a), len(b))
    ai, bi, ap, bp = a.input_ids, b.input_ids, a.position_ids, b.position_ids
    i = 0
    while i < n and ai[i] == bi[i] and ap[i] == bp[i]:
        i += 1
    return i


def _tree_units(sequences: Sequence[TokenSequence], records,
                row_len: int | None) -> list[tuple[list[int], list[int], int]]:
    """Per share key (:func:`_share_key`), the sequences in lexicographic order of their ``(id, position)``
    pairs, cut into consecutive runs whose tries hold at most ``row_len`` tokens (a sequence longer than that
    forms its own). Each unit is ``(members, lcp with the previous member (0 for the first), trie tokens)``."""
    groups: dict[tuple, list[int]] = defaultdict(list)
    for i, s in enumerate(sequences):
        groups[_share_key(s, records)].append(i)
    units = []
    for members in groups.values():
        members.sort(key=lambda i: list(zip(sequences[i].input_ids, sequences[i].position_ids)))
        current, lcps, size = [], [], 0
        for i in members:
            q = _pair_prefix(sequences[current[-1]], sequences[i]) if current else 0
            add = len(sequences[i]) - q
            if current and row_len is not None and size + add > row_len:
                units.append((current, lcps, size))
                current, lcps, size, q, add = [], [], 0, 0, len(sequences[i])
            current.append(i)
            lcps.append(q)
            size += add
        units.append((current, lcps, size))
    return units


def _tree_row(units, sequences, next_unit: int):
    """One row of prefix tries: token lists, the subtree ends, and per sequence the column of each of its
    tokens (its path from the root of its trie)."""
    ids, pos, unit_ids, shared, end = [], [], [], [], []
    paths: dict[int, list[int]] = {}
    for members, lcps, _ in units:
        previous: list[int] = []
        for i, q in zip(members, lcps):
            s = sequences[i]
            start = len(ids)
            ids += s.input_ids[q:]
            pos += s.position_ids[q:]
            unit_ids += [next_unit] * (len(s) - q)
            shared += [False] * (len(s) - q)
            end += [0] * (len(s) - q)
            path = previous[:q] + list(range(start, len(ids)))
            for c in path[:q]:
                shared[c] = True
            for c in path:  # the last path through a column ends its subtree
                end[c] = len(ids)
            paths[i] = path
            previous = path
        next_unit += 1
    return (ids, pos, unit_ids, shared, end), paths, next_unit


def _tree_batch(rows, row_paths, sequences, pad_id) -> PackedBatch:
    input_ids, position_ids, unit_ids, n_tokens = _stack_rows(rows, pad_id)
    R, L = input_ids.shape
    tree_end = (torch.arange(L, dtype=torch.long) + 1).repeat(R, 1)  # padding: a subtree of itself
    is_prefix = torch.zeros((R, L), dtype=torch.bool)
    for k, (ids, _, _, shared, end) in enumerate(rows):
        is_prefix[k, :len(ids)] = torch.tensor(shared, dtype=torch.bool)
        tree_end[k, :len(ids)] = torch.tensor(end, dtype=torch.long)
    scored = []  # (record, t, row, col, target)
    for k, paths in enumerate(row_paths):
        for i, path in paths.items():
            s = sequences[i]
            for seg in s.segments:
                for t in range(seg.length):
                    scored.append((seg.record, t, k, path[seg.start + t - 1], s.input_ids[seg.start + t]))
    return PackedBatch(
        input_ids=input_ids, position_ids=position_ids, attention_mask=build_tree_mask(tree_end),
        **_scored_fields(scored), unit_ids=unit_ids, seq_ids=unit_ids.clone(), is_prefix=is_prefix,
        method="prefix_tree", n_tokens=n_tokens, tree_end=tree_end,
    )


def _pack_tree(sequences, records, token_budget: int, row_len: int | None, pad_id: int) -> list[PackedBatch]:
    if row_len is None:  # whole tries, split only where one exceeds the budget (never below a sequence)
        row_len = max(max(len(s) for s in sequences),
                      min(token_budget, max(u[2] for u in _tree_units(sequences, records, None))))
    units = _tree_units(sequences, records, int(row_len))
    rows: list[list] = []
    free: list[int] = []
    for u in sorted(units, key=lambda u: -u[2]):  # first-fit decreasing
        for k, room in enumerate(free):
            if u[2] <= room:
                rows[k].append(u)
                free[k] -= u[2]
                break
        else:
            rows.append([u])
            free.append(max(0, row_len - u[2]))
    batches, pending, widest, next_unit = [], [], 0, 0
    for units_of_row in rows:
        row, paths, next_unit = _tree_row(units_of_row, sequences, next_unit)
        width = len(row[0])
        if pending and (len(pending) + 1) * max(widest, width) > token_budget:
            batches.append(_tree_batch(*zip(*pending), sequences, pad_id))
            pending, widest = [], 0
        pending.append((row, paths))
        widest = max(widest, width)
    batches.append(_tree_batch(*zip(*pending), sequences, pad_id))
    return batches


def tree_pieces(batch: PackedBatch) -> list[list[tuple[int, int, tuple[int, ...] | None]]]:
    """Per row of a prefix-tree batch, its pieces ``(a, b, ancestors)``: columns ``a..b-1`` form one chain of the
    trie (every column but the last has exactly one child, the next column), ``ancestors`` the indices (in
    this row's list) of the pieces on the path from the root to it, in order, which it attends in full before
    attending itself causally; ``None`` marks padding. Together the pieces tile each row."""
    out = []
    for u_row, e_row in zip(batch.unit_ids.tolist(), batch.tree_end.tolist()):
        pieces: list[tuple[int, int, tuple[int, ...] | None]] = []
        stack: list[tuple[int, int]] = []  # (piece index, subtree end of its last column) on the current path
        L = len(e_row)
        a = 0
        while a < L:
            b = a + 1
            if u_row[a] < 0:
                while b < L and u_row[b] < 0:
                    b += 1
                pieces.append((a, b, None))
                a = b
                continue
            while b < L and b < e_row[b - 1] and e_row[b] == e_row[b - 1]:
                b += 1  # column b is the only child of b - 1
            while stack and stack[-1][1] <= a:
                stack.pop()
            pieces.append((a, b, tuple(k for k, _ in stack)))
            stack.append((len(pieces) - 1, e_row[b - 1]))
            a = b
        out.append(pieces)
    return out


def pack(sequences: Sequence[TokenSequence], method: str = "shared_prefix", *, token_budget: int = 4096,
         row_len: int | None = None, pad_id: int = 0, records=None, min_prefix: int = 1) -> list[PackedBatch]:
    """Pack ``sequences`` into batches (see the module doc).

    Args:
        method: one of :data:`PACKINGS` (see the module doc).
        token_budget: most tokens (rows x row length, padding included) in one batch; a batch always holds at
            least one row.
        row_len: most tokens in a packed row (default: the longest sequence, or for shared-prefix packing the
            longest prefix-with-branches unit, so that nothing is split; for the prefix tree the largest trie,
            but at most ``token_budget`` or, if longer, the longest sequence).
        pad_id: id of padding tokens (never attended to by real tokens, never scored).
        records: the records the sequences' segments index; shared-prefix and prefix-tree packing group by
            their episode / GRPO group (without records, all sequences form one group).
        min_prefix: shortest common prefix worth sharing.
    """
    if method not in PACKINGS:
        raise ValueError(f"packing method must be one of {PACKINGS}, got {method!r}")
    if not sequences:
        raise ValueError("pack() got no sequences")
    if token_budget < 1 or (row_len is not None and row_len < 1):
        raise ValueError(f"token_budget and row_len must be >= 1, got {token_budget}, {row_len}")
    if method == "prefix_tree":
        return _pack_tree(sequences, records, int(token_budget), row_len, pad_id)
    if row_len is None:  # rows as long as the longest unit: nothing is split
        units = _units(sequences, method, 1 << 62, records, min_prefix)
        row_len = max(u.length for u in units)
    else:
        units = _units(sequences, method, int(row_len), records, min_prefix)
    if method == "padded":
        row_units = [[u] for u in units]  # input order
    elif method == "sorted_padded":
        row_units = [[u] for u in sorted(units, key=lambda u: -u.length)]  # longest first: batches of like lengths
    else:
        row_units = _first_fit_decreasing(units, row_len)
    batches, pending, widest = [], [], 0
    next_unit = next_seq = 0

    def flush() -> None:
        rows, wheres, prefixes = zip(*pending)
        batches.append(_make_batch(list(rows), list(wheres), list(prefixes), sequences, method, pad_id))
        pending.clear()

    for units_of_row in row_units:
        row, where, next_unit, next_seq = _layout_row(units_of_row, sequences, next_unit, next_seq)
        width = len(row[0])
        if pending and (len(pending) + 1) * max(widest, width) > token_budget:
            flush()
            widest = 0
        prefixes = {i: u.prefix for u in units_of_row for i in u.members}
        pending.append((row, where, prefixes))
        widest = max(widest, width)
    flush()
    return batches


# --------------------------------------------------------------------------------------------- model calls
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
        raise RuntimeError("sdpa_blocks attention needs the batch's blocks: call distill.packing.hidden_states")
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
                           "distill.packing.hidden_states")
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


def action_hidden(model, batch: PackedBatch, backend: str = "auto") -> torch.Tensor:
    """``[N, d]`` hidden states of the logits that predict the sampled tokens (``hidden[rows, cols]``)."""
    h = hidden_states(model, batch, backend)
    return h[batch.rows.to(h.device), batch.cols.to(h.device)]


def chunked_logprobs(model, hidden: torch.Tensor, targets: torch.Tensor, temperature=1.0, chunk: int = 1024,
                     return_argmax: bool = False):
    """``log_softmax(lm_head(hidden) / T)[targets]`` in fp32, ``chunk`` positions at a time (O(chunk x vocab)).
    ``temperature``: a float or an ``[N]`` tensor. With ``return_argmax`` also the argmax ids."""
    head = model.get_output_embeddings()
    targets = targets.to(hidden.device)
    temp = temperature if not isinstance(temperature, torch.Tensor) else temperature.to(hidden.device).float()
    out, best = [], []
    for a in range(0, hidden.shape[0], max(1, int(chunk))):
        logits = head(hidden[a:a + chunk]).float()
        t = temp[a:a + chunk, None] if isinstance(temp, torch.Tensor) else temp
        logp = torch.log_softmax(logits / t, dim=-1)
        out.append(logp.gather(-1, targets[a:a + chunk, None])[:, 0])
        if return_argmax:
            best.append(logits.argmax(-1))
    lp = torch.cat(out) if out else hidden.new_zeros(0, dtype=torch.float32)
    if return_argmax:
        return lp, (torch.cat(best) if best else torch.zeros(0, dtype=torch.long, device=hidden.device))
    return lp


def action_logprobs(model, batch: PackedBatch, temperature=1.0, chunk: int = 1024, backend: str = "auto",
                    return_argmax: bool = False):
    """``[N]`` log-probs of the sampled tokens of ``batch`` (fp32; see :func:`chunked_logprobs`)."""
    return chunked_logprobs(model, action_hidden(model, batch, backend), batch.targets, temperature, chunk,
                            return_argmax)


def unpack(values, batch, n_records: int) -> list[torch.Tensor]:
    """Per-record tensors (one entry per response token) from ``[N, ...]`` values of ``batch``; ``batch`` may
    be a list of batches with ``values`` a list of their tensors (or one tensor, their concatenation)."""
    batches = batch if isinstance(batch, (list, tuple)) else [batch]
    if isinstance(values, (list, tuple)):
        values = torch.cat(list(values)) if values else torch.zeros(0)
    record_index = torch.cat([b.record_index for b in batches]).to(values.device)
    token_index = torch.cat([b.token_index for b in batches]).to(values.device)
    if record_index.numel() != values.shape[0]:
        raise ValueError(f"unpack: {values.shape[0]} values for {record_index.numel()} scored tokens")
    if record_index.numel() and int(record_index.max()) >= n_records:
        raise ValueError(f"unpack: a batch scores record {int(record_index.max())} but n_records={n_records}")
    counts = torch.bincount(record_index, minlength=n_records).tolist()
    out = [values.new_zeros((c, *values.shape[1:])) for c in counts]
    for i, c in enumerate(counts):
        if c:
            sel = record_index == i
            out[i][token_index[sel]] = values[sel]
    return out


# --------------------------------------------------------------------------------------------- input checks
def model_limits(model) -> tuple[int, int | None]:
    """``(vocabulary size, max positions or None)`` of a transformers causal LM."""
    emb = model.get_input_embeddings()
    vocab = int(getattr(emb, "num_embeddings", None) or emb.weight.shape[0])
    max_pos = getattr(model.config, "max_position_embeddings", None)
    return vocab, (int(max_pos) if max_pos else None)


def check_records(records, model, tokenizer=None) -> None:
    """Fail before any compute, naming the record, when ``records`` cannot be scored by ``model``: an empty
    list, an empty prompt (its first sampled token has no predicting logit), ids outside ``[0, vocab)``, an
    invocation longer than the model's max positions, or a tokenizer fingerprint that differs from
    ``tokenizer``'s (or, without ``tokenizer``, from the other records'). Records without a fingerprint
    (written before the field existed) are not fingerprint-checked."""
    if records is None or len(records) == 0:
        raise ValueError("no records to score: the record list is empty")
    vocab, max_pos = model_limits(model)
    expected = tokenizer_fingerprint(tokenizer) if tokenizer is not None else None
    first_fp = None
    for r in records:
        if not r.prompt_ids:
            raise ValueError(f"{r.describe()} has an empty prompt: its first sampled token cannot be scored")
        ids = list(r.prompt_ids) + list(r.response_ids)
        bad = [t for t in ids if not 0 <= int(t) < vocab]
        if bad:
            raise ValueError(f"{r.describe()} has token id {bad[0]} outside the model's vocabulary [0, {vocab}) "
                             f"({len(bad)} such ids): records from another tokenizer/model?")
        if max_pos is not None and len(ids) > max_pos:
            raise ValueError(f"{r.describe()} has {len(ids)} tokens, more than the model's max positions "
                             f"({max_pos})")
        fp = getattr(r, "tokenizer_fingerprint", "")
        if not fp:
            continue
        if expected is not None and fp != expected:
            raise ValueError(f"{r.describe()} was tokenised by tokenizer {fp}, but the model's tokenizer is "
                             f"{expected}: the ids mean different tokens")
        if first_fp is None:
            first_fp = (fp, r)
        elif fp != first_fp[0]:
            raise ValueError(f"{r.describe()} was tokenised by tokenizer {fp}, but {first_fp[1].describe()} by "
                             f"{first_fp[0]}: records from different tokenizers cannot be scored together")


def check_sequences(sequences, records, model) -> None:
    """Reconstructed sequences (the persistent control grows with the episode) must fit the model's positions."""
    _, max_pos = model_limits(model)
    if max_pos is None:
        return
    for s in sequences:
        if s.position_ids and max(s.position_ids) >= max_pos:
            r = records[s.segments[0].record]
            raise ValueError(f"the sequence of episode (rollout_id={getattr(r, 'rollout_id', '')!r}, "
                             f"episode_id={r.episode_id!r}) needs positions up to {max(s.position_ids)}, beyond "
                             f"the model's max positions ({max_pos})")


# --------------------------------------------------------------------------------------------- scoring records
@torch.no_grad()
def score_records(model, records, method: str = "padded", *, reconstruction: str = "aligned", tokenizer=None,
                  chunk: int = 1024, backend: str = "auto", **pack_kw) -> dict:
    """Score every sampled token of ``records`` under one reconstruction and packing (eval mode, no grad).

    Returns ``logprobs`` and ``argmax`` (per-record tensors, at each record's temperature), ``tokens`` (real
    tokens run), ``slots`` (tokens run, padding included) and ``batches``."""
    check_records(records, model, tokenizer)
    sequences = reconstruct(records, reconstruction, tokenizer)
    check_sequences(sequences, records, model)
    pack_kw.setdefault("pad_id", _pad_id(model))
    batches = pack(sequences, method, records=records, **pack_kw)
    temps = torch.tensor([float(r.temperature) or 1.0 for r in records])
    was_training = model.training
    model.eval()
    try:
        lps, best = [], []
        for b in batches:
            lp, am = action_logprobs(model, b, temps[b.record_index], chunk, backend, return_argmax=True)
            lps.append(lp.cpu())
            best.append(am.cpu())
    finally:
        model.train(was_training)
    return {"logprobs": unpack(lps, batches, len(records)), "argmax": unpack(best, batches, len(records)),
            "tokens": sum(b.n_tokens for b in batches), "slots": sum(b.n_slots for b in batches),
            "batches": batches}


def _pad_id(model) -> int:
    pad = getattr(model.config, "pad_token_id", None)
    return int(pad) if pad is not None else 0


def rce(model, records, method: str = "shared_prefix", **pack_kw) -> dict:
    """The RCE check: log-probs of the sampled tokens recomputed under ``method`` (aligned reconstruction) vs
    the records' ``response_logprobs``: ``max_abs`` and ``p99_abs`` of |delta|, ``tokens``, ``slots``."""
    scored = score_records(model, records, method, **pack_kw)
    ref = torch.cat([torch.tensor(r.response_logprobs, dtype=torch.float32) for r in records])
    delta = (torch.cat(scored["logprobs"]) - ref).abs()
    return {"method": method, "max_abs": float(delta.max()) if delta.numel() else 0.0,
            "p99_abs": float(torch.quantile(delta.double(), 0.99)) if delta.numel() else 0.0,
            "tokens": scored["tokens"], "slots": scored["slots"], "scored": int(delta.numel())}
