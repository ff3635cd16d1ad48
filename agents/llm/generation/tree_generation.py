"""Padding-free batched generation for :class:`agents.llm.generation.policy.LLMPolicy`: a prefix tree for the prefill,
one KV buffer for the decode, finished rows out of the batch.

Why: the prompts of a rollout step are long and share most of their tokens (the system prompt and the protocol
for every episode, the question for the episodes of a GRPO group, all of it for a group's first turn), and their
lengths differ. Left-padding them into one batch prefills every row to the longest and prefills the shared
tokens once per row; a finished row that stays in the batch keeps paying decode steps.

Prefill. The prompts form a trie over their token ids (:func:`prefix_tree`; a node is a run of tokens shared by
every prompt below it, split where prompts diverge or end). Each node is prefilled once, as one sequence of
batch 1 (no padding), on top of its parent's KV (copied into a buffer of the node's length, positions continuing
from the parent's), so a prefix shared by k prompts costs its tokens once instead of k times. Every prompt ends at
a node; that node's last logits are the prompt's first next-token logits and its KV (the whole prompt's) is
copied into the prompt's row of the decode buffer. A :class:`PrefixStore` keeps the KV of shared nodes across
calls (the rollout's turns repeat the system prompt and the question): a node starts from the longest stored
prefix of its tokens. Only a caller that knows the weights do not change between its calls may keep one
(:meth:`agents.llm.generation.policy.LLMPolicy.reuse_prefixes`).

Decode. The rows' KV sit right-aligned in one preallocated buffer per layer (``[rows, kv_heads, width, head]``,
width = the longest prompt + ``max_new_tokens``, written in place by :class:`BufferLayer` instead of
concatenated at every step), masked on the left as the padded path's; positions are each row's own. When rows
finish they leave: the buffer keeps the remaining rows and drops the columns that are padding for all of them.

Exactness: every row sees exactly its own tokens at its own positions, as in one forward of the prompt and its
response; the arithmetic differs from that forward only in summation order (tested: log-probs within 1e-4 in fp32
of :func:`agents.llm.generation.policy.sequence_logprobs`, the same as the padded path).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer


@dataclass
class PrefixNode:
    """A run ``[start, end)`` of tokens shared by every prompt in ``rows_below``; ``ending`` are the prompts
    (indices) that end at ``end``."""

    start: int
    end: int
    ending: list[int]
    rows_below: list[int]
    children: list["PrefixNode"] = field(default_factory=list)


def prefix_tree(prompts: Sequence[Sequence[int]]) -> PrefixNode:
    """The trie of ``prompts`` (non-empty id lists), compressed: the root holds their common prefix (possibly empty),
    each other node at least one token. Children in lexicographic order of their tokens."""
    if not prompts:
        raise ValueError("prefix_tree needs at least one prompt")
    if any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    order = sorted(range(len(prompts)), key=lambda i: list(prompts[i]))

    def build(rows: list[int], start: int) -> PrefixNode:
        first, last = prompts[rows[0]], prompts[rows[-1]]  # sorted: their common prefix is everyone's
        end, limit = start, min(len(first), len(last))
        while end < limit and first[end] == last[end]:
            end += 1
        node = PrefixNode(start, end, [r for r in rows if len(prompts[r]) == end], sorted(rows))
        rest = [r for r in rows if len(prompts[r]) > end]
        i = 0
        while i < len(rest):
            j = i
            while j < len(rest) and prompts[rest[j]][end] == prompts[rest[i]][end]:
                j += 1
            node.children.append(build(rest[i:j], end))
            i = j
        return node

    return build(order, 0)


class BufferLayer(DynamicLayer):
    """One layer's KV in a preallocated buffer ``[B, H, capacity, D]``, the first ``length`` columns filled:
    :meth:`update` writes the new columns in place and returns views of the filled part (no concatenation, so a
    decode step does not copy the whole cache)."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, length: int) -> None:
        super().__init__()
        self.key_buffer, self.value_buffer, self.length = keys, values, int(length)
        self.device = keys.device
        self.is_initialized = True
        self._views()

    def _views(self) -> None:
        self.keys = self.key_buffer[:, :, :self.length]
        self.values = self.value_buffer[:, :, :self.length]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        new = key_states.shape[-2]
        if self.length + new > self.key_buffer.shape[-2]:
            raise RuntimeError(f"KV buffer of {self.key_buffer.shape[-2]} columns is full ({self.length} + {new})")
        self.key_buffer[:, :, self.length:self.length + new] = key_states
        self.value_buffer[:, :, self.length:self.length + new] = value_states
        self.length += new
        self._views()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def keep(self, rows: torch.Tensor, first_column: int) -> None:
        """Keep the batch rows ``rows`` and the columns from ``first_column`` on."""
        self.key_buffer = self.key_buffer[rows, :, first_column:]
        self.value_buffer = self.value_buffer[rows, :, first_column:]
        self.length -= first_column
        self._views()


def buffer_cache(kv: Sequence[tuple[torch.Tensor, torch.Tensor]], capacity: int) -> Cache:
    """A cache holding ``kv`` (per layer ``(keys, values)`` of ``[B, H, L, D]``) with room for ``capacity``
    columns in all."""
    layers = []
    for keys, values in kv:
        length = keys.shape[-2]
        kbuf = keys.new_empty(keys.shape[:2] + (capacity,) + keys.shape[3:])
        vbuf = values.new_empty(values.shape[:2] + (capacity,) + values.shape[3:])
        kbuf[:, :, :length] = keys
        vbuf[:, :, :length] = values
        layers.append(BufferLayer(kbuf, vbuf, length))
    return Cache(layers=layers)


def supports_tree_generation(model) -> bool:
    """Whether the model's cache is plain full attention in every layer (no sliding window, no linear attention,
    no cross-layer KV sharing): what :class:`BufferLayer` stands in for."""
    config = getattr(model, "config", None)
    if config is None:
        return False
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    if getattr(text, "is_encoder_decoder", False):
        return False
    if getattr(text, "use_sliding_window", False) and getattr(text, "sliding_window", None):
        return False
    types = getattr(text, "layer_types", None)
    if types is not None and any(t != "full_attention" for t in types):
        return False
    return True


class PrefixStore:
    """KV of shared prompt prefixes kept across generation calls (LRU, at most ``max_tokens`` prefix tokens in
    all). Valid only while the weights stay the same: see the module doc."""

    def __init__(self, max_tokens: int = 8192) -> None:
        self.max_tokens = int(max_tokens)
        self.entries: OrderedDict[tuple[int, ...], tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor]] = \
            OrderedDict()
        self.tokens = 0
        self.hits = 0  # prefix tokens not prefilled thanks to the store

    def longest(self, prompt: Sequence[int], low: int, high: int):
        """The longest stored prefix of ``prompt`` with ``low < length <= high``: ``(length, kv, logits)``, or
        None."""
        best = None
        for key, value in self.entries.items():
            n = len(key)
            if low < n <= high and (best is None or n > best[0]) and tuple(prompt[:n]) == key:
                best = (n, key, value)
        if best is None:
            return None
        n, key, (kv, logits) = best
        self.entries.move_to_end(key)
        return n, kv, logits

    def put(self, prefix: Sequence[int], kv, logits: torch.Tensor) -> None:
        key = tuple(prefix)
        if key in self.entries or len(key) > self.max_tokens:
            return
        self.entries[key] = (kv, logits)
        self.tokens += len(key)
        while self.tokens > self.max_tokens:
            old, _ = self.entries.popitem(last=False)
            self.tokens -= len(old)


def prefill_tree(model, prompts: Sequence[Sequence[int]], forward_kwargs: dict[str, Any],
                 store: PrefixStore | None = None, on_tokens: Callable[[int], None] | None = None,
                 cache_arg: str = "past_key_values") -> tuple[list, torch.Tensor]:
    """Prefill ``prompts`` along their prefix tree; returns ``(kv_rows, logits)``: per prompt its per-layer
    ``(keys, values)`` (``[1, H, len, D]``, views that may be shared between prompts) and ``logits`` ``[n, V]``
    fp32 of the next token after each prompt. ``forward_kwargs`` go to every forward (``logits_to_keep``);
    ``cache_arg`` names the forward's cache argument; ``on_tokens(k)`` is told each forward's token count."""
    device = next(model.parameters()).device
    root = prefix_tree(prompts)
    kv_rows: list = [None] * len(prompts)
    logits_rows: list = [None] * len(prompts)

    def visit(node: PrefixNode, parent_kv, parent_len: int) -> None:
        prompt = prompts[node.rows_below[0]]
        kv, logits, done = parent_kv, None, parent_len
        if store is not None and node.end > parent_len:
            found = store.longest(prompt, parent_len, node.end)
            if found is not None:
                done, kv, logits = found
                store.hits += done - parent_len
        if node.end > done:
            cache = buffer_cache(kv, node.end) if kv is not None else DynamicCache()
            ids = torch.tensor([list(prompt[done:node.end])], dtype=torch.long, device=device)
            positions = torch.arange(done, node.end, dtype=torch.long, device=device)[None]
            out = model(input_ids=ids, position_ids=positions, use_cache=True, **{cache_arg: cache},
                        **forward_kwargs)
            if on_tokens is not None:
                on_tokens(node.end - done)
            kv = [(layer.keys, layer.values) for layer in cache.layers]
            logits = out.logits[0, -1].float()
        if store is not None and len(node.rows_below) > 1 and node.end > parent_len:
            store.put(prompt[:node.end], kv, logits)
        for r in node.ending:
            kv_rows[r], logits_rows[r] = kv, logits
        for child in node.children:
            visit(child, kv, node.end)

    visit(root, None, 0)
    return kv_rows, torch.stack(logits_rows)


def decode_buffers(kv_rows: list, lengths: Sequence[int], extra: int) -> tuple[Cache, torch.Tensor]:
    """The rows' prompt KV right-aligned in one buffer cache with ``extra`` free columns, and the attention mask
    ``[n, width]`` (1 on each row's prompt and on every free column; written as the rows decode)."""
    if isinstance(extra, bool) or not isinstance(extra, int) or extra < 1:  # 0 columns: the first decode overflows
        raise ValueError(f"decode_buffers: extra (max_new_tokens) must be a whole number >= 1, got {extra!r}")
    n, longest = len(kv_rows), max(lengths)
    layers = []
    first = kv_rows[0]
    for layer, (k0, v0) in enumerate(first):
        kbuf = k0.new_zeros((n, k0.shape[1], longest + extra, k0.shape[3]))
        vbuf = v0.new_zeros((n, v0.shape[1], longest + extra, v0.shape[3]))
        for r in range(n):
            keys, values = kv_rows[r][layer]
            kbuf[r, :, longest - lengths[r]:longest] = keys[0]
            vbuf[r, :, longest - lengths[r]:longest] = values[0]
        layers.append(BufferLayer(kbuf, vbuf, longest))
    mask = torch.ones((n, longest + extra), dtype=torch.long, device=first[0][0].device)
    for r in range(n):
        mask[r, :longest - lengths[r]] = 0
    return Cache(layers=layers), mask
