"""Runtime RCE diagnostic: how far each reconstruction/packing moves the log-probs of the sampled tokens.

    from distill.diagnose import diagnose
    table = diagnose(records, model, tokenizer)     # a pandas DataFrame, one row per method
    print(table.to_string(index=False))

Rows (``methods``): ``aligned`` (each invocation as sampled, one per padded row: the reference),
``padding_free``, ``shared_prefix`` (aligned invocations packed), and ``persistent`` (the episode flattened into
one transcript, the misaligned control of MemOPD's paper; needs the tokenizer, scored in padded rows).

Columns: ``max_abs_dlogp`` / ``p99_abs_dlogp``: |recomputed - recorded| log-prob of the sampled tokens (the
records' ``response_logprobs``; run it with the model that sampled them, else policy drift adds in);
``top1_flips``: action positions whose argmax token differs from the aligned one; ``clip_share``: share of action
tokens whose ratio ``exp(recomputed - recorded)`` leaves ``[1 - clip, 1 + clip]`` (a PPO update would clip them
before any learning); ``action_tokens``: tokens scored; ``tokens``: real tokens run through the model;
``slots``: tokens run including padding; ``saved_vs_padded``: ``1 - slots / slots(aligned)``.

:func:`teacher_next_actions` shows where each reconstruction points the student: the teacher's greedy next action
under the aligned view and under the persistent transcript of the same invocations (:func:`teacher_views`).
"""

from __future__ import annotations

from typing import Sequence

import torch

from agents.llm.generation.policy import DEFAULT_STOP
from distill import DIAGNOSE_METHODS
from distill.scoring import score_records
from distill.views import information_gaps, teacher_views  # noqa: F401 - teacher_views: also this module's API

_PLAN = {  # method -> (reconstruction, packing)
    "aligned": ("aligned", "padded"),
    "padding_free": ("aligned", "padding_free"),
    "shared_prefix": ("aligned", "shared_prefix"),
    "persistent": ("persistent", "padded"),
}


def diagnose(records, model, tokenizer=None, clip: float = 0.2, methods: Sequence[str] = DIAGNOSE_METHODS, *,
             progress: bool = False, **pack_kw):
    """One row per method (see the module doc) as a :class:`pandas.DataFrame`. ``pack_kw`` go to
    :func:`distill.packing.pack` (``token_budget``, ``row_len``, ...). ``persistent`` needs ``tokenizer``."""
    import pandas as pd
    from tqdm.auto import tqdm

    unknown = [m for m in methods if m not in _PLAN]
    if unknown or not methods:
        raise ValueError(f"methods must be a non-empty subset of {DIAGNOSE_METHODS}, got {list(methods)!r}")
    if not 0 < clip < 1:
        raise ValueError(f"clip must be in (0, 1), got {clip}")
    if "persistent" in methods and tokenizer is None:
        raise ValueError("the persistent control tokenises environment text: pass the tokenizer")
    recorded = torch.cat([torch.tensor(r.response_logprobs, dtype=torch.float32) for r in records]) \
        if records else torch.zeros(0)
    # the aligned argmax is the reference for top-1 flips: computed first even when not asked for as a row
    order = ["aligned"] + [m for m in methods if m != "aligned"]
    results = {}
    for method in tqdm(order, desc="diagnose", disable=not progress, leave=False):
        reconstruction, packing = _PLAN[method]
        results[method] = score_records(model, records, packing, reconstruction=reconstruction,
                                        tokenizer=tokenizer, **pack_kw)
    reference = torch.cat(results["aligned"]["argmax"])
    padded_slots = results["aligned"]["slots"]
    rows = []
    for method in methods:
        scored = results[method]
        delta = torch.cat(scored["logprobs"]) - recorded
        ratio = delta.double().exp()
        absd = delta.abs().double()
        rows.append({
            "method": method,
            "reconstruction": _PLAN[method][0],
            "packing": _PLAN[method][1],
            "max_abs_dlogp": float(absd.max()) if absd.numel() else 0.0,
            "p99_abs_dlogp": float(torch.quantile(absd, 0.99)) if absd.numel() else 0.0,
            "top1_flips": int((torch.cat(scored["argmax"]) != reference).sum()),
            "clip_share": float(((ratio < 1 - clip) | (ratio > 1 + clip)).double().mean()) if absd.numel() else 0.0,
            "action_tokens": int(absd.numel()),
            "tokens": scored["tokens"],
            "slots": scored["slots"],
            "saved_vs_padded": 1.0 - scored["slots"] / padded_slots,
        })
    return pd.DataFrame(rows)


def action_kind(text: str, stop: Sequence[str] = DEFAULT_STOP) -> str:
    """The kind of action ``text`` is, as the policy would have sent it (cut after its first stop string, like
    :class:`agents.llm.generation.policy.LLMPolicy`): its tool (``"search"`` or ``"answer"``), or ``"invalid"`` where
    the protocol parser refuses it (no memory rewrite first, no tool call, stray text)."""
    from memenv.protocol import parse_action

    ends = [text.find(s) + len(s) for s in stop if s in text]
    parsed = parse_action(text[:min(ends)] if ends else text)
    return parsed.tool if parsed.valid else "invalid"


def teacher_next_actions(model, tokenizer, records, *, max_new_tokens: int = 96, min_turn: int = 1,
                         progress: bool = False):
    """Where each reconstruction points the student: the teacher's greedy next action under the aligned view and
    under the persistent view (:func:`teacher_views`) of every invocation from turn ``min_turn`` on (turn 0's
    views are the same prompt). A :class:`pandas.DataFrame`, one row per invocation and view: ``record``,
    ``turn``, ``view``, ``context_tokens``, ``kind`` (:func:`action_kind`), ``text``, ``student_kind``, the
    kind of the action the student sampled there (its record's response), and ``answerable``: every objective's
    gold answer is in that view's text (:func:`distill.views.information_gaps`), so answering there is possible:
    searching where it is not is right, and only the answerable states show whether a teacher answers when it can.
    A teacher trained on memory-state
    prompts that acts otherwise on the flattened transcript distils that other behaviour into the student under the
    persistent control; ``pd.crosstab(table.view, table.kind)`` shows it. Where the teacher acts otherwise than the
    student did in the student's own state (``pd.crosstab(table.student_kind, table.kind)`` of the aligned rows),
    that is the behaviour the distillation term pushes the student toward."""
    import pandas as pd
    from tqdm.auto import tqdm

    if min_turn < 0 or max_new_tokens < 1:
        raise ValueError(f"min_turn must be >= 0 and max_new_tokens >= 1, got {min_turn} and {max_new_tokens}")
    gaps = information_gaps(records, tokenizer).set_index("record")
    views = [v for v in teacher_views(records, tokenizer) if v["turn"] >= min_turn]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    rows = []
    with torch.no_grad():
        for v in tqdm(views, desc="teacher next actions", disable=not progress, leave=False):
            sampled = action_kind(tokenizer.decode(records[v["record"]].response_ids, skip_special_tokens=True))
            for view in ("aligned", "persistent"):
                ids = torch.tensor([v[view]])
                # stopped where the policy would stop (the kind reads only up to there; greedy, so the text up to
                # the stop is the same as without it)
                out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                                     do_sample=False, pad_token_id=pad, stop_strings=list(DEFAULT_STOP),
                                     tokenizer=tokenizer)
                text = tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
                rows.append({"record": v["record"], "turn": v["turn"], "view": view, "context_tokens": ids.shape[1],
                             "kind": action_kind(text), "text": text, "student_kind": sampled,
                             "answerable": bool(gaps.loc[v["record"], f"answerable_{view}"])})
    return pd.DataFrame(rows, columns=["record", "turn", "view", "context_tokens", "kind", "text", "student_kind",
                                       "answerable"])
