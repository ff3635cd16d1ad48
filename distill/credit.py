"""Memory credit: auxiliary advantages on the memory tokens of each write, from how well the memory predicts the
gold answer (MemPO, HiMPO). The trajectory advantage (PPO's GAE or GRPO's) still trains every generated token;
these add to ``token_advantages`` at the tokens inside ``<memory>…</memory>`` only.

A *probe* asks a model (the current student by default, no grad) for ``log p(y* | memory, context)``: the
context text with the memory slot filled by the memory's **sampled ids** (``record.memory_mask`` over
``response_ids``; never ``snapshot["memory_after"]``, which the env sanitises and may cut to its budget), followed
by ``answer_prefix`` (``"<answer>"``), scored on the ids of the gold answers ``y*`` (per objective its first
accepted answer, joined by ``"; "``, as the protocol's ``<answer>A1; A2</answer>``). Probes use the plain prompt
template (``observation + "\\n"``, a bos token first when the tokenizer has one); the context text is tokenised,
the memory ids are inserted as they were sampled.

- **MemPO** (``kind="mempo"``): ``s_t = p(y* | m_t)``, the geometric mean of the gold tokens' probabilities
  (``exp`` of their mean log-prob) under a prompt built from the memory alone: the task block of the
  invocation's observation then ``<memory>m_t</memory>``. Normalised within the group (``(s - mean) / (std +
  eps)``, population std, over the memory writes of one GRPO group, or of one episode without groups) and
  added as ``coef * A_mem`` to the write's memory tokens.
- **HiMPO** (``kind="himpo"``): the local utility of the write at step t,
  ``u_t = log p(y* | m_t, s_pre) - log p(y* | m_{t-1}, s_pre)`` (sums over the gold tokens), with the pre-write
  context ``s_pre`` held fixed: invocation t's own observation, its memory slot holding either the new memory
  ``m_t`` or the one it replaced, ``m_{t-1}`` (the sampled ids of the episode's previous accepted write; the
  env's initial memory text before any). The soft gate is our reading of *group-relative hindsight relevance*:
  the hindsight relevance of the write is ``log p(y* | m_t, s_pre)`` (how much the memory supports the answer,
  known once the gold is known), normalised within the group as for MemPO to ``z_t``, and
  ``g_t = sigmoid(z_t / gate_temperature)``. The write's memory tokens get ``coef * g_t * u_t``.

No credit on invalid actions (``snapshot["valid"] is False``): their write was discarded by the env, so they
are also skipped as ``m_{t-1}`` of later writes. Records without gold answers (``record.gold``) or without
memory tokens get none.

Credit also acts where the task reward is flat: in a GRPO group whose episodes all scored alike the trajectory
advantage is 0 and :func:`agents.llm.training.ppo.train_rl` drops that part of the policy gradient, but the memory
advantages added here still train the group's memory tokens (logged as ``flat_credited_tokens``): the memory
probe still tells a useful write from a useless one when every answer scored 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from agents.llm.training.ppo import group_advantages
from agents.llm.records.invocation import InvocationRecord
from agents.llm.training.common import ActorCritic, collate

CREDIT_KINDS = ("none", "mempo", "himpo")


@dataclass(frozen=True)
class CreditConfig:
    """Memory-credit options (see the module doc)."""

    kind: str = "none"
    coef: float = 1.0  # weight of the memory advantage
    gate_temperature: float = 1.0  # HiMPO: g = sigmoid(z / gate_temperature)
    answer_prefix: str = "<answer>"
    memory_open: str = "<memory>"
    memory_close: str = "</memory>"
    task_close: str = "</task>"
    eps: float = 1e-6
    batch_size: int = 16  # probes per forward

    def __post_init__(self) -> None:
        if self.kind not in CREDIT_KINDS:
            raise ValueError(f"memory credit must be one of {', '.join(CREDIT_KINDS)}; got {self.kind!r}")
        if self.gate_temperature <= 0:
            raise ValueError(f"gate_temperature must be > 0, got {self.gate_temperature}")


# ---------------------------------------------------------------------- probes
def memory_ids(record: InvocationRecord) -> list[int]:
    """The sampled ids inside ``<memory>…</memory>`` of ``record`` (``memory_mask`` over ``response_ids``)."""
    return [t for t, m in zip(record.response_ids, record.memory_mask) if m]


def gold_text(gold: Sequence[Any]) -> str:
    """The protocol's answer text for ``gold`` (per objective its accepted answers, or one string each)."""
    return "; ".join(str(g) if isinstance(g, str) else str(g[0]) for g in gold)


def wrote_memory(record: InvocationRecord, cfg: CreditConfig) -> bool:
    """The action opened a memory block (even an empty one) and the env accepted it."""
    valid = record.snapshot.get("valid", True) is not False
    action = str(record.snapshot.get("action", ""))
    return valid and (any(record.memory_mask) or cfg.memory_open in action)


def split_memory_slot(observation: str, cfg: CreditConfig) -> tuple[str, str]:
    """``(before, after)``: the observation around the content of its memory block (the newlines that frame the
    content stay outside it); an observation without one gets an empty block appended."""
    a = observation.find(cfg.memory_open)
    b = observation.find(cfg.memory_close, a + len(cfg.memory_open)) if a >= 0 else -1
    if a < 0 or b < 0:
        return observation + "\n" + cfg.memory_open + "\n", "\n" + cfg.memory_close
    a += len(cfg.memory_open)
    content = observation[a:b]
    if content.startswith("\n"):
        a += 1
        content = content[1:]
    if content.endswith("\n"):
        b -= 1
    return observation[:a], observation[b:]


def task_block(observation: str, cfg: CreditConfig) -> str:
    """The observation up to the end of its task block (empty when there is none)."""
    end = observation.find(cfg.task_close)
    return observation[:end + len(cfg.task_close)] if end >= 0 else ""


@dataclass
class Probe:
    """One ``log p(gold | memory, context)`` query: the prompt ids (memory ids inserted) and the gold ids."""

    prompt_ids: list[int]
    gold_ids: list[int]


def make_probe(before: str, memory: Sequence[int], after: str, gold: Sequence[Any], tokenizer,
               cfg: CreditConfig) -> Probe:
    enc = lambda text: list(tokenizer.encode(text, add_special_tokens=False))  # noqa: E731
    bos = [tokenizer.bos_token_id] if getattr(tokenizer, "bos_token_id", None) is not None else []
    prompt = bos + enc(before) + list(memory) + enc(after + "\n" + cfg.answer_prefix)
    return Probe(prompt, enc(gold_text(gold)))


@torch.no_grad()
def probe_logprobs(model, probes: Sequence[Probe], pad_id: int, batch_size: int = 16) -> list[float]:
    """``sum_t log p(gold_t | prompt, gold_<t)`` of each probe (no grad; ``model``: a causal LM or an
    :class:`agents.llm.training.common.ActorCritic`)."""
    actor = model if isinstance(model, ActorCritic) else ActorCritic(model)
    device = next(actor.parameters()).device
    was_training = actor.training
    actor.eval()
    out = []
    for i in range(0, len(probes), batch_size):
        part = probes[i:i + batch_size]
        b = collate([(p.prompt_ids, p.gold_ids) for p in part], pad_id, device=device)
        logp = actor(**b.inputs())[0]
        out += [float(x) for x in torch.zeros(len(part), device=logp.device).index_add_(0, b.seq_index, logp)]
    actor.train(was_training)
    return out


def _group_key(record: InvocationRecord) -> tuple:
    if record.group is not None:
        return ("group", record.rollout_id, record.group)
    return ("episode", record.rollout_id, record.episode_id)


# ---------------------------------------------------------------------- credits
def _episodes(records: Sequence[InvocationRecord]) -> dict[tuple, list[int]]:
    groups: dict[tuple, list[int]] = {}
    for i, r in enumerate(records):
        groups.setdefault((r.rollout_id, r.episode_id), []).append(i)
    for members in groups.values():
        members.sort(key=lambda i: records[i].turn)
    return groups


def memory_credits(records: Sequence[InvocationRecord], model, tokenizer, cfg: CreditConfig) -> list[float | None]:
    """The memory advantage of each record (``None``: no credit: invalid, no memory tokens or no gold)."""
    if cfg.kind == "none":
        return [None] * len(records)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    credited = [i for i, r in enumerate(records)
                if r.gold and wrote_memory(r, cfg) and any(m and a for m, a in zip(r.memory_mask, r.action_mask))]
    credits: list[float | None] = [None] * len(records)
    if not credited:
        return credits
    obs = {i: str(records[i].snapshot.get("observation", "")) for i in credited}
    if cfg.kind == "mempo":
        probes = []
        for i in credited:
            task = task_block(obs[i], cfg)
            before = (task + "\n" if task else "") + cfg.memory_open + "\n"
            probes.append(make_probe(before, memory_ids(records[i]), "\n" + cfg.memory_close, records[i].gold,
                                     tokenizer, cfg))
        lp = probe_logprobs(model, probes, pad, cfg.batch_size)
        score = [float(np.exp(v / max(1, len(p.gold_ids)))) for v, p in zip(lp, probes)]
        adv = group_advantages(score, [_group_key(records[i]) for i in credited], eps=cfg.eps)
        for i, a in zip(credited, adv):
            credits[i] = cfg.coef * a
        return credits
    # HiMPO: the memory each write replaced (the previous accepted write's sampled ids)
    previous: dict[int, list[int]] = {}
    for members in _episodes(records).values():
        first = records[members[0]]
        current = list(tokenizer.encode(str(first.snapshot.get("memory_before", "") or ""), add_special_tokens=False))
        for i in members:
            previous[i] = current
            if wrote_memory(records[i], cfg):
                current = memory_ids(records[i])
    probes = []
    for i in credited:
        before, after = split_memory_slot(obs[i], cfg)
        probes.append(make_probe(before, memory_ids(records[i]), after, records[i].gold, tokenizer, cfg))
        probes.append(make_probe(before, previous[i], after, records[i].gold, tokenizer, cfg))
    lp = probe_logprobs(model, probes, pad, cfg.batch_size)
    new, old = lp[0::2], lp[1::2]
    z = group_advantages(new, [_group_key(records[i]) for i in credited], eps=cfg.eps)
    for i, n, o, zi in zip(credited, new, old, z):
        gate = 1.0 / (1.0 + np.exp(-zi / cfg.gate_temperature))
        credits[i] = cfg.coef * float(gate) * (n - o)
    return credits


def apply_memory_credit(records: Sequence[InvocationRecord], model, tokenizer, cfg: CreditConfig) -> dict[str, float]:
    """Add each record's memory credit to its ``token_advantages`` at memory (action) tokens; returns metrics
    (``credit_mean``: mean credit over credited writes, ``credit_share``: share of records credited)."""
    credits = memory_credits(records, model, tokenizer, cfg)
    given = []
    for r, c in zip(records, credits):
        if c is None:
            continue
        if r.token_advantages is None:
            r.token_advantages = [0.0] * len(r.response_ids)
        r.token_advantages = [a + c if (m and act) else a
                              for a, m, act in zip(r.token_advantages, r.memory_mask, r.action_mask)]
        given.append(c)
    if cfg.kind == "none":
        return {}
    return {"credit_mean": float(np.mean(given)) if given else 0.0,
            "credit_share": len(given) / max(1, len(records))}


__all__ = ["CreditConfig", "CREDIT_KINDS", "memory_ids", "gold_text", "split_memory_slot", "task_block", "Probe",
           "make_probe", "probe_logprobs", "memory_credits", "apply_memory_credit"]
