"""LLM judges through an OpenAI-compatible server (``judge="openai:MODEL@URL"``).

:class:`OpenAIJudge` grades one rubric item 0 / 0.5 / 1 (BEAM's nugget judging) or gives a yes/no verdict
(LongMemEval's grading); both parse the reply strictly. :func:`make_judge` parses the
``openai:MODEL@URL`` spec every env and the bench accept. :data:`OFFICIAL_JUDGE_MODELS` names the model each
benchmark's own scorer judges with; any model a server serves can stand in, but only those make a judged figure
comparable with published ones.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Sequence

from memenv.search.http import BadReplyError, HTTPStatusError, ServiceError, UnreachableError, excerpt, request_json

__all__ = ["JUDGE_PROMPT", "JUDGE_SPEC_HELP", "JudgeError", "OFFICIAL_JUDGE_MODELS", "OpenAIJudge", "make_judge",
           "parse_score", "parse_verdict"]

#: The judge model of each benchmark's own scorer, all called at temperature 0 (as :class:`OpenAIJudge` does):
#: BEAM's ``run_evaluation.py`` grades every rubric item with gpt-4.1-mini; LongMemEval's ``evaluate_qa.py``
#: with gpt-4o (the gpt-4o-2024-08-06 snapshot); MemoryAgentBench judges its LongMemEval subset with gpt-4o.
OFFICIAL_JUDGE_MODELS = {
    "BEAM": "gpt-4.1-mini",
    "LongMemEval": "gpt-4o-2024-08-06",
    "MemoryAgentBench (its LongMemEval subset)": "gpt-4o",
}
#: What a judge spec is, for help texts and error messages.
JUDGE_SPEC_HELP = (
    "judge=openai:MODEL@URL: an OpenAI-compatible chat/completions server (URL its /v1 base) grading at "
    "temperature 0; the official judges: " + "; ".join(f"{b} {m}" for b, m in OFFICIAL_JUDGE_MODELS.items())
    + " (another model gives a judged figure, not one comparable with published numbers)"
)


class JudgeError(ServiceError, RuntimeError):
    """The judge server could not be reached or answered something unusable; the one-line message names the judge
    (``MODEL@URL``) and what came back."""


# One of the scale's values and nothing else: 0, 0.5 or 1 (also written 0.0, .5, 0.50, 1.0), optionally after
# "Score:" and before a full stop, with whitespace around.
_SCORE = re.compile(r"\s*(?:score\s*[:=]?\s*)?([01](?:\.0*)?|0?\.50*)\s*\.?\s*", re.IGNORECASE)


def parse_score(reply: str) -> float | None:
    """The grade a judge's reply states (0.0, 0.5 or 1.0), or None when the reply is not exactly one of them."""
    match = _SCORE.fullmatch(reply)
    return None if match is None else float(match.group(1))
# "yes" or "no" and nothing else (any case), optionally followed by a full stop, with whitespace around.
_VERDICT = re.compile(r"\s*(yes|no)\s*\.?\s*", re.IGNORECASE)


def parse_verdict(reply: str) -> bool | None:
    """A yes/no judge's verdict (True for yes), or None when the reply is not exactly "yes" or "no"."""
    match = _VERDICT.fullmatch(reply)
    return None if match is None else match.group(1).lower() == "yes"


JUDGE_PROMPT = (
    "You are grading a chatbot's answer against one rubric item.\n"
    "Question: {question}\nRubric item: {item}\nAnswer: {answer}\n"
    "Reply with only a score: 1 if the answer fully satisfies the rubric item, 0.5 if it partially does, "
    "0 if it does not."
)


@dataclass
class OpenAIJudge:
    """BEAM's rubric judging through ``{url}/chat/completions`` of an OpenAI-compatible server.

    ``url`` is the API base (e.g. ``http://127.0.0.1:8000/v1``). Each attempt of a request has ``timeout``
    seconds of wall-clock time (connect and read the whole reply); it is retried ``retries`` times with
    exponential backoff (``backoff`` seconds, doubled each time) on a connection error, a timeout or an HTTP
    5xx/429, within ``total_timeout`` seconds in all when given. A reply must be exactly one of the scale's values
    (:func:`parse_score`). Every failure is a :class:`JudgeError` naming the judge.
    """

    model: str
    url: str
    timeout: float = 30.0
    retries: int = 3
    backoff: float = 0.5
    api_key: str | None = None
    total_timeout: float | None = None

    @property
    def name(self) -> str:
        return f"{self.model}@{self.url}"

    def grade(self, question: str, item: str, answer: str) -> float:
        """0, 0.5 or 1 for one rubric item."""
        body = {"model": self.model, "temperature": 0.0, "max_tokens": 8,
                "messages": [{"role": "user", "content": JUDGE_PROMPT.format(question=question, item=item, answer=answer)}]}
        content = self._post(body)
        score = parse_score(content)
        if score is None:
            raise JudgeError(f"judge {self.name} replied {excerpt(content, 80)!r}: expected exactly one of the scores "
                             "0, 0.5, 1")
        return score

    def verdict(self, prompt: str) -> bool:
        """A yes/no judgement (LongMemEval's grading): True for "yes"; any other reply is a :class:`JudgeError`."""
        body = {"model": self.model, "temperature": 0.0, "max_tokens": 8,
                "messages": [{"role": "user", "content": prompt}]}
        content = self._post(body)
        verdict = parse_verdict(content)
        if verdict is None:
            raise JudgeError(f"judge {self.name} replied {excerpt(content, 80)!r}: expected exactly yes or no")
        return verdict

    def rubric_score(self, question: str, rubric: Sequence[str], answer: str) -> tuple[float, list[float]]:
        grades = [self.grade(question, item, answer) for item in rubric]
        return (float(sum(grades) / len(grades)) if grades else 0.0), grades

    def _post(self, body: dict[str, Any]) -> str:
        endpoint = self.url.rstrip("/") + "/chat/completions"
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        try:
            payload = request_json(endpoint, body, headers=headers, timeout=self.timeout, retries=self.retries,
                                   backoff=self.backoff, total_timeout=self.total_timeout)
        except (HTTPStatusError, BadReplyError) as err:  # names the endpoint, the status and an excerpt
            raise JudgeError(f"judge {self.name}: {err}") from None
        except UnreachableError as err:
            raise JudgeError(f"judge {self.name}: {endpoint} unreachable after {err.attempts} tries: "
                             f"{err.reason}") from None
        try:
            content = payload["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            content = None
        if not isinstance(content, str):
            raise JudgeError(f"judge {self.name}: {endpoint} sent no choices[0].message.content string (expected an "
                             f"OpenAI chat/completions object): {excerpt(payload)}")
        return content


def make_judge(spec: str | None) -> OpenAIJudge | None:
    """``"openai:MODEL@URL"`` -> :class:`OpenAIJudge`; ``None`` -> no judge. See :data:`JUDGE_SPEC_HELP`."""
    if spec is None:
        return None
    if not isinstance(spec, str) or not spec.startswith("openai:") or "@" not in spec:
        raise ValueError(f"judge must be 'openai:MODEL@URL' (e.g. openai:gpt-4.1-mini@http://127.0.0.1:8000/v1, "
                         f"BEAM's official judge model) or None, got {spec!r}")
    model, _, url = spec[len("openai:"):].rpartition("@")
    if not model or not url.startswith(("http://", "https://")):
        raise ValueError(f"judge {spec!r}: expected openai:MODEL@http(s)://HOST[:PORT]/PATH")
    return OpenAIJudge(model, url)
