"""Plain data types shared by every task source.

A task source provides a *corpus* (documents an agent can search) and *questions* (each with gold answers,
aliases allowed, and the ids of the documents that support it). Environments in ``memenv`` compose one or
more questions into an episode ("objectives", MEM1 style).
"""

from __future__ import annotations

import math
import os
import numbers
from dataclasses import dataclass, field
from typing import Any


class DataFormatError(ValueError):
    """A data file (or record inside one) does not have the expected layout.

    The message always names the file and, where there is one, the line or record index.
    """


class DataFormatWarning(UserWarning):
    """A data file loaded, but with records that are usable only in part (e.g. evidence naming no turn).

    Like :class:`DataFormatError`, the message names the file and the records.
    """


def answer_text(value: Any) -> str:
    """An answer as text, whatever JSON type an official file (or a caller) gives it.

    A string as it is; an integral number without a fraction (``3`` and ``3.0`` -> ``"3"``: a reply "3" must
    match a gold answer written ``3.0``); another finite number as Python writes it (``2.5`` -> ``"2.5"``); a
    list or tuple as its items' texts joined by ``", "``; ``None`` as ``""`` (no answer). Any other type (a
    bool, an object) raises ``TypeError`` and NaN or infinity ``ValueError``, each naming what it got.
    Every loader and scorer of the project converts through this one function, so a gold answer and a reply
    of the same value always have the same text.
    """
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    if isinstance(value, bool) or not isinstance(value, (numbers.Real, list, tuple)):
        raise TypeError(f"an answer must be a string, a number or a list of them, got {type(value).__name__}")
    if isinstance(value, (list, tuple)):
        return ", ".join(answer_text(item) for item in value)
    if isinstance(value, numbers.Integral):
        return str(int(value))
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"an answer must be a finite number, got {number!r}")
    return str(int(number)) if number.is_integer() else repr(number)


def gold_answer_text(value: Any, *, lists: bool = True) -> str:
    """:func:`answer_text` of a gold answer, stripped, refusing one that is empty (no reply could score on it):
    ``ValueError("empty answer")``; loaders add the file and the record. ``lists=False``: a list (or tuple) is
    refused too (``TypeError`` naming it), for formats whose answer is one value (LongMemEval, LoCoMo), where a
    list is a damaged record that joined by ", " would score silently against a text nobody wrote."""
    if not lists and isinstance(value, (list, tuple)):
        raise TypeError(f"an answer must be a string or a number, got {type(value).__name__} {_short(value)} "
                        "(this format has one answer per question)")
    text = answer_text(value).strip()
    if not text:
        raise ValueError("empty answer (no reply can score on it)")
    return text


def _short(value: Any, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass(frozen=True)
class Document:
    """One searchable document. ``id`` is unique within a corpus."""

    id: str
    title: str
    text: str

    @property
    def contents(self) -> str:
        """Search-R1/FlashRAG style ``"title\\ntext"`` string (what search backends index)."""
        return f"{self.title}\n{self.text}"


@dataclass(frozen=True)
class Question:
    """One question (objective) with its gold answers.

    ``answers`` holds every accepted surface form (the first is the canonical one); scoring takes the best
    match over them. ``supporting_ids`` are the ids of the corpus documents needed to answer, in the order a
    reader would visit them (for bridge chains: the chain order).
    """

    id: str
    question: str
    answers: tuple[str, ...]
    supporting_ids: tuple[str, ...] = ()
    hops: int = 1
    kind: str = "bridge"  # "bridge" | "comparison" | other source-specific labels
    meta: dict = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        if not self.answers:
            raise ValueError(f"question {self.id!r} has no gold answer")
        for i, answer in enumerate(self.answers):  # every loader checks (naming its file); this is the backstop
            if not isinstance(answer, str) or not answer.strip():
                raise ValueError(f"question {self.id!r}: gold answer {i} is {answer!r}: it must be a non-empty "
                                 f"string (tasks.types.gold_answer_text converts a file's value)")


class QADataset:
    """A fixed corpus plus a fixed pool of questions (real data: HotpotQA, generic JSONL pairs).

    Environments draw the questions of an episode with :meth:`sample_questions`, passing their own
    ``np_random`` generator so that seeding stays Gymnasium's.
    """

    def __init__(self, documents: list[Document], questions: list[Question], name: str = "dataset") -> None:
        if not documents:
            raise ValueError(f"{name}: empty corpus")
        if not questions:
            raise ValueError(f"{name}: no questions")
        ids = [d.id for d in documents]
        if len(set(ids)) != len(ids):
            raise ValueError(f"{name}: duplicate document ids in corpus")
        self.documents = documents
        self.questions = questions
        self.name = name

    def __len__(self) -> int:
        return len(self.questions)

    def sample_questions(self, rng, n: int) -> list[Question]:
        """``n`` distinct questions drawn with ``rng`` (a ``numpy.random.Generator``)."""
        if n > len(self.questions):
            raise ValueError(f"{self.name}: asked for {n} objectives but only {len(self.questions)} questions")
        idx = rng.choice(len(self.questions), size=n, replace=False)
        return [self.questions[int(i)] for i in idx]


def file_stamps(*paths: str | os.PathLike) -> tuple:
    """The identity of every file a cached loader reads, to key its cache on: ``(path, size, mtime_ns, ctime_ns,
    inode)`` per file, ``(path, None)`` for one that is missing (the loader, called then, names it).

    Size and mtime notice an edit; ctime and inode a file copied or renamed over it with its mtime kept. A
    cache keyed on fewer files than its loader reads (BEAM's ``chat.json`` but not ``probing_questions.json``)
    serves stale data after an edit of the others, so every cache of the envs keys on this, with all of them."""
    stamps = []
    for path in paths:
        path = os.fspath(path)
        try:
            info = os.stat(path)
        except OSError:
            stamps.append((path, None))
            continue
        stamps.append((path, info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino))
    return tuple(stamps)
