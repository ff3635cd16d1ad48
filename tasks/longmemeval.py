"""LongMemEval (Wu et al., ICLR 2025): a streaming loader for its official files (oracle, S and M variants).

Official layout, one JSON array of items (``longmemeval_oracle.json``, ``longmemeval_s*.json``,
``longmemeval_m*.json`` share it)::

    {"question_id": str ("..._abs": abstention), "question_type": str (QUESTION_TYPES), "question": str,
     "answer": str | number (a rubric for single-session-preference; an explanation for abstention items),
     "question_date": "2023/05/28 (Sun) 19:47", "haystack_dates": [str], "haystack_session_ids": [str],
     "haystack_sessions": [[{"role": "user"|"assistant", "content": str, "has_answer"?: bool}, ...], ...],
     "answer_session_ids": [str]}

Memory: an M item holds ~500 sessions (~1.5M tokens), the M file ~2.7 GB. Nothing here holds a file or an item:
:func:`index_longmemeval` reads the file once, session by session, and keeps per item only its fields other than
the sessions, the counts, the evidence turn ids and the byte offset where the item starts;
:meth:`LongMemEvalSource.iter_batches` seeks there and decodes one session at a time. So playing an item costs
about one session of memory whatever its size (``benchmarks/longmemeval_rss.py`` measures it).

Mapping onto the BEAM env's task source (:class:`tasks.beam.BeamBatch`): a session is a batch (its date the
``haystack_dates`` entry), each turn one message with id ``"S:T"`` (1-based session and turn numbers); the item's
one question is a :class:`~tasks.types.Question` with ``kind`` = ``question_type``, ``answers[0]`` = the answer
(numbers as :func:`tasks.types.answer_text` writes them: ``3.0`` -> ``"3"``) and ``meta``: ``ability`` (the
type), ``abstention`` (``_abs`` in the id), ``question_date``, ``evidence`` (the ids of the ``has_answer`` turns),
``answer_session_ids``, ``rubric`` (``[answer]``).

Malformed input raises :class:`~tasks.types.DataFormatError` naming the file, the item (0-based position and
``question_id``) and the field: not UTF-8, not a JSON array, invalid or truncated JSON, a missing field, a wrong
type, an empty answer or a list as the answer (one value per item), an item without sessions, an unknown ``question_type``, dates or ids that do not match the
sessions, a repeated ``question_id``.
"""

from __future__ import annotations

import codecs
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tasks.beam import MAX_MESSAGE_CHARS, BeamBatch, BeamMessage
from tasks.types import DataFormatError, Question, file_stamps, gold_answer_text

__all__ = ["QUESTION_TYPES", "LongMemEvalItem", "LongMemEvalSource", "index_longmemeval", "iter_item_sessions",
           "write_synthetic_longmemeval"]

QUESTION_TYPES = ("single-session-user", "single-session-assistant", "single-session-preference",
                  "temporal-reasoning", "knowledge-update", "multi-session")
_REQUIRED = ("question_id", "question_type", "question", "answer", "question_date", "haystack_dates",
             "haystack_session_ids", "haystack_sessions")
_SCALAR_START = re.compile(r"[-0-9A-Za-z.+]+")
_READ = 1 << 16


@dataclass(frozen=True)
class LongMemEvalItem:
    """One item without its sessions (what :func:`index_longmemeval` keeps)."""

    position: int
    offset: int  # byte offset of the item's "{" in the file
    question_id: str
    question_type: str
    question: str
    answer: str
    question_date: str
    haystack_dates: tuple[str, ...]
    haystack_session_ids: tuple[str, ...]
    answer_session_ids: tuple[str, ...]
    evidence: tuple[str, ...]  # "S:T" ids of the turns marked has_answer
    n_sessions: int
    n_messages: int
    n_tokens: int  # whitespace tokens of every turn's content

    @property
    def abstention(self) -> bool:
        return "_abs" in self.question_id


class _Stream:
    """A UTF-8 JSON text read in pieces from a binary file, with the byte offset of every position.

    ``buf[pos:]`` is the unread text; ``base`` is the byte offset of ``buf[0]``. :meth:`value` decodes the JSON
    value at ``pos`` with :class:`json.JSONDecoder`, reading more while it runs past the buffer (so memory is
    one value plus one read)."""

    def __init__(self, f: Any, path: Path, where: str, offset: int = 0) -> None:
        self.f, self.path, self.where = f, path, where
        self.decoder = codecs.getincrementaldecoder("utf-8")()
        self.json = json.JSONDecoder()
        self.buf, self.pos, self.base, self.eof = "", 0, offset, False

    def fail(self, message: str) -> None:
        raise DataFormatError(f"{self.path}: {self.where}: {message}")

    def fill(self, size: int = _READ) -> bool:
        if self.eof:
            return False
        data = self.f.read(size)
        try:
            text = self.decoder.decode(data, final=not data)
        except UnicodeDecodeError as err:
            raise DataFormatError(f"{self.path}: not UTF-8 text ({err.reason}) near byte "
                                  f"{self.base + len(self.buf.encode('utf-8', 'surrogatepass'))}") from None
        if self.pos:
            self.base += len(self.buf[:self.pos].encode("utf-8", "surrogatepass"))
        self.buf, self.pos = self.buf[self.pos:] + text, 0
        if not data:
            self.eof = True
        return bool(data) or bool(text)

    def offset(self) -> int:
        return self.base + len(self.buf[:self.pos].encode("utf-8", "surrogatepass"))

    def peek(self) -> str:
        """The next non-blank character ("" at the end of the file), not consumed."""
        while True:
            buf, pos = self.buf, self.pos
            while pos < len(buf) and buf[pos] in " \t\r\n":
                pos += 1
            self.pos = pos
            if pos < len(buf):
                return buf[pos]
            if not self.fill():
                return ""

    def expect(self, chars: str, what: str) -> str:
        char = self.peek()
        if not char or char not in chars:
            found = "the end of the file" if not char else repr(char)
            self.fail(f"expected {what}, found {found}")
        self.pos += 1
        return char

    def value(self) -> Any:
        self.peek()
        chunk = _READ
        while True:
            if self.pos < len(self.buf) and self.buf[self.pos] not in '"[{':  # a number or literal: whole first
                match = _SCALAR_START.match(self.buf, self.pos)
                if match and match.end() == len(self.buf) and self.fill():
                    continue
            try:
                value, end = self.json.raw_decode(self.buf, self.pos)
            except RecursionError:
                self.fail("invalid JSON: nested too deeply")
            except json.JSONDecodeError as err:
                # An error well inside the text read so far is a real one; one at its end may be a value the
                # buffer cuts (an unterminated string reports where the string starts): read more and retry.
                inside = err.pos < len(self.buf) - 8 and not err.msg.startswith("Unterminated string")
                if inside or not self.fill(chunk):
                    self.fail(f"invalid or truncated JSON ({err.msg})")
                chunk = min(chunk * 2, 1 << 24)
                continue
            self.pos = end
            return value


def _check_str(value: Any, name: str, stream: _Stream) -> str:
    if not isinstance(value, str):
        stream.fail(f"{name} must be a string, got {type(value).__name__}")
    return value


def _str_list(value: Any, name: str, stream: _Stream) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        stream.fail(f"{name} must be a list of strings, got {_short(value)}")
    return tuple(value)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:59] + "…"


def _check_session(raw: Any, s: int, stream: _Stream) -> list[dict]:
    if not isinstance(raw, list):
        stream.fail(f"haystack_sessions[{s}] must be a list of turns, got {type(raw).__name__}")
    for t, turn in enumerate(raw):
        at = f"haystack_sessions[{s}][{t}]"
        if not isinstance(turn, dict):
            stream.fail(f"{at} must be an object, got {type(turn).__name__}")
        for key in ("role", "content"):
            if key not in turn:
                stream.fail(f"{at}: missing key {key!r}")
        if turn["role"] not in ("user", "assistant"):
            stream.fail(f"{at}: role must be 'user' or 'assistant', got {_short(turn['role'])}")
        if not isinstance(turn["content"], str):
            stream.fail(f"{at}: content must be a string, got {type(turn['content']).__name__}")
        if not isinstance(turn.get("has_answer", False), bool):
            stream.fail(f"{at}: has_answer must be true or false, got {_short(turn['has_answer'])}")
    return raw


def _item_events(stream: _Stream) -> Iterator[tuple[str, Any, Any]]:
    """The members of the item object at the stream's position, in file order: ``("field", key, value)`` for
    every member but the sessions, ``("session", s, turns)`` for each session (one decoded at a time)."""
    stream.expect("{", "an item object")
    if stream.peek() == "}":
        stream.pos += 1
        return
    while True:
        key = stream.value() if stream.peek() == '"' else stream.fail("expected a member name (a string)")
        stream.expect(":", "':' after a member name")
        if key == "haystack_sessions" and stream.peek() == "[":
            stream.pos += 1
            s = 0
            yield "field", key, []  # the sessions follow, one event each
            if stream.peek() == "]":
                stream.pos += 1
            else:
                while True:
                    yield "session", s, _check_session(stream.value(), s, stream)
                    s += 1
                    if stream.expect(",]", "',' or ']' after a session") == "]":
                        break
        else:
            yield "field", key, stream.value()
        if stream.expect(",}", "',' or '}' after a member") == "}":
            return


def _item_from(fields: dict[str, Any], position: int, offset: int, counts: tuple[int, int, int, tuple[str, ...]],
               stream: _Stream) -> LongMemEvalItem:
    for key in _REQUIRED:
        if key not in fields:
            stream.fail(f"missing key {key!r}")
    qtype = _check_str(fields["question_type"], "question_type", stream)
    if qtype not in QUESTION_TYPES:
        stream.fail(f"unknown question_type {qtype!r}; valid: {', '.join(QUESTION_TYPES)}")
    question = _check_str(fields["question"], "question", stream)
    if not question.strip():
        stream.fail("empty question")
    try:
        answer = gold_answer_text(fields["answer"], lists=False)  # one value: a list is damage
    except (TypeError, ValueError) as err:
        stream.fail(f"answer: {err}")
    n_sessions, n_messages, n_tokens, evidence = counts
    if n_sessions == 0:
        stream.fail("haystack_sessions is empty: an item needs at least one session to read before its question")
    dates = _str_list(fields["haystack_dates"], "haystack_dates", stream)
    ids = _str_list(fields["haystack_session_ids"], "haystack_session_ids", stream)
    for name, values in (("haystack_dates", dates), ("haystack_session_ids", ids)):
        if len(values) != n_sessions:
            stream.fail(f"{name} has {len(values)} entries for {n_sessions} haystack_sessions")
    answer_ids = _str_list(fields.get("answer_session_ids", []), "answer_session_ids", stream)
    return LongMemEvalItem(position, offset, _check_str(fields["question_id"], "question_id", stream), qtype,
                           question, answer, _check_str(fields["question_date"], "question_date", stream), dates,
                           ids, answer_ids, evidence, n_sessions, n_messages, n_tokens)


def index_longmemeval(path: str | os.PathLike, limit: int | None = None) -> list[LongMemEvalItem]:
    """Every item of a LongMemEval file without its sessions, in one streaming pass (see the module docstring).

    ``limit`` stops after that many items. Raises :class:`FileNotFoundError` for a missing file and
    :class:`DataFormatError` naming the file and the item for anything malformed (nothing is skipped)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"LongMemEval file {'is a directory' if path.is_dir() else 'not found'}: {path}")
    items: list[LongMemEvalItem] = []
    seen: dict[str, int] = {}
    with open(path, "rb") as f:
        stream = _Stream(f, path, "start of the file")
        stream.fill()
        if stream.buf.startswith("\ufeff"):
            stream.pos = 1
        first = stream.peek()
        if not first:
            stream.fail("empty file (expected a JSON array of LongMemEval items)")
        stream.expect("[", "a JSON array of LongMemEval items")
        if stream.peek() == "]":
            stream.pos += 1
        else:
            while limit is None or len(items) < limit:
                position = len(items)
                stream.where = f"item {position}"
                stream.peek()
                offset = stream.offset()
                fields: dict[str, Any] = {}
                n_sessions = n_messages = n_tokens = 0
                evidence: list[str] = []
                for kind, key, value in _item_events(stream):
                    if kind == "field":
                        fields[key] = value
                        if key == "question_id" and isinstance(value, str):
                            stream.where = f"item {position} ({value})"
                    else:
                        n_sessions += 1
                        n_messages += len(value)
                        n_tokens += sum(len(turn["content"].split()) for turn in value)
                        evidence += [f"{key + 1}:{t + 1}" for t, turn in enumerate(value) if turn.get("has_answer")]
                item = _item_from(fields, position, offset, (n_sessions, n_messages, n_tokens, tuple(evidence)), stream)
                if item.question_id in seen:
                    stream.fail(f"duplicate question_id {item.question_id!r} (first at item {seen[item.question_id]})")
                seen[item.question_id] = position
                items.append(item)
                if stream.expect(",]", "',' or ']' after an item") == "]":
                    break
        if limit is None:
            stream.where = "after the last item"
            if stream.peek():
                stream.fail("unexpected data after the JSON array")
    if not items:
        raise DataFormatError(f"{path}: no LongMemEval items")
    return items


def iter_item_sessions(path: str | os.PathLike, item: LongMemEvalItem, start: int = 0) -> Iterator[tuple[int, list[dict]]]:
    """``(s, turns)`` for the sessions of ``item`` from 0-based session ``start`` on, decoded one at a time from
    its offset in ``path``."""
    path = Path(path)
    with open(path, "rb") as f:
        f.seek(item.offset)
        stream = _Stream(f, path, f"item {item.position} ({item.question_id})", item.offset)
        for kind, s, turns in _item_events(stream):
            if kind == "session" and s >= start:
                yield s, turns
            if kind == "session" and s + 1 >= item.n_sessions:
                return


@dataclass
class LongMemEvalSource:
    """One LongMemEval item as the BEAM env's task source: its question, and its sessions streamed as batches."""

    path: str
    item: LongMemEvalItem
    questions: list[Question] = field(init=False)

    def __post_init__(self) -> None:
        item = self.item
        # the file as the episode starts (made at reset, after the env's check of the file): every session the
        # episode reads must come from this version of it (_check_unchanged)
        self._stamp = file_stamps(self.path)
        self.id = item.question_id
        self.n_batches = item.n_sessions
        self.n_messages = item.n_messages
        self.n_tokens = item.n_tokens
        meta = {"ability": item.question_type, "abstention": item.abstention, "question_date": item.question_date,
                "evidence": list(item.evidence), "answer_session_ids": list(item.answer_session_ids),
                "rubric": [item.answer], "index": 0, "dataset": "longmemeval"}
        self.questions = [Question(id=item.question_id, question=item.question, answers=(item.answer,),
                                   supporting_ids=item.evidence, kind=item.question_type, meta=meta)]

    def _check_unchanged(self) -> None:
        if file_stamps(self.path) != self._stamp:
            raise DataFormatError(f"{self.path}: changed while an episode was reading item {self.item.position} "
                                  f"({self.item.question_id}); an episode reads one version of its item: reset to "
                                  "read the new file")

    def iter_batches(self, start: int = 0) -> Iterator[BeamBatch]:
        self._check_unchanged()
        for s, turns in iter_item_sessions(self.path, self.item, start):
            self._check_unchanged()  # a session decoded from a file rewritten since: refused, not mixed in
            messages = []
            for t, turn in enumerate(turns):
                content = turn["content"]
                cut = max(0, len(content) - MAX_MESSAGE_CHARS)
                if cut:
                    content = content[:MAX_MESSAGE_CHARS]
                messages.append((BeamMessage(turn["role"], f"{s + 1}:{t + 1}", t, content, cut_chars=cut),))
            yield BeamBatch(s, self.item.haystack_session_ids[s], self.item.haystack_dates[s], tuple(messages))


# ---------------------------------------------------------------------------------------------------- synthetic
_WORDS = ("garden", "recipe", "budget", "travel", "weekend", "project", "music", "coffee", "library", "river",
          "market", "bicycle", "window", "letter", "evening", "mountain", "station", "picture", "kitchen", "lesson")
_PETS = ("Biscuit", "Pepper", "Juniper", "Mochi", "Clover", "Ziggy")


def write_synthetic_longmemeval(path: str | os.PathLike, items: int = 1, sessions: int = 40, turns: int = 10,
                                words: int = 300, seed: int = 0) -> Path:
    """Write a seeded LongMemEval-layout file of ``items`` items, each of ``sessions`` sessions of ``turns``
    turns of about ``words`` whitespace tokens (one turn of one session states the answer, ``has_answer``).
    Written item by item and session by session (never held whole), to a temporary sibling then renamed.

    Sizes: the S variant is ~40 sessions (~115k tokens), the M variant ~500 (~1.5M tokens: ``sessions=500,
    turns=10, words=300``). Every third item is an abstention item (``_abs``, its question about a pet never
    named)."""
    import numpy as np
    import tempfile

    path = Path(path)
    rng = np.random.default_rng(seed)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write("[")
            for i in range(items):
                abstain = i % 3 == 2
                pet = _PETS[i % len(_PETS)]
                where = (int(rng.integers(sessions)), int(rng.integers(turns // 2)) * 2)
                qid = f"synth{seed:04d}{i:04d}" + ("_abs" if abstain else "")
                dates = [f"2023/{1 + s * 11 // max(1, sessions):02d}/{1 + s % 28:02d} (Mon) 10:{s % 60:02d}"
                         for s in range(sessions)]
                head = {"question_id": qid, "question_type": "single-session-user",
                        "question": "What is the name of my " + ("hamster?" if abstain else "dog?"),
                        "answer": "You did not mention a hamster." if abstain else pet,
                        "question_date": "2023/12/30 (Sat) 09:00", "haystack_dates": dates,
                        "haystack_session_ids": [f"{qid}_s{s}" for s in range(sessions)]}
                f.write(("," if i else "") + "\n" + json.dumps(head)[:-1] + ', "haystack_sessions": [')
                for s in range(sessions):
                    session = []
                    for t in range(turns):
                        role = "user" if t % 2 == 0 else "assistant"
                        text = " ".join(_WORDS[int(k)] for k in rng.integers(len(_WORDS), size=words))
                        fact = (s, t) == where
                        if fact:
                            text = f"By the way, my dog is called {pet}. " + text
                        session.append({"role": role, "content": text, "has_answer": fact and not abstain})
                    f.write(("," if s else "") + json.dumps(session))
                answer_ids = [] if abstain else [f"{qid}_s{where[0]}"]
                f.write('], "answer_session_ids": ' + json.dumps(answer_ids) + "}")
            f.write("\n]\n")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path
