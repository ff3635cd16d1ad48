"""Answer scoring: SQuAD-normalised exact match and token F1, over aliases and over several objectives.

The metrics follow the official SQuAD v1.1 / HotpotQA evaluation scripts so figures are comparable with
published ones (MEM1 reports EM/F1 summed over objectives; we report per objective, sum and mean):

* :func:`normalize_answer`: lowercase, drop ASCII punctuation, drop the articles a/an/the, collapse
  whitespace;
* :func:`f1_score`: bag-of-tokens F1, with HotpotQA's rule that a yes/no/noanswer answer only scores
  when it matches exactly.

Answers and gold answers of any type an official file writes them in (numbers, lists) are first made text by
:func:`tasks.types.answer_text`, the loaders' own conversion (``3.0`` -> ``"3"``), so ``f1_score(3, "3")`` is 1.0.

One deliberate deviation: when both normalised sides are empty, F1 is 1.0 (as in the SQuAD v2 script),
where the v1.1 script gives 0.0 while EM gives 1.0. Only gold answers that normalise to nothing (e.g.
"The.") are affected.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Sequence
from typing import Any

from tasks.types import answer_text

__all__ = [
    "best_em_f1",
    "exact_match",
    "f1_score",
    "normalize_answer",
    "score_objectives",
    "split_answers",
]

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES_RE = re.compile(r"\b(a|an|the)\b")
# HotpotQA: these answers are categorical, so partial token overlap with them must not earn credit.
_SPECIAL_ANSWERS = frozenset({"yes", "no", "noanswer"})


def normalize_answer(text: str) -> str:
    """SQuAD answer normalisation: lower, remove punctuation, remove articles, collapse whitespace.

    >>> normalize_answer("  The Eiffel-Tower, Paris! ")
    'eiffeltower paris'
    """
    text = answer_text(text).lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES_RE.sub(" ", text)
    return " ".join(text.split())


def exact_match(pred: str, gold: str) -> float:
    """1.0 if the normalised prediction equals the normalised gold answer, else 0.0."""
    return float(normalize_answer(pred) == normalize_answer(gold))


def f1_score(pred: str, gold: str) -> float:
    """Token-level F1 between the normalised prediction and gold answer (HotpotQA rules)."""
    p_norm, g_norm = normalize_answer(pred), normalize_answer(gold)
    if (p_norm in _SPECIAL_ANSWERS or g_norm in _SPECIAL_ANSWERS) and p_norm != g_norm:
        return 0.0
    p_tokens, g_tokens = p_norm.split(), g_norm.split()
    if not p_tokens or not g_tokens:
        # See the module docstring: both empty counts as a match, consistent with exact_match.
        return float(p_tokens == g_tokens)
    num_same = sum((Counter(p_tokens) & Counter(g_tokens)).values())
    if num_same == 0:
        return 0.0
    precision = num_same / len(p_tokens)
    recall = num_same / len(g_tokens)
    return 2 * precision * recall / (precision + recall)


def _aliases(golds: str | Sequence[str]) -> list[str]:
    # A bare string (or number) is one alias, not a sequence of one-character aliases.
    return [golds] if isinstance(golds, str) or not isinstance(golds, Sequence) else list(golds)


def best_em_f1(pred: str | None, golds: str | Sequence[str]) -> tuple[float, float]:
    """Best EM and best F1 of ``pred`` over the gold aliases (each maximised independently).

    A missing prediction (``None``) counts as ``""``; no aliases at all gives ``(0.0, 0.0)``.
    """
    pred = answer_text(pred)
    aliases = _aliases(golds)
    if not aliases:
        return 0.0, 0.0
    return (
        max(exact_match(pred, g) for g in aliases),
        max(f1_score(pred, g) for g in aliases),
    )


def score_objectives(
    preds: Sequence[str | None], golds: Sequence[str | Sequence[str]]
) -> dict[str, Any]:
    """Score one answer per objective against that objective's aliases.

    ``golds[i]`` holds the aliases of objective ``i`` (a bare string is one alias). Predictions beyond the
    number of objectives are ignored; missing ones (too few, or ``None``) count as ``""`` and score 0.

    Returns ``{"em": [...], "f1": [...], "em_sum", "f1_sum", "em_mean", "f1_mean"}``; the means are 0.0
    when there are no objectives.
    """
    em: list[float] = []
    f1: list[float] = []
    for i, aliases in enumerate(golds):
        pred = preds[i] if i < len(preds) else None
        e, f = best_em_f1(pred, aliases)
        em.append(e)
        f1.append(f)
    n = len(golds)
    em_sum, f1_sum = float(sum(em)), float(sum(f1))
    return {
        "em": em,
        "f1": f1,
        "em_sum": em_sum,
        "f1_sum": f1_sum,
        "em_mean": em_sum / n if n else 0.0,
        "f1_mean": f1_sum / n if n else 0.0,
    }


def split_answers(text: str, n: int) -> list[str]:
    """Split an ``<answer>`` payload ``"A1; A2; ..."`` into exactly ``n`` stripped answers.

    Missing answers are padded with ``""`` and surplus ones dropped, so answer ``i`` always lines up with
    objective ``i``. An answer cannot itself contain ``";"`` (it is the protocol's separator).

    >>> split_answers(" Paris ;Berlin", 3)
    ['Paris', 'Berlin', '']
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    parts = [part.strip() for part in answer_text(text).split(";")]
    return (parts + [""] * n)[:n]
