"""BEAM (Beyond a Million Tokens) conversations: a streaming loader for its layout and a seeded synthetic generator.

BEAM's layout, one directory per conversation::

    <conv>/chat.json                                   [{"batch_number", "time_anchor", "turns": [[message, ...], ...]}, ...]
    <conv>/probing_questions/probing_questions.json    {ability: [{"question", <reference>, "rubric", "difficulty", ...}]}

A message is ``{"role": "user"|"assistant", "id", "index", "content", "time_anchor"?, "question_type"?}``. In the
official release a batch's ``time_anchor`` is ``null`` (the batch then takes the first anchor of its messages, or
``""``), ids are ints, user messages carry ``index: "B,T"`` and end with a ``->-> B,T`` marker (cut at load), and
each chat folder holds other files (``chat.pickle``, ``plan*.txt``, ``chat_trunecated.json``, ...) that are never
read; evidence is ``source_chat_ids`` (a list, ints mixed with lists, or a dict of named lists). The
reference sits under an ability-dependent key (:data:`REFERENCE_KEYS`: ``answer``, ``ideal_response``,
``ideal_answer``, ``ideal_summary`` or ``expected_compliance`` with ``compliance_indicators``).

Memory: a 10M-token chat is never materialised. :func:`iter_chat_batches` parses ``chat.json`` one batch at a
time (``json.JSONDecoder.raw_decode`` over a growing read buffer, so at most one batch is held; a batch past
1 Mi characters is read piece by piece, and a message longer than :data:`MAX_MESSAGE_CHARS` keeps its start and
a marker with the count cut, the rest never decoded or held, so one 50 MB message costs ~1 MB), and
:class:`SyntheticBeamChat` keeps only a plan of its facts (O(number of questions)) and renders each batch on
demand from a per-batch seed. Both yield :class:`BeamBatch` objects; a batch is one session of the env.

Malformed input raises :class:`~tasks.types.DataFormatError` naming the file, the batch (0-based position and
``batch_number``) and, inside it, the turn and message index, or the ability and question index.

The synthetic generator (:class:`SyntheticBeamChat`) writes a user talking to an assistant over dated batches:
long filler exchanges (how-to questions, often after a first-person statement that looks like a fact but is
never asked about, and long answers, so the chat reaches 128K to 10M whitespace tokens)
with, at planned places, personal facts that are stated, updated, contradicted, ordered in time, preferences
and instructions the assistant must follow later, and none of what the abstention questions ask about. Each
of the ten abilities (:data:`ABILITIES`) gets ``questions_per_ability`` questions with a reference, a rubric and
the ids of its evidence messages (``meta["evidence"]``; event ordering also ``meta["order"]``).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import re
import secrets
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tasks.conversations import Conversation
from tasks.corpus import _TOO_DEEP, _read_text, _type_name
from tasks.types import DataFormatError, Question, answer_text

__all__ = [
    "ABILITIES",
    "REFERENCE_KEYS",
    "BeamBatch",
    "BeamConversation",
    "BeamMessage",
    "BatchStream",
    "ConversationSource",
    "MAX_MESSAGE_CHARS",
    "SyntheticBeamChat",
    "conversation_files",
    "cut_marker",
    "find_conversations",
    "iter_chat_batches",
    "load_probing_questions",
    "write_beam_directory",
]

ABILITIES = (
    "abstention", "contradiction_resolution", "event_ordering", "information_extraction", "instruction_following",
    "knowledge_update", "multi_session_reasoning", "preference_following", "summarization", "temporal_reasoning",
)
# The keys a probing question's reference may sit under, in the order they are looked for.
REFERENCE_KEYS = ("answer", "ideal_response", "ideal_answer", "ideal_summary", "expected_compliance")
# The key the synthetic generator writes per ability (the one BEAM's release uses for it).
_WRITE_KEY = {
    "abstention": "ideal_response", "contradiction_resolution": "ideal_answer", "event_ordering": "answer",
    "information_extraction": "answer", "instruction_following": "expected_compliance",
    "knowledge_update": "answer", "multi_session_reasoning": "answer", "preference_following": "expected_compliance",
    "summarization": "ideal_summary", "temporal_reasoning": "answer",
}
CHAT_FILE = "chat.json"
#: The longest message content kept (characters): a longer one keeps its first ``MAX_MESSAGE_CHARS`` characters
#: and :func:`cut_marker`, and the rest is never decoded or held. memenv's observations hold at most 1,000,000
#: characters, so none could show more of one message.
MAX_MESSAGE_CHARS = 1_000_000
# What the piecewise reader puts after a string it cut, then the count of characters cut (the nonce keeps real
# text from ever looking like it).
_CUT_TAG = f"\x00cut-{secrets.token_hex(8)}:"
QUESTIONS_FILE = os.path.join("probing_questions", "probing_questions.json")


# ---------------------------------------------------------------------------------------------------- types
@dataclass(frozen=True)
class BeamMessage:
    role: str
    id: int | str
    index: int | str
    content: str
    time_anchor: str | None = None
    question_type: str | None = None
    speaker: str | None = None  # a named speaker (LoCoMo/MemDialog conversations); BEAM's are the roles
    cut_chars: int = 0  # characters of the content not loaded (see MAX_MESSAGE_CHARS); the content ends with cut_marker()

    def render(self) -> str:
        """``User (#id): content`` (the line the env shows; the speaker's name instead of the role if set)."""
        return f"{self.speaker or self.role.capitalize()} (#{self.id}): {self.content}"


@dataclass(frozen=True)
class BeamBatch:
    """One batch of ``chat.json`` (one session of the env): its turns, each a tuple of messages."""

    position: int  # 0-based position in chat.json
    number: int | str
    time_anchor: str
    turns: tuple[tuple[BeamMessage, ...], ...]

    @property
    def messages(self) -> list[BeamMessage]:
        return [m for turn in self.turns for m in turn]

    @property
    def n_tokens(self) -> int:
        return sum(len(m.content.split()) for turn in self.turns for m in turn)

    def to_json(self) -> dict[str, Any]:
        def message(m: BeamMessage) -> dict[str, Any]:
            out = {"role": m.role, "id": m.id, "index": m.index, "content": m.content}
            if m.time_anchor is not None:
                out["time_anchor"] = m.time_anchor
            if m.question_type is not None:
                out["question_type"] = m.question_type
            return out
        return {"batch_number": self.number, "time_anchor": self.time_anchor,
                "turns": [[message(m) for m in turn] for turn in self.turns]}


# ---------------------------------------------------------------------------------------------------- loader
def cut_marker(cut: int) -> str:
    """What ends the content of a message cut at load: how many characters were not loaded."""
    return f" [... {cut:,} more characters of this message not loaded]"  # ASCII: an ASCII text stays 1 byte a character


def _cut_content(content: str, limit: int) -> tuple[str, int]:
    """``content`` within ``limit`` characters (plus :func:`cut_marker`), and the number of characters cut."""
    if len(content) <= limit:
        return content, 0
    rest = content[limit:limit + len(_CUT_TAG) + 20]
    cut = int(rest[len(_CUT_TAG):]) if rest.startswith(_CUT_TAG) else len(content) - limit
    return content[:limit] + cut_marker(cut), cut


# The release ends each user message with its "B,T" index ("...->-> 1,1"); the index is kept in ``index``.
_INDEX_MARKER = re.compile(r"\s*->->\s*\d+\s*,\s*\d+\s*$")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:59] + "…"


def _where(path: Path, position: int, number: Any = None) -> str:
    label = f"{path}: batch {position}"
    return label + (f" (batch_number {_short(number)})" if number is not None else "")


def _parse_batch(raw: Any, path: Path, position: int, max_message_chars: int = MAX_MESSAGE_CHARS) -> BeamBatch:
    if not isinstance(raw, dict):
        raise DataFormatError(f"{_where(path, position)}: expected an object, got {type(raw).__name__}")
    number = raw.get("batch_number")
    where = _where(path, position, number)
    for key in ("batch_number", "turns"):
        if key not in raw:
            raise DataFormatError(f"{where}: missing key {key!r}")
    if isinstance(number, bool) or not isinstance(number, (int, str)):
        raise DataFormatError(f"{where}: batch_number must be an integer or a string, got {_short(number)}")
    anchor = raw.get("time_anchor")
    if anchor is not None and not isinstance(anchor, str):
        raise DataFormatError(f"{where}: time_anchor must be a string or null, got {type(anchor).__name__}")
    turns_raw = raw["turns"]
    if not isinstance(turns_raw, list):
        raise DataFormatError(f"{where}: turns must be a list of turns, got {type(turns_raw).__name__}")
    turns = []
    for t, turn in enumerate(turns_raw):
        if not isinstance(turn, list):
            raise DataFormatError(f"{where}, turn {t}: expected a list of messages, got {type(turn).__name__}")
        messages = []
        for k, msg in enumerate(turn):
            at = f"{where}, turn {t}, message {k}"
            if not isinstance(msg, dict):
                raise DataFormatError(f"{at}: expected an object, got {type(msg).__name__}")
            for key in ("role", "id", "content"):
                if key not in msg:
                    raise DataFormatError(f"{at}: missing key {key!r}")
            if msg["role"] not in ("user", "assistant"):
                raise DataFormatError(f"{at}: role must be 'user' or 'assistant', got {_short(msg['role'])}")
            if not isinstance(msg["content"], str):
                raise DataFormatError(f"{at}: content must be a string, got {type(msg['content']).__name__}")
            for key in ("id", "index"):
                value = msg.get(key, k)
                if isinstance(value, bool) or not isinstance(value, (int, str)):
                    raise DataFormatError(f"{at}: {key} must be an integer or a string, got {_type_name(value)}")
            for key in ("time_anchor", "question_type"):
                if msg.get(key) is not None and not isinstance(msg[key], str):
                    raise DataFormatError(f"{at}: {key} must be a string, got {_type_name(msg[key])}")
            content, cut = _cut_content(msg["content"], max_message_chars)
            if msg["role"] == "user" and not cut:
                content = _INDEX_MARKER.sub("", content)
            messages.append(BeamMessage(msg["role"], msg["id"], msg.get("index", k), content,
                                        msg.get("time_anchor"), msg.get("question_type"), cut_chars=cut))
        turns.append(tuple(messages))
    if anchor is None:  # the release's batches carry none: the first message anchor of the batch, if any
        anchor = next((m.time_anchor for turn in turns for m in turn if m.time_anchor), "")
    return BeamBatch(position, number, anchor, tuple(turns))


def iter_chat_batches(path: str | os.PathLike, read_size: int = 1 << 16,
                      max_message_chars: int = MAX_MESSAGE_CHARS) -> Iterator[BeamBatch]:
    """Stream the batches of a BEAM ``chat.json`` one at a time (memory: one batch plus the read buffer).

    A message longer than ``max_message_chars`` characters keeps its first ``max_message_chars`` and a marker
    with the count of the rest (:func:`cut_marker`); the rest is never decoded or held, so a single huge
    message costs O(``max_message_chars``) memory, not its size.

    Raises :class:`FileNotFoundError` for a missing file and :class:`DataFormatError` naming the file and the
    batch for invalid JSON, a truncated file, or a batch, turn or message of the wrong shape.
    """
    path = Path(path)
    decoder = json.JSONDecoder()
    with open(path, encoding="utf-8-sig") as f:
        reader = _ChatReader(f, path, read_size)
        reader.skip_ws()
        if reader.pos >= len(reader.buf):
            raise DataFormatError(f"{path}: empty file (expected a JSON array of batches)")
        if reader.buf[reader.pos] != "[":
            raise DataFormatError(f"{path}: expected a JSON array of batches, found {reader.buf[reader.pos]!r} "
                                  "at the start")
        reader.pos += 1
        reader.skip_ws()
        if reader.pos < len(reader.buf) and reader.buf[reader.pos] == "]":
            return
        while True:
            reader.skip_ws()
            raw = reader.batch(decoder, max_message_chars)
            yield _parse_batch(raw, path, reader.position, max_message_chars)
            reader.position += 1
            reader.skip_ws()
            position, buf, pos = reader.position, reader.buf, reader.pos
            if pos >= len(buf):
                raise DataFormatError(f"{path}: truncated after batch {position - 1} (missing ']')")
            if buf[pos] == ",":
                reader.pos += 1
                continue
            if buf[pos] == "]":
                reader.pos += 1
                reader.skip_ws()
                if reader.pos < len(reader.buf):
                    raise DataFormatError(f"{path}: unexpected data after the JSON array")
                return
            raise DataFormatError(f"{path}: after batch {position - 1}: expected ',' or ']', found {buf[pos]!r}")


# A batch still unfinished after this many buffered characters is read piece by piece (_ChatReader.huge_batch).
_HUGE_BATCH_CHARS = 1 << 20
_STRUCTURE = re.compile(r'["\[\]{},]')
# An escape that a piece must not end with: a \\u escape not yet complete, or the high half of a surrogate pair.
_TAIL_ESCAPE = re.compile(r'\\u(?:[0-9a-fA-F]{0,3}|[dD][89abAB][0-9a-fA-F]{2})$')


class _ChatReader:
    """The read buffer of :func:`iter_chat_batches`: text read from ``chat.json`` and the parse position in it."""

    def __init__(self, f: Any, path: Path, read_size: int) -> None:
        self.f, self.path, self.read_size = f, path, read_size
        self.buf, self.pos, self.eof = "", 0, False
        self.position = 0  # the batch being read

    def fill(self, size: int | None = None) -> bool:
        """Append up to ``size`` characters, dropping what lies before ``pos``; False at the end of the file."""
        try:
            data = self.f.read(size or self.read_size)
        except UnicodeDecodeError as err:
            raise DataFormatError(f"{self.path}: not UTF-8 text ({err.reason}), reading batch {self.position}") from None
        if not data:
            self.eof = True
            return False
        buf = self.buf[self.pos:]
        self.buf = ""  # the only reference left is ``buf``: CPython then appends in place instead of copying
        buf += data
        self.buf, self.pos = buf, 0
        return True

    def skip_ws(self) -> None:
        while True:
            buf, pos = self.buf, self.pos
            while pos < len(buf) and buf[pos] in " \t\r\n":
                pos += 1
            self.pos = pos
            if pos < len(buf) or not self.fill():
                return

    def batch(self, decoder: json.JSONDecoder, limit: int) -> Any:
        """The JSON value of the batch at ``pos``: decoded whole while it fits in a few MB of buffer, else read
        piece by piece (:meth:`huge_batch`)."""
        chunk = self.read_size
        while True:
            failed = None
            try:
                raw, end = decoder.raw_decode(self.buf, self.pos)
            except RecursionError:
                raise DataFormatError(f"{_where(self.path, self.position)}: {_TOO_DEEP}") from None
            except json.JSONDecodeError as err:
                failed = err.msg  # the error holds the whole buffer: let it go before the buffer grows
            if failed is None:
                self.pos = end
                if end > self.read_size:  # do not keep a big batch's text alive while the batch is used
                    self.buf, self.pos = self.buf[end:], 0
                return raw
            # The batch runs past the buffer: read more, doubling the read size so a big batch costs O(size)
            # reads rather than O(size^2 / read_size); past _HUGE_BATCH_CHARS, piece by piece.
            chunk = chunk * 2
            if len(self.buf) - self.pos + chunk > _HUGE_BATCH_CHARS and not self.eof:
                return self.huge_batch(limit)
            if self.eof or not self.fill(chunk):
                raise DataFormatError(f"{_where(self.path, self.position)}: invalid or truncated JSON ({failed})")

    def huge_batch(self, limit: int) -> Any:
        """A batch too big for the buffer, read by its structure: string literals one by one (each cut to
        ``limit`` characters, :meth:`literal`), the text between them as is; the result is then decoded."""
        out: list[str] = []
        depth = 0
        while True:
            match = _STRUCTURE.search(self.buf, self.pos)
            if match is None:
                out.append(self.buf[self.pos:])
                self.pos = len(self.buf)
                if not self.fill(1 << 18):
                    raise DataFormatError(f"{_where(self.path, self.position)}: invalid or truncated JSON "
                                          "(the file ends inside the batch)")
                continue
            char = match.group()
            out.append(self.buf[self.pos:match.start()])
            self.pos = match.start()
            if char == '"':
                out.append(self.literal(limit))
                if depth == 0:
                    break
                continue
            if depth == 0 and char in ",]":  # a batch that is a bare number or word: _parse_batch names it
                break
            depth += 1 if char in "[{" else -1 if char in "]}" else 0
            out.append(char)
            self.pos += 1
            if depth == 0:
                break
        try:
            return json.loads("".join(out))
        except RecursionError:
            raise DataFormatError(f"{_where(self.path, self.position)}: {_TOO_DEEP}") from None
        except json.JSONDecodeError as err:
            raise DataFormatError(f"{_where(self.path, self.position)}: invalid JSON ({err.msg})") from None

    def literal(self, limit: int) -> str:
        """The JSON string literal at ``pos`` as JSON text: as it is when it decodes to at most ``limit``
        characters, else its first ``limit`` characters, :data:`_CUT_TAG` and the number of characters cut.
        Decoded piece by piece as it is read (memory: ``limit`` characters plus one read)."""
        start = self.pos
        self.pos += 1
        head: list[str] = []
        kept = cut = 0
        while True:
            buf = self.buf
            end = _closing_quote(buf, self.pos)
            closed = end >= 0
            if closed and not head and end - start - 1 <= limit:  # short and whole: decoded length <= raw length
                self.pos = end + 1
                return buf[start:end + 1]
            if not closed:  # never cut inside an escape or between the halves of a surrogate pair
                end = len(buf) - (_backslashes_before(buf, len(buf)) % 2)
                end = _safe_end(buf, self.pos, end)
            if end > self.pos:
                try:
                    text = json.loads('"' + buf[self.pos:end] + '"')
                except json.JSONDecodeError as err:
                    raise DataFormatError(f"{_where(self.path, self.position)}: invalid JSON in a string "
                                          f"({err.msg})") from None
                if kept < limit:
                    head.append(text)
                    kept += len(text)
                else:
                    cut += len(text)
                self.pos = end
            if closed:
                self.pos += 1
                break
            if not self.fill(1 << 18):
                raise DataFormatError(f"{_where(self.path, self.position)}: invalid or truncated JSON "
                                      "(the file ends inside a string)")
        value = "".join(head)
        if len(value) > limit:
            cut += len(value) - limit
            value = value[:limit]
        return json.dumps(value + (f"{_CUT_TAG}{cut}" if cut else ""), ensure_ascii=False)


def _closing_quote(buf: str, pos: int) -> int:
    """The index of the first unescaped ``"`` at or after ``pos``, or -1."""
    while True:
        i = buf.find('"', pos)
        if i < 0 or _backslashes_before(buf, i) % 2 == 0:
            return i
        pos = i + 1


def _backslashes_before(text: str, i: int) -> int:
    j = i
    while j > 0 and text[j - 1] == "\\":
        j -= 1
    return i - j


def _safe_end(buf: str, lo: int, end: int) -> int:
    """``end``, moved back before an escape that is incomplete or the first half of a surrogate pair."""
    for _ in range(2):  # a high surrogate may come right before an incomplete low one
        tail = _TAIL_ESCAPE.search(buf, max(lo, end - 12), end)
        if tail is None or _backslashes_before(buf, tail.start()) % 2:
            break
        end = tail.start()
    return end


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


@dataclass
class BeamConversation:
    """A BEAM conversation directory: its probing questions (loaded) and its batches (streamed on demand)."""

    path: Path
    questions: list[Question]
    n_batches: int
    n_messages: int
    n_tokens: int
    id: str = ""
    max_message_chars: int = MAX_MESSAGE_CHARS

    @classmethod
    def open(cls, path: str | os.PathLike, max_message_chars: int = MAX_MESSAGE_CHARS) -> "BeamConversation":
        """Check a directory's layout and count its batches in one streaming pass (nothing kept).

        ``n_tokens`` counts the whitespace tokens of the messages as loaded: a message longer than
        ``max_message_chars`` counts its first ``max_message_chars`` characters (see :func:`iter_chat_batches`)."""
        path = Path(path)
        chat, questions_file = conversation_files(path)
        for required in (chat, questions_file):
            if not required.is_file():
                raise FileNotFoundError(f"BEAM conversation {path}: missing {required.relative_to(path)}")
        n_batches = n_messages = n_tokens = 0
        for batch in iter_chat_batches(chat, max_message_chars=max_message_chars):
            n_batches += 1
            n_messages += sum(len(turn) for turn in batch.turns)
            n_tokens += batch.n_tokens
        if n_batches == 0:
            raise DataFormatError(f"{chat}: no batches")
        questions = load_probing_questions(questions_file, path.name)
        if not questions:
            raise DataFormatError(f"{questions_file}: no probing questions")
        return cls(path, questions, n_batches, n_messages, n_tokens, path.name, max_message_chars)

    def iter_batches(self, start: int = 0) -> Iterator[BeamBatch]:
        """The batches from position ``start`` on (earlier ones are parsed and dropped: the file is streamed)."""
        return (b for b in iter_chat_batches(self.path / CHAT_FILE, max_message_chars=self.max_message_chars)
                if b.position >= start)


def conversation_files(path: str | os.PathLike) -> tuple[Path, Path]:
    """The files of a conversation directory that :class:`BeamConversation` reads: its chat and its probing
    questions (a cache of conversations keys on both)."""
    return Path(path) / CHAT_FILE, Path(path) / QUESTIONS_FILE


@dataclass
class ConversationSource:
    """A :class:`tasks.conversations.Conversation` (MemDialog's synthetic ones, LoCoMo) seen as a BEAM chat:
    one batch per session, one message per dialogue turn (``id`` = its ``dia_id``, the speaker's name shown), the
    questions with ``meta["ability"]`` = their type, ``rubric`` = the gold answer and ``evidence`` = the
    ``supporting_ids``. So the tools mode and its strategies run on MemDialog and LoCoMo conversations too."""

    conversation: Conversation
    questions: list[Question] = field(init=False)

    def __post_init__(self) -> None:
        self.id = self.conversation.id
        self.n_batches = len(self.conversation.sessions)
        self.n_messages = self.conversation.n_turns
        self.questions = [Question(q.id, q.question, q.answers, q.supporting_ids, q.hops, q.kind,
                                   {**q.meta, "ability": q.kind, "rubric": [q.answers[0]],
                                    "evidence": list(q.supporting_ids), "abstention": bool(q.meta.get("abstention"))})
                          for q in self.conversation.questions]
        first = self.conversation.speakers[0] if self.conversation.speakers else None
        self._roles = {first: "user"}

    def iter_batches(self, start: int = 0) -> Iterator[BeamBatch]:
        for position, session in enumerate(self.conversation.sessions[start:], start):
            turns = tuple((BeamMessage(self._roles.get(t.speaker, "assistant"), t.dia_id or f"{position}:{k}", k,
                                       t.text, session.date, speaker=t.speaker),)
                          for k, t in enumerate(session.turns))
            yield BeamBatch(position, session.index, session.date, turns)


class BatchStream:
    """An iterator over a chat's batches that survives pickling (vector envs copy envs mid-episode): it keeps
    the source and the next position; after unpickling it re-opens the source there."""

    def __init__(self, source: "BeamConversation | SyntheticBeamChat", start: int = 0) -> None:
        self.source = source
        self.next_position = start
        self._iterator: Iterator[BeamBatch] | None = None

    def __iter__(self) -> "BatchStream":
        return self

    def __next__(self) -> BeamBatch:
        if self._iterator is None:
            self._iterator = self.source.iter_batches(self.next_position)
        batch = next(self._iterator)
        self.next_position = batch.position + 1
        return batch

    def __getstate__(self) -> dict[str, Any]:
        return {"source": self.source, "next_position": self.next_position, "_iterator": None}


def find_conversations(data_path: str | os.PathLike) -> list[Path]:
    """The conversation directories under ``data_path``: itself when it holds ``chat.json``, else every
    folder below it that does (sorted, numbers in names compared as numbers)."""
    root = Path(data_path)
    if not root.exists():
        raise FileNotFoundError(f"BEAM data_path not found: {root}")
    if (root / CHAT_FILE).is_file():
        return [root]
    found = [Path(d) for d, _, files in os.walk(root) if CHAT_FILE in files]
    if not found:
        raise FileNotFoundError(f"no BEAM conversation under {root}: expected <dir>/{CHAT_FILE} and <dir>/{QUESTIONS_FILE}")

    def key(p: Path) -> list:
        return [int(part) if part.isdigit() else part for part in p.relative_to(root).parts]
    return sorted(found, key=key)


# ---------------------------------------------------------------------------------------------------- synthetic
_NAMES = ("Maya", "Jonas", "Priya", "Tomas", "Lena", "Omar", "Sofia", "Ravi", "Elena", "Kenji", "Noor", "Felix",
          "Ines", "Marco", "Zara", "Hugo", "Leila", "Arjun", "Clara", "Mateo")
_RELATIONS = ("sister", "brother", "cousin", "manager", "mentor", "landlord", "dentist", "neighbour", "roommate",
              "accountant", "coach", "tutor")
_COUNTRIES = ("Japan", "Peru", "Iceland", "Kenya", "Portugal", "Vietnam", "Norway", "Morocco", "Chile", "Greece")
_ITEMS = ("gym membership", "phone plan", "parking spot", "streaming bundle", "music lessons", "storage unit",
          "language course", "bike insurance")
_PROJECTS = ("garden shed", "mobile app", "kitchen remodel", "podcast", "novel draft", "wedding plan",
             "science fair robot", "community mural")
_MILESTONES = ("drew the first sketches", "bought the materials", "built the frame", "painted everything",
               "tested the prototype", "showed it to friends", "fixed the last bugs", "published the result")
_COURSES = ("pottery course", "sailing licence", "first aid training", "Spanish module", "coding bootcamp",
            "photography workshop", "yoga teacher training", "baking class")
_BOOKS = ("The Silent Harbor", "Glass Orchards", "Northern Lanterns", "The Copper Key", "Paper Moons",
          "The Last Cartographer", "Salt and Cedar", "Winter Arithmetic")
_PREFERENCES = (("window seats", "aisle seats", "a seat for my flight"), ("green tea", "coffee", "a drink for my morning"),
                ("paperback books", "e-books", "a format for my next book"), ("trains", "planes", "a way to travel to the coast"),
                ("morning workouts", "evening workouts", "a time for my workout"), ("vegetarian dishes", "meat dishes", "a dish for dinner"))
_INSTRUCTIONS = (("my budget", "always state amounts in euros"), ("my travel plans", "always list the departure time first"),
                 ("my workouts", "always include a rest day"), ("my reading list", "always give the page count"),
                 ("my schedule", "always mention the time zone CET"), ("my recipes", "always give quantities in grams"))
_UNMENTIONED = ("godmother", "piano teacher", "business partner", "pen pal", "veterinarian", "wedding planner")
_TOPICS = ("sourdough bread", "a home network", "houseplants", "a budget spreadsheet", "a bicycle chain", "a job interview",
           "a vegetable bed", "a compost bin", "a slide deck", "a camping trip", "a resume", "noise in the attic",
           "a leaking tap", "a chess opening", "a birthday party", "a laptop battery")
_FILLER = (
    "The first step is to gather what you need and set aside enough time so that nothing feels rushed.",
    "Many people find it helps to write the plan down and check each part off as it is done.",
    "If something goes wrong, pause, look at what changed last, and undo that change before trying again.",
    "A small test run on a tiny scale saves a lot of trouble compared with doing everything at once.",
    "Keep notes of the settings you used, because the details are easy to forget after a few weeks.",
    "Quality matters more than speed here, and patience usually pays off in the final result.",
    "It is worth comparing two or three options before committing, since prices and features vary a lot.",
    "Ask someone with experience for a second opinion when a decision is expensive to reverse.",
    "Regular maintenance prevents most problems, so a short monthly check is a good habit.",
    "Safety comes first: wear protection, work in good light, and keep tools out of reach of children.",
    "The instructions from the manufacturer are the best reference when in doubt about a specific model.",
    "Breaking the task into smaller steps makes it easier to see progress and stay motivated.",
    "Common mistakes include skipping the preparation and using the wrong size or amount of material.",
    "Online forums often have detailed walkthroughs with photos that make each step clearer.",
    "Once the basics work, you can refine the details and adjust them to your own taste.",
    "Budget a little extra for surprises, since small costs tend to add up along the way.",
)
_USER_OPENERS = ("Can you explain how to handle {t}?", "I have a question about {t}.", "What is the best way to deal with {t}?",
                 "Could you give me tips on {t}?", "I was wondering about {t} today.")
# First-person statements in filler messages that look like facts but are never asked about: they compete
# with the real facts for a relevance-pruned store and for retrieval.
_DISTRACTORS = ("My neighbour {n} just adopted a {a}.", "My colleague's name is {n}, and she loves {a}s.",
                "My {thing} costs {k} dollars a year.", "Today I cleaned the {thing} with my friend {n}.",
                "I much prefer {a}s over cats, says my friend {n}.", "My classmate {n} visited Oslo last {month}.",
                "I have never tried to repair a {thing} before.", "This week I finally sorted my {thing} receipts.")
_ANIMALS = ("parrot", "beagle", "hamster", "tortoise", "kitten", "goldfish")
_THINGS = ("garage", "bike", "balcony", "printer", "attic", "car seat", "desk", "aquarium")
_MONTHS = ("January", "March", "June", "October")
_ACKS = ("Thanks for telling me, I will keep that in mind.", "Noted, that is good to know.",
         "Got it, I will remember that for later.", "Thank you for the update.")


@dataclass(frozen=True)
class _Fact:
    batch: int
    text: str  # the user's sentence that carries the fact
    key: str   # which question(s) it supports


def _days(a: str, b: str) -> int:
    return (_dt.date.fromisoformat(b) - _dt.date.fromisoformat(a)).days


@dataclass
class SyntheticBeamChat:
    """A seeded synthetic BEAM conversation of about ``chat_tokens`` whitespace tokens, rendered lazily.

    ``iter_batches()`` renders batch after batch from a per-batch seed (memory: one batch);
    :func:`write_beam_directory` writes the same chat in BEAM's layout. ``questions`` holds
    ``questions_per_ability`` questions for each of the ten abilities (see the module docstring).
    """

    seed: int
    chat_tokens: int = 128_000
    questions_per_ability: int = 2
    batch_tokens: int = 2_000
    start_date: str = "2024-01-01"
    days: int = 365
    questions: list[Question] = field(init=False)
    n_batches: int = field(init=False)
    id: str = field(init=False)

    def __post_init__(self) -> None:
        if not isinstance(self.chat_tokens, int) or self.chat_tokens < 4_000:
            raise ValueError(f"chat_tokens must be an int >= 4000, got {self.chat_tokens!r}")
        if not isinstance(self.questions_per_ability, int) or not 1 <= self.questions_per_ability <= 4:
            raise ValueError(f"questions_per_ability must be an int in 1..4, got {self.questions_per_ability!r}")
        self.n_batches = max(8, self.chat_tokens // self.batch_tokens)
        self._batch_budget = self.chat_tokens // self.n_batches  # <= batch_tokens: short chats get shorter batches
        self.id = f"synthetic-{self.seed}-{self.chat_tokens}"
        self._plan()

    # ------------------------------------------------------------------ plan (facts and questions, no text)
    def date(self, batch: int) -> str:
        start = _dt.date.fromisoformat(self.start_date)
        return (start + _dt.timedelta(days=batch * self.days // self.n_batches)).isoformat()

    def _plan(self) -> None:
        rng = np.random.default_rng([self.seed, 0])
        B, n = self.n_batches, self.questions_per_ability
        user = str(rng.choice(_NAMES))
        self.user = user
        facts: list[_Fact] = []
        qs: list[Question] = []

        def when(lo: float, hi: float) -> int:  # a batch in the [lo, hi) fraction of the chat
            return int(rng.integers(int(lo * B), max(int(lo * B) + 1, int(hi * B))))

        def add(ability: str, i: int, question: str, reference: str, rubric: list[str], evidence: list[str], **meta) -> None:
            qs.append(Question(id=f"{self.id}/{ability}/{i}", question=question, answers=(reference,), kind=ability,
                               meta={"ability": ability, "reference_key": _WRITE_KEY[ability], "rubric": rubric,
                                     "difficulty": meta.pop("difficulty", "medium"), "evidence": evidence,
                                     "compliance_indicators": meta.pop("indicators", []),
                                     "abstention": ability == "abstention", "index": i, **meta}))

        def fact(batch: int, text: str, key: str) -> str:
            facts.append(_Fact(batch, text, key))
            return key

        pick = lambda pool, k: [pool[int(j)] for j in rng.choice(len(pool), size=k, replace=False)]  # noqa: E731
        relations = pick(_RELATIONS, 2 * n)
        names = pick(_NAMES, 2 * n + 1)
        for i in range(n):  # information extraction: a relative's name
            rel, name = relations[i], names[i]
            key = fact(when(0, 0.9), f"My {rel}'s name is {name}, by the way.", f"ie{i}")
            add("information_extraction", i, f"What is the name of my {rel}?", name, [name], [key])
        items = pick(_ITEMS, n)
        for i, item in enumerate(items):  # knowledge update: a price that changes
            old, new = int(rng.integers(10, 60)), int(rng.integers(61, 120))
            k1 = fact(when(0, 0.4), f"My {item} costs {old} dollars a month.", f"ku{i}a")
            k2 = fact(when(0.5, 0.95), f"Update: my {item} now costs {new} dollars a month.", f"ku{i}b")
            add("knowledge_update", i, f"How much does my {item} cost per month now?", f"{new} dollars",
                [f"{new} dollars"], [k1, k2], old_value=f"{old} dollars")
        countries = pick(_COUNTRIES, n)
        for i, country in enumerate(countries):  # contradiction: never been vs visited
            k1 = fact(when(0, 0.45), f"I have never been to {country} in my life.", f"cr{i}a")
            k2 = fact(when(0.5, 0.95), f"I loved the food when I visited {country} last spring.", f"cr{i}b")
            add("contradiction_resolution", i, f"Have I ever been to {country}?",
                f"There is contradictory information: you said you have never been to {country}, but you also "
                f"mentioned that you visited {country} last spring. Could you clarify which is correct?",
                [f"never been to {country}", f"visited {country} last spring"], [k1, k2])
        projects = pick(_PROJECTS, 2 * n)
        for i in range(n):  # event ordering: four milestones of a project, in chat order
            project = projects[i]
            steps = pick(_MILESTONES, 4)
            batches = sorted(when(0, 0.95) for _ in range(4))
            keys = [fact(b, f"Today I {s} for my {project} project.", f"eo{i}{j}") for j, (b, s) in enumerate(zip(batches, steps))]
            add("event_ordering", i, f"In what order did I complete the steps of my {project} project?",
                "\n".join(f"{j + 1}. {s}" for j, s in enumerate(steps)), list(steps), keys, order=list(steps))
        for i in range(n):  # summarization: a second project's milestones
            project = projects[n + i]
            steps = pick(_MILESTONES, 3)
            keys = [fact(when(0, 0.95), f"This week I {s} for my {project} project.", f"su{i}{j}") for j, s in enumerate(steps)]
            add("summarization", i, f"Can you summarize what I told you about my {project} project?",
                f"For your {project} project you " + ", then ".join(steps) + ".",
                [f"{project} project"] + list(steps), keys)
        courses = pick(_COURSES, n)
        for i, course in enumerate(courses):  # temporal reasoning: days between start and finish
            b1 = when(0, 0.45)
            b2 = when(0.5, 0.95)
            k1 = fact(b1, f"I started my {course} today.", f"tr{i}a")
            k2 = fact(b2, f"I finished my {course} today.", f"tr{i}b")
            days = _days(self.date(b1), self.date(b2))
            add("temporal_reasoning", i, f"How many days did it take me to finish my {course}?", f"{days} days",
                [f"{days} days"], [k1, k2])
        for i in range(n):  # multi-session reasoning: count things read across sessions
            count = 2 + i % 2
            chosen = pick(_BOOKS, count)
            tag = ("novel", "comic", "cookbook", "biography")[i]
            keys = [fact(when(0, 0.95), f"I just read the {tag} {b} and liked it.", f"ms{i}{j}") for j, b in enumerate(chosen)]
            add("multi_session_reasoning", i, f"How many different {tag}s did I tell you I read?",
                f"{count} {tag}s: " + ", ".join(chosen), [f"{count} {tag}s"] + list(chosen), keys)
        prefs = pick(list(range(len(_PREFERENCES))), n)
        for i, p in enumerate(prefs):  # preference following
            liked, disliked, ask = _PREFERENCES[p]
            key = fact(when(0, 0.8), f"I much prefer {liked} over {disliked}.", f"pf{i}")
            add("preference_following", i, f"Can you recommend {ask}?", f"Recommends {liked}, not {disliked}.",
                [liked], [key], indicators=[liked])
        instr = pick(list(range(len(_INSTRUCTIONS))), n)
        for i, p in enumerate(instr):  # instruction following
            topic, rule = _INSTRUCTIONS[p]
            key = fact(when(0, 0.8), f"From now on, whenever we talk about {topic}, {rule}.", f"if{i}")
            add("instruction_following", i, f"Can you help me with {topic} this week?",
                f"The answer should follow the instruction: {rule}.", [rule], [key], indicators=[rule])
        absent = pick(_UNMENTIONED, n)
        for i, who in enumerate(absent):  # abstention: never mentioned
            add("abstention", i, f"What is the name of my {who}?",
                f"Based on the chat, there is no information available about your {who}.",
                ["there is no information available"], [])
        self._facts: dict[int, list[_Fact]] = {}
        for f in facts:
            self._facts.setdefault(f.batch, []).append(f)
        self.questions = sorted(qs, key=lambda q: (ABILITIES.index(q.kind), q.meta["index"]))
        self._keys = {}  # filled while rendering: fact key -> message id (ids are deterministic per batch)
        # Message ids are <batch>*1000 + k so evidence ids are known without rendering anything.
        for batch, fs in self._facts.items():
            for j, f in enumerate(fs):
                self._keys[f.key] = str(batch * 1000 + 2 * j)
        for q in self.questions:
            q.meta["evidence"] = [self._keys[k] for k in q.meta["evidence"]]

    # ------------------------------------------------------------------ rendering
    @property
    def n_tokens(self) -> int:
        """The planned length (rendered batches overshoot it by at most one message each)."""
        return self.n_batches * self._batch_budget

    def render_batch(self, b: int) -> BeamBatch:
        """Batch ``b`` (0-based), rendered from its own seed: the same text every time."""
        if not 0 <= b < self.n_batches:
            raise IndexError(f"batch must be in 0..{self.n_batches - 1}, got {b}")
        rng = np.random.default_rng([self.seed, 1, b])
        date = self.date(b)
        turns, next_id, budget = [], b * 1000, self._batch_budget

        def message(role: str, text: str) -> BeamMessage:
            nonlocal next_id, budget
            m = BeamMessage(role, str(next_id), next_id - b * 1000, text, date)
            next_id += 1
            budget -= len(text.split())
            return m

        for f in self._facts.get(b, ()):  # fact turns first so their ids are predictable (see _plan)
            opener = str(rng.choice(_USER_OPENERS)).format(t=str(rng.choice(_TOPICS)))
            turns.append((message("user", f"{f.text} {opener}"),
                          message("assistant", f"{rng.choice(_ACKS)} " + self._filler(rng, 60))))
        while budget > 0:
            topic = str(rng.choice(_TOPICS))
            ask = str(rng.choice(_USER_OPENERS)).format(t=topic)
            if rng.random() < 0.5:
                ask = str(rng.choice(_DISTRACTORS)).format(
                    n=str(rng.choice(_NAMES)), a=str(rng.choice(_ANIMALS)), thing=str(rng.choice(_THINGS)),
                    k=int(rng.integers(20, 400)), month=str(rng.choice(_MONTHS))) + " " + ask
            turns.append((message("user", ask),
                          message("assistant", f"Here is how to approach {topic}. " + self._filler(rng, min(900, max(40, budget))))))
        return BeamBatch(b, b + 1, date, tuple(turns))

    @staticmethod
    def _filler(rng: np.random.Generator, words: int) -> str:
        out, n = [], 0
        idx = rng.integers(len(_FILLER), size=max(1, words // 12 + 1))
        for i in idx:
            s = _FILLER[int(i)]
            out.append(s)
            n += s.count(" ") + 1
            if n >= words:
                break
        return " ".join(out)

    def iter_batches(self, start: int = 0) -> Iterator[BeamBatch]:
        for b in range(start, self.n_batches):
            yield self.render_batch(b)


def write_beam_directory(chat: SyntheticBeamChat | BeamConversation, path: str | os.PathLike) -> Path:
    """Write ``chat`` in BEAM's layout under ``path`` (``chat.json`` streamed batch by batch; each file
    written to a temporary sibling and renamed, so a reader never sees half a file)."""
    path = Path(path)
    (path / "probing_questions").mkdir(parents=True, exist_ok=True)

    def atomic(target: Path, write) -> None:
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                write(f)
            os.replace(tmp, target)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    def write_chat(f) -> None:
        f.write("[")
        for i, batch in enumerate(chat.iter_batches()):
            f.write(("," if i else "") + "\n" + json.dumps(batch.to_json()))
        f.write("\n]\n")

    def write_questions(f) -> None:
        by_ability: dict[str, list[dict]] = {}
        for q in chat.questions:
            item = {"question": q.question, q.meta.get("reference_key", "answer"): q.answers[0],
                    "rubric": list(q.meta.get("rubric", [])), "difficulty": q.meta.get("difficulty"),
                    "evidence": list(q.meta.get("evidence", []))}
            if q.meta.get("compliance_indicators"):
                item["compliance_indicators"] = list(q.meta["compliance_indicators"])
            if "order" in q.meta:
                item["order"] = list(q.meta["order"])
            by_ability.setdefault(q.kind, []).append(item)
        json.dump(by_ability, f, indent=1)

    atomic(path / CHAT_FILE, write_chat)
    atomic(path / QUESTIONS_FILE, write_questions)
    return path
