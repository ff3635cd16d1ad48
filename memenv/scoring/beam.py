"""BEAM answer scoring: a judge-free approximation, and BEAM's rubric judging through an OpenAI-compatible server.

Judge-free (the default; **an approximation of BEAM's official score, not the official score**):

* ``abstention``: LoCoMo's rule (:func:`tasks.conversations.is_abstention_answer`): 1.0 when the answer
  contains "not mentioned" or "no information available" (after SQuAD normalisation), else 0.0;
* ``event_ordering``: ``(tau_b + 1) / 2`` with Kendall's tau-b (:func:`scipy.stats.kendalltau`) between the
  reference order and the order in which the answer mentions the items (:func:`event_order_score`);
* every other ability: *rubric-nugget recall* (:func:`nugget_recall`): each rubric item, stripped of BEAM's
  "LLM response should ...:" lead, is matched against the answer by SQuAD token F1 (the best F1 over the
  answer's sentences, lines, the whole answer and its runs of as many tokens as the nugget), and the matches
  are averaged.

With a judge (``judge="openai:MODEL@URL"``, :class:`memenv.scoring.judges.OpenAIJudge`; BEAM's own scorer uses
gpt-4.1-mini at temperature 0): each rubric item is graded 0 / 0.5 / 1 by the model (the prompt is memenv's
wording, not BEAM's), and the grades are averaged two ways:

* ``score``, the grades as given (0.5 counts half);
* ``official_score``, as BEAM's official scorer sums them: each grade through ``int()``, so every 0.5 counts 0,
  in every ability but ``event_ordering``, whose grades it keeps as floats (:func:`official_rubric_score`).

Event ordering with a reference order keeps the tau score, judge or not. Where no judge graded (the judge-free
methods, tau) there is nothing to truncate and ``official_score`` equals ``score``.
"""

from __future__ import annotations

import re
from typing import Any, Sequence

from scipy.stats import kendalltau

from memenv.scoring.judges import JudgeError, OpenAIJudge, make_judge
from memenv.scoring.qa import f1_score, normalize_answer
from tasks.conversations import is_abstention_answer
from tasks.types import Question, answer_text

__all__ = ["FLOAT_GRADE_ABILITIES", "JudgeError", "OpenAIJudge", "event_order_score", "make_judge", "nugget_recall",
           "nugget_scores", "official_rubric_score", "rubric_nugget", "score_beam_answer"]

#: The abilities whose judge grades BEAM's official scorer averages as floats; it sums ``int(grade)`` in the others.
FLOAT_GRADE_ABILITIES = frozenset({"event_ordering"})

_RUBRIC_LEAD = re.compile(r"^\s*(?:the\s+)?(?:llm\s+)?response\s+(?:should|must)\s+[a-z ]*?:\s*", re.IGNORECASE)
_SEGMENT = re.compile(r"(?<=[.!?;])\s+|\n+")


def rubric_nugget(item: str) -> str:
    """A rubric item without BEAM's lead ("LLM response should state: 2 days" -> "2 days")."""
    return _RUBRIC_LEAD.sub("", item).strip()


def _segments(answer: str) -> list[str]:
    parts = [p.strip() for p in _SEGMENT.split(answer) if p and p.strip()]
    return parts + [answer]


def _windows(answer: str, size: int) -> list[str]:
    tokens = normalize_answer(answer).split()
    if len(tokens) <= size:
        return []
    return [" ".join(tokens[i:i + size]) for i in range(len(tokens) - size + 1)]


def nugget_scores(answer: str | None, rubric: Sequence[str]) -> list[float]:
    """Per rubric item: the best token F1 between the item's nugget and a part of ``answer``: a sentence, a
    line, the whole answer, or any run of as many tokens as the nugget has (so a nugget stated inside a longer
    sentence is matched, as a judge would, rather than diluted by the sentence's other words)."""
    answer = answer_text(answer)
    segments = _segments(answer)
    scores = []
    for item in rubric:
        nugget = rubric_nugget(item)
        parts = segments + _windows(answer, max(1, len(normalize_answer(nugget).split())))
        scores.append(max(f1_score(part, nugget) for part in parts))
    return scores


def nugget_recall(answer: str | None, rubric: Sequence[str]) -> float:
    """Mean of :func:`nugget_scores` (0.0 for an empty rubric)."""
    scores = nugget_scores(answer, rubric)
    return float(sum(scores) / len(scores)) if scores else 0.0


def _position(answer_norm: str, segments: list[str], item: str) -> float:
    """Where ``item`` is mentioned in the answer: the character offset of its exact (normalised) mention, else
    of the segment that matches it best (F1 >= 0.5), else infinity (not mentioned)."""
    item_norm = normalize_answer(item)
    at = answer_norm.find(item_norm) if item_norm else -1
    if at >= 0:
        return float(at)
    best, where = 0.0, float("inf")
    offset = 0
    for seg in segments:
        seg_norm = normalize_answer(seg)
        f1 = f1_score(seg_norm, item_norm)
        pos = answer_norm.find(seg_norm, offset)
        if f1 >= 0.5 and f1 > best:
            best, where = f1, float(pos if pos >= 0 else offset)
        if pos >= 0:
            offset = pos
    return where


def event_order_score(answer: str | None, order: Sequence[str]) -> float:
    """``(tau_b + 1) / 2``: Kendall's tau-b between the reference ``order`` and the answer's order.

    Items the answer does not mention share the last rank (ties, which tau-b accounts for); an answer that
    mentions none of them (or a one-item reference) scores 0.0 unless it gets the single item, then 1.0.
    """
    answer = answer_text(answer)
    answer_norm = normalize_answer(answer)
    segments = _segments(answer)[:-1] or [answer]
    positions = [_position(answer_norm, segments, item) for item in order]
    found = [p for p in positions if p != float("inf")]
    if len(order) < 2:
        return float(len(found) == len(order))
    if len(found) < 2:
        return 0.0
    last = max(found) + 1.0
    ranks = [p if p != float("inf") else last for p in positions]
    tau = kendalltau(list(range(len(order))), ranks, variant="b").statistic
    if tau != tau:  # NaN: every answer rank tied
        return 0.0
    return float((tau + 1.0) / 2.0)


# ---------------------------------------------------------------------------------------------------- one answer
def official_rubric_score(grades: Sequence[float], ability: str) -> float:
    """BEAM's official aggregate of one answer's judge grades (0 / 0.5 / 1): their mean after ``int()`` (a 0.5
    counts 0), or the plain mean for an ability of :data:`FLOAT_GRADE_ABILITIES`; 0.0 for no grades."""
    if not grades:
        return 0.0
    kept = [float(g) if ability in FLOAT_GRADE_ABILITIES else float(int(g)) for g in grades]
    return float(sum(kept) / len(kept))


def score_beam_answer(answer: str | None, question: Question, judge: OpenAIJudge | None = None) -> dict[str, Any]:
    """``{"score", "official_score", "method", "items"}`` for one answer to a BEAM probing question (see the module
    docstring).

    ``method`` says how the score was computed: ``abstention``, ``kendall_tau`` , ``nugget_f1`` (the
    approximation) or ``judge``. ``items`` holds the per-rubric-item scores (empty for abstention and tau): the
    judge's grades as given for ``judge``. ``official_score`` differs from ``score`` only for ``judge``.
    """
    answer = answer_text(answer)
    ability = question.meta.get("ability", question.kind)
    rubric = list(question.meta.get("rubric") or []) or [question.answers[0]]
    if ability == "event_ordering" and question.meta.get("order"):
        score = event_order_score(answer, question.meta["order"])
        return {"score": score, "official_score": score, "method": "kendall_tau", "items": []}
    if judge is not None:
        score, grades = judge.rubric_score(question.question, rubric, answer)
        return {"score": score, "official_score": official_rubric_score(grades, ability), "method": "judge",
                "items": grades}
    if ability == "abstention" or question.meta.get("abstention"):
        score = float(is_abstention_answer(answer))
        return {"score": score, "official_score": score, "method": "abstention", "items": []}
    items = nugget_scores(answer, rubric)
    score = float(sum(items) / len(items))
    return {"score": score, "official_score": score, "method": "nugget_f1", "items": items}
