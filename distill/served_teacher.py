"""A served teacher for MemOPD: the teacher's log-probs come from an OpenAI-compatible server (vLLM) instead of a
model in this process (``memenv distill --teacher openai:NAME@URL``).

Scoring (:class:`ServedTeacher`). For each invocation record, one ``POST /v1/completions`` whose prompt is the
record's token ids as sampled (``prompt_ids + response_ids``: the teacher scores exactly what the student saw
and wrote, the ``aligned`` reconstruction), ``max_tokens=1`` (vLLM's least; the one generated token is thrown
away), ``prompt_logprobs=k`` and ``return_token_ids``: the server returns, for every prompt position, the
log-prob of the actual token and of its ``k`` most likely ones (``k = 0``: the actual token only). This is how
verl and slime get teacher (or reference) log-probs from a vLLM/SGLang engine at scale. The answers at the
response positions with ``action_mask == 1`` are kept, in record order then token order (the order of
:class:`agents.llm.training.ppo.ActorOutput`). Requests run on a thread pool (``concurrency``); vLLM batches them.

Checks, each a one-line error naming the server: before any work a probe text (chat markers, the memory and
search tags, digits) and the text of every vocabulary id, one per line (:func:`vocabulary_probe`: 96 requests of
about 1,000 tokens for a 49,152-id vocabulary), are sent as text and their ids compared with the student tokenizer's
(:class:`ServedTokenizerMismatch`, a :class:`distill.teacher.VocabularyMismatchError`, when they differ); every
reply must echo the ids it was sent (``prompt_token_ids``) and give one entry per prompt position with the
actual token in it (:class:`ServedTeacherError` otherwise: "returned N positions for a prompt of M tokens").
Log-probs are the server's at temperature 1 (vLLM's prompt log-probs are of the raw logits), so
``distill_temperature`` must be 1.

Losses (:class:`ServedTeacherHook`, the :class:`agents.llm.training.ppo.LossHook` of ``train_memopd`` for a served
teacher), per action token ``t`` with the student's ``log pi(a_t)`` and the teacher's ``log q(a_t)``:

- ``top_k=None`` (**default**: the sampled-token reverse KL of on-policy distillation, needs ``k = 0``): the
  estimator ``log pi(a_t) - log q(a_t)`` of ``KL(pi || q)`` (its mean is reported as ``distill_loss``); the
  gradient term is ``sg(log pi - log q) * pi/pi_old`` (``pi_old``: the records' behaviour log-probs), whose
  gradient ``sg(log pi - log q) * (pi/pi_old) * grad log pi`` is the importance-weighted score-function
  gradient of the reverse KL (a per-token advantage ``-(log pi - log q)``, as verl, slime and Tinker use).
- ``top_k=k``: the divergence of ``--loss`` (reverse KL by default) between the student's full distribution and
  the teacher's on the teacher's top-k tokens, closed with a tail bucket (``top_k_mode="tail"``) or renormalised
  (``"renorm"``) as in :mod:`distill.losses`; the student's side is the LM head applied in checkpointed chunks
  (memory ``O(chunk x V)``). vLLM caps ``k`` at its ``--max-logprobs`` (default 20).
"""

from __future__ import annotations

import math
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Sequence

import torch
from torch.utils.checkpoint import checkpoint

from agents.llm.records.invocation import InvocationRecord
from agents.llm.training.common import unwrap_ddp
from agents.llm.adapters.served import CompletionsClient, ServedSpec, ServerError, is_served
from distill.credit import CreditConfig, apply_memory_credit
from distill.losses import DistillLossConfig, _tail_logmass, divergence, head_logprobs
from distill.teacher import VocabularyMismatchError
from memenv.search.http import BadReplyError, HTTPStatusError, UnreachableError, excerpt, request_json

#: The tokenizer probe: chat-template markers, the protocol's tags, digits, accents and spacing.
PROBE = ("<|im_start|>user\nQuestion 1: In which country is Wigei?<|im_end|>\n<|im_start|>assistant\n"
         "<memory>Wigei 1957: Solurtia, Staitou</memory><search>capital of Solurtia</search>  café 3.14")


def vocabulary_probe(tokenizer, lines_per_chunk: int = 512) -> tuple[list[str], float]:
    """The whole-vocabulary part of the tokenizer check: the text of every id (``decode([id])``), one per line, in
    chunks of ``lines_per_chunk`` lines (one request each), and the share of the vocabulary whose ids the
    student's tokenizer produces on those chunks.

    A server whose tokenizer differs from the student's at a covered id (another text for it, or its text under
    another id) tokenizes that line differently, so the check fails; a difference at an uncovered id goes
    unseen. So a one-id difference at a uniformly random id is caught with probability ``coverage`` (0.9926 of
    SmolLM2's 49,152 ids: 96 chunks of at most 1,025 tokens; the 365 ids left are 313 byte fragments, whose text
    alone is not valid UTF-8, and 52 runs of spaces and line breaks that merge with the line ends)."""
    size = len(tokenizer)
    lines = [tokenizer.decode([i]) for i in range(size)]
    chunks = ["\n".join(lines[i:i + lines_per_chunk]) for i in range(0, size, lines_per_chunk)]
    seen = set()
    for chunk in chunks:
        seen.update(tokenizer.encode(chunk, add_special_tokens=False))
    return chunks, len(seen & set(range(size))) / max(1, size)


class ServedTeacherError(ServerError):
    """The teacher server answered something that is not the log-probs it was asked for."""


class ServedTokenizerMismatch(VocabularyMismatchError):
    """The server's tokenizer is not the student's."""


@dataclass
class ServedScores:
    """The served teacher's answers at the action tokens of some records (record order, then token order)."""

    sampled: torch.Tensor  # [N] log q(a_t), fp32
    top_logp: torch.Tensor | None = None  # [N, k] the teacher's k most likely tokens' log-probs, by rank
    top_ids: torch.Tensor | None = None  # [N, k]
    seconds: float = 0.0
    tokens: int = 0  # prompt tokens the server scored


class ServedTeacher:
    """Teacher log-probs from an OpenAI-compatible server (see the module doc).

    Args:
        spec: ``openai:NAME@URL`` (or a :class:`agents.llm.adapters.served.ServedSpec`).
        tokenizer: the student's tokenizer (the probe compares the server's ids with it).
        top_k: top-k log-probs per position (None or 0: the actual token only).
        concurrency: requests in flight.
        check: probe the server's tokenizer now (one request).
    """

    def __init__(self, spec: ServedSpec | str, tokenizer, *, top_k: int | None = None, concurrency: int = 8,
                 timeout: float = 300.0, retries: int = 4, backoff: float = 0.5, check: bool = True) -> None:
        self.spec = spec if isinstance(spec, ServedSpec) else ServedSpec.parse(spec)
        if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0):
            raise ValueError(f"top_k must be a number of tokens >= 0 (or None), got {top_k!r}")
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        self.tokenizer, self.top_k, self.concurrency = tokenizer, int(top_k or 0), int(concurrency)
        self.client = CompletionsClient(self.spec, max_tokens=1, temperature=0.0, stop=(), timeout=timeout,
                                        retries=retries, backoff=backoff)
        self.url = self.spec.api_base + "/completions"
        if check:
            self.check()

    def __repr__(self) -> str:
        return f"ServedTeacher({self.spec.text!r}, top_k={self.top_k})"

    def _post(self, prompt: str | list[int], k: int, **extra: Any) -> dict:
        body = {"model": self.spec.model, "prompt": prompt, "max_tokens": 1, "temperature": 0.0,
                "prompt_logprobs": int(k), "return_token_ids": True, **extra}
        reply = self.client.post("/completions", body)
        choices = reply.get("choices") if isinstance(reply, dict) else None
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise ServedTeacherError(f"{self.url} returned no choices (expected a completions object): "
                                     f"{excerpt(reply)}")
        return choices[0]

    def check(self) -> None:
        """The server is up, serves the model, and tokenizes :data:`PROBE` and the text of every vocabulary entry
        (:func:`vocabulary_probe`) into the student tokenizer's ids; ``vocabulary_coverage`` is then the share of
        the vocabulary whose ids that comparison saw."""
        self.client.check()
        chunks, coverage = vocabulary_probe(self.tokenizer)
        # The short probe first, alone: another tokenizer usually differs there, and is refused after one request.
        # It also tells whether the server has vLLM's /tokenize, which tokenizes without a forward pass (the
        # vocabulary's texts are ~100k tokens: minutes of prefill on a CPU server, milliseconds to tokenize).
        try:
            probe_reply = self._tokenize_reply(PROBE)
            via_tokenize = isinstance(probe_reply["prompt_token_ids"], list)
        except HTTPStatusError:  # no /tokenize (another OpenAI-compatible server): 1-token completions instead
            via_tokenize = False
        if not via_tokenize:
            probe_reply = self._post(PROBE, 0, add_special_tokens=False, prompt_logprobs=None)
        self._compare_tokenization([PROBE], [probe_reply], len(chunks), start=0)
        fetch = self._tokenize_reply if via_tokenize else (
            lambda text: self._post(text, 0, add_special_tokens=False, prompt_logprobs=None))
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(chunks))) as pool:
            replies = list(pool.map(fetch, chunks))
        self._compare_tokenization(chunks, replies, len(chunks), start=1)
        self.vocabulary_coverage = coverage

    def _tokenize_reply(self, text: str) -> dict:
        """vLLM's ``POST /tokenize`` of ``text`` (no special tokens), as ``{"prompt_token_ids": ids}`` (the shape of
        a completion's choice, which :meth:`_compare_tokenization` reads)."""
        root = self.spec.api_base[:-len("/v1")]
        client = self.client
        headers = {"Authorization": f"Bearer {client.api_key}"} if client.api_key else {}
        try:  # the caller's timeout, retries and back-off, as every other request of this teacher
            reply = request_json(root + "/tokenize", {"model": self.spec.model, "prompt": text,
                                                      "add_special_tokens": False}, headers=headers,
                                 timeout=client.timeout, retries=client.retries, backoff=client.backoff,
                                 total_timeout=client.total_timeout)
        except UnreachableError as err:
            raise client.unreachable(err) from err
        except BadReplyError as err:
            raise ServedTeacherError(str(err)) from err
        return {"prompt_token_ids": reply.get("tokens") if isinstance(reply, dict) else None}

    def _compare_tokenization(self, texts: list[str], replies: list[dict], n_chunks: int, start: int) -> None:
        """Refuse (:class:`ServedTokenizerMismatch`) the first text the server tokenized otherwise than the student;
        ``start``: the index of ``texts[0]`` (0: the probe, n: part n of the vocabulary's ``n_chunks`` texts)."""
        for n, (text, choice) in enumerate(zip(texts, replies), start=start):
            local = list(self.tokenizer.encode(text, add_special_tokens=False))
            served = choice.get("prompt_token_ids")
            if not isinstance(served, list):
                raise ServedTeacherError(f"{self.url} sent no prompt_token_ids for the tokenizer probe (a served "
                                         f"teacher needs vLLM's return_token_ids): {excerpt(choice)}")
            if served != local:
                what = "a probe" if n == 0 else f"part {n} of {n_chunks} of its vocabulary's texts"
                first = next((i for i, (a, b) in enumerate(zip(served, local)) if a != b), min(len(served), len(local)))
                raise ServedTokenizerMismatch(
                    f"the teacher server {self.spec.url} (model {self.spec.model}) tokenizes {what} into "
                    f"{len(served)} ids, the student's tokenizer ({getattr(self.tokenizer, 'name_or_path', '?')}) "
                    f"into {len(local)}; first difference at position {first}: server {served[first:first + 4]} vs "
                    f"student {local[first:first + 4]}. Distillation compares distributions over one vocabulary: "
                    "serve a teacher with the student's tokenizer")

    # ------------------------------------------------------------------ scoring
    def _score_one(self, record: InvocationRecord) -> tuple[list[float], list[list[float]], list[list[int]], int]:
        ids = [int(i) for i in record.input_ids]
        choice = self._post(ids, self.top_k)
        where = f"{self.url} ({record.describe()})"
        echoed = choice.get("prompt_token_ids")
        if isinstance(echoed, list) and echoed != ids:
            raise ServedTeacherError(f"{where}: the server scored other ids than it was sent ({len(echoed)} ids "
                                     f"back for {len(ids)} sent): its tokenizer or template changed the prompt")
        positions = choice.get("prompt_logprobs")
        if not isinstance(positions, list) or len(positions) != len(ids):
            have = len(positions) if isinstance(positions, list) else 0
            raise ServedTeacherError(f"{where} returned {have} positions of prompt_logprobs for a prompt of "
                                     f"{len(ids)} tokens (expected one per token): {excerpt(choice)}")
        sampled, top_v, top_i = [], [], []
        start = record.prompt_len
        for t, mask in enumerate(record.action_mask):
            if not mask:
                continue
            entry, token = positions[start + t], ids[start + t]
            if not isinstance(entry, dict) or str(token) not in entry:
                raise ServedTeacherError(f"{where}: position {start + t} has no log-prob of its token {token}: "
                                         f"{excerpt(entry)}")
            sampled.append(self._logprob(entry[str(token)], f"{where}: position {start + t}, token {token}"))
            if self.top_k:
                top_i_t, top_v_t = self._top_entries(entry, f"{where}: position {start + t}")
                top_i.append(top_i_t)
                top_v.append(top_v_t)
        return sampled, top_v, top_i, len(ids)

    @staticmethod
    def _logprob(answer: Any, where: str) -> float:
        """The ``logprob`` of one answer entry, which must be a finite log-probability (a number <= 0, up to
        rounding): NaN, -inf or a positive value would reach the loss as NaN or inf and, through the update, the
        weights (:class:`ServedTeacherError` before anything is computed from it)."""
        value = answer.get("logprob") if isinstance(answer, dict) else None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value > 1e-4:
            raise ServedTeacherError(f"{where}: log-prob {value!r} is not a finite log-probability")
        return float(value)

    def _top_entries(self, entry: dict, where: str) -> tuple[list[int], list[float]]:
        """The ``top_k`` ids (in the student's vocabulary) and their finite log-probs of one position, by rank."""
        vocab = len(self.tokenizer)
        ranked = []
        for key, answer in entry.items():
            rank = answer.get("rank") if isinstance(answer, dict) else None
            if isinstance(rank, bool) or not isinstance(rank, int) or not 1 <= rank <= self.top_k:
                continue  # the actual token outside the top k (its rank is larger), or an entry without one
            token = int(key) if isinstance(key, str) and key.isdigit() else -1
            if not 0 <= token < vocab:
                raise ServedTeacherError(f"{where}: top-k id {key!r} is not an id of the student's vocabulary "
                                         f"(0..{vocab - 1})")
            ranked.append((rank, token, self._logprob(answer, f"{where}, top-k id {token}")))
        ranked.sort(key=lambda x: x[0])
        if len(ranked) < self.top_k:
            raise ServedTeacherError(f"{where} has {len(ranked)} of the {self.top_k} top log-probs asked for: "
                                     f"{excerpt(entry)}")
        return [i for _, i, _ in ranked[:self.top_k]], [v for _, _, v in ranked[:self.top_k]]

    def score(self, records: Sequence[InvocationRecord]) -> ServedScores:
        """The teacher's log-probs at the action tokens of ``records`` (see :class:`ServedScores`)."""
        t0 = time.perf_counter()
        todo = [r for r in records if any(r.action_mask)]
        with ThreadPoolExecutor(max_workers=min(self.concurrency, max(1, len(todo)))) as pool:
            results = dict(zip(map(id, todo), pool.map(self._score_one, todo)))
        sampled, top_v, top_i, tokens = [], [], [], 0
        for r in records:
            if id(r) in results:
                s, v, i, n = results[id(r)]
                sampled += s
                top_v += v
                top_i += i
                tokens += n
        out = ServedScores(torch.tensor(sampled, dtype=torch.float32), tokens=tokens)
        if self.top_k:
            out.top_logp = torch.tensor(top_v, dtype=torch.float32).reshape(-1, self.top_k)
            out.top_ids = torch.tensor(top_i, dtype=torch.long).reshape(-1, self.top_k)
        out.seconds = time.perf_counter() - t0
        return out


# ---------------------------------------------------------------------- losses
def sampled_reverse_kl_term(student_logp: torch.Tensor, teacher_logp: torch.Tensor,
                            behaviour_logp: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(term [N], estimate [N])`` of the sampled-token reverse KL (module doc): ``estimate = log pi - log q``
    (no grad); ``term = sg(estimate) * exp(log pi - sg(log pi_old))``, whose gradient is the importance-weighted
    score-function gradient of ``KL(pi || q)``."""
    estimate = (student_logp - teacher_logp).detach()
    ratio = torch.exp(student_logp - behaviour_logp.detach())
    return estimate * ratio, estimate


def top_k_served_loss(student_head, student_hidden: torch.Tensor, teacher_top: torch.Tensor,
                      teacher_ids: torch.Tensor, cfg: DistillLossConfig) -> torch.Tensor:
    """Per-position ``[N]`` divergence ``cfg.kind`` between the student (full vocabulary, from ``student_hidden``
    through ``student_head``, ``cfg.chunk`` positions at a time, checkpointed) and the teacher's top-k
    (``teacher_top`` log-probs at ``teacher_ids``), closed by ``cfg.top_k_mode`` (tail bucket or renormalised)."""

    def one_chunk(h: torch.Tensor, t_top: torch.Tensor, t_ids: torch.Tensor) -> torch.Tensor:
        student = head_logprobs(student_head, h, cfg.temperature).gather(-1, t_ids)
        if cfg.top_k_mode == "renorm":
            s, t = student - student.logsumexp(-1, keepdim=True), t_top - t_top.logsumexp(-1, keepdim=True)
        else:
            s = torch.cat([student, _tail_logmass(student)], -1)
            t = torch.cat([t_top, _tail_logmass(t_top)], -1)
        return divergence(s, t, cfg.kind, cfg.beta)

    parts = []
    for i in range(0, student_hidden.shape[0], cfg.chunk):
        args = (student_hidden[i:i + cfg.chunk], teacher_top[i:i + cfg.chunk], teacher_ids[i:i + cfg.chunk])
        if torch.is_grad_enabled() and args[0].requires_grad:
            parts.append(checkpoint(one_chunk, *args, use_reentrant=False))
        else:
            parts.append(one_chunk(*args))
    return torch.cat(parts) if parts else student_hidden.new_zeros(0, dtype=torch.float32)


def check_served_options(loss: DistillLossConfig, teacher_reconstruction: str | None = None,
                         reconstruction: str = "aligned") -> None:
    """What a served teacher can do: temperature 1, the teacher on the records as sampled, and (without top-k)
    only the reverse KL."""
    if loss.temperature != 1.0:
        raise ValueError(f"a served teacher gives log-probs at temperature 1: distill_temperature must be 1, "
                         f"got {loss.temperature}")
    if (teacher_reconstruction or reconstruction) != "aligned":
        raise ValueError("a served teacher scores each invocation as sampled (aligned): teacher_reconstruction "
                         f"{teacher_reconstruction or reconstruction!r} needs an in-process teacher")
    if loss.top_k is None and loss.kind != "reverse_kl":
        raise ValueError(f"a served teacher without top_k gives the sampled token's log-prob only: the loss is the "
                         f"sampled-token reverse KL; --loss {loss.kind} needs --top-k K")


class ServedTeacherHook:
    """The distillation term against a :class:`ServedTeacher` (and memory credit), as a
    :class:`agents.llm.training.ppo.LossHook` (see the module doc for the two losses)."""

    plot_keys = ("distill_loss",)

    def __init__(self, teacher: ServedTeacher, loss: DistillLossConfig, coef: float,
                 credit: CreditConfig | None = None, tokenizer=None) -> None:
        check_served_options(loss)
        if (loss.top_k or 0) != teacher.top_k:
            raise ValueError(f"the loss's top_k ({loss.top_k}) and the served teacher's ({teacher.top_k}) differ")
        self.teacher, self.loss, self.coef = teacher, loss, coef
        self.credit = credit or CreditConfig()
        self.tokenizer = tokenizer if tokenizer is not None else teacher.tokenizer
        self._scores: dict[int, tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]] = {}

    def on_update(self, episodes, records: Sequence[InvocationRecord], module) -> dict[str, float]:
        stats = apply_memory_credit(records, unwrap_ddp(module), self.tokenizer, self.credit)
        scores = self.teacher.score(records)
        counts = [sum(r.action_mask) for r in records]
        sampled = scores.sampled.split(counts)
        tops = scores.top_logp.split(counts) if scores.top_logp is not None else [None] * len(records)
        ids = scores.top_ids.split(counts) if scores.top_ids is not None else [None] * len(records)
        self._scores = {id(r): (s, v, i) for r, s, v, i in zip(records, sampled, tops, ids)}
        stats["teacher_s"] = scores.seconds
        return stats

    def __call__(self, records: Sequence[InvocationRecord], actor) -> tuple[torch.Tensor, dict[str, float]]:
        try:
            parts = [self._scores[id(r)] for r in records]
        except KeyError:
            raise RuntimeError("ServedTeacherHook was called on records it has not scored: on_update runs first") from None
        device = actor.logp.device
        if self.loss.top_k is None:
            teacher = torch.cat([p[0] for p in parts]).to(device)
            behaviour = torch.tensor([lp for r in records for lp, m in zip(r.response_logprobs, r.action_mask) if m],
                                     dtype=torch.float32, device=device)
            per_token, estimate = sampled_reverse_kl_term(actor.logp, teacher, behaviour)
        else:
            top = torch.cat([p[1] for p in parts]).to(device)
            top_ids = torch.cat([p[2] for p in parts]).to(device)
            per_token = estimate = top_k_served_loss(actor.head, actor.hidden, top, top_ids, self.loss)
        if not per_token.numel():
            return actor.logp.sum() * 0.0, {"distill_loss": 0.0}
        term = per_token.sum() / actor.token_denom if actor.token_denom is not None else per_token.mean()
        return self.coef * term, {"distill_loss": float(estimate.detach().mean())}


__all__ = ["PROBE", "ServedScores", "ServedTeacher", "ServedTeacherError", "ServedTokenizerMismatch",
           "ServedTeacherHook", "vocabulary_probe", "check_served_options", "sampled_reverse_kl_term",
           "top_k_served_loss", "is_served"]
