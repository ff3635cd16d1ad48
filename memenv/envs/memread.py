"""MemRead: a long document read chunk by chunk, the agent rewriting its memory after each chunk (MemAgent).

One episode: ``objectives`` questions (synthetic world by default, HotpotQA items with ``data_path=``) and a
long document of about ``doc_tokens`` whitespace tokens in which the questions' gold supporting documents are
buried among distractor documents (see :mod:`tasks.documents`). The document is streamed: the env keeps a
plan of paragraph indices and renders one chunk at a time, so its memory use does not grow with the length.

Turns (context mode ``memory``)::

    turn i (1..n)   observation: task + memory + "[chunk i/n]" and the chunk
                    action: <memory>...</memory>               (next chunk)
                         or <memory>...</memory><answer>a1; a2</answer>   (answers now, ends the episode)
    turn n+1        observation: task + memory + "[document finished ...]"
                    action: [<memory>...</memory>]<answer>a1; a2</answer>

In the ``history``, ``window:K`` and ``none`` modes the memory is not shown and may be omitted: an empty
action (or a lone ``<think>``) reads the next chunk. An invalid action repeats the same chunk with a notice;
the turn is used. The turn limit defaults to ``2 * (chunks + 1)``; reaching it without an answer ends the
episode (truncated) with F1 0. Reward: mean F1 over the questions, at the end.

Lengths are whitespace tokens (``doc_tokens``, ``chunk_tokens``), whatever ``token_counter`` counts for the
context and memory budgets. Memory stays flat in ``context="memory"`` (and ``none``) with
``keep_snapshots=False``; ``history`` keeps the whole transcript by design (and re-renders it each turn, so
its cost grows with the square of the length). Over the default 1,200-document world, a document longer than
the corpus (about 80k tokens) repeats distractors; raise ``corpus_size`` for fewer repeats.
"""

from __future__ import annotations

import functools
import os
import re
from typing import Any

import numpy as np

from memenv.envs.base import MemEnvBase, sanitize
from memenv.context import TokenCounter
from memenv.envs.memqa import _document_positions, _sanitized_corpus, check_qa_task, resolve_qa_source
from memenv.protocol import parse_action
from memenv.validation import DEFAULT_KEPT_SNAPSHOTS, check_bool, check_int, check_keep_snapshots
from memenv.scoring.qa import score_objectives, split_answers
from tasks.documents import READ_INSTRUCTIONS, READ_INSTRUCTIONS_NO_MEMORY, DocumentPlan, plan_long_document, token_counts
from tasks.types import Document, Question
from tasks.world import World

__all__ = ["MemReadEnv"]

#: Longest document an episode streams (its plan holds one int32 per paragraph: about 6 MB at this length).
MAX_DOC_TOKENS = 100_000_000
MIN_CHUNK_TOKENS = 16

_THINK_ONLY = re.compile(r"\s*(?:<think>.*?</think>)?\s*", re.DOTALL)


@functools.lru_cache(maxsize=8)
def _token_counts(source: Any) -> tuple[np.ndarray, np.ndarray]:
    return token_counts(_sanitized_corpus(source))


def blank_action(action: Any) -> bool:
    """Whether ``action`` is empty apart from an optional ``<think>`` block (a "continue" without memory)."""
    return isinstance(action, str) and _THINK_ONLY.fullmatch(action) is not None


class MemReadEnv(MemEnvBase):
    """Long-document reading with memory rewrites (MemAgent style).

    Args:
        objectives: questions per episode, answered together as ``<answer>a1; a2; ...</answer>``.
        hops, comparison_rate, corpus_size, lookalike_rate, distractors, world_seed: the synthetic world and
            its questions (as in MemQA).
        data_path, data_limit: a HotpotQA file (official or HF layout) instead of the world; its pooled
            context paragraphs are the corpus the distractors come from.
        corpus_path, questions_path: a generic corpus + questions JSONL pair; ``source``: any object with
            ``documents`` and ``sample_questions(rng, n)``.
        doc_tokens: length of the long document in whitespace tokens (about 2,000 to 1,000,000 and more).
        chunk_tokens: tokens per chunk (whole paragraphs are packed; a longer paragraph is split).
        memory_budget: memory cap in tokens (the start is kept), shown in the instructions.
        max_turns: turn limit (default ``2 * (chunks + 1)``, per episode).
        keep_snapshots: the invocation snapshots ``info["summary"]["snapshots"]`` keeps: the last 256 by default,
            ``True`` every one, N the last N (``snapshots_dropped`` counts the others); ``False`` keeps
            none (``info["invocation"]`` is still returned each step), for million-token episodes.
        context, context_budget, token_counter, invalid_penalty, render_mode: see :class:`MemEnvBase`.
    """

    def __init__(
        self,
        objectives: int = 1,
        hops: int | tuple[int, ...] = 2,
        *,
        doc_tokens: int = 8000,
        chunk_tokens: int = 512,
        corpus_size: int = 1200,
        lookalike_rate: float = 0.3,
        distractors: int = 3,
        comparison_rate: float = 0.25,
        world_seed: int = 0,
        dataset: str = "synthetic",
        data_path: str | os.PathLike | None = None,
        data_limit: int | None = None,
        corpus_path: str | os.PathLike | None = None,
        questions_path: str | os.PathLike | None = None,
        source: Any = None,
        max_turns: int | None = None,
        context: str = "memory",
        context_budget: int | None = None,
        token_counter: TokenCounter | None = None,
        memory_budget: int | None = 256,
        invalid_penalty: float = 0.0,
        keep_snapshots: bool | int = DEFAULT_KEPT_SNAPSHOTS,
        render_mode: str | None = None,
    ) -> None:
        super().__init__(context=context, context_budget=context_budget, token_counter=token_counter,
                         memory_budget=memory_budget, invalid_penalty=invalid_penalty, render_mode=render_mode)
        self.objectives, self.hops, self.comparison_rate = check_qa_task(objectives, hops, comparison_rate)
        self.doc_tokens = check_int("doc_tokens", doc_tokens, minimum=1, maximum=MAX_DOC_TOKENS)
        self.chunk_tokens = check_int("chunk_tokens", chunk_tokens, minimum=MIN_CHUNK_TOKENS)
        self._max_turns_arg = check_int("max_turns", max_turns, minimum=1, allow_none=True)
        self.keep_snapshots = check_keep_snapshots(keep_snapshots)
        self.source = resolve_qa_source(
            objectives=self.objectives, hops=self.hops, comparison_rate=self.comparison_rate, dataset=dataset,
            source=source, data_path=data_path, data_limit=data_limit, corpus_path=corpus_path,
            questions_path=questions_path, corpus_size=corpus_size, lookalike_rate=lookalike_rate,
            distractors=distractors, world_seed=world_seed, env_id="MemRead-v0")
        self._check_context_budget(self._compose_task([""] * self.objectives))
        self.documents: tuple[Document, ...] = _sanitized_corpus(self.source)
        self._header_tokens, self._text_tokens = _token_counts(self.source)
        self.questions: list[Question] = []
        self.plan: DocumentPlan | None = None
        self.max_turns = max_turns or 0
        self._chunk = 0
        self._task_text = ""
        self._block = ""

    # ------------------------------------------------------------------ text
    def _task_block(self) -> str:
        return self._task_text

    def _instructions(self) -> str:
        if not self.mode.uses_memory:
            return READ_INSTRUCTIONS_NO_MEMORY
        budget = "no limit" if self.memory_budget is None else f"{self.memory_budget} tokens"
        return READ_INSTRUCTIONS.format(budget=budget)

    def _compose_task(self, questions: list[str]) -> str:
        lines = [self._instructions()]
        lines += [f"Question {i}: {sanitize(q)}" for i, q in enumerate(questions, 1)]
        return "<task>\n" + "\n".join(lines) + "\n</task>"

    @property
    def n_chunks(self) -> int:
        return 0 if self.plan is None else self.plan.n_chunks

    @property
    def reading(self) -> bool:
        """Whether a chunk is being shown (``False`` once the env asks for the answer)."""
        return self._chunk < self.n_chunks

    def chunk(self, c: int) -> str:
        """The text of chunk ``c`` (0-based) of the current episode's document."""
        if self.plan is None:
            raise RuntimeError("call reset() first")
        return self.plan.chunk_text(c, self.documents)

    def iter_chunks(self):
        """Every chunk of the current document, rendered one at a time (nothing is kept)."""
        if self.plan is None:
            raise RuntimeError("call reset() first")
        return self.plan.iter_chunks(self.documents)

    def document(self, doc_id: str) -> Document:
        """The corpus document with id ``doc_id`` (as shown to the policy: sanitised text)."""
        return self.documents[_document_positions(self.source)[doc_id]]

    def _information_block(self, notice: str | None = None) -> str:
        tail = f"\n[{notice}]" if notice else ""
        if self.reading:
            head = f"[chunk {self._chunk + 1}/{self.n_chunks}]"
            return f"<information>{head}{tail}\n{self.chunk(self._chunk)}\n</information>"
        head = f"[document finished: all {self.n_chunks} chunks read; turns left: {self.max_turns - self._turn}]"
        return (f"<information>{head}{tail}\nAnswer now with <answer>answer 1; answer 2; ...</answer>, one answer "
                "per question, in order.\n</information>")

    # ------------------------------------------------------------------ gymnasium API
    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        super().reset(seed=seed)
        if isinstance(self.source, World):
            self.questions = self.source.sample_questions(self.np_random, self.objectives, self.hops,
                                                          self.comparison_rate)
        else:
            self.questions = self.source.sample_questions(self.np_random, self.objectives)
        positions = _document_positions(self.source)
        gold = [positions[d] for q in self.questions for d in q.supporting_ids if d in positions]
        self.plan = plan_long_document(self.np_random, self._header_tokens, self._text_tokens, gold,
                                       self.doc_tokens, self.chunk_tokens)
        self.max_turns = self._max_turns_arg or 2 * (self.plan.n_chunks + 1)
        self._task_text = self._compose_task([q.question for q in self.questions])
        self._chunk = 0
        self._turn = 0
        self._block = self._information_block()
        self._start_episode(self._block)
        info = {
            "episode_id": self._episode_id,
            "questions": [q.question for q in self.questions],
            "question_ids": [q.id for q in self.questions],
            "doc_tokens": self.plan.total_tokens,
            "chunks": self.plan.n_chunks,
            "chunk_tokens": self.chunk_tokens,
            "max_turns": self.max_turns,
            "context_tokens": self._obs_tokens,
        }
        return self._obs, info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        memory_before = self._begin_step()
        shown_chunk = self._chunk if self.reading else -1  # -1: the answer phase (an int on every step)
        reward, terminated, extra, scores = 0.0, False, {}, None
        memory_cut, tool, tool_input = 0, None, None
        answers: list[str] = []

        if not self.mode.uses_memory and blank_action(action):
            parsed_error, memory, tool = None, None, None
        else:
            parsed = parse_action(action, require_memory=False, tools=("answer",), allow_memory_only=True)
            parsed_error, memory, tool = parsed.error, parsed.memory, parsed.tool
            tool_input = parsed.argument
            if parsed_error is None and tool is None and not self.reading:
                parsed_error = "the document is finished: answer with <answer>answer 1; answer 2; ...</answer>"
        valid = parsed_error is None

        if not valid:
            reward = -self.invalid_penalty
            notice = sanitize(f"invalid action, state unchanged: {parsed_error}")
            tool, tool_input = None, None
            tool_output = notice
            information = self._information_block(notice)
        else:
            if memory is not None:
                memory_cut = self._set_memory(memory)
            if tool == "answer":
                answers = split_answers(tool_input, len(self.questions))
                scores = score_objectives(answers, [q.answers for q in self.questions])
                reward = float(scores["f1_mean"])
                terminated = True
                extra["answer_f1"], extra["answer_em"] = list(scores["f1"]), list(scores["em"])
                tool_output = f"answers submitted; F1 {reward:.3f}"
                information = f"<information>[{tool_output}]\n</information>"
            else:
                self._chunk += 1
                tool_output = (f"chunk {self._chunk + 1}/{self.n_chunks} shown next" if self.reading
                               else "document finished; answer requested")
                information = self._information_block()
        truncated = not terminated and self._turn >= self.max_turns
        snapshot = self._record(
            action=action, memory_before=memory_before, tool=tool, tool_input=tool_input, tool_output=tool_output,
            valid=valid, error=parsed_error, reward=reward, memory_truncated_tokens=memory_cut,
            chunk=shown_chunk, chunks=self.n_chunks, **extra,
        )
        def summary() -> dict[str, Any]:
            final = scores or score_objectives([""] * len(self.questions), [q.answers for q in self.questions])
            return self._episode_info(
                final["em"], final["f1"], answers, terminated,
                doc_tokens=self.plan.total_tokens, chunks=self.plan.n_chunks,
                chunks_read=min(self._chunk, self.n_chunks), chunk_tokens=self.chunk_tokens,
                gold_chunks=self.plan.gold_chunks,
            )

        return self._close_step(snapshot, information, action, reward, terminated, truncated, summary)
