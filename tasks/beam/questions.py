"""BEAM's probing questions (``probing_questions/probing_questions.json``): the ten abilities, where a question's
reference sits, and :func:`load_probing_questions`."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from tasks.corpus import _TOO_DEEP, _read_text, _type_name
from tasks.types import DataFormatError, Question, answer_text


ABILITIES = (
    "abstention", "contradiction_resolution", "event_ordering", "information_extraction", "instruction_following",
    "knowledge_update", "multi_session_reasoning", "preference_following", "summarization", "temporal_reasoning",
)
# The keys a probing question's reference may sit under, in the order they are looked for.
REFERENCE_KEYS = ("answer", "ideal_response", "ideal_answer", "ideal_summary", "expected_compliance")

QUESTIONS_FILE = os.path.join("probing_questions", "probing_questions.json")

def _reference(raw: dict, at: str) -> tuple[str, str]:
    for key in REFERENCE_KEYS:
        if key in raw:
            value = raw[key]
            try:  # a list is one item per line (event ordering's events); numbers as answer_text writes them
                items = value if isinstance(value, list) else [value]
                value = "\n".join(answer_text(item) for item in items)
            except (TypeError, ValueError) as err:
                raise DataFormatError(f"{at}: {key}: {err}") from None
            if not value.strip():
                raise DataFormatError(f"{at}: {key}: empty answer (no reply can score on it)")
            return key, value
    raise DataFormatError(f"{at}: no reference: expected one of {', '.join(REFERENCE_KEYS)}")


def load_probing_questions(path: str | os.PathLike, conversation_id: str = "") -> list[Question]:
    """The probing questions of ``probing_questions.json`` as :class:`~tasks.types.Question` (``kind`` is the
    ability; ``answers[0]`` the reference; ``meta`` has ``ability``, ``reference_key``, ``rubric``,
    ``difficulty``, ``compliance_indicators``, ``evidence`` (message ids, when given as ``evidence`` or
    ``source_chat_ids``) and ``order`` (event ordering: the reference items in order)).

    Malformed input raises :class:`DataFormatError` naming the file and the ability and question index: bytes
    that are not UTF-8, an empty file, invalid or too deeply nested JSON, an unknown ability (the valid ones are
    listed), a missing, empty or non-string question, no reference, a rubric, indicators, ``order`` or
    evidence of the wrong type. Nothing is skipped: a bad question stops the load.
    """
    path = Path(path)
    text = _read_text(path, "BEAM probing questions file")
    if not text.strip():
        raise DataFormatError(f"{path}: empty file (expected an object from ability to a list of questions)")
    try:
        data = json.loads(text)
    except RecursionError:
        raise DataFormatError(f"{path}: {_TOO_DEEP}") from None
    except json.JSONDecodeError as err:
        raise DataFormatError(f"{path}: invalid JSON at line {err.lineno}: {err.msg}") from None
    if not isinstance(data, dict):
        raise DataFormatError(f"{path}: expected an object from ability to a list of questions, got {type(data).__name__}")
    questions = []
    for ability, items in data.items():
        if ability not in ABILITIES:
            raise DataFormatError(f"{path}: unknown ability {ability!r}; valid: {', '.join(ABILITIES)}")
        if not isinstance(items, list):
            raise DataFormatError(f"{path}: {ability}: expected a list of questions, got {type(items).__name__}")
        for i, raw in enumerate(items):
            at = f"{path}: {ability}[{i}]"
            if not isinstance(raw, dict):
                raise DataFormatError(f"{at}: expected an object, got {type(raw).__name__}")
            if "question" not in raw:
                raise DataFormatError(f"{at}: missing key 'question'")
            text = raw["question"]
            if not isinstance(text, str):
                raise DataFormatError(f"{at}: question must be a string, got {_type_name(text)}")
            if not text.strip():
                raise DataFormatError(f"{at}: empty question")
            key, reference = _reference(raw, at)
            rubric = raw.get("rubric", [])
            if isinstance(rubric, str):
                rubric = [rubric]
            if not isinstance(rubric, list) or not all(isinstance(r, str) for r in rubric):
                raise DataFormatError(f"{at}: rubric must be a list of strings")
            indicators = raw.get("compliance_indicators", [])
            if not isinstance(indicators, list) or not all(isinstance(r, str) for r in indicators):
                raise DataFormatError(f"{at}: compliance_indicators must be a list of strings")
            evidence_key = "evidence" if "evidence" in raw else "source_chat_ids"
            evidence = _evidence_ids(raw.get(evidence_key), f"{at}: {evidence_key}")
            difficulty = raw.get("difficulty")
            if isinstance(difficulty, bool) or not isinstance(difficulty, (str, int, type(None))):
                raise DataFormatError(f"{at}: difficulty must be a string (easy, medium, hard), got "
                                      f"{_type_name(difficulty)}")
            order = raw.get("order")
            if order is not None and (not isinstance(order, list) or not all(isinstance(o, str) for o in order)):
                raise DataFormatError(f"{at}: order must be a list of strings (the events in order), got "
                                      f"{_type_name(order)}")
            if order is None and ability == "event_ordering":
                order = _ordered_items(raw.get("answer", reference))
            meta = {"ability": ability, "reference_key": key, "rubric": list(rubric),
                    "difficulty": difficulty, "compliance_indicators": list(indicators),
                    "evidence": evidence, "abstention": ability == "abstention", "index": i}
            if order is not None:
                meta["order"] = list(order)
            questions.append(Question(id=f"{conversation_id}/{ability}/{i}", question=text,
                                      answers=(reference,), kind=ability, meta=meta))
    return questions


def _evidence_ids(value: Any, at: str, depth: int = 0) -> list[str]:
    """The message ids a question's evidence names, as strings: one id, a list of ids, or lists and objects of
    them (grouped, e.g. by statement), flattened in order. Anything else is an error."""
    if value is None:
        return []
    if isinstance(value, (str, int)) and not isinstance(value, bool):
        return [str(value)]
    if isinstance(value, (list, dict)) and depth < 3:
        items = value.values() if isinstance(value, dict) else value
        return [e for item in items for e in _evidence_ids(item, at, depth + 1)]
    what = "nested too deeply" if isinstance(value, (list, dict)) else _type_name(value)
    raise DataFormatError(f"{at}: expected message ids (integers or strings), or lists or objects of them; "
                          f"got {what}")


def _ordered_items(answer: Any) -> list[str]:
    """Event-ordering reference items: a list as given, or the non-empty lines of a text (list markers cut)."""
    if isinstance(answer, list):
        return [str(a) for a in answer]
    lines = [line.strip().lstrip("-*0123456789.) ").strip() for line in str(answer).splitlines()]
    return [line for line in lines if line]
