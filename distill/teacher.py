"""The teacher: a frozen causal LM that scores the student's sampled actions, on the same reconstruction and packing.

Only the states that predict sampled action tokens are kept (``[N, d]`` hidden states, small); the teacher's
full-vocabulary log-probs are made from them ``chunk`` positions at a time (:meth:`Teacher.logprob_chunks`,
:func:`distill.losses.chunked_distill_loss`), so the ``N x V`` matrix never exists. The teacher is in eval
mode with ``requires_grad=False`` and runs under ``no_grad``.

Vocabulary check (:func:`check_vocabulary`): teacher and student must share one tokenizer (the student's sampled
ids are fed to the teacher as they are). It compares the tokenizers' fingerprints
(:func:`agents.llm.records.invocation.tokenizer_fingerprint`: the vocabulary and the added tokens) and that both heads
cover the tokenizer, and fails with an error naming both, before any weights are loaded by
:meth:`Teacher.from_pretrained`. Heads of different widths over one tokenizer (e.g. Qwen2.5 checkpoints padded to
151,936 or 152,064 rows) are compared on their common first ``vocab_size`` logits, which cover every real token.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Iterator, Sequence

import torch

from agents.llm.records.invocation import InvocationRecord, tokenizer_fingerprint
from distill.losses import head_logprobs
from distill.packing import PACKINGS, pack
from distill.scoring import action_hidden
from distill.reconstruct import RECONSTRUCTIONS, reconstruct


class VocabularyMismatchError(ValueError):
    """Teacher and student (or records and model) do not share one vocabulary."""


def _name(tokenizer) -> str:
    return str(getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__)


def head_size(model) -> int:
    """Rows of ``model``'s output embedding (the number of logits it produces)."""
    return int(model.get_output_embeddings().weight.shape[0])


def check_vocabulary(teacher_tokenizer, student_tokenizer, teacher_model=None, student_model=None) -> int:
    """Fail with :class:`VocabularyMismatchError` unless teacher and student share the tokenizer (same
    fingerprint) and each model's head covers it; returns the number of logits both heads share."""
    t_fp, s_fp = tokenizer_fingerprint(teacher_tokenizer), tokenizer_fingerprint(student_tokenizer)
    t_len, s_len = len(teacher_tokenizer), len(student_tokenizer)
    if t_fp != s_fp or t_len != s_len:
        raise VocabularyMismatchError(
            f"the teacher's tokenizer ({_name(teacher_tokenizer)}: {t_len} tokens, fingerprint {t_fp[:12]}) differs "
            f"from the student's ({_name(student_tokenizer)}: {s_len} tokens, fingerprint {s_fp[:12]}); "
            "distillation compares distributions over one vocabulary: use a teacher with the student's tokenizer")
    shared = None
    for role, model, tok in (("teacher", teacher_model, teacher_tokenizer), ("student", student_model, student_tokenizer)):
        if model is None:
            continue
        rows = head_size(model)
        if rows < len(tok):
            raise VocabularyMismatchError(
                f"the {role} model's head has {rows} logits but its tokenizer ({_name(tok)}) has {len(tok)} tokens")
        shared = rows if shared is None else min(shared, rows)
    return shared if shared is not None else s_len


# ---------------------------------------------------------------------- scoring records on a packing
@dataclass
class ScoringLayout:
    """How records are turned into model inputs: the reconstruction, the packing and its sizes."""

    reconstruction: str = "aligned"
    packing: str = "shared_prefix"
    token_budget: int = 4096
    backend: str = "auto"

    def __post_init__(self) -> None:
        if self.reconstruction not in RECONSTRUCTIONS:
            raise ValueError(f"reconstruction must be one of {', '.join(RECONSTRUCTIONS)}; got {self.reconstruction!r}")
        if self.packing not in PACKINGS:
            raise ValueError(f"packing must be one of {', '.join(PACKINGS)}; got {self.packing!r}")
        if self.token_budget < 1:
            raise ValueError(f"token_budget must be >= 1 token, got {self.token_budget}")

    def batches(self, records: Sequence[InvocationRecord], tokenizer, pad_id: int):
        """The packed batches of ``records`` (every response token scored, see :mod:`distill.packing`)."""
        sequences = reconstruct(records, self.reconstruction, tokenizer)
        return pack(sequences, self.packing, token_budget=self.token_budget, pad_id=pad_id, records=records)


def action_order(records: Sequence[InvocationRecord], batches) -> tuple[torch.Tensor, torch.Tensor]:
    """``(keep, index)`` mapping the concatenated scored tokens of ``batches`` onto the action tokens of
    ``records`` in record order, then token order (the order of ``agents.llm.training.ppo``'s flattened per-token
    fields): ``values[keep][index]`` is that order. ``keep`` drops response tokens whose ``action_mask`` is 0."""
    offsets, ranks, total = [], [], 0
    for r in records:
        rank = [-1] * len(r.response_ids)
        k = 0
        for t, m in enumerate(r.action_mask):
            if m:
                rank[t] = k
                k += 1
        offsets.append(total)
        ranks.append(rank)
        total += k
    rec = torch.cat([b.record_index for b in batches]).tolist()
    tok = torch.cat([b.token_index for b in batches]).tolist()
    dest = [offsets[i] + ranks[i][t] if ranks[i][t] >= 0 else -1 for i, t in zip(rec, tok)]
    keep = torch.tensor([d >= 0 for d in dest], dtype=torch.bool)
    kept = torch.tensor([d for d in dest if d >= 0], dtype=torch.long)
    if kept.numel() != total:
        raise ValueError(f"the packed batches score {kept.numel()} of the {total} action tokens of the records")
    index = torch.empty_like(kept)
    index[kept] = torch.arange(kept.numel())
    return keep, index


def records_action_hidden(model, records: Sequence[InvocationRecord], layout: ScoringLayout, tokenizer,
                          pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(hidden [N, d], targets [N])`` at the action tokens of ``records`` (record order, then token order), from
    one body forward per packed batch of ``layout``; gradients flow when enabled (the student's training forward)."""
    batches = layout.batches(records, tokenizer, pad_id)
    device = next(model.parameters()).device
    hidden = torch.cat([action_hidden(model, b.to(device), layout.backend) for b in batches])
    targets = torch.cat([b.targets for b in batches]).to(device)
    keep, index = action_order(records, batches)
    keep, index = keep.to(device), index.to(device)
    return hidden[keep][index], targets[keep][index]


# ---------------------------------------------------------------------- the teacher
class Teacher:
    """A frozen teacher LM (eval mode, no grad) that shares the student's vocabulary.

    Args:
        model: a transformers causal LM.
        tokenizer: its tokenizer.
        student_tokenizer, student_model: checked against the teacher (:func:`check_vocabulary`) when given.
        temperature: the teacher's distribution is ``softmax(logits / temperature)``.
        chunk: positions per lm-head application.
    """

    def __init__(self, model, tokenizer, *, student_tokenizer=None, student_model=None, temperature: float = 1.0,
                 chunk: int = 1024) -> None:
        self.vocab_size = head_size(model)
        if student_tokenizer is not None:
            self.vocab_size = check_vocabulary(tokenizer, student_tokenizer, model, student_model)
        self.model = model.eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.tokenizer = tokenizer
        self.temperature = float(temperature)
        self.chunk = int(chunk)

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, *, student_tokenizer=None, student_model=None, device=None,
                        dtype=None, attn_implementation: str = "sdpa", **kwargs) -> "Teacher":
        """Load a local checkpoint; the tokenizers are compared before the weights are read. ``dtype``: as
        :func:`agents.llm.models.local.load_pretrained` (None: float32; ``"auto"``: bf16 on a CUDA device that has
        it; a frozen teacher has no optimizer state to keep in float32), ``attn_implementation`` likewise."""
        from agents.llm.models.local import load_pretrained, load_tokenizer
        from agents.llm.models.precision import check_attn_implementation, resolve_dtype

        check_attn_implementation(attn_implementation, resolve_dtype(dtype, device, "teacher dtype"), device)
        if student_tokenizer is not None:
            check_vocabulary(load_tokenizer(path), student_tokenizer)
        model, tokenizer = load_pretrained(path, dtype=dtype, device=device, attn_implementation=attn_implementation)
        return cls(model, tokenizer, student_tokenizer=student_tokenizer, student_model=student_model, **kwargs)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """Teacher logits over the shared vocabulary (the first ``vocab_size`` rows of its head)."""
        return self.model.get_output_embeddings()(hidden)[..., :self.vocab_size]

    @torch.no_grad()
    def action_hidden(self, records: Sequence[InvocationRecord], layout: ScoringLayout,
                      pad_id: int | None = None) -> torch.Tensor:
        """``[N, d]`` teacher hidden states at the records' action tokens (record order, then token order)."""
        pad = self.tokenizer.pad_token_id if pad_id is None else pad_id
        return records_action_hidden(self.model, records, layout, self.tokenizer, pad or 0)[0]

    @torch.no_grad()
    def logprob_chunks(self, hidden: torch.Tensor) -> Iterator[tuple[int, torch.Tensor]]:
        """``(start, [c, V] fp32 log-probs)`` for consecutive chunks of ``hidden``'s positions."""
        for i in range(0, hidden.shape[0], self.chunk):
            yield i, head_logprobs(self.head, hidden[i:i + self.chunk].to(self.device), self.temperature)

    @torch.no_grad()
    def top_k(self, hidden: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(log-probs [N, k], token ids [N, k])`` of the teacher's ``k`` most likely tokens at each position."""
        values, ids = [], []
        for _, logp in self.logprob_chunks(hidden):
            v, i = logp.topk(min(k, logp.shape[-1]), dim=-1)
            values.append(v)
            ids.append(i)
        return torch.cat(values), torch.cat(ids)


__all__ = ["Teacher", "VocabularyMismatchError", "check_vocabulary", "head_size", "ScoringLayout",
           "action_order", "records_action_hidden"]
