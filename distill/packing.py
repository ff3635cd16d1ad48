"""Packing layouts: reconstructed token sequences into batches (:func:`pack`), and values back per record
(:func:`unpack`).

Five packings of :class:`distill.reconstruct.TokenSequence` (each scored token keeps exactly the context it had
when sampled, so every packing reproduces the records' log-probs: the RCE check,
:func:`distill.scoring.rce`):

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

How a batch is run through a model (the attention back-ends, which read these masks, ids and ``tree_end``) is
:mod:`distill.attention`; scoring records' sampled tokens on a packing is :mod:`distill.scoring`.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, fields
from typing import Sequence

import torch

from distill.reconstruct import TokenSequence, episode_key

PACKINGS = ("padded", "padding_free", "shared_prefix", "sorted_padded", "prefix_tree")


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
