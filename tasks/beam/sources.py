"""The conversations a BEAM env plays, each with ``questions`` and ``iter_batches(start)``: a folder of BEAM's
layout (:class:`BeamConversation`, found by :func:`find_conversations`), a :class:`tasks.conversations.Conversation`
seen as a BEAM chat (:class:`ConversationSource`), and :class:`BatchStream`, an iterator over either that survives
pickling."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tasks.beam.chat import CHAT_FILE, MAX_MESSAGE_CHARS, BeamBatch, BeamMessage, iter_chat_batches
from tasks.beam.questions import QUESTIONS_FILE, load_probing_questions
from tasks.conversations import Conversation
from tasks.types import DataFormatError, Question


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

    def __init__(self, source: Any, start: int = 0) -> None:  # a source of this module or a SyntheticBeamChat
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
