"""HotpotQA loader (official and Hugging Face layouts).

Two layouts are accepted, detected per record:

* official (one JSON array)::

    {"_id", "question", "answer", "type", "level",
     "supporting_facts": [[title, sent_idx], ...], "context": [[title, [sentence, ...]], ...]}

* Hugging Face ``datasets`` (JSON array or JSON Lines)::

    {"id", "question", "answer", "type", "level",
     "supporting_facts": {"title": [...], "sent_id": [...]},
     "context": {"title": [...], "sentences": [[...], ...]}}

The corpus pools the context paragraphs of every loaded item (so each question's search space holds its own
distractors plus everyone else's), deduplicated by ``(title, text)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tasks.corpus import (
    PathLike,
    RecordLocation,
    as_answer,
    as_str,
    as_text,
    as_str_list,
    get_field,
    iter_json_records,
    normalize_ws,
)
from tasks.types import DataFormatError, Document, QADataset, Question

__all__ = ["load_hotpotqa"]


@dataclass(frozen=True)
class _Item:
    """One parsed HotpotQA record, before document ids are assigned."""

    loc: RecordLocation
    id: str
    question: str
    answer: str
    type: str
    level: str | None
    paragraphs: list[tuple[str, str]]  # (title, normalised text), context order
    sentence_counts: list[int]  # sentences of each paragraph
    supporting_facts: list[tuple[str, int]]  # (title, sentence index)


def _parse_context(value: Any, loc: RecordLocation) -> list[tuple[str, list[str]]]:
    """Context in either layout -> ``[(title, sentences), ...]``."""
    if isinstance(value, list):  # official: [[title, [sentence, ...]], ...]
        pairs = []
        for i, entry in enumerate(value):
            if not (isinstance(entry, list) and len(entry) == 2):
                loc.fail(f"context[{i}]: expected [title, [sentence, ...]], got {_short(entry)}")
            title = as_str(entry[0], f"context[{i}][0] (title)", loc)
            pairs.append((title, as_str_list(entry[1], f"context[{i}][1] (sentences)", loc)))
    elif isinstance(value, dict):  # Hugging Face: {"title": [...], "sentences": [[...], ...]}
        titles = as_str_list(get_field(value, "title", loc, within="context"), "context.title", loc)
        sentences = get_field(value, "sentences", loc, within="context")
        if not isinstance(sentences, list):
            loc.fail(f"context.sentences: expected a list of sentence lists, got {_short(sentences)}")
        if len(titles) != len(sentences):
            loc.fail(f"context: {len(titles)} titles but {len(sentences)} sentence lists")
        pairs = [(t, as_str_list(s, f"context.sentences[{i}]", loc)) for i, (t, s) in enumerate(zip(titles, sentences))]
    else:
        loc.fail(
            f"context: expected a list (official layout) or an object (Hugging Face layout), got {_short(value)}"
        )
    if not pairs:
        loc.fail("context: no paragraph")
    return pairs


def _parse_supporting_facts(value: Any, loc: RecordLocation) -> list[tuple[str, int]]:
    """Supporting facts in either layout -> ``[(title, sentence index), ...]``."""
    if isinstance(value, list):  # official: [[title, sent_idx], ...]
        facts = []
        for i, entry in enumerate(value):
            if not (isinstance(entry, list) and len(entry) == 2):
                loc.fail(f"supporting_facts[{i}]: expected [title, sentence index], got {_short(entry)}")
            title = as_str(entry[0], f"supporting_facts[{i}][0] (title)", loc)
            facts.append((title, _as_index(entry[1], f"supporting_facts[{i}][1] (sentence index)", loc)))
        return facts
    if isinstance(value, dict):  # Hugging Face: {"title": [...], "sent_id": [...]}
        titles = as_str_list(get_field(value, "title", loc, within="supporting_facts"), "supporting_facts.title", loc)
        sent_ids = get_field(value, "sent_id", loc, within="supporting_facts")
        if not isinstance(sent_ids, list):
            loc.fail(f"supporting_facts.sent_id: expected a list of integers, got {_short(sent_ids)}")
        if len(titles) != len(sent_ids):
            loc.fail(f"supporting_facts: {len(titles)} titles but {len(sent_ids)} sentence ids")
        return [
            (title, _as_index(sent, f"supporting_facts.sent_id[{i}]", loc))
            for i, (title, sent) in enumerate(zip(titles, sent_ids))
        ]
    loc.fail(
        f"supporting_facts: expected a list (official layout) or an object (Hugging Face layout), got {_short(value)}"
    )


def _as_index(value: Any, field: str, loc: RecordLocation) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    loc.fail(f"{field}: expected a sentence index (non-negative integer), got {_short(value)}")


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _parse_item(loc: RecordLocation, rec: dict[str, Any]) -> _Item:
    level = rec.get("level")
    context = _parse_context(get_field(rec, "context", loc), loc)
    facts = _parse_supporting_facts(get_field(rec, "supporting_facts", loc), loc)
    if not facts:
        loc.fail("supporting_facts: empty (every HotpotQA question names the sentences that support it)")
    return _Item(
        loc=loc,
        id=as_str(get_field(rec, ("_id", "id"), loc), "_id" if "_id" in rec else "id", loc, allow_int=True),
        question=as_text(get_field(rec, "question", loc), "question", loc),
        answer=as_answer(get_field(rec, "answer", loc), "answer", loc),
        type=as_str(get_field(rec, "type", loc), "type", loc),
        level=None if level is None else as_str(level, "level", loc),
        # HotpotQA sentences usually carry their own leading space: join, then normalise.
        paragraphs=[(title, normalize_ws(" ".join(sentences))) for title, sentences in context],
        sentence_counts=[len(sentences) for _, sentences in context],
        supporting_facts=facts,
    )


def _assign_ids(keys: list[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """Document id per distinct ``(title, text)``, in first-appearance order.

    The first text seen under a title gets the title itself as id; later, different texts under the same title
    get ``"title (2)"``, ``"title (3)"``, … skipping any candidate that is already a title or an assigned id.
    """
    titles = {t for t, _ in keys}
    ids: dict[tuple[str, str], str] = {}
    used: set[str] = set()
    count: dict[str, int] = {}
    for title, text in keys:
        n = count.get(title, 0) + 1
        doc_id = title if n == 1 else f"{title} ({n})"
        while n > 1 and (doc_id in titles or doc_id in used):
            n += 1
            doc_id = f"{title} ({n})"
        count[title] = n
        used.add(doc_id)
        ids[(title, text)] = doc_id
    return ids


def load_hotpotqa(path: PathLike, limit: int | None = None, *, name: str | None = None) -> QADataset:
    """Load HotpotQA items from ``path`` (official or Hugging Face layout; JSON array or JSON Lines).

    * ``limit`` keeps the first ``limit`` items; the pooled corpus then comes from those items only.
    * Corpus: every item's context paragraphs, pooled and deduplicated by ``(title, text)``;
      ``Document.id`` is the title (``"title (2)"`` … for a different text under a title already used),
      ``Document.text`` the sentences joined by single spaces with whitespace normalised.
    * Questions: ``id`` from ``_id``/``id``; ``answers=(answer,)``; ``supporting_ids`` the ids of the supporting
      titles' paragraphs (the item's own paragraph with that title; if the item's context lacks it, the first
      pooled paragraph with that title), in first-appearance order in ``supporting_facts``; ``hops`` the number
      of distinct supporting titles (at least 1); ``kind`` the item ``type``; ``meta`` holds ``level`` and
      ``supporting_facts`` as ``[(doc_id, sentence_index), ...]``.

    Raises :class:`FileNotFoundError` (naming the path) if the file does not exist, and
    :class:`~tasks.types.DataFormatError` naming the file and the record index (JSON array) or line (JSON
    Lines) for malformed input: invalid JSON, truncated file, missing key, wrong type, an empty question or
    answer, no context paragraph, empty ``supporting_facts``, a supporting title found in no loaded paragraph,
    a sentence index beyond its paragraph, repeated question ids. Nothing is skipped: a wrong record stops the
    load (the policy of every loader in :mod:`tasks`).
    """
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be a positive integer or None, got {limit!r}")
    path = Path(path)
    items = [_parse_item(loc, rec) for loc, rec in iter_json_records(path, limit=limit, what="HotpotQA file")]
    if not items:
        raise DataFormatError(f"{path}: no HotpotQA items")

    keys = list(dict.fromkeys(p for item in items for p in item.paragraphs))
    ids = _assign_ids(keys)
    sentences: dict[str, int] = {}  # document id -> sentence count (the same text has the same count)
    for item in items:
        for key, n in zip(item.paragraphs, item.sentence_counts):
            sentences.setdefault(ids[key], n)
    first_by_title: dict[str, str] = {}
    for title, text in keys:
        first_by_title.setdefault(title, ids[(title, text)])

    questions: list[Question] = []
    seen: dict[str, RecordLocation] = {}
    for item in items:
        if item.id in seen:
            item.loc.fail(f"duplicate question id {item.id!r} (first at {seen[item.id]})")
        seen[item.id] = item.loc
        own: dict[str, str] = {}
        for key in item.paragraphs:
            own.setdefault(key[0], ids[key])
        facts: list[tuple[str, int]] = []
        for title, sent in item.supporting_facts:
            doc_id = own.get(title, first_by_title.get(title))
            if doc_id is None:
                item.loc.fail(f"supporting fact title {title!r} matches no context paragraph")
            if sent >= sentences[doc_id]:
                item.loc.fail(f"supporting fact [{title!r}, {sent}]: sentence index out of range (the paragraph "
                              f"has {sentences[doc_id]} sentence(s), indexes 0..{sentences[doc_id] - 1})")
            facts.append((doc_id, sent))
        support = tuple(dict.fromkeys(doc_id for doc_id, _ in facts))
        questions.append(
            Question(
                id=item.id,
                question=item.question,
                answers=(item.answer,),
                supporting_ids=support,
                hops=max(1, len(support)),
                kind=item.type,
                meta={"level": item.level, "supporting_facts": facts},
            )
        )
    documents = [Document(id=ids[key], title=key[0], text=key[1]) for key in keys]
    return QADataset(documents, questions, name=name if name is not None else f"hotpotqa:{path.stem}")
