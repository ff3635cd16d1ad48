"""MemQA: multi-objective, multi-hop search QA where every action rewrites the agent's memory.

One episode composes N questions (objectives, MEM1 style). Each turn the policy sees the task, its own memory
and the newest search result (context mode ``memory``), writes a new memory and either searches or answers
all questions at once. Reward: mean F1 over the objectives, at the end.
"""

from __future__ import annotations

import functools
import os
from typing import Any

from memenv.base import MemEnvBase, required_data_file, sanitize
from memenv.context import TokenCounter
from memenv.protocol import parse_action
from memenv.scoring import score_objectives, split_answers
from memenv.index import BM25Index, QuestionPool
from memenv.remote import RemoteRetriever, is_retriever_url, shared_retriever
from memenv.search import SearchBackend, make_backend
from tasks.corpus import load_questions_jsonl
from tasks.types import Document, QADataset, Question
from tasks.world import World, build_world

INSTRUCTIONS = {
    True: (
        "Answer the questions below by searching a document collection. Each turn, first rewrite your memory "
        "inside <memory>...</memory>: it is all you will keep from earlier turns. Then either search with "
        "<search>query</search> or, when done, answer with <answer>answer 1; answer 2; ...</answer>, one answer "
        "per question, in order."
    ),
    False: (
        "Answer the questions below by searching a document collection. Each turn, either search with "
        "<search>query</search> or, when done, answer with <answer>answer 1; answer 2; ...</answer>, one answer "
        "per question, in order. You may note things in <memory>...</memory> before the tool call."
    ),
}


@functools.lru_cache(maxsize=8)
def _sanitized_corpus(source: World | QADataset) -> tuple[Document, ...]:
    return tuple(Document(d.id, sanitize(d.title), sanitize(d.text)) for d in source.documents)


@functools.lru_cache(maxsize=8)
def _document_positions(source: World | QADataset) -> dict[str, int]:
    return {d.id: i for i, d in enumerate(source.documents)}


@functools.lru_cache(maxsize=8)
def _search_index(source: World | QADataset, backend: str) -> SearchBackend:
    """One index per (source, backend), shared by every env instance in the process."""
    return make_backend(backend, [d.contents for d in _sanitized_corpus(source)])


@functools.lru_cache(maxsize=8)
def _load_dataset(kind: str, paths: tuple[str, ...], mtimes: tuple[float, ...], limit: int | None) -> QADataset:
    if kind == "hotpotqa":
        from tasks.hotpot import load_hotpotqa

        return load_hotpotqa(paths[0], limit=limit)
    from tasks.corpus import load_qa_pair

    return load_qa_pair(paths[0], paths[1])


@functools.lru_cache(maxsize=8)
def _open_index(index_path: str, corpus_path: str | None, corpus_stat: tuple | None) -> BM25Index:
    """One memory-mapped index per (directory, corpus) per process; the corpus is checked by fingerprint
    (``corpus_stat`` keys the cache, so a corpus changed since is checked again)."""
    return BM25Index(index_path, corpus_path=corpus_path)


@functools.lru_cache(maxsize=8)
def _question_pool(documents: Any, questions_path: str, mtime: float) -> QuestionPool:
    return QuestionPool(documents, load_questions_jsonl(questions_path), name=os.path.basename(questions_path))


def resolve_scaled_search(index_path, search_backend: str, corpus_path, questions_path, source) -> tuple:
    """``(source, documents, index)`` of a MemQA env over a disk index (``index_path=``) or a retrieval server
    (``search_backend="http://..."``): the corpus stays on disk or on the server; questions come from
    ``questions_path`` (or ``source``)."""
    if index_path is not None:
        if is_retriever_url(search_backend):
            raise ValueError("give index_path= or a retrieval server url as search_backend=, not both")
        corpus = None if corpus_path is None else os.fspath(corpus_path)
        stat = None if corpus is None else (os.stat(corpus).st_size, os.stat(corpus).st_mtime_ns)
        index = _open_index(os.fspath(index_path), corpus, stat)
        documents: Any = index.documents
    else:
        index, documents = shared_retriever(search_backend), ()
    if source is None:
        if questions_path is None:
            raise ValueError("index_path= or a retrieval server needs questions_path= (a questions JSONL file)")
        path = os.fspath(questions_path)
        source = _question_pool(documents, path, os.path.getmtime(path))
    return source, documents, index


def resolve_qa_source(*, dataset: str = "synthetic", source: Any = None, data_path=None, data_limit=None,
                      corpus_path=None, questions_path=None, corpus_size: int = 1200, lookalike_rate: float = 0.3,
                      distractors: int = 3, world_seed: int = 0) -> Any:
    """The task source of a QA-style env (MemQA, MemRead): a given ``source``, a generic JSONL pair, a HotpotQA
    file, or the (cached) synthetic world. Loaded files and worlds are shared by every env in the process."""
    if source is not None:
        if not hasattr(source, "documents") or not hasattr(source, "sample_questions"):
            raise TypeError("source must have .documents and .sample_questions(rng, n)")
        return source
    if corpus_path is not None or questions_path is not None:
        if corpus_path is None or questions_path is None:
            raise ValueError("a generic dataset needs both corpus_path= and questions_path= (JSONL files)")
        paths = (os.fspath(corpus_path), os.fspath(questions_path))
        return _load_dataset("pair", paths, tuple(os.path.getmtime(p) for p in paths), None)
    if data_path is not None or dataset == "hotpotqa":
        path = required_data_file(data_path, "MemQA-Hotpot-v0", "a HotpotQA JSON or JSONL file",
                                  "../shared/data/hotpotqa/hotpot_dev_distractor_1100.json", "HotpotQA")
        return _load_dataset("hotpotqa", (path,), (os.path.getmtime(path),), data_limit)
    if dataset != "synthetic":
        raise ValueError(f"unknown dataset {dataset!r}: use 'synthetic' or 'hotpotqa'")
    return build_world(int(corpus_size), float(lookalike_rate), int(distractors), int(world_seed))


class MemQAEnv(MemEnvBase):
    """Multi-objective search QA with explicit memory rewrites.

    Task source (one of): the synthetic world (default; knobs ``corpus_size``, ``lookalike_rate``,
    ``distractors``, ``world_seed``, ``hops``, ``comparison_rate``), a HotpotQA file (``data_path``), or a
    generic corpus + questions JSONL pair (``corpus_path``, ``questions_path``), or any ``source`` object
    with ``documents`` and ``sample_questions``.

    Args:
        objectives: questions per episode, answered together as ``<answer>a1; a2; ...</answer>``.
        top_k: documents returned per search.
        max_turns: invocations per episode (default ``2 * objectives * max(hops) + 2``).
        context: ``memory`` | ``history`` | ``window:K`` | ``none`` (see DESIGN.md).
        context_budget: observation budget in tokens (left-truncates the body, keeps the task block).
        token_counter: callable ``str -> int`` (default: whitespace words).
        memory_budget: optional cap on the memory, in tokens (the start is kept).
        invalid_penalty: reward subtracted for an invalid action (the turn is used, state unchanged).
        search_backend: ``bm25`` (fast, default), ``rank_bm25`` (reference), or the URL of a Search-R1/MEM1
            retrieval server (``http://HOST:PORT/retrieve``, see :mod:`memenv.remote`; with ``questions_path``).
        index_path: a directory written by ``memenv index build`` (:mod:`memenv.index`): search it instead of
            indexing the corpus in memory; documents come from its store, questions from ``questions_path``;
            a ``corpus_path`` given too must be the indexed file (checked by fingerprint).
    """

    def __init__(
        self,
        objectives: int = 2,
        hops: int | tuple[int, ...] = 2,
        *,
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
        top_k: int = 3,
        max_turns: int | None = None,
        context: str = "memory",
        context_budget: int | None = None,
        token_counter: TokenCounter | None = None,
        memory_budget: int | None = None,
        invalid_penalty: float = 0.0,
        search_backend: str = "bm25",
        index_path: str | os.PathLike | None = None,
        render_mode: str | None = None,
    ) -> None:
        super().__init__(context=context, context_budget=context_budget, token_counter=token_counter,
                         memory_budget=memory_budget, invalid_penalty=invalid_penalty, render_mode=render_mode)
        if not isinstance(objectives, int) or objectives < 1:
            raise ValueError(f"objectives must be a positive int, got {objectives!r}")
        depths = (hops,) if isinstance(hops, int) else tuple(hops)
        if not depths or any(not isinstance(h, int) or not 1 <= h <= 6 for h in depths):
            raise ValueError(f"hops must be an int in 1..6 or a tuple of them, got {hops!r}")
        if not isinstance(top_k, int) or top_k < 1:
            raise ValueError(f"top_k must be a positive int, got {top_k!r}")
        self.objectives = objectives
        self.hops = depths
        self.comparison_rate = float(comparison_rate)
        self.top_k = top_k
        self.index: SearchBackend | RemoteRetriever
        if index_path is not None or is_retriever_url(search_backend):
            self.source, self.documents, self.index = resolve_scaled_search(
                index_path, search_backend, corpus_path, questions_path, source)
        else:
            self.source = resolve_qa_source(
                dataset=dataset, source=source, data_path=data_path, data_limit=data_limit,
                corpus_path=corpus_path, questions_path=questions_path, corpus_size=corpus_size,
                lookalike_rate=lookalike_rate, distractors=distractors, world_seed=world_seed)
            self.documents = _sanitized_corpus(self.source)
            self.index = _search_index(self.source, search_backend)
        self.max_turns = int(max_turns) if max_turns is not None else 2 * objectives * max(depths) + 2
        if self.max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns!r}")
        self.questions: list[Question] = []
        self._task_text = ""
        self._last_result = ""

    # ------------------------------------------------------------------ text
    def _task_block(self) -> str:
        return self._task_text

    def _information_block(self, content: str, notice: str | None = None) -> str:
        turns_left = self.max_turns - self._turn
        head = f"[turns left: {turns_left}]"
        if notice:
            head += f"\n[{notice}]"
        return f"<information>{head}\n{content}\n</information>"

    def document(self, doc_id: str) -> Document:
        """The corpus document with id ``doc_id`` (as shown to the policy: sanitised text)."""
        return self.documents[_document_positions(self.source)[doc_id]]

    def format_results(self, doc_indices: list[int]) -> str:
        return self.format_documents([self.documents[i] for i in doc_indices])

    def format_documents(self, docs: list[Document]) -> str:
        if not docs:
            return "No documents matched the query."
        return "\n".join(f"Doc {rank} (Title: {sanitize(d.title)}) {sanitize(d.text)}" for rank, d in enumerate(docs, 1))

    def retrieve(self, query: str) -> list[Document]:
        """The top ``top_k`` documents for ``query`` (from the in-memory index, a disk index or a server)."""
        if isinstance(self.index, RemoteRetriever):
            return self.index.search_documents(query, self.top_k)
        return [self.documents[i] for i in self.index.search(query, self.top_k)]

    # ------------------------------------------------------------------ gymnasium API
    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        super().reset(seed=seed)
        if isinstance(self.source, World):
            self.questions = self.source.sample_questions(self.np_random, self.objectives, self.hops,
                                                          self.comparison_rate)
        else:
            self.questions = self.source.sample_questions(self.np_random, self.objectives)
        lines = [INSTRUCTIONS[self.mode.uses_memory]]
        lines += [f"Question {i}: {sanitize(q.question)}" for i, q in enumerate(self.questions, 1)]
        self._task_text = "<task>\n" + "\n".join(lines) + "\n</task>"
        self._last_result = "No search results yet."
        self._turn = 0  # the information block shows the turns left of the new episode
        self._start_episode(self._information_block(self._last_result))
        info = {
            "episode_id": self._episode_id,
            "questions": [q.question for q in self.questions],
            "question_ids": [q.id for q in self.questions],
            "max_turns": self.max_turns,
            "context_tokens": self._obs_tokens,
        }
        return self._obs, info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        memory_before = self._begin_step()
        parsed = parse_action(action, require_memory=self.mode.uses_memory)
        reward, terminated, extra = 0.0, False, {}
        tool_output, notice, memory_cut = "", None, 0
        if not parsed.valid:
            reward = -self.invalid_penalty
            notice = sanitize(f"invalid action, state unchanged: {parsed.error}")
            information = self._information_block(self._last_result, notice)
            tool_output = notice
        else:
            if parsed.memory is not None:
                memory_cut = self._set_memory(parsed.memory)
            if parsed.tool == "search":
                hits = self.retrieve(parsed.argument)
                tool_output = self.format_documents(hits)
                extra["retrieved_ids"] = [d.id for d in hits]
                self._last_result = tool_output
                information = self._information_block(tool_output)
            else:  # answer
                preds = split_answers(parsed.argument, len(self.questions))
                scores = score_objectives(preds, [q.answers for q in self.questions])
                reward = float(scores["f1_mean"])
                terminated = True
                tool_output = f"answers submitted; F1 {reward:.3f}"
                extra["scores"] = scores
                information = self._information_block(tool_output)
        truncated = not terminated and self._turn >= self.max_turns
        snapshot = self._record(
            action=action, memory_before=memory_before, tool=parsed.tool if parsed.valid else None,
            tool_input=parsed.argument if parsed.valid else None, tool_output=tool_output, valid=parsed.valid,
            error=parsed.error, reward=reward, memory_truncated_tokens=memory_cut, **extra,
        )
        self._advance(information, action if isinstance(action, str) else repr(action))
        info: dict[str, Any] = {"invocation": snapshot}
        if terminated or truncated:
            self._done = True
            scores = extra.get("scores") or score_objectives([""] * len(self.questions),
                                                             [q.answers for q in self.questions])
            answers = split_answers(parsed.argument, len(self.questions)) if terminated else []
            info["summary"] = self._episode_info(scores["em"], scores["f1"], answers, terminated)
        return self._obs, reward, terminated, truncated, info
