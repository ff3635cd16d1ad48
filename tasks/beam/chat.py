"""A BEAM ``chat.json``: its batches (:class:`BeamBatch` of :class:`BeamMessage`) and :func:`iter_chat_batches`,
the streaming reader that holds one batch at a time (a batch past 1 Mi characters read piece by piece, a message
longer than :data:`MAX_MESSAGE_CHARS` cut at load, the rest never decoded)."""

from __future__ import annotations

import json
import os
import re
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tasks.corpus import _TOO_DEEP, _type_name
from tasks.types import DataFormatError


CHAT_FILE = "chat.json"
#: The longest message content kept (characters): a longer one keeps its first ``MAX_MESSAGE_CHARS`` characters
#: and :func:`cut_marker`, and the rest is never decoded or held. memenv's observations hold at most 1,000,000
#: characters, so none could show more of one message.
MAX_MESSAGE_CHARS = 1_000_000
# What the piecewise reader puts after a string it cut, then the count of characters cut (the nonce keeps real
# text from ever looking like it).
_CUT_TAG = f"\x00cut-{secrets.token_hex(8)}:"

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
