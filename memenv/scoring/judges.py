"""LLM judges through an OpenAI-compatible server (``judge="openai:MODEL@URL"``).

:class:`OpenAIJudge` grades one rubric item 0 / 0.5 / 1 (BEAM's nugget judging); :func:`make_judge` parses the
``openai:MODEL@URL`` spec every env and the bench accept.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Sequence

from memenv.search.http import HTTPStatusError, UnreachableError, request_json

__all__ = ["JUDGE_PROMPT", "JudgeError", "OpenAIJudge", "make_judge"]


class JudgeError(RuntimeError):
    """The judge server could not be reached or answered something unusable."""


_SCORE = re.compile(r"\b(0\.5|0|1)(?:\.0+)?\b")
JUDGE_PROMPT = (
    "You are grading a chatbot's answer against one rubric item.\n"
    "Question: {question}\nRubric item: {item}\nAnswer: {answer}\n"
    "Reply with only a score: 1 if the answer fully satisfies the rubric item, 0.5 if it partially does, "
    "0 if it does not."
)


@dataclass
class OpenAIJudge:
    """BEAM's rubric judging through ``{url}/chat/completions`` of an OpenAI-compatible server.

    ``url`` is the API base (e.g. ``http://127.0.0.1:8000/v1``). Each request is retried ``retries`` times with
    exponential backoff (``backoff`` seconds, doubled each time) on a connection error, a timeout or an HTTP
    5xx/429; then :class:`JudgeError` names the URL.
    """

    model: str
    url: str
    timeout: float = 30.0
    retries: int = 3
    backoff: float = 0.5
    api_key: str | None = None

    def grade(self, question: str, item: str, answer: str) -> float:
        """0, 0.5 or 1 for one rubric item."""
        body = {"model": self.model, "temperature": 0.0, "max_tokens": 8,
                "messages": [{"role": "user", "content": JUDGE_PROMPT.format(question=question, item=item, answer=answer)}]}
        content = self._post(body)
        match = _SCORE.search(content)
        if match is None:
            raise JudgeError(f"judge at {self.url} answered {content[:80]!r}: expected a score 0, 0.5 or 1")
        return float(match.group(1))

    def rubric_score(self, question: str, rubric: Sequence[str], answer: str) -> tuple[float, list[float]]:
        grades = [self.grade(question, item, answer) for item in rubric]
        return (float(sum(grades) / len(grades)) if grades else 0.0), grades

    def _post(self, body: dict[str, Any]) -> str:
        endpoint = self.url.rstrip("/") + "/chat/completions"
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        try:
            payload = request_json(endpoint, body, headers=headers, timeout=self.timeout, retries=self.retries,
                                   backoff=self.backoff)
            return str(payload["choices"][0]["message"]["content"])
        except HTTPStatusError as err:
            raise JudgeError(f"judge at {endpoint} refused the request: HTTP {err.status} {err.reason}") from None
        except UnreachableError as err:
            raise JudgeError(f"judge at {endpoint} unreachable after {err.attempts} tries: {err.reason}") from None
        except (KeyError, IndexError, TypeError, json.JSONDecodeError) as err:
            raise JudgeError(f"judge at {endpoint} sent an unexpected response ({err!r}); expected "
                             "an OpenAI chat/completions object") from None


def make_judge(spec: str | None) -> OpenAIJudge | None:
    """``"openai:MODEL@URL"`` -> :class:`OpenAIJudge`; ``None`` -> no judge."""
    if spec is None:
        return None
    if not isinstance(spec, str) or not spec.startswith("openai:") or "@" not in spec:
        raise ValueError(f"judge must be 'openai:MODEL@URL' (e.g. openai:gpt-4o-mini@http://127.0.0.1:8000/v1) "
                         f"or None, got {spec!r}")
    model, _, url = spec[len("openai:"):].rpartition("@")
    if not model or not url.startswith(("http://", "https://")):
        raise ValueError(f"judge {spec!r}: expected openai:MODEL@http(s)://HOST[:PORT]/PATH")
    return OpenAIJudge(model, url)
