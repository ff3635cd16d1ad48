"""LoCoMo's official QA score: stemmed token F1 with a rule per question category.

The rules of LoCoMo's evaluation (Maharana et al., ACL 2024; ``task_eval/evaluation.py`` of its repository),
written here from their description:

* normalisation: commas dropped, lower case, punctuation dropped, the words ``a an the and`` dropped, whitespace
  collapsed; every token is then stemmed with the Porter stemmer (:class:`nltk.stem.porter.PorterStemmer`, the
  stemmer the official script uses; it needs no data download);
* token F1 between the stemmed bags of words (0 when they share no token or either side is empty);
* category 1 (multi-hop): the answer and the gold are both split on commas; each gold part takes its best F1
  over the answer's parts, and the parts' scores are averaged;
* category 2 (temporal), 4 (single-hop): plain stemmed F1 against the gold;
* category 3 (open-domain): the gold is cut at its first ``;`` and the first part is scored with stemmed F1;
* category 5 (adversarial): 1 when the answer (lower-cased) contains "no information available" or
  "not mentioned", else 0.

This sits beside the project's SQuAD F1 (:mod:`memenv.scoring.qa`), which stays the env's reward; MemDialog
reports both (``f1`` and ``locomo_f1``).
"""

from __future__ import annotations

import functools
import re
import string
from collections import Counter

from tasks.types import answer_text

__all__ = ["ABSTENTION_PHRASES", "locomo_f1", "locomo_normalize", "locomo_score", "locomo_tokens"]

#: What an answer must contain (lower-cased) for an adversarial question to score 1.
ABSTENTION_PHRASES = ("no information available", "not mentioned")
_PUNCTUATION = frozenset(string.punctuation)
_DROPPED_WORDS = re.compile(r"\b(a|an|the|and)\b")


@functools.lru_cache(maxsize=1)
def _stemmer():
    from nltk.stem.porter import PorterStemmer  # imported on first use: nltk's package import takes ~1 s

    return PorterStemmer()


@functools.lru_cache(maxsize=65536)
def _stem(word: str) -> str:
    return _stemmer().stem(word)


def locomo_normalize(text: str) -> str:
    """LoCoMo's answer normalisation (see the module docstring), before stemming."""
    text = answer_text(text).replace(",", "").lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _DROPPED_WORDS.sub(" ", text)
    return " ".join(text.split())


def locomo_tokens(text: str) -> list[str]:
    """The normalised, Porter-stemmed tokens of ``text``."""
    return [_stem(w) for w in locomo_normalize(text).split()]


def locomo_f1(prediction: str, gold: str) -> float:
    """Stemmed token F1 of one prediction against one gold answer."""
    pred, ref = locomo_tokens(prediction), locomo_tokens(gold)
    same = sum((Counter(pred) & Counter(ref)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(ref)
    return 2 * precision * recall / (precision + recall)


def _multi_hop(prediction: str, gold: str) -> float:
    predictions = [p.strip() for p in prediction.split(",")]
    golds = [g.strip() for g in gold.split(",")]
    return sum(max(locomo_f1(p, g) for p in predictions) for g in golds) / len(golds)


def locomo_score(prediction: str | None, gold: str | None, category: int) -> float:
    """The official score of one answer to a LoCoMo question of ``category`` (1..5)."""
    if isinstance(category, bool) or category not in (1, 2, 3, 4, 5):
        raise ValueError(f"category must be a LoCoMo category 1..5, got {category!r}")
    prediction = answer_text(prediction)
    if category == 5:
        lowered = prediction.lower()
        return float(any(phrase in lowered for phrase in ABSTENTION_PHRASES))
    gold = answer_text(gold)
    if category == 1:
        return _multi_hop(prediction, gold)
    if category == 3:
        gold = gold.split(";")[0].strip()
    return locomo_f1(prediction, gold)
