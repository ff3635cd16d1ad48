"""Generic corpus + questions loaders (JSON Lines), and the record reader the real-data loaders share.

A *pair* is two files:

* a corpus, one document per line, either ``{"id", "title", "text"}`` or the Search-R1/FlashRAG style
  ``{"id", "contents"}`` where ``contents`` is ``"title\\ntext"`` (FlashRAG dumps quote the title:
  ``"\\"Title\\"\\ntext"``; the quotes are stripped);
* questions, one per line: ``{"id", "question", "answers" | "golden_answers"}`` with optional
  ``supporting_titles`` or ``supporting_ids`` (lists), and optional ``type``/``kind`` and ``hops``.

:func:`load_qa_pair` reads both and resolves supporting titles to document ids. Every malformed input raises
:class:`~tasks.types.DataFormatError` whose message names the file and the line (or, for a file holding one
JSON array instead of JSON Lines, the 0-based record index and the line where that record starts): bytes that
are not UTF-8, an empty or truncated file, invalid or too deeply nested JSON, a top level that is neither an
array nor objects, a missing key, a value of the wrong type, empty required text, repeated ids.
"""

from __future__ import annotations

import errno
import json
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from tasks.types import DataFormatError, Document, QADataset, Question, gold_answer_text

__all__ = [
    "RecordLocation",
    "as_text",
    "document_from_record",
    "iter_json_records",
    "load_corpus_jsonl",
    "load_qa_pair",
    "load_questions_jsonl",
]

PathLike = str | os.PathLike

_WS = re.compile(r"[ \t\n\r]*")
# Python's JSON decoder recurses once per nesting level and raises RecursionError past the interpreter's limit.
_TOO_DEEP = "invalid JSON: nested too deeply (arrays/objects inside each other beyond the decoder's recursion limit)"


# --------------------------------------------------------------------------------------------------------------
# Record reader shared by the loaders
# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RecordLocation:
    """Where a record sits in its file, for error messages.

    ``line`` is 1-based (the line on which the record starts); ``index`` is the 0-based position in a JSON
    array, or ``None`` for a JSON Lines file (where the line number is the natural address).
    """

    path: Path
    line: int
    index: int | None = None

    def __str__(self) -> str:
        if self.index is None:
            return f"{self.path}: line {self.line}"
        return f"{self.path}: record {self.index} (line {self.line})"

    def fail(self, message: str) -> NoReturn:
        """Raise a :class:`DataFormatError` located at this record."""
        raise DataFormatError(f"{self}: {message}")


def _read_text(path: Path, what: str) -> str:
    try:
        with open(path, encoding="utf-8-sig") as f:
            return f.read()
    except FileNotFoundError:
        raise FileNotFoundError(errno.ENOENT, f"{what} not found", str(path)) from None
    except UnicodeDecodeError as e:
        raise DataFormatError(f"{path}: not UTF-8 text (byte offset {e.start}: {e.reason})") from None


def _is_truncation(err: json.JSONDecodeError, text: str) -> bool:
    """Whether a decode error means the input simply stopped (rather than holding a bad character)."""
    return err.msg.startswith("Unterminated string") or not text[err.pos :].strip()


def _json_msg(err: json.JSONDecodeError) -> str:
    """The decoder's message without its dangling "at" ("Invalid control character at" -> "... character")."""
    return err.msg.removesuffix(" starting at").removesuffix(" at")


def iter_json_records(
    path: PathLike, *, limit: int | None = None, what: str = "data file"
) -> Iterator[tuple[RecordLocation, dict[str, Any]]]:
    """Yield ``(location, record)`` for each JSON object in ``path``.

    The layout is detected from the first non-blank character: ``[`` is one JSON array of objects, ``{`` is
    JSON Lines (one object per line; blank lines skipped). At most ``limit`` records are read. ``what`` names
    the file's role in the :class:`FileNotFoundError` raised when it does not exist.
    """
    path = Path(path)
    text = _read_text(path, what)
    start = _WS.match(text).end()
    if start == len(text):
        raise DataFormatError(f"{path}: empty file (expected a JSON array or JSON Lines)")
    first = text[start]
    if first == "[":
        records = _iter_array(path, text, start)
    elif first == "{":
        records = _iter_lines(path, text)
    else:
        line = text.count("\n", 0, start) + 1
        raise DataFormatError(
            f"{path}: line {line}: expected a JSON array ('[') or JSON Lines objects ('{{'), found {first!r}"
        )
    if limit is not None and limit <= 0:
        return
    for n, item in enumerate(records, start=1):
        yield item
        if limit is not None and n >= limit:
            return


def _iter_lines(path: Path, text: str) -> Iterator[tuple[RecordLocation, dict[str, Any]]]:
    # Split on "\n" only: str.splitlines() would also split on U+2028 etc., which may sit unescaped in strings.
    lines = text.split("\n")
    last = max(i for i, s in enumerate(lines) if s.strip())
    for i, raw in enumerate(lines):
        line = raw.rstrip("\r")
        if not line.strip():
            continue
        loc = RecordLocation(path, i + 1)
        try:
            obj = json.loads(line)
        except RecursionError:
            loc.fail(_TOO_DEEP)
        except json.JSONDecodeError as e:
            if _is_truncation(e, line):
                if i == last and not text.endswith("\n"):
                    loc.fail(f"truncated file: the last line ends inside a JSON record ({_json_msg(e)})")
                loc.fail(f"invalid JSON: the record is cut off ({_json_msg(e)}; a line break inside a record?)")
            loc.fail(f"invalid JSON: {_json_msg(e)} at column {e.colno}")
        if not isinstance(obj, dict):
            loc.fail(f"expected a JSON object, got {_type_name(obj)}")
        yield loc, obj


def _iter_array(path: Path, text: str, start: int) -> Iterator[tuple[RecordLocation, dict[str, Any]]]:
    decoder = json.JSONDecoder()
    n = len(text)
    line, counted = 1, 0  # line number of position `counted`

    def line_at(pos: int) -> int:
        nonlocal line, counted
        line += text.count("\n", counted, pos)
        counted = pos
        return line

    pos = _WS.match(text, start + 1).end()
    if text.startswith("]", pos):
        _check_trailing(path, text, pos + 1)
        return
    index = 0
    while True:
        loc = RecordLocation(path, line_at(pos), index)
        if pos >= n:
            loc.fail("truncated file: the JSON array ends before this record")
        try:
            obj, end = decoder.raw_decode(text, pos)
        except RecursionError:
            loc.fail(_TOO_DEEP)
        except json.JSONDecodeError as e:
            if _is_truncation(e, text):
                loc.fail(f"truncated file: the JSON array stops inside this record ({_json_msg(e)})")
            loc.fail(f"invalid JSON: {_json_msg(e)} at line {e.lineno}, column {e.colno}")
        if not isinstance(obj, dict):
            loc.fail(f"expected a JSON object, got {_type_name(obj)}")
        yield loc, obj
        pos = _WS.match(text, end).end()
        sep = text[pos : pos + 1]
        if sep == ",":
            pos = _WS.match(text, pos + 1).end()
            index += 1
        elif sep == "]":
            _check_trailing(path, text, pos + 1)
            return
        elif not sep:
            loc.fail("truncated file: the JSON array is not closed after this record")
        else:
            loc.fail(f"invalid JSON: expected ',' or ']' after this record, found {sep!r} (line {line_at(pos)})")


def _check_trailing(path: Path, text: str, pos: int) -> None:
    rest = _WS.match(text, pos).end()
    if rest < len(text):
        line = text.count("\n", 0, rest) + 1
        raise DataFormatError(f"{path}: line {line}: unexpected data after the JSON array")


# --------------------------------------------------------------------------------------------------------------
# Field helpers (shared with tasks.hotpot)
# --------------------------------------------------------------------------------------------------------------


def _type_name(value: object) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), f"a {type(value).__name__}"
    )


def get_field(
    record: Mapping[str, Any], keys: str | Sequence[str], loc: RecordLocation, *, within: str = ""
) -> Any:
    """The value of the first of ``keys`` present in ``record``; a :class:`DataFormatError` if none is.

    ``within`` names the enclosing field (e.g. ``"context"``) for a nested object.
    """
    names = (keys,) if isinstance(keys, str) else tuple(keys)
    for key in names:
        if key in record:
            return record[key]
    wanted = " or ".join(repr(k) for k in names)
    loc.fail(f"{within}: missing key {wanted}" if within else f"missing key {wanted}")


def as_str(value: Any, field: str, loc: RecordLocation, *, allow_int: bool = False) -> str:
    """``value`` as a string (ints accepted for ids when ``allow_int``), else a located error."""
    if isinstance(value, str):
        return value
    if allow_int and isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    loc.fail(f"{field}: expected a string, got {_type_name(value)}")


def as_str_list(value: Any, field: str, loc: RecordLocation) -> list[str]:
    """``value`` as a list of strings, else a located error naming the offending element."""
    if not isinstance(value, list):
        loc.fail(f"{field}: expected a list of strings, got {_type_name(value)}")
    for i, v in enumerate(value):
        if not isinstance(v, str):
            loc.fail(f"{field}[{i}]: expected a string, got {_type_name(v)}")
    return value


def as_text(value: Any, field: str, loc: RecordLocation) -> str:
    """``value`` as a string with some non-whitespace content (a question, an answer), else a located error."""
    text = as_str(value, field, loc)
    if not text.strip():
        loc.fail(f"{field}: empty text")
    return text


def as_answer(value: Any, field: str, loc: RecordLocation, *, lists: bool = True) -> str:
    """A gold answer of any type an official file writes it in (:func:`tasks.types.gold_answer_text`: numbers,
    lists unless ``lists=False``), stripped and non-empty, else a located error."""
    try:
        return gold_answer_text(value, lists=lists)
    except (TypeError, ValueError) as err:
        loc.fail(f"{field}: {err}")


def as_nonempty_str_list(value: Any, field: str, loc: RecordLocation) -> list[str]:
    """``value`` as a non-empty list of strings (an explicitly empty list is an error: omit the key instead)."""
    items = as_str_list(value, field, loc)
    if not items:
        loc.fail(f"{field}: empty list (omit the key when there is nothing to list)")
    return items


def normalize_ws(text: str) -> str:
    """Collapse every run of whitespace to one space and strip the ends."""
    return " ".join(text.split())


def _unique(items: Sequence[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(items))


# --------------------------------------------------------------------------------------------------------------
# Corpus
# --------------------------------------------------------------------------------------------------------------


def split_contents(contents: str) -> tuple[str, str]:
    """Search-R1/FlashRAG ``contents`` -> ``(title, text)``: title is the first line, quotes stripped.

    Contents without a line break have no title: ``("", contents)``.
    """
    title, sep, text = contents.partition("\n")
    if not sep:
        return "", contents.strip()
    title = title.strip()
    if len(title) >= 2 and title[0] == title[-1] == '"':
        title = title[1:-1].strip()
    return title, text.strip()


def load_corpus_jsonl(path: PathLike) -> list[Document]:
    """Read a corpus: one document per line, ``{"id", "title", "text"}`` or ``{"id", "contents"}``.

    ``id`` may be a string or an integer (kept as its decimal string). With ``title``/``text``, ``title`` is
    optional (default ``""``). With ``contents`` (Search-R1/FlashRAG), the first line is the title (surrounding
    double quotes stripped) and the rest the text. Blank lines are skipped. A repeated id, or a document with
    neither title nor text, raises :class:`DataFormatError` naming the file and the line(s).
    """
    docs: list[Document] = []
    seen: dict[str, RecordLocation] = {}
    for loc, rec in iter_json_records(path, what="corpus file"):
        doc = document_from_record(rec, loc)
        if doc.id in seen:
            loc.fail(f"duplicate document id {doc.id!r} (first at line {seen[doc.id].line})")
        seen[doc.id] = loc
        docs.append(doc)
    return docs


def document_from_record(rec: Mapping[str, Any], loc: RecordLocation) -> Document:
    """One corpus record (``{"id", "title", "text"}`` or ``{"id", "contents"}``) as a :class:`Document`.

    The rules of :func:`load_corpus_jsonl`, for one record; streaming readers (``memenv.search.index``) share them.
    """
    doc_id = as_str(get_field(rec, "id", loc), "id", loc, allow_int=True)
    if "text" in rec:
        title = as_str(rec.get("title", ""), "title", loc)
        text = as_str(rec["text"], "text", loc)
    elif "contents" in rec:
        title, text = split_contents(as_str(rec["contents"], "contents", loc))
    else:
        loc.fail("missing key 'text' (with 'title') or 'contents'")
    if not (title.strip() or text.strip()):
        loc.fail(f"document {doc_id!r} has neither title nor text")
    return Document(id=doc_id, title=title, text=text)


# --------------------------------------------------------------------------------------------------------------
# Questions
# --------------------------------------------------------------------------------------------------------------


class _TitleIndex:
    """Supporting title -> document id: exact title first, then case- and whitespace-insensitive.

    A title shared by several documents (e.g. an article split into passages) maps to the first of them in
    corpus order.
    """

    def __init__(self, documents: Sequence[Document]) -> None:
        self.exact: dict[str, str] = {}
        self.loose: dict[str, str] = {}
        for d in documents:
            self.exact.setdefault(d.title, d.id)
            self.loose.setdefault(normalize_ws(d.title).casefold(), d.id)

    def get(self, title: str) -> str | None:
        hit = self.exact.get(title)
        return hit if hit is not None else self.loose.get(normalize_ws(title).casefold())


def _answers(rec: Mapping[str, Any], loc: RecordLocation) -> tuple[str, ...]:
    key = "answers" if "answers" in rec else "golden_answers"
    value = get_field(rec, ("answers", "golden_answers"), loc)
    answers = []
    for i, alias in enumerate(value if isinstance(value, list) else [value]):
        try:
            answers.append(gold_answer_text(alias))
        except ValueError:  # an empty alias is dropped; the record needs one that is not
            continue
        except TypeError as err:
            loc.fail(f"{key}[{i}]: {err}" if isinstance(value, list) else f"{key}: {err}")
    if not answers:
        loc.fail(f"{key}: no non-empty gold answer")
    return _unique(answers)


def load_questions_jsonl(path: PathLike, *, documents: Sequence[Document] | None = None) -> list[Question]:
    """Read questions: one per line, ``{"id", "question", "answers" | "golden_answers"}``.

    * ``answers``/``golden_answers``: a list of strings or one string (the first is canonical; empty strings and
      repeats are dropped; at least one answer is required).
    * ``id`` (string or integer) is optional: ``"q<line>"`` when missing (``"q<index>"`` in a JSON array file).
    * ``supporting_ids`` or ``supporting_titles`` (lists, not both): kept as given in ``supporting_ids`` resp.
      ``meta["supporting_titles"]``. When ``documents`` is given, titles are resolved to document ids (exact
      title, else case/whitespace-insensitive; the first document with that title) and ids are checked to exist.
    * ``type`` or ``kind`` sets :attr:`Question.kind` (default: ``"bridge"`` with several supporting documents,
      ``"single"`` otherwise); ``hops`` (int) overrides the default of the number of supporting documents
      (at least 1).

    ``meta`` holds ``source`` (the path) and ``line`` (where the record starts).

    Policy (shared by every loader): a record that is wrong or incomplete raises :class:`DataFormatError`
    naming the file and the line; nothing is skipped silently. That covers repeated ids, an empty question,
    no non-empty answer, and an explicitly empty ``supporting_ids``/``supporting_titles`` list (omit the key
    for a question without known support).
    """
    path = Path(path)
    index = _TitleIndex(documents) if documents is not None else None
    known_ids = {d.id for d in documents} if documents is not None else None
    questions: list[Question] = []
    seen: dict[str, RecordLocation] = {}
    for loc, rec in iter_json_records(path, what="questions file"):
        if "id" in rec:
            qid = as_str(rec["id"], "id", loc, allow_int=True)
        else:
            qid = f"q{loc.line if loc.index is None else loc.index}"
        if qid in seen:
            loc.fail(f"duplicate question id {qid!r} (first at line {seen[qid].line})")
        seen[qid] = loc
        text = as_text(get_field(rec, "question", loc), "question", loc)
        answers = _answers(rec, loc)
        meta: dict[str, Any] = {"source": str(path), "line": loc.line}

        if "supporting_ids" in rec and "supporting_titles" in rec:
            loc.fail("give 'supporting_ids' or 'supporting_titles', not both")
        support: tuple[str, ...] = ()
        if "supporting_ids" in rec:
            support = _unique(as_nonempty_str_list(rec["supporting_ids"], "supporting_ids", loc))
            if known_ids is not None:
                for doc_id in support:
                    if doc_id not in known_ids:
                        loc.fail(f"supporting id {doc_id!r} is not in the corpus")
        elif "supporting_titles" in rec:
            titles = _unique(as_nonempty_str_list(rec["supporting_titles"], "supporting_titles", loc))
            meta["supporting_titles"] = titles
            if index is not None:
                resolved = []
                for title in titles:
                    doc_id = index.get(title)
                    if doc_id is None:
                        loc.fail(f"supporting title {title!r} is not in the corpus")
                    resolved.append(doc_id)
                support = _unique(resolved)
        n_support = len(support) or len(meta.get("supporting_titles", ()))

        if "hops" in rec:
            hops = rec["hops"]
            if not isinstance(hops, int) or isinstance(hops, bool) or hops < 1:
                loc.fail(f"hops: expected a positive integer, got {hops!r}")
        else:
            hops = max(1, n_support)
        kind_value = rec.get("type", rec.get("kind"))
        if kind_value is None:
            kind = "bridge" if n_support > 1 else "single"
        else:
            kind = as_str(kind_value, "type" if "type" in rec else "kind", loc)
        questions.append(
            Question(id=qid, question=text, answers=answers, supporting_ids=support, hops=hops, kind=kind, meta=meta)
        )
    return questions


def load_qa_pair(corpus_path: PathLike, questions_path: PathLike, name: str | None = None) -> QADataset:
    """A :class:`QADataset` from a corpus file and a questions file (see the module docstring for layouts).

    Supporting titles are mapped to document ids; an unknown title or id raises :class:`DataFormatError`
    naming the questions file, the line and the title/id. ``name`` defaults to the questions file's stem.
    """
    documents = load_corpus_jsonl(corpus_path)
    if not documents:
        raise DataFormatError(f"{corpus_path}: no documents")
    questions = load_questions_jsonl(questions_path, documents=documents)
    if not questions:
        raise DataFormatError(f"{questions_path}: no questions")
    return QADataset(documents, questions, name=name if name is not None else Path(questions_path).stem)

