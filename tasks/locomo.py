"""LoCoMo loader (Maharana et al., ACL 2024): long multi-session conversations with probing questions.

The official release file (``locomo10.json``) is one JSON array of samples::

    {"sample_id",
     "conversation": {"speaker_a", "speaker_b",
                      "session_<n>_date_time": "1:56 pm on 8 May, 2023",
                      "session_<n>": [{"speaker", "dia_id": "D<n>:<k>", "text",
                                       optional "blip_caption", "img_url", "query", ...}, ...], ...},
     "qa": [{"question", "answer" | "adversarial_answer", "evidence": [dia_id, ...], "category": 1..5}, ...],
     "event_summary", "observation", "session_summary"}   # generated summaries: ignored

Mapping onto :mod:`tasks.conversations` types:

* sessions in numeric order of ``n`` (a ``session_<n>_date_time`` without its ``session_<n>`` is ignored,
  as the release has such keys; a session without a date is an error); the date is kept verbatim;
* a turn's text is its ``text``, followed by ``[shares <blip_caption>]`` when the turn shared an image;
* question types from the category (:data:`CATEGORY_TYPES`: 1 multi-hop, 2 temporal, 3 open-domain,
  4 single-hop, 5 adversarial); ``meta`` holds ``category``, ``abstention`` and, for category 5,
  ``adversarial_answer``;
* category 5 (adversarial) questions have as gold :data:`~tasks.conversations.ABSTENTION_ANSWER` (the
  conversation does not contain the answer). The two category-5 items of the release that do carry an
  ``answer`` ("No") keep it as a second accepted answer. Numeric answers become strings; a list as an
  answer is refused (one value per question: a list is a damaged record);
* ``supporting_ids`` are the evidence ``dia_id`` s, split where one string holds several ("D8:6; D9:17") and
  normalised ("D:11:26" -> "D11:26", "D30:05" -> "D30:5"), as in nine entries of the release.

Policy (as every loader in :mod:`tasks`): malformed input raises :class:`~tasks.types.DataFormatError` naming
the file, the record (sample) index and the field inside it; nothing is skipped. That includes a sample
without questions, an empty question or answer, and empty evidence for a question of category 1, 2 or 4 (the
release leaves evidence empty only for categories 3 and 5). One exception, because the official release has
three of them: evidence that names no turn of its conversation is kept, and one
:class:`~tasks.types.DataFormatWarning` per file lists each such entry with its record and question index.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import Any

from tasks.conversations import ABSTENTION_ANSWER, Conversation, Session, Turn
from tasks.corpus import PathLike, RecordLocation, as_answer, as_str, as_text, get_field, iter_json_records
from tasks.types import DataFormatError, DataFormatWarning, Question

__all__ = ["CATEGORY_TYPES", "load_locomo"]

CATEGORY_TYPES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}
_SESSION_KEY = re.compile(r"session_(\d+)")
_DATE_KEY = re.compile(r"session_(\d+)_date_time")
_DIA_ID = re.compile(r"D:?(\d+):(\d+)")
# Categories whose questions may come without evidence: open-domain inference (3) and adversarial (5).
_EVIDENCE_OPTIONAL = (3, 5)


def _turns(value: Any, field: str, loc: RecordLocation) -> tuple[Turn, ...]:
    if not isinstance(value, list):
        loc.fail(f"{field}: expected a list of dialogue turns, got {type(value).__name__}")
    turns = []
    for i, raw in enumerate(value):
        where = f"{field}[{i}]"
        if not isinstance(raw, dict):
            loc.fail(f"{where}: expected an object, got {type(raw).__name__}")
        speaker = as_str(get_field(raw, "speaker", loc, within=where), f"{where}.speaker", loc)
        text = as_str(get_field(raw, "text", loc, within=where), f"{where}.text", loc)
        dia_id = as_str(get_field(raw, "dia_id", loc, within=where), f"{where}.dia_id", loc)
        caption = raw.get("blip_caption")
        if caption is not None:
            caption = as_str(caption, f"{where}.blip_caption", loc)
            text = f"{text} [shares {caption}]" if text else f"[shares {caption}]"
        turns.append(Turn(speaker, " ".join(text.split()), dia_id))
    return tuple(turns)


def _sessions(conv: Any, loc: RecordLocation) -> tuple[tuple[str, ...], tuple[Session, ...]]:
    if not isinstance(conv, dict):
        loc.fail(f"conversation: expected an object, got {type(conv).__name__}")
    speakers = tuple(
        as_str(get_field(conv, key, loc, within="conversation"), f"conversation.{key}", loc)
        for key in ("speaker_a", "speaker_b")
    )
    numbers = sorted(int(m.group(1)) for key in conv if (m := _SESSION_KEY.fullmatch(key)))
    if not numbers:
        loc.fail("conversation: no session_<n> key")
    sessions = []
    for n in numbers:
        date_key = f"session_{n}_date_time"
        if date_key not in conv:
            loc.fail(f"conversation: session_{n} has no {date_key}")
        date = as_str(conv[date_key], f"conversation.{date_key}", loc)
        sessions.append(Session(n, date, _turns(conv[f"session_{n}"], f"conversation.session_{n}", loc)))
    return speakers, tuple(sessions)


def _evidence(value: Any, field: str, loc: RecordLocation) -> list[str]:
    """Evidence dia_ids, split and normalised: the release joins some ("D8:6; D9:17"), misspells others
    ("D:11:26", "D30:05"); a string without any ``D<session>:<turn>`` is kept verbatim."""
    if not isinstance(value, list) or not all(isinstance(e, str) for e in value):
        loc.fail(f"{field}: expected a list of dia_id strings, got {_short(value)}")
    ids: list[str] = []
    for raw in value:
        found = [f"D{int(m.group(1))}:{int(m.group(2))}" for m in _DIA_ID.finditer(raw)]
        ids.extend(found or [raw])
    return list(dict.fromkeys(ids))


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _questions(qa: Any, sample_id: str, loc: RecordLocation) -> tuple[Question, ...]:
    if not isinstance(qa, list):
        loc.fail(f"qa: expected a list, got {type(qa).__name__}")
    if not qa:
        loc.fail("qa: no question (a LoCoMo sample probes its conversation with questions)")
    questions = []
    for i, raw in enumerate(qa):
        where = f"qa[{i}]"
        if not isinstance(raw, dict):
            loc.fail(f"{where}: expected an object, got {type(raw).__name__}")
        text = as_text(get_field(raw, "question", loc, within=where), f"{where}.question", loc)
        category = get_field(raw, "category", loc, within=where)
        if isinstance(category, bool) or category not in CATEGORY_TYPES:
            loc.fail(f"{where}.category: expected an integer 1..5, got {category!r}")
        evidence = _evidence(raw.get("evidence", []), f"{where}.evidence", loc)
        if not evidence and category not in _EVIDENCE_OPTIONAL:
            loc.fail(f"{where}.evidence: empty, but a {CATEGORY_TYPES[category]} question (category {category}) "
                     f"needs the dia_id of the turn(s) that answer it")
        meta: dict[str, Any] = {"category": category, "abstention": category == 5, "index": i}
        if category == 5:
            answers = [ABSTENTION_ANSWER]
            if "adversarial_answer" in raw:
                meta["adversarial_answer"] = as_answer(raw["adversarial_answer"], f"{where}.adversarial_answer", loc,
                                                     lists=False)
            if raw.get("answer") is not None:
                answers.append(as_answer(raw["answer"], f"{where}.answer", loc, lists=False))
        else:
            answers = [as_answer(get_field(raw, "answer", loc, within=where), f"{where}.answer", loc, lists=False)]
        questions.append(Question(
            id=f"{sample_id}/q{i}", question=text, answers=tuple(dict.fromkeys(answers)),
            supporting_ids=tuple(evidence), hops=max(1, len(evidence)), kind=CATEGORY_TYPES[category], meta=meta,
        ))
    return tuple(questions)


def load_locomo(path: PathLike, limit: int | None = None) -> list[Conversation]:
    """Load LoCoMo conversations from ``path`` (the official JSON array; JSON Lines of samples also works).

    ``limit`` keeps the first ``limit`` samples. Raises :class:`FileNotFoundError` naming the path when it
    does not exist, and :class:`~tasks.types.DataFormatError` naming the file, the record index and the field
    for invalid JSON, a truncated file, a missing key, a wrong type, an unknown category or a repeated
    ``sample_id``.
    """
    path = Path(path)
    conversations: list[Conversation] = []
    seen: dict[str, RecordLocation] = {}
    dangling: list[str] = []
    for loc, rec in iter_json_records(path, limit=limit, what="LoCoMo file"):
        sample_id = as_str(get_field(rec, "sample_id", loc), "sample_id", loc, allow_int=True)
        if sample_id in seen:
            loc.fail(f"duplicate sample_id {sample_id!r} (first at {seen[sample_id]})")
        seen[sample_id] = loc
        speakers, sessions = _sessions(get_field(rec, "conversation", loc), loc)
        questions = _questions(get_field(rec, "qa", loc), sample_id, loc)
        turns = {t.dia_id for session in sessions for t in session.turns}
        dangling.extend(f"record {loc.index} ({sample_id}) qa[{q.meta['index']}]: {d!r}"
                        for q in questions for d in q.supporting_ids if d not in turns)
        conversations.append(Conversation(sample_id, speakers, sessions, questions,
                                          {"source": str(path), "record": loc.index}))
    if not conversations:
        raise DataFormatError(f"{path}: no LoCoMo samples")
    if dangling:
        shown = "; ".join(dangling[:10]) + (f"; ... ({len(dangling)} in all)" if len(dangling) > 10 else "")
        warnings.warn(f"{path}: {len(dangling)} evidence dia_id(s) name no turn of their conversation (kept as "
                      f"given): {shown}", DataFormatWarning, stacklevel=2)
    return conversations
