"""Whether the teacher's two views differ enough for MemOPD's matched control to test anything: measured on a batch
of the student's own rollouts before any arm runs (issue 61).

MemOPD scores each sampled action with the teacher in the state the student sampled it in (the *aligned* view: the
memory-state prompt); its matched control scores the same action after the flattened transcript of the episode
(the *persistent* view, :func:`distill.reconstruct.persistent`). Where the two views give the teacher the same
distribution, the two arms are the same algorithm and no number of seeds can tell them apart.
:func:`view_divergence` measures how far apart they are, in the units that matter for training:

- per action token, ``KL(teacher | aligned || teacher | persistent)`` and whether the teacher's argmax differs,
  overall and per turn (turn 0's two views are one prompt);
- the **cosine between the two distillation gradients** (the student's gradient of the mean per-token
  distillation loss against the teacher under each view, on the same records and the same student forward),
  beside the **same-view noise reference**: the cosine between one view's gradients on two independent batches.
  A between-view cosine near 1 while the same-view one is lower means the views' difference is smaller than the
  batch-to-batch noise of one view: the arms' updates differ by less than two rollouts of one arm do;
- the share of invocations with an **information gap** (:func:`information_gaps`): the flattened transcript holds
  a gold answer that the memory state does not (the memory dropped a fact the transcript still holds: the
  paper's mechanism, a teacher scoring with information the student no longer has), and the views' disagreement
  on those invocations against the others;
- per episode, whether the memory lost a fact the transcript holds (:func:`lost_facts`, from the env's own
  snapshots, so for episodes played in either view): what a teacher's F1 is split by, in each view
  (``benchmarks/teacher_lost_facts.py``).

    from distill.views import view_divergence
    result = view_divergence(teacher, student, tokenizer, batch_a, batch_b)   # two independent rollout batches
    result.summary["between_view_cosine"], result.summary["same_view_cosine"], result.per_turn

``python benchmarks/view_divergence.py`` runs it over a table of env settings (the regime search).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch

from agents.llm.records.invocation import InvocationRecord
from distill.losses import DistillLossConfig, chunked_distill_loss, head_logprobs
from distill.teacher import ScoringLayout, Teacher, records_action_hidden

VIEWS = ("aligned", "persistent")


def _holds(text: str, answers: Sequence[str]) -> bool:
    """Whether ``text`` (lower-cased) contains one of an objective's accepted ``answers`` (case-insensitive)."""
    return any(a and a.strip().lower() in text for a in answers)


def teacher_views(records, tokenizer) -> list[dict]:
    """What the teacher is shown before each sampled action, under each reconstruction: one dict per invocation,
    in episode and turn order, with ``record`` (its index in ``records``), ``turn`` (0-based, in its episode),
    ``aligned`` (the prompt ids the student sampled under: its memory state) and ``persistent`` (the flattened
    transcript's ids up to that action, :func:`distill.reconstruct.persistent`). At turn 0 both are the first
    prompt; they part from turn 1 on."""
    from distill.reconstruct import persistent

    return [{"record": seg.record, "turn": turn, "aligned": list(records[seg.record].prompt_ids),
             "persistent": list(seq.input_ids[:seg.start])}
            for seq in persistent(records, tokenizer) for turn, seg in enumerate(seq.segments)]


def information_gaps(records: Sequence[InvocationRecord], tokenizer):
    """One row per invocation (a :class:`pandas.DataFrame`, in :func:`teacher_views` order):
    ``record``, ``episode``, ``turn`` (0-based in its episode), ``objectives``, ``held_aligned`` and
    ``held_persistent`` (how many objectives have an accepted gold answer in the text of that view: the memory-state
    prompt, or the flattened transcript up to the action), ``info_gap`` (some objective's answer is in the
    transcript but not in the memory state: the memory lost a fact the transcript keeps) and ``answerable_aligned``
    / ``answerable_persistent`` (every objective's answer is in that view: answering from it is possible).
    Records without gold answers (``gold`` None) count no objective and no gap."""
    import pandas as pd

    rows = []
    for v in teacher_views(records, tokenizer):
        r = records[v["record"]]
        gold = r.gold or []
        text = {view: tokenizer.decode(v[view], skip_special_tokens=True).lower() for view in VIEWS}
        held = {view: [_holds(text[view], answers) for answers in gold] for view in VIEWS}
        rows.append({"record": v["record"], "episode": r.episode_id, "turn": v["turn"], "objectives": len(gold),
                     "held_aligned": sum(held["aligned"]), "held_persistent": sum(held["persistent"]),
                     "info_gap": any(p and not a for a, p in zip(held["aligned"], held["persistent"])),
                     "answerable_aligned": bool(gold) and all(held["aligned"]),
                     "answerable_persistent": bool(gold) and all(held["persistent"])})
    return pd.DataFrame(rows, columns=["record", "episode", "turn", "objectives", "held_aligned", "held_persistent",
                                       "info_gap", "answerable_aligned", "answerable_persistent"])


def lost_facts(records: Sequence[InvocationRecord]):
    """Whether each episode's memory lost a fact its transcript holds, from the env's own snapshots (so the same
    for an episode played in either view: the env keeps the memory in both). One row per episode (a
    :class:`pandas.DataFrame`, in order of first appearance): ``episode``, ``invocations``, ``lost_turns`` (the
    invocations whose memory-state observation, ``snapshot["observation"]``: the task, the memory and the last tool
    output, lacks a gold answer that an earlier tool output showed) and ``lost`` (``lost_turns > 0``). Records
    without gold answers or snapshots count none (without an observation, the memory alone is read)."""
    import pandas as pd

    rows: dict[str, dict] = {}
    seen_text: dict[str, str] = {}
    for r in sorted(records, key=lambda r: (r.episode_id, r.turn)):
        row = rows.setdefault(r.episode_id, {"episode": r.episode_id, "invocations": 0, "lost_turns": 0})
        row["invocations"] += 1
        earlier = seen_text.get(r.episode_id, "")
        shown = str(r.snapshot.get("observation") or r.snapshot.get("memory_before") or "").lower()
        if any(_holds(earlier, answers) and not _holds(shown, answers) for answers in (r.gold or [])):
            row["lost_turns"] += 1
        seen_text[r.episode_id] = earlier + "\n" + str(r.snapshot.get("tool_output") or "").lower()
    order = list(dict.fromkeys(r.episode_id for r in records))
    frame = pd.DataFrame([rows[e] for e in order], columns=["episode", "invocations", "lost_turns"])
    return frame.assign(lost=frame.lost_turns > 0)


@torch.no_grad()
def token_disagreement(teacher: Teacher, records: Sequence[InvocationRecord], tokenizer,
                       layouts: dict[str, ScoringLayout]):
    """Per action token of ``records`` (record order, then token order): ``record``, ``memory_token`` (inside the
    action's memory block, from the record's ``memory_mask``; else the tool call), ``kl`` =
    ``KL(p_aligned || p_persistent)`` of the teacher's distributions (its temperature) and ``argmax_differs``.
    Also returns the teacher's ``[N, d]`` hidden states per view (for the gradients)."""
    import pandas as pd

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    hidden = {view: teacher.action_hidden(records, layouts[view], pad) for view in VIEWS}
    kl, differs = [], []
    for i in range(0, hidden["aligned"].shape[0], teacher.chunk):
        lp = {view: head_logprobs(teacher.head, hidden[view][i:i + teacher.chunk], teacher.temperature)
              for view in VIEWS}
        p = lp["aligned"].exp()
        kl.append(torch.where(p > 0, p * (lp["aligned"] - lp["persistent"]), torch.zeros_like(p)).sum(-1))
        differs.append(lp["aligned"].argmax(-1) != lp["persistent"].argmax(-1))
    owner = [i for i, r in enumerate(records) for m in r.action_mask if m]
    # inside the action's <memory> block (the rewrite) or not (the tool call: search or answer, and its argument)
    in_memory = [bool(r.memory_mask[j]) if j < len(r.memory_mask) else False
                 for r in records for j, m in enumerate(r.action_mask) if m]
    frame = pd.DataFrame({"record": owner, "memory_token": in_memory,
                          "kl": torch.cat(kl).clamp_min(0).tolist() if kl else [],
                          "argmax_differs": torch.cat(differs).tolist() if differs else []})
    return frame, hidden


def distill_gradients(student, teacher: Teacher, records: Sequence[InvocationRecord], tokenizer,
                      teacher_hidden: dict[str, torch.Tensor], loss: DistillLossConfig,
                      layout: ScoringLayout, token_mask: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """The student's gradient (every trainable parameter, flattened into one fp32 vector) of the mean per-action-
    token distillation loss against the teacher under each view, from one student forward on ``layout`` (the
    actor's: the student's side is the same in both arms, only the teacher's view differs). ``token_mask`` (a bool
    per action token): the mean over those tokens only (e.g. the invocations with an information gap). The student
    is scored in eval mode (no dropout) and left as it was."""
    params = [p for p in student.parameters() if p.requires_grad]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    was_training = student.training
    student.eval()
    try:
        with torch.enable_grad():
            hidden, _ = records_action_hidden(student, records, layout, tokenizer, pad)
            vocab = teacher.vocab_size
            head = student.get_output_embeddings()
            out = {}
            for k, view in enumerate(VIEWS):
                per_token = chunked_distill_loss(lambda h: head(h)[..., :vocab], hidden, teacher.head,
                                                 teacher_hidden[view].to(hidden.device), loss)
                term = per_token.mean() if token_mask is None else per_token[token_mask.to(per_token.device)].mean()
                grads = torch.autograd.grad(term, params, retain_graph=k + 1 < len(VIEWS), allow_unused=True)
                out[view] = torch.cat([(g if g is not None else torch.zeros_like(p)).detach().float().flatten()
                                       for g, p in zip(grads, params)])
    finally:
        student.train(was_training)
    return out


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    """The cosine of two gradient vectors (nan where either is 0), in float64."""
    a, b = a.double(), b.double()
    na, nb = float(a.norm()), float(b.norm())
    return float(a @ b) / (na * nb) if na > 0 and nb > 0 else math.nan


@dataclass
class ViewDivergence:
    """:func:`view_divergence`'s result: ``summary`` (one dict of figures), ``per_turn`` (a DataFrame, one row per
    0-based turn), ``tokens`` (one row per action token of both batches) and ``invocations`` (one row per
    invocation, :func:`information_gaps` with each invocation's mean KL and argmax share)."""

    summary: dict
    per_turn: object
    tokens: object
    invocations: object


def expected_cosine(grads: Sequence[dict[str, torch.Tensor]]) -> tuple[float, float]:
    """The cosine of the two views' *expected* distillation gradients from ``grads`` (per independent batch, each
    view's gradient), and its jackknife standard error over batches (nan under 3 batches). One batch gives both views
    the same sampled tokens, so a single-batch cosine mixes the views' difference with noise they share; products
    of gradients from *different* batches are unbiased for the products of the expectations:
    ``mean_{i != j} g_aligned^i . g_persistent^j / sqrt(mean_{i < j} g_aligned^i . g_aligned^j * (the same for
    persistent))``. nan where a view's batches point apart on average (no expected direction to compare); a noisy
    ratio that may pass 1. Holds every batch's two gradients (fp32, 2 x parameters each) until the products are
    taken."""
    import numpy as np

    k = len(grads)
    if k < 2:
        raise ValueError(f"expected_cosine needs at least two batches, got {k}")
    def products(left: str, right: str) -> np.ndarray:  # one pair at a time: no stacked float64 copy of every gradient
        return np.array([[float(a[left].double() @ b[right].double()) for b in grads] for a in grads])

    cross = products("aligned", "persistent")
    gram = {view: products(view, view) for view in VIEWS}

    def estimate(keep: np.ndarray) -> float:
        off = ~np.eye(len(keep), dtype=bool)
        across = cross[np.ix_(keep, keep)][off].mean()
        within = [gram[view][np.ix_(keep, keep)][off].mean() for view in VIEWS]
        return float(across / math.sqrt(within[0] * within[1])) if min(within) > 0 else math.nan

    whole = estimate(np.arange(k))
    if k < 3:
        return whole, math.nan
    leave_out = np.array([estimate(np.delete(np.arange(k), i)) for i in range(k)])
    return whole, float(math.sqrt((k - 1) / k * ((leave_out - leave_out.mean()) ** 2).sum()))


def _share(x) -> float:
    return float(x.mean()) if len(x) else math.nan


def view_divergence(teacher: Teacher, student, tokenizer, records: Sequence[InvocationRecord],
                    reference: Sequence[InvocationRecord], *, loss: DistillLossConfig | None = None,
                    packing: str = "shared_prefix", token_budget: int = 4096,
                    backend: str = "auto", more: Sequence[Sequence[InvocationRecord]] = ()) -> ViewDivergence:
    """How differently the teacher's two views score the student's sampled actions (see the module doc), on
    ``records`` and ``reference``: two independent batches of the student's rollouts (other task seeds, or other
    sampling seeds), each scored in both views; ``more``: further independent batches (the expected-gradient cosine
    and the per-token, per-invocation figures use every batch; the single-batch cosines the first two).

    ``summary``: ``between_view_cosine`` (the cosine of the aligned and the persistent distillation gradients on the
    same batch, mean over the two batches), ``same_view_cosine`` (one view's gradients on the two batches, mean over
    the two views: the noise reference), ``grad_norm_ratio`` (``|g_aligned - g_persistent| / |g_aligned|``, mean
    over the batches), ``expected_between_view_cosine`` (the cosine of the two views' expected gradients, estimated
    from products across the two batches, so the sampling noise one batch gives both views cancels: 1 where the views
    pull the same way on average; nan where a view's two batches point apart; a noisy estimate that may pass 1),
    ``expected_between_view_cosine_se`` (its jackknife standard error over batches: ``more`` batches give one),
    ``between_view_cosine_tool`` (the single-batch cosine on the tool call's tokens only, outside the memory block:
    where searching or answering is decided), ``memory_token_share`` (action tokens inside the memory block),
    ``kl_memory_tokens`` / ``kl_tool_tokens`` (the per-token KL inside and outside it), ``view_difference_cosine`` (the cosine of batch 1's ``g_aligned - g_persistent`` and batch
    2's: near 1 where the views' difference is systematic, near 0 where it is noise), ``difference_to_noise`` (the
    difference's norm over the norm of one view's gradient difference between the two batches, means over
    batches and views), ``between_view_cosine_gap`` (the same cosine on the information-gap invocations' tokens
    only: where the paper's mechanism lives), the per-token ``kl_mean`` / ``kl_median`` / ``argmax_differs``, ``info_gap_share`` (share of
    invocations with an information gap), ``kl_info_gap`` / ``kl_no_gap`` and ``argmax_info_gap`` /
    ``argmax_no_gap`` (per action token, on invocations with and without one; nan where there are none),
    ``turns_per_episode``, ``invocations``, ``action_tokens`` and ``episodes``. Identical views give cosine 1, KL 0
    and no argmax difference."""
    import numpy as np
    import pandas as pd

    if not records or not reference or not all(more):
        raise ValueError("view_divergence needs two non-empty batches of records (records and reference)"
                         + (", and every batch in more non-empty" if more else ""))
    loss = loss or DistillLossConfig()
    layouts = {view: ScoringLayout(view, packing, token_budget, backend) for view in VIEWS}
    grads, gap_grads, tool_grads, tokens, invocations = [], [], [], [], []
    batches = (records, reference, *more)
    for batch, recs in enumerate(batches):
        frame, hidden = token_disagreement(teacher, recs, tokenizer, layouts)
        grads.append(distill_gradients(student, teacher, recs, tokenizer, hidden, loss, layouts["aligned"]))
        on_tool = torch.tensor(~frame.memory_token.to_numpy(dtype=bool))
        if bool(on_tool.any()) and batch < 2:  # the tool call's tokens only: where searching or answering is decided
            tool_grads.append(distill_gradients(student, teacher, recs, tokenizer, hidden, loss, layouts["aligned"],
                                                token_mask=on_tool))
        gaps = information_gaps(recs, tokenizer)
        on_gap = torch.tensor(frame.record.map(gaps.set_index("record").info_gap).astype(bool).to_numpy())
        if bool(on_gap.any()):  # the same, on the invocations where the transcript holds what the memory lost
            gap_grads.append(distill_gradients(student, teacher, recs, tokenizer, hidden, loss, layouts["aligned"],
                                               token_mask=on_gap))
        per_record = frame.groupby("record").agg(kl=("kl", "mean"), argmax_differs=("argmax_differs", "mean"),
                                                 action_tokens=("kl", "size"))
        gaps = gaps.join(per_record, on="record")
        frame = frame.merge(gaps[["record", "turn", "info_gap"]], on="record", how="left")
        tokens.append(frame.assign(batch=batch))
        invocations.append(gaps.assign(batch=batch))
    tokens = pd.concat(tokens, ignore_index=True)
    invocations = pd.concat(invocations, ignore_index=True)
    expected, expected_se = expected_cosine(grads)
    grads = grads[:2]  # the single-batch figures below: the first two batches, as without ``more``
    between = [cosine(g["aligned"], g["persistent"]) for g in grads]
    same = [cosine(grads[0][view], grads[1][view]) for view in VIEWS]
    norm_ratio = [float((g["aligned"] - g["persistent"]).norm() / g["aligned"].norm())
                  if float(g["aligned"].norm()) > 0 else math.nan for g in grads]
    # Is the views' difference systematic? The two batches' differences point the same way (cosine near 1) where
    # the views part on what the task shows them, and at random (near 0) where it is the batch's noise; and its size
    # against the noise between the two batches of one view (an update's signal from the views vs its sampling noise).
    differences = [g["aligned"] - g["persistent"] for g in grads]
    noise = [float((grads[0][view] - grads[1][view]).norm()) for view in VIEWS]
    gap_tokens, other_tokens = tokens[tokens.info_gap.astype(bool)], tokens[~tokens.info_gap.astype(bool)]
    episodes = invocations.groupby(["batch", "episode"]).size()
    summary = {
        "between_view_cosine": float(np.mean(between)), "between_view_cosine_batches": between,
        "same_view_cosine": float(np.mean(same)), "same_view_cosine_views": dict(zip(VIEWS, same)),
        "grad_norm_ratio": float(np.mean(norm_ratio)),
        "expected_between_view_cosine": expected, "expected_between_view_cosine_se": expected_se,
        "batches": len(batches),
        "view_difference_cosine": cosine(*differences),
        "difference_to_noise": float(np.mean([float(d.norm()) for d in differences]) / np.mean(noise))
        if np.mean(noise) > 0 else math.nan,
        # on the information-gap invocations' tokens only (nan where a batch has none)
        "between_view_cosine_gap": float(np.mean([cosine(g["aligned"], g["persistent"]) for g in gap_grads]))
        if gap_grads else math.nan,
        "between_view_cosine_tool": float(np.mean([cosine(g["aligned"], g["persistent"]) for g in tool_grads]))
        if tool_grads else math.nan,
        "memory_token_share": _share(tokens.memory_token.astype(float)),
        "kl_memory_tokens": _share(tokens.kl[tokens.memory_token.astype(bool)]),
        "kl_tool_tokens": _share(tokens.kl[~tokens.memory_token.astype(bool)]),
        "kl_mean": _share(tokens.kl), "kl_median": float(tokens.kl.median()) if len(tokens) else math.nan,
        "argmax_differs": _share(tokens.argmax_differs.astype(float)),
        "info_gap_share": _share(invocations.info_gap.astype(float)),
        "kl_info_gap": _share(gap_tokens.kl), "kl_no_gap": _share(other_tokens.kl),
        "argmax_info_gap": _share(gap_tokens.argmax_differs.astype(float)),
        "argmax_no_gap": _share(other_tokens.argmax_differs.astype(float)),
        "turns_per_episode": float(episodes.mean()) if len(episodes) else math.nan,
        "episodes": int(len(episodes)), "invocations": int(len(invocations)), "action_tokens": int(len(tokens)),
    }
    per_turn = (tokens.groupby("turn").agg(action_tokens=("kl", "size"), kl_mean=("kl", "mean"),
                                           kl_median=("kl", "median"),
                                           argmax_differs=("argmax_differs", "mean"))
                .join(invocations.groupby("turn").agg(invocations=("record", "size"),
                                                      info_gap_share=("info_gap", "mean")))
                .reset_index())
    return ViewDivergence(summary, per_turn, tokens, invocations)


__all__ = ["VIEWS", "teacher_views", "information_gaps", "lost_facts", "token_disagreement", "distill_gradients",
           "cosine", "expected_cosine", "ViewDivergence", "view_divergence"]
