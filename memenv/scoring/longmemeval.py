"""LongMemEval answer scoring: its per-type yes/no judging through an OpenAI-compatible server, and a judge-free
approximation.

Judged (``judge="openai:MODEL@URL"``, :meth:`memenv.scoring.judges.OpenAIJudge.verdict`): the grading rules of
LongMemEval's official judge, one prompt per question type, written here in our own words:

* single-session-user, single-session-assistant, multi-session: correct when the response holds the correct
  answer (an equivalent answer, or one that holds every intermediate step, counts); a response with only part of
  the answer is not correct;
* temporal-reasoning: the same, and an off-by-one count of days, weeks or months is still correct;
* knowledge-update: correct when the response gives the updated answer, even if it also mentions the old
  information;
* single-session-preference: the reference is a rubric of what the user would want; correct when the response
  follows the user's personal information in that spirit (it need not cover every point);
* abstention (``_abs`` in the id): correct when the response says the question cannot be answered from the chat
  (it may say what was mentioned instead).

The judge must reply "yes" or "no"; anything else is an error naming the judge and the reply (the official
script looks for "yes" anywhere in the reply; we parse strictly, as for BEAM). The official judge model is
gpt-4o-2024-08-06 at temperature 0.

Judge-free (the default; **an approximation, not LongMemEval's official accuracy**): 1 when the normalised
answer contains every token of the normalised reference (a numeric reference also matches its number word,
"3" ~ "three"), else 0; abstention items score 1 when the response abstains
(:func:`is_abstention_reply`); preference items score 1 when the response covers at least half of the
rubric's content words.
"""

from __future__ import annotations

import re
from typing import Any

from memenv.scoring.judges import OpenAIJudge
from memenv.scoring.qa import normalize_answer
from memenv.search.bm25 import tokenize
from tasks.conversations import is_abstention_answer
from tasks.types import Question, answer_text

__all__ = ["JUDGE_PROMPTS", "judge_prompt", "is_abstention_reply", "judge_free_correct", "score_longmemeval_answer"]

_SHARED = (
    "I will give you a question, a correct answer, and a response from a model. Reply yes if the response "
    "contains the correct answer, otherwise reply no. A response that is equivalent to the correct answer, or "
    "that contains all the intermediate steps to reach it, also counts as correct. A response that holds only "
    "part of the correct answer counts as incorrect.\n\n"
    "Question: {question}\n\nCorrect answer: {answer}\n\nModel response: {response}\n\n"
    "Does the response contain the correct answer? Reply with only yes or no."
)
JUDGE_PROMPTS = {
    "single-session-user": _SHARED,
    "single-session-assistant": _SHARED,
    "multi-session": _SHARED,
    "temporal-reasoning": (
        "I will give you a question, a correct answer, and a response from a model. Reply yes if the response "
        "contains the correct answer, otherwise reply no. An equivalent answer, or one with all the intermediate "
        "steps, counts as correct; one with only part of the answer does not. Do not penalise an off-by-one "
        "error in a number of days, weeks or months (18 days for 19, say): count it as correct.\n\n"
        "Question: {question}\n\nCorrect answer: {answer}\n\nModel response: {response}\n\n"
        "Does the response contain the correct answer? Reply with only yes or no."
    ),
    "knowledge-update": (
        "I will give you a question, a correct answer, and a response from a model. Reply yes if the response "
        "contains the correct answer, otherwise reply no. If the response also mentions earlier information "
        "that has since changed, it is still correct as long as it gives the updated answer.\n\n"
        "Question: {question}\n\nCorrect answer: {answer}\n\nModel response: {response}\n\n"
        "Does the response contain the correct answer? Reply with only yes or no."
    ),
    "single-session-preference": (
        "I will give you a question, a rubric describing the personalised response the user wants, and a "
        "response from a model. Reply yes if the response satisfies the rubric, otherwise reply no. The response "
        "need not cover every point of the rubric; it is correct when it recalls and uses the user's personal "
        "information the way the rubric asks.\n\n"
        "Question: {question}\n\nRubric: {answer}\n\nModel response: {response}\n\n"
        "Does the response satisfy the rubric? Reply with only yes or no."
    ),
    "abstention": (
        "I will give you an unanswerable question, an explanation of why it cannot be answered, and a response "
        "from a model. Reply yes if the model correctly identifies the question as unanswerable (it may say "
        "that the information is incomplete or was never mentioned, or what was mentioned instead), otherwise "
        "reply no.\n\n"
        "Question: {question}\n\nExplanation: {answer}\n\nModel response: {response}\n\n"
        "Does the model identify the question as unanswerable? Reply with only yes or no."
    ),
}
_NUMBER_WORDS = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
                 "sixteen seventeen eighteen nineteen twenty").split()
_ABSTAIN = re.compile(r"\b(not mentioned|no information|not enough information|don'?t know|do not know|"
                      r"cannot (?:be )?(?:answer|determine|tell)|can'?t (?:answer|determine|tell)|"
                      r"did(?: not|n'?t) (?:mention|say|tell)|not (?:provided|specified|stated)|unanswerable|"
                      r"no record)\b", re.IGNORECASE)


def judge_prompt(question: Question, response: str) -> str:
    """The judge prompt for ``question`` (its type's, or the abstention one for an ``_abs`` item)."""
    kind = "abstention" if question.meta.get("abstention") else question.kind
    template = JUDGE_PROMPTS.get(kind, _SHARED)
    return template.format(question=question.question, answer=question.answers[0], response=response)


def is_abstention_reply(response: str) -> bool:
    """Whether a response says it cannot answer (the env's abstention answer, or a common wording of it)."""
    response = answer_text(response)
    return is_abstention_answer(response) or bool(_ABSTAIN.search(response))


def _with_number_words(tokens: list[str]) -> list[set[str]]:
    out = []
    for tok in tokens:
        forms = {tok}
        if tok.isdigit() and int(tok) < len(_NUMBER_WORDS):
            forms.add(_NUMBER_WORDS[int(tok)])
        elif tok in _NUMBER_WORDS:
            forms.add(str(_NUMBER_WORDS.index(tok)))
        out.append(forms)
    return out


def judge_free_correct(response: str | None, question: Question) -> bool:
    """The judge-free verdict (see the module docstring)."""
    response = answer_text(response)
    if question.meta.get("abstention"):
        return is_abstention_reply(response)
    if question.kind == "single-session-preference":
        words = set(tokenize(question.answers[0])) - {"user", "would", "prefer", "preferences", "suggestions",
                                                      "responses", "may", "might", "they", "their", "not"}
        said = set(tokenize(response))
        return bool(words) and len(words & said) >= len(words) / 2
    said = set(normalize_answer(response).split())
    reference = normalize_answer(question.answers[0]).split()
    return bool(reference) and all(forms & said for forms in _with_number_words(reference))


def score_longmemeval_answer(answer: str | None, question: Question, judge: OpenAIJudge | None = None) -> dict[str, Any]:
    """``{"score", "method", "items"}`` for one answer (the BEAM env's per-question shape): ``score`` 1.0 or 0.0,
    ``method`` ``judge`` or ``judge_free``."""
    answer = answer_text(answer)
    if judge is not None:
        return {"score": float(judge.verdict(judge_prompt(question, answer))), "method": "judge", "items": []}
    return {"score": float(judge_free_correct(answer, question)), "method": "judge_free", "items": []}
