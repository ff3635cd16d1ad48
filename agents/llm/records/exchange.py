"""Invocation records as an exchange format: converters to the training rows of other RL stacks (docs/exchange.md).

One exported row per :class:`~agents.llm.records.invocation.InvocationRecord` (memenv rewrites the context at every
invocation, so every invocation is its own sequence, positions from 0, exactly as it was sampled). Rows are
ordered episode by episode (the episodes in their first appearance, each episode's invocations by turn), so the
steps of one trajectory are contiguous, as SkyRL's step-wise layout requires.

Targets (:data:`TARGETS`) and what each row is:

* ``trl``: TRL's ``AsyncGRPO`` ``RolloutSample`` (``trl.experimental.async_grpo``; the real class, trl being a
  dependency): ``input_ids``, ``completion_mask``, ``old_log_probs`` over the whole sequence, and the advantage;
* ``slime``: a dict with the fields of slime's ``Sample`` (``tokens``, ``response_length``, ``loss_mask``,
  ``rollout_log_probs``, ``teacher_log_probs``, ``reward``, ``group_index``, ``index``, ...);
* ``skyrl``: SkyRL's step-wise ``GeneratorOutput`` (one dict of columns for the whole batch: ``prompt_token_ids``,
  ``response_ids``, ``rewards``, ``loss_masks``, ``rollout_logprobs``, ``trajectory_ids``, ``is_last_step``);
* ``tinker``: Tinker's ``Datum`` (the real class when the ``tinker`` package is installed, else the same layout as
  a dict): ``model_input`` = the sequence without its last token, ``loss_fn_inputs`` = ``target_tokens`` (the
  sequence shifted by one), ``logprobs``, ``advantages`` and ``weights``, one entry per target token;
* ``verl``: :class:`InvocationOutput`, the fields of verl's ``AgentLoopOutput``;
* ``prime``: a dict with the fields of verifiers' ``TrajectoryStep`` (prime-rl's input), ``tokens`` =
  ``{prompt_ids, prompt_mask, completion_ids, completion_mask, completion_logprobs, ...}``.

Row weights (:data:`WEIGHTS`), a multiplier ``w`` on every action token of a row: ``token`` (``w = 1``: every
sampled token counts the same, a global token mean), ``row`` (``w = 1 / action tokens of the row``: every
invocation counts the same, whatever its length) and ``episode`` (``w = 1 / action tokens of the episode``: every
episode counts the same, however many invocations it has). Where a target's loss reads per-token weights (Tinker's
``weights``) they are applied there; elsewhere the weight is carried in the row's free-form slot (named in
docs/exchange.md) for a reducer that reads it. Advantages are exported as recorded (``token_advantages`` when the
record has them, else its ``advantage`` on every response token; none when the record has none).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from memenv.files import write_atomic
from agents.llm.records.invocation import InvocationRecord

TARGETS = ("trl", "slime", "skyrl", "tinker", "verl", "prime")
WEIGHTS = ("token", "row", "episode")


@dataclass
class TeacherScores:
    """A teacher's scores of one record's response tokens: the sampled tokens' log-probs (one per response token)
    and, optionally, its top-k per position (``top_ids[t]``, ``top_logprobs[t]``, k each)."""

    logprobs: list[float]
    top_ids: list[list[int]] | None = None
    top_logprobs: list[list[float]] | None = None


Teacher = Mapping[tuple[str, str, int], TeacherScores]  # by InvocationRecord.uid


@dataclass
class InvocationOutput:
    """One invocation as verl wants it (the fields of ``AgentLoopOutput``): the ``verl`` export's row and what the
    verl adapter's loop (:mod:`agents.llm.adapters.verl`) returns."""

    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_logprobs: list[float] | None
    reward_score: float = 0.0
    num_turns: int = 2  # one user message (the observation), one assistant message (the action)
    extra_fields: dict[str, Any] = field(default_factory=dict)


def episode_key(record: InvocationRecord) -> str:
    """The identifier of a record's episode across rollout calls (``rollout_id/episode_id``)."""
    return f"{record.rollout_id}/{record.episode_id}" if record.rollout_id else record.episode_id


def ordered(records: Iterable[InvocationRecord]) -> list[InvocationRecord]:
    """Episodes in order of first appearance, each one's invocations by turn (a duplicate uid is an error)."""
    first: dict[str, int] = {}
    seen: set[tuple[str, str, int]] = set()
    out = list(records)
    for r in out:
        if r.uid in seen:
            raise ValueError(f"{r.describe()} appears twice")
        seen.add(r.uid)
        first.setdefault(episode_key(r), len(first))
    return sorted(out, key=lambda r: (first[episode_key(r)], r.turn))


def row_weights(records: Sequence[InvocationRecord], policy: str = "token") -> list[float]:
    """The per-token weight of each record's action tokens under ``policy`` (see the module docstring)."""
    if policy not in WEIGHTS:
        raise ValueError(f"weight policy must be one of {', '.join(WEIGHTS)}, got {policy!r}")
    if policy == "token":
        return [1.0] * len(records)
    if policy == "row":
        return [1.0 / max(1, sum(r.action_mask)) for r in records]
    per_episode: dict[str, int] = {}
    for r in records:
        per_episode[episode_key(r)] = per_episode.get(episode_key(r), 0) + sum(r.action_mask)
    return [1.0 / max(1, per_episode[episode_key(r)]) for r in records]


def token_advantages(record: InvocationRecord) -> list[float] | None:
    """The record's advantages per response token (``token_advantages``, else ``advantage`` broadcast; None
    when it has neither)."""
    if record.token_advantages is not None:
        return [float(a) for a in record.token_advantages]
    if record.advantage is None:
        return None
    return [float(record.advantage)] * len(record.response_ids)


def check_tokenizer(records: Sequence[InvocationRecord], fingerprint: str | None = None) -> None:
    """One tokenizer made all ``records`` (their ``tokenizer_fingerprint``), and it is ``fingerprint`` when
    given; a ``ValueError`` naming the first record that differs otherwise (records without a fingerprint pass)."""
    known = [r for r in records if r.tokenizer_fingerprint]
    expected = fingerprint or (known[0].tokenizer_fingerprint if known else None)
    for r in known:
        if r.tokenizer_fingerprint != expected:
            whose = "the given tokenizer's" if fingerprint else f"the first record's ({expected})"
            raise ValueError(f"{r.describe()} was made by another tokenizer (fingerprint "
                             f"{r.tokenizer_fingerprint}, not {whose}{' ' + expected if fingerprint else ''})")


def _teacher_of(record: InvocationRecord, teacher: Teacher | None) -> TeacherScores | None:
    if teacher is None:
        return None
    scores = teacher.get(record.uid)
    if scores is None:
        raise ValueError(f"{record.describe()} has no teacher scores")
    if len(scores.logprobs) != len(record.response_ids):
        raise ValueError(f"{record.describe()}: {len(scores.logprobs)} teacher log-probs for "
                         f"{len(record.response_ids)} response tokens")
    return scores


def _teacher_fields(scores: TeacherScores | None, prefix: str = "teacher_") -> dict[str, Any]:
    if scores is None:
        return {}
    out: dict[str, Any] = {f"{prefix}logprobs": list(scores.logprobs)}
    if scores.top_ids is not None:
        out[f"{prefix}top_ids"] = [list(t) for t in scores.top_ids]
        out[f"{prefix}top_logprobs"] = [list(t) for t in scores.top_logprobs or []]
    return out


def _messages(record: InvocationRecord) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    snap = record.snapshot or {}
    return ([{"role": "user", "content": str(snap.get("observation") or "")}],
            [{"role": "assistant", "content": str(snap.get("action") or "")}])


def _memenv_fields(record: InvocationRecord, weight: float) -> dict[str, Any]:
    """What every target's free-form slot carries, so a row can be joined back to its record."""
    return {"rollout_id": record.rollout_id, "episode_id": record.episode_id, "turn": record.turn,
            "advantage": record.advantage, "token_advantages": token_advantages(record), "loss_weight": weight,
            "memory_mask": list(record.memory_mask), "episode_return": record.episode_return,
            "tokenizer_fingerprint": record.tokenizer_fingerprint}


# ------------------------------------------------------------------------------------------------- the targets
def _trl(records, weights, teachers) -> list[Any]:
    import numpy as np

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from trl.experimental.async_grpo.async_rollout_worker import RolloutSample

    rows = []
    for r, w, t in zip(records, weights, teachers):
        prompt, completion = _messages(r)
        pad = [0] * len(r.prompt_ids)
        adv = token_advantages(r)
        if adv is not None and len(set(adv)) > 1:
            raise ValueError(f"{r.describe()} has per-token advantages (PPO); TRL's AsyncGRPO rows carry one "
                             "advantage per row")
        adv = adv[0] if adv else (r.advantage if r.advantage is not None else 0.0)
        metrics = {"reward": float(r.reward), "episode_return": float(r.episode_return), "turn": float(r.turn),
                   "loss_weight": float(w),
                   "has_advantage": float(r.advantage is not None or r.token_advantages is not None)}
        rows.append(RolloutSample(
            prompt=prompt, completion=completion,
            input_ids=np.asarray(r.input_ids, dtype=np.int64),
            completion_mask=np.asarray(pad + list(r.action_mask), dtype=np.int64),
            old_log_probs=np.asarray([0.0] * len(pad) + list(r.response_logprobs), dtype=np.float32),
            advantage=float(adv), model_version=0, group_id=-1 if r.group is None else int(r.group),
            metrics=metrics))
    return rows


def _slime(records, weights, teachers) -> list[dict[str, Any]]:
    rows = []
    for i, (r, w, t) in enumerate(zip(records, weights, teachers)):
        prompt, completion = _messages(r)
        extra = _memenv_fields(r, w)
        if t is not None and t.top_ids is not None:
            extra.update(_teacher_fields(t))
        rows.append({
            "group_index": r.group, "index": i, "prompt": prompt[0]["content"], "tokens": r.input_ids,
            "response": completion[0]["content"], "response_length": len(r.response_ids), "label": None,
            "reward": float(r.reward), "loss_mask": list(r.action_mask),
            "rollout_log_probs": list(r.response_logprobs),
            "teacher_log_probs": None if t is None else list(t.logprobs),
            "status": "truncated" if r.finish_reason == "length" else "completed",
            "session_id": episode_key(r), "train_metadata": {"loss_weight": w}, "metadata": extra})
    return rows


def _skyrl(records, weights, teachers) -> list[dict[str, Any]]:
    last = {episode_key(r): r.turn for r in records}
    out = {"prompt_token_ids": [], "response_ids": [], "rewards": [], "loss_masks": [], "stop_reasons": [],
           "rollout_metrics": None, "rollout_logprobs": [], "trajectory_ids": [], "is_last_step": [],
           "advantages": [], "loss_weights": []}
    with_teacher = any(t is not None for t in teachers)
    if with_teacher:
        out["teacher_logprobs"] = []
    for r, w, t in zip(records, weights, teachers):
        out["prompt_token_ids"].append(list(r.prompt_ids))
        out["response_ids"].append(list(r.response_ids))
        out["rewards"].append(float(r.reward))
        out["loss_masks"].append(list(r.action_mask))
        out["stop_reasons"].append(r.finish_reason)
        out["rollout_logprobs"].append(list(r.response_logprobs))
        out["trajectory_ids"].append({"instance_id": episode_key(r), "repetition_id": 0})
        out["is_last_step"].append(r.turn == last[episode_key(r)])
        out["advantages"].append(token_advantages(r))
        out["loss_weights"].append(w)
        if with_teacher:
            out["teacher_logprobs"].append(list(t.logprobs))
    return [out]


def _tinker_inputs(r: InvocationRecord, w: float, t: TeacherScores | None) -> tuple[list[int], dict[str, list]]:
    """Tinker's shifted layout: inputs ``ids[:-1]``, one loss entry per target token ``ids[1:]``; the entries of
    the prompt's targets (all but the first response token's predecessor) are 0."""
    ids = r.input_ids
    pad = [0.0] * (len(r.prompt_ids) - 1)
    inputs = {"target_tokens": ids[1:], "logprobs": pad + list(r.response_logprobs),
              "weights": pad + [w * m for m in r.action_mask]}
    adv = token_advantages(r)
    if adv is not None:
        inputs["advantages"] = pad + adv
    if t is not None:
        inputs["teacher_logprobs"] = pad + list(t.logprobs)
    return ids[:-1], inputs


def _tinker(records, weights, teachers) -> list[Any]:
    for r in records:
        if not r.prompt_ids:
            raise ValueError(f"{r.describe()} has no prompt token (Tinker predicts every token from the one before)")
    if any(r.advantage is None and r.token_advantages is None for r in records) and \
            any(r.advantage is not None or r.token_advantages is not None for r in records):
        raise ValueError("some records have advantages and some do not: Tinker rows of one batch share their keys")
    try:
        import numpy as np
        from tinker import types
    except ImportError:
        return [{"model_input": inputs, "loss_fn_inputs": loss}
                for inputs, loss in (_tinker_inputs(r, w, t) for r, w, t in zip(records, weights, teachers))]
    rows = []
    for r, w, t in zip(records, weights, teachers):
        inputs, loss = _tinker_inputs(r, w, t)
        arrays = {k: np.asarray(v, dtype=np.int64 if k == "target_tokens" else np.float32) for k, v in loss.items()}
        rows.append(types.Datum(model_input=types.ModelInput.from_ints(inputs), loss_fn_inputs=arrays))
    return rows


def _verl(records, weights, teachers) -> list[Any]:
    return [InvocationOutput(prompt_ids=list(r.prompt_ids), response_ids=list(r.response_ids),
                             response_mask=list(r.action_mask), response_logprobs=list(r.response_logprobs),
                             reward_score=float(r.episode_return), num_turns=2,
                             extra_fields={**_memenv_fields(r, w), **_teacher_fields(t)})
            for r, w, t in zip(records, weights, teachers)]


def _prime(records, weights, teachers) -> list[dict[str, Any]]:
    rows = []
    for r, w, t in zip(records, weights, teachers):
        prompt, completion = _messages(r)
        truncated = r.finish_reason == "length"
        rows.append({
            "prompt": prompt, "completion": completion, "response": None,
            "tokens": {"prompt_ids": list(r.prompt_ids), "prompt_mask": [0] * len(r.prompt_ids),
                       "completion_ids": list(r.response_ids), "completion_mask": list(r.action_mask),
                       "completion_logprobs": list(r.response_logprobs), "overlong_prompt": False,
                       "is_truncated": truncated, "routed_experts": None},
            "reward": float(r.reward), "advantage": r.advantage, "is_truncated": truncated,
            "trajectory_id": episode_key(r), "extras": {**_memenv_fields(r, w), **_teacher_fields(t)}})
    return rows


_CONVERTERS = {"trl": _trl, "slime": _slime, "skyrl": _skyrl, "tinker": _tinker, "verl": _verl, "prime": _prime}


def export_records(records: Iterable[InvocationRecord], target: str, *, weight: str = "token",
                   teacher: Teacher | None = None) -> list[Any]:
    """``records`` as ``target``'s rows (see the module docstring), in episode order (:func:`ordered`).

    ``weight`` is the row-weight policy (:data:`WEIGHTS`); ``teacher`` maps each record's ``uid`` to its
    :class:`TeacherScores` (sampled-token log-probs, and top-k where the target takes it). SkyRL's rows are one
    ``GeneratorOutput`` (a list of one dict). Raises ``ValueError`` for an unknown target or weight policy, records
    of more than one tokenizer, or teacher scores that do not fit."""
    if target not in _CONVERTERS:
        raise ValueError(f"unknown target {target!r}; targets: {', '.join(TARGETS)}")
    records = ordered(records)
    if not records:
        raise ValueError("no records to export")
    check_tokenizer(records)
    weights = row_weights(records, weight)
    teachers = [_teacher_of(r, teacher) for r in records]
    return _CONVERTERS[target](records, weights, teachers)


def teacher_scores(model, records: Sequence[InvocationRecord], *, top_k: int = 0, tokenizer=None) -> dict:
    """A teacher ``model``'s :class:`TeacherScores` of each record (by ``uid``): each invocation scored alone, as
    it was sampled (its own prompt, positions from 0), at temperature 1; ``top_k`` > 0 adds the k most likely
    ids per response position. With ``tokenizer`` the records must have been made by it (their fingerprint)."""
    import torch

    from agents.llm.records.invocation import tokenizer_fingerprint

    if tokenizer is not None:
        check_tokenizer(records, tokenizer_fingerprint(tokenizer))
    device = next(model.parameters()).device
    vocab = model.get_input_embeddings().weight.shape[0]
    for r in records:  # an id beyond the teacher's embedding would be an IndexError deep inside the model
        top = max(r.input_ids, default=0)
        if top >= vocab:
            raise ValueError(f"{r.describe()}: token id {top} is outside the teacher's vocabulary ({vocab} ids)")
    was_training = model.training
    model.eval()
    out = {}
    try:
        with torch.no_grad():
            for r in records:
                ids = torch.tensor([r.input_ids], dtype=torch.long, device=device)
                logits = model(input_ids=ids, use_cache=False).logits[0].float()
                start = len(r.prompt_ids)
                logp = torch.log_softmax(logits[start - 1:start - 1 + len(r.response_ids)], dim=-1)
                target = ids[0, start:start + len(r.response_ids)]
                scores = TeacherScores(logp.gather(-1, target[:, None])[:, 0].tolist())
                if top_k > 0:
                    top = logp.topk(min(top_k, logp.shape[-1]), dim=-1)
                    scores.top_ids, scores.top_logprobs = top.indices.tolist(), top.values.tolist()
                out[r.uid] = scores
    finally:
        model.train(was_training)
    return out


# ------------------------------------------------------------------------------------------------- JSON
def row_to_json(row: Any) -> dict[str, Any]:
    """A row of any target as plain JSON data (arrays as lists; Tinker's ``Datum`` as its tokens and lists)."""
    if type(row).__name__ == "Datum" and hasattr(row, "model_input"):
        return {"model_input": row.model_input.to_ints(),
                "loss_fn_inputs": {k: v.tolist() for k, v in row.loss_fn_inputs.items()}}
    if is_dataclass(row):
        data = {f.name: getattr(row, f.name) for f in fields(row)}
    else:
        data = dict(row)
    return {k: (v.tolist() if hasattr(v, "tolist") else v) for k, v in data.items()}


def write_export(path: str | os.PathLike, rows: Sequence[Any]) -> None:
    """JSON lines, one row a line (SkyRL's one ``GeneratorOutput`` is one line), written atomically."""
    def write(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as fh:
            for row in rows:
                fh.write(json.dumps(row_to_json(row), allow_nan=False) + "\n")

    write_atomic(Path(path), write)


def read_export(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The rows :func:`write_export` wrote, as JSON data."""
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


# ------------------------------------------------------------------------------------------------- back again
@dataclass
class ExportedInvocation:
    """What every target's row keeps of its invocation: the ids, the action mask over the response, the
    behaviour log-probs, the advantages and the weight (per action token)."""

    prompt_ids: list[int]
    response_ids: list[int]
    action_mask: list[int]
    response_logprobs: list[float]
    token_advantages: list[float] | None
    weight: float


def _row_data(row: Any) -> dict[str, Any]:
    return row if isinstance(row, dict) else row_to_json(row)


def import_rows(target: str, rows: Sequence[Any]) -> list[ExportedInvocation]:
    """``target``'s rows (objects or their JSON) back to :class:`ExportedInvocation` (the round trip)."""
    out = []
    if target == "skyrl":
        for batch in map(_row_data, rows):
            for i, prompt in enumerate(batch["prompt_token_ids"]):
                out.append(ExportedInvocation(list(prompt), list(batch["response_ids"][i]),
                                              list(batch["loss_masks"][i]), list(batch["rollout_logprobs"][i]),
                                              batch["advantages"][i], batch["loss_weights"][i]))
        return out
    for row in map(_row_data, rows):
        if target == "trl":
            mask = [int(m) for m in row["completion_mask"]]
            start = _prompt_length(row, mask)
            ids = [int(t) for t in row["input_ids"]]
            adv = row["advantage"] if row["metrics"]["has_advantage"] else None
            out.append(ExportedInvocation(ids[:start], ids[start:], mask[start:],
                                          [float(v) for v in row["old_log_probs"][start:]],
                                          None if adv is None else [float(adv)] * (len(ids) - start),
                                          row["metrics"]["loss_weight"]))
        elif target == "slime":
            n = row["response_length"]
            tokens = row["tokens"]
            out.append(ExportedInvocation(tokens[:len(tokens) - n], tokens[len(tokens) - n:], row["loss_mask"],
                                          row["rollout_log_probs"], row["metadata"]["token_advantages"],
                                          row["train_metadata"]["loss_weight"]))
        elif target == "tinker":
            inputs, loss = row["model_input"], row["loss_fn_inputs"]
            ids = list(inputs) + [loss["target_tokens"][-1]]
            start = _prompt_length(row, None)
            weights = loss["weights"][start - 1:]
            w = max(weights) if weights else 1.0
            adv = loss.get("advantages")
            out.append(ExportedInvocation(ids[:start], ids[start:], [int(x > 0) for x in weights],
                                          [float(v) for v in loss["logprobs"][start - 1:]],
                                          None if adv is None else [float(v) for v in adv[start - 1:]], w))
        elif target == "verl":
            extra = row["extra_fields"]
            out.append(ExportedInvocation(row["prompt_ids"], row["response_ids"], row["response_mask"],
                                          row["response_logprobs"], extra["token_advantages"], extra["loss_weight"]))
        elif target == "prime":
            tokens, extra = row["tokens"], row["extras"]
            out.append(ExportedInvocation(tokens["prompt_ids"], tokens["completion_ids"], tokens["completion_mask"],
                                          tokens["completion_logprobs"], extra["token_advantages"],
                                          extra["loss_weight"]))
        else:
            raise ValueError(f"unknown target {target!r}; targets: {', '.join(TARGETS)}")
    return out


def _prompt_length(row: dict[str, Any], mask: list[int] | None) -> int:
    """Where the response starts in a row that has no prompt length field of its own: TRL's and Tinker's rows
    mark it only by the mask, so a response whose first tokens are unmasked would be ambiguous. The exporters
    put no unmasked token first (LLMPolicy samples every response token), so the first masked position is the
    start; rows of other writers are read the same way."""
    if mask is None:  # Tinker: positions are target positions, shifted by one
        weights = row["loss_fn_inputs"]["weights"]
        first = next((i for i, w in enumerate(weights) if w > 0), len(weights))
        return first + 1
    return next((i for i, m in enumerate(mask) if m), len(mask))


def assert_finite(rows: Sequence[Any]) -> None:
    """Every number of the exported rows is finite (JSON has no NaN; a trainer would fail on one later)."""
    def walk(value: Any) -> None:
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError("an exported row holds a non-finite number (a record's log-prob or advantage)")
        if isinstance(value, dict):
            for v in value.values():
                walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)

    for row in rows:
        walk(row_to_json(row))


__all__ = ["TARGETS", "WEIGHTS", "ExportedInvocation", "TeacherScores", "assert_finite", "check_tokenizer",
           "episode_key", "export_records", "import_rows", "ordered", "read_export", "row_to_json", "row_weights",
           "token_advantages", "teacher_scores", "write_export"]
