"""MemQA: multi-objective, multi-hop search QA where every action rewrites the agent's memory.

One episode composes N questions (objectives, MEM1 style). Each turn the policy sees the task, its own memory
and the newest search result (context mode ``memory``), writes a new memory and either searches or answers
all questions at once. Reward: mean F1 over the objectives, at the end.

With ``memory_mode="tools"`` the memory is instead a :class:`memenv.memory_tools.MemoryStore` of numbered
entries, and each action is exactly one call: a store tool (``<mem_add>``, ``<mem_update id=N>``,
``<mem_delete id=N/>``, ``<mem_search>``), ``<search>`` over the corpus, or ``<answer>``.
"""

from __future__ import annotations

import functools
import os
from typing import Any

from memenv.envs.base import MemEnvBase, file_stamps, required_data_file, sanitize
from memenv.context import TokenCounter
from memenv.memory_tools import (MEMORY_MODES, STORE_TOOLS, MemoryStore, StoreError, check_tools_context,
                                 parse_tool_call, run_store_call)
from memenv.protocol import parse_action
from memenv.scoring.qa import score_objectives, split_answers
from memenv.search.index.search import BM25Index, QuestionPool
from memenv.search.remote import RemoteRetriever, is_retriever_url, shared_retriever
from memenv.search.bm25 import BACKENDS, SearchBackend, make_backend
from memenv.validation import (ArgumentTypeError, check_bool, check_choice, check_int, check_int_tuple, check_number,
                               check_path, check_rate)
from tasks.corpus import load_questions_jsonl
from tasks.types import Document, QADataset, Question
from tasks.world import QUESTION_POOLS, World, build_world, objective_capacity, question_pool

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
    "tools": (
        "Answer the questions below by searching a document collection. Your memory is a store of numbered "
        "entries ({budget}): besides the newest search result, it is all you keep from earlier turns. Act with "
        "exactly one tool call per turn: <search>query</search> searches the collection; <mem_add>text</mem_add>, "
        "<mem_update id=N>text</mem_update> and <mem_delete id=N/> edit your store; <mem_search>query</mem_search> "
        "searches it. When done, answer with <answer>answer 1; answer 2; ...</answer>, one answer per question, "
        "in order."
    ),
}
#: The calls of the tools protocol on MemQA.
QA_TOOLS = (*STORE_TOOLS, "search", "answer")
# The invocation keys of the tools mode on a step that did not produce them (every step has every key, one
# type per key): no entry touched (ids start at 1), no store search.
NO_STORE_RESULT = {"entry_id": -1, "retrieved_entries": []}
DEFAULT_SEARCH_K = 8


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
def _load_dataset(kind: str, paths: tuple[str, ...], stamps: tuple, limit: int | None) -> QADataset:
    if kind == "hotpotqa":
        from tasks.hotpot import load_hotpotqa

        return load_hotpotqa(paths[0], limit=limit)
    from tasks.corpus import load_qa_pair

    return load_qa_pair(paths[0], paths[1])


#: Task sources of the QA-style envs (``dataset=``); a generic pair is chosen by ``corpus_path``/``questions_path``.
QA_DATASETS = ("synthetic", "hotpotqa")
#: Largest synthetic world an env builds (a million documents take about a minute to generate and index).
MAX_CORPUS_SIZE = 1_000_000
MIN_CORPUS_SIZE = 50
#: Most distractor sentences per synthetic document.
MAX_DISTRACTORS = 100
MAX_HOPS = 6


def check_qa_task(objectives: Any, hops: Any, comparison_rate: Any) -> tuple[int, tuple[int, ...], float]:
    """The validated ``(objectives, hops, comparison_rate)`` of a QA-style env (range checks against the
    task source come in :func:`resolve_qa_source`)."""
    return (check_int("objectives", objectives, minimum=1),
            check_int_tuple("hops", hops, minimum=1, maximum=MAX_HOPS),
            check_rate("comparison_rate", comparison_rate))


@functools.lru_cache(maxsize=8)
def _open_index(index_path: str, corpus_path: str | None, stamps: tuple) -> BM25Index:
    """One memory-mapped index per (directory, corpus) per process; the corpus is checked by fingerprint
    (its stamp keys the cache, so a corpus changed since is checked again) and the index's manifest by its
    stamp (a rebuilt or replaced index is opened, and verified, again)."""
    return BM25Index(index_path, corpus_path=corpus_path)


@functools.lru_cache(maxsize=8)
def _question_pool(documents: Any, questions_path: str, stamps: tuple) -> QuestionPool:
    return QuestionPool(documents, load_questions_jsonl(questions_path), name=os.path.basename(questions_path))


def resolve_scaled_search(index_path, search_backend: str, corpus_path, questions_path, source) -> tuple:
    """``(source, documents, index)`` of a MemQA env over a disk index (``index_path=``) or a retrieval server
    (``search_backend="http://..."``): the corpus stays on disk or on the server; questions come from
    ``questions_path`` (or ``source``)."""
    if index_path is not None:
        if is_retriever_url(search_backend):
            raise ValueError("give index_path= or a retrieval server url as search_backend=, not both")
        corpus = None if corpus_path is None else os.fspath(corpus_path)
        manifest = os.path.join(index_path, "manifest.json")
        index = _open_index(os.fspath(index_path), corpus, file_stamps(manifest, *([corpus] if corpus else [])))
        documents: Any = index.documents
    else:
        index, documents = shared_retriever(search_backend), ()
    if source is None:
        if questions_path is None:
            raise ValueError("index_path= or a retrieval server needs questions_path= (a questions JSONL file)")
        path = os.fspath(questions_path)
        source = _question_pool(documents, path, file_stamps(path))
    return source, documents, index


def resolve_qa_source(*, objectives: int = 1, hops: tuple[int, ...] = (2,), comparison_rate: float = 0.25,
                      dataset: str = "synthetic", source: Any = None, data_path=None, data_limit=None,
                      corpus_path=None, questions_path=None, corpus_size: int = 1200, lookalike_rate: float = 0.3,
                      distractors: int = 3, world_seed: int = 0, env_id: str = "MemQA-Hotpot-v0") -> Any:
    """The task source of a QA-style env (MemQA, MemRead): a given ``source``, a generic JSONL pair, a HotpotQA
    file, or the (cached) synthetic world. Loaded files and worlds are shared by every env in the process.

    Every argument is validated first (a ValueError/TypeError naming it); ``objectives`` (already checked by
    :func:`check_qa_task`) is then checked against what the source holds: the question count of a file, or
    :func:`tasks.world.objective_capacity` of the world, computed before the world is built.
    """
    dataset = check_choice("dataset", dataset, QA_DATASETS)
    data_path = check_path("data_path", data_path)
    data_limit = check_int("data_limit", data_limit, minimum=1, allow_none=True)
    corpus_path = check_path("corpus_path", corpus_path)
    questions_path = check_path("questions_path", questions_path)
    corpus_size = check_int("corpus_size", corpus_size, minimum=MIN_CORPUS_SIZE, maximum=MAX_CORPUS_SIZE)
    lookalike_rate = check_rate("lookalike_rate", lookalike_rate)
    distractors = check_int("distractors", distractors, minimum=0, maximum=MAX_DISTRACTORS)
    world_seed = check_int("world_seed", world_seed, minimum=0)
    pair = corpus_path is not None or questions_path is not None
    if source is not None:
        if not hasattr(source, "documents") or not hasattr(source, "sample_questions"):
            raise ArgumentTypeError(f"source must have .documents and .sample_questions(rng, n), got "
                                    f"{type(source).__name__}")
        if pair or data_path is not None:
            raise ValueError("source= is a task source of its own: give it without data_path/corpus_path/questions_path")
        _check_question_count(objectives, source, "source")
        return source
    if pair:
        if corpus_path is None or questions_path is None:
            raise ValueError("a generic dataset needs both corpus_path= and questions_path= (JSONL files)")
        if data_path is not None or dataset == "hotpotqa":
            raise ValueError("corpus_path/questions_path make a generic dataset: give them without "
                             "data_path= or dataset='hotpotqa'")
        for name, path in (("corpus_path", corpus_path), ("questions_path", questions_path)):
            if not os.path.isfile(path):
                raise FileNotFoundError(f"{name} file not found: {path!r}")
        paths = (corpus_path, questions_path)
        loaded = _load_dataset("pair", paths, file_stamps(*paths), None)
        _check_question_count(objectives, loaded, f"questions_path={questions_path!r}")
        return loaded
    if data_path is not None or dataset == "hotpotqa":
        path = required_data_file(data_path, env_id, "a HotpotQA JSON or JSONL file",
                                  "../shared/data/hotpotqa/hotpot_dev_distractor_1100.json", "HotpotQA")
        loaded = _load_dataset("hotpotqa", (path,), file_stamps(path), data_limit)
        _check_question_count(objectives, loaded, f"data_path={path!r}" + (
            f" with data_limit={data_limit}" if data_limit is not None else ""))
        return loaded
    capacity = objective_capacity(corpus_size, hops, comparison_rate)
    if objectives > capacity:
        raise ValueError(
            f"objectives={objectives} is more than a world of corpus_size={corpus_size} holds with hops={hops} "
            f"and comparison_rate={comparison_rate}: at most {capacity} objectives (questions need disjoint "
            f"supporting documents); lower objectives or raise corpus_size (up to {MAX_CORPUS_SIZE})")
    return build_world(corpus_size, lookalike_rate, distractors, world_seed)


def _check_question_count(objectives: int, source: Any, what: str) -> None:
    """Objectives are drawn without replacement: a file must hold at least that many questions."""
    questions = getattr(source, "questions", None)
    if questions is not None and objectives > len(questions):
        raise ValueError(f"objectives={objectives} is more than {what} holds: at most {len(questions)} "
                         f"(its question count)")


def _in_pool(question: Question, *, pool: str, fraction: float, salt: str) -> bool:
    return question_pool(question, fraction, salt) == pool


class MemQAEnv(MemEnvBase):
    """Multi-objective search QA with explicit memory rewrites.

    Task source (one of): the synthetic world (default; knobs ``corpus_size``, ``lookalike_rate``,
    ``distractors``, ``world_seed``, ``hops``, ``comparison_rate``), a HotpotQA file (``data_path``), or a
    generic corpus + questions JSONL pair (``corpus_path``, ``questions_path``), or any ``source`` object
    with ``documents`` and ``sample_questions``.

    Args:
        objectives: questions per episode, answered together as ``<answer>a1; a2; ...</answer>``.
        question_split: the synthetic world's question pool: ``all`` (default), ``train`` or ``heldout``, a
            split of its questions by subject entity fixed before any training (:func:`tasks.world.question_pool`):
            an agent trained on ``train`` episodes never saw a ``heldout`` question; the documents are shared.
        heldout_fraction: share of the world's entities whose questions are held out (default 0.25).
        fresh_facts: the synthetic world only. ``False`` (default): one fixed world (``world_seed``) for every
            episode, so its facts can be learnt by heart. ``True``: every ``reset`` draws the world's facts afresh
            from the episode's seed (:meth:`tasks.world.World.with_fresh_facts`) over the fixed inventory of
            ``world_seed``'s names and values (entity names, look-alikes included, year ranges, populations):
            documents and answers are those of the draw, so the same question has another answer in another
            episode and only reading can answer it. The corpus is re-indexed at each reset (~0.1 s at 1,200
            documents). ``reset``'s info carries ``world_draw``, a fingerprint of the episode's facts.
        fresh_name_rate: with ``fresh_facts``, the share of episodes whose draw also renames every entity (new
            names, none of the inventory's; :meth:`tasks.world.World.with_fresh_facts`), default 0. Training
            demonstrations drawn so teach copying a name read in the question or a document rather than knowing
            entities by name: held-out subjects are names no training question asked about.
        top_k: documents returned per search.
        max_turns: invocations per episode (default ``2 * objectives * max(hops) + 2``).
        context: ``memory`` | ``history`` | ``window:K`` | ``none`` (see docs/design.md).
        context_budget: observation budget in tokens (left-truncates the body, keeps the task block).
        token_counter: callable ``str -> int`` (default: whitespace words).
        memory_budget: optional cap on the memory, in tokens (the start is kept).
        invalid_penalty: reward subtracted for an invalid action (the turn is used, state unchanged).
        search_backend: ``bm25`` (fast, default), ``rank_bm25`` (reference), or the URL of a Search-R1/MEM1
            retrieval server (``http://HOST:PORT/retrieve``, see :mod:`memenv.search.remote`; with ``questions_path``).
        index_path: a directory written by ``memenv index build`` (:mod:`memenv.search.index`): search it instead of
            indexing the corpus in memory; documents come from its store, questions from ``questions_path``;
            a ``corpus_path`` given too must be the indexed file (checked by fingerprint).
        memory_mode: ``rewrite`` (default: one memory rewrite per action) or ``tools`` (a store of entries
            edited with tool calls, one call per action; needs ``context="memory"``; ``memory_budget`` then
            caps the store, and the default ``max_turns`` is ``(top_k + 3)`` times larger, as every stored
            document costs a call).
        search_k: tools mode: entries a ``<mem_search>`` returns (default 8).
        show_store: tools mode: list every entry in the ``<memory>`` block (default True); ``False`` shows only
            the store's size, so the agent must ``<mem_search>`` its store.
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
        question_split: str = "all",
        heldout_fraction: float = 0.25,
        fresh_facts: bool = False,
        fresh_name_rate: float = 0.0,
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
        memory_mode: str = "rewrite",
        search_k: int | None = None,
        show_store: bool | None = None,
        render_mode: str | None = None,
    ) -> None:
        self.memory_mode = check_choice("memory_mode", memory_mode, MEMORY_MODES)
        tools = self.memory_mode == "tools"
        memory_budget = check_int("memory_budget", memory_budget, minimum=0, allow_none=True)
        super().__init__(context=context, context_budget=context_budget, token_counter=token_counter,
                         memory_budget=None if tools else memory_budget, invalid_penalty=invalid_penalty,
                         render_mode=render_mode)
        check_tools_context(self.memory_mode, self.mode.uses_memory, context)
        for name, value in (("search_k", search_k), ("show_store", show_store)):
            if value is not None and not tools:  # a knob of the other protocol would be ignored silently
                raise ValueError(f"{name}={value!r} applies to memory_mode='tools' only; it has no effect with "
                                 f"memory_mode={self.memory_mode!r}")
        self.search_k = check_int("search_k", DEFAULT_SEARCH_K if search_k is None else search_k, minimum=1)
        self.show_store = check_bool("show_store", True if show_store is None else show_store)
        self.store_budget = memory_budget
        self.objectives, self.hops, self.comparison_rate = check_qa_task(objectives, hops, comparison_rate)
        self.top_k = check_int("top_k", top_k, minimum=1)
        self.max_turns = check_int("max_turns", max_turns, minimum=1, allow_none=True)
        self.index: SearchBackend | RemoteRetriever
        if index_path is not None or is_retriever_url(search_backend):
            index_path = check_path("index_path", index_path)
            self.source, self.documents, self.index = resolve_scaled_search(
                index_path, search_backend, corpus_path, questions_path, source)
            available = len(getattr(self.source, "questions", ()) or ())
            if available and self.objectives > available:
                raise ValueError(f"objectives={self.objectives} is more than the {available} questions of "
                                 f"{getattr(self.source, 'name', 'the questions file')}")
        else:
            search_backend = check_choice("search_backend", search_backend, tuple(BACKENDS))
            self.source = resolve_qa_source(
                objectives=self.objectives, hops=self.hops, comparison_rate=self.comparison_rate, dataset=dataset,
                source=source, data_path=data_path, data_limit=data_limit, corpus_path=corpus_path,
                questions_path=questions_path, corpus_size=corpus_size, lookalike_rate=lookalike_rate,
                distractors=distractors, world_seed=world_seed)
            self.documents = _sanitized_corpus(self.source)
            self.index = _search_index(self.source, search_backend)
        self.fresh_facts = check_bool("fresh_facts", fresh_facts)
        self._search_backend = search_backend
        if self.fresh_facts and not isinstance(self.source, World):
            raise ValueError("fresh_facts=True draws the synthetic world's facts afresh each episode; this task "
                             "source has fixed documents (give no data_path, corpus_path, questions_path, "
                             "index_path or source)")
        self.fresh_name_rate = check_number("fresh_name_rate", fresh_name_rate, minimum=0.0, maximum=1.0)
        if self.fresh_name_rate and not self.fresh_facts:
            raise ValueError(f"fresh_name_rate={fresh_name_rate} renames the entities of each episode's fresh draw; "
                             "it needs fresh_facts=True")
        self._inventory = self.source  # fresh_facts: the world whose names and values every draw shares
        self.question_split = check_choice("question_split", question_split, QUESTION_POOLS)
        self.heldout_fraction = check_number("heldout_fraction", heldout_fraction, minimum=0.01, maximum=0.99)
        self._accept = None
        if self.question_split != "all":
            if not isinstance(self.source, World):
                raise ValueError(f"question_split={question_split!r} splits the synthetic world's questions; this "
                                 "task source has its own question file (split that file instead)")
            share = self.heldout_fraction if self.question_split == "heldout" else 1 - self.heldout_fraction
            capacity = objective_capacity(int(len(self.documents) * share), self.hops, self.comparison_rate)
            if self.objectives > capacity:
                raise ValueError(f"objectives={self.objectives} is more than the {question_split!r} pool "
                                 f"(heldout_fraction={self.heldout_fraction}) holds: at most {capacity}")
            self._accept = functools.partial(_in_pool, pool=self.question_split, fraction=self.heldout_fraction,
                                             salt=f"world{world_seed}")
        if self.max_turns is None:
            # Tools: a document found costs a search, up to top_k adds and a store search or two.
            per_document = self.top_k + 3 if tools else 1
            self.max_turns = 2 * self.objectives * max(self.hops) * per_document + 2
        self._check_context_budget(self._compose_task([""] * self.objectives))
        self.questions: list[Question] = []
        self._task_text = ""
        self._last_result = ""
        self._tool_result = ""  # tools mode: the newest store call's output, shown under the search result
        self.store = MemoryStore(self.store_budget, self.count_tokens)

    # ------------------------------------------------------------------ text
    def _task_block(self) -> str:
        return self._task_text

    def _compose_task(self, questions: list[str]) -> str:
        if self.memory_mode == "tools":
            budget = "no limit" if self.store_budget is None else f"at most {self.store_budget} tokens"
            lines = [INSTRUCTIONS["tools"].format(budget=budget)]
        else:
            lines = [INSTRUCTIONS[self.mode.uses_memory]]
        lines += [f"Question {i}: {sanitize(q)}" for i, q in enumerate(questions, 1)]
        return "<task>\n" + "\n".join(lines) + "\n</task>"

    def _information_block(self, content: str, notice: str | None = None) -> str:
        turns_left = self.max_turns - self._turn
        head = f"[turns left: {turns_left}]"
        if notice:
            head += f"\n[{notice}]"
        result = f"\n[result] {self._tool_result}" if self._tool_result else ""
        return f"<information>{head}\n{content}{result}\n</information>"

    def document(self, doc_id: str) -> Document:
        """The corpus document with id ``doc_id`` (as shown to the policy: sanitised text)."""
        if self.fresh_facts:  # this episode's draw (a World indexes its own documents)
            return self.documents[self.source.doc_index[doc_id]]
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
        if self.fresh_facts:
            # The facts first, then the questions, both from the episode's generator: one seed, one draw.
            # no draw for the rate when it is 0: episodes of a seed stay those made before the option existed
            renamed = bool(self.fresh_name_rate) and bool(self.np_random.random() < self.fresh_name_rate)
            self.source = self._inventory.with_fresh_facts(self.np_random, fresh_names=renamed)
            self.documents = tuple(Document(d.id, sanitize(d.title), sanitize(d.text)) for d in self.source.documents)
            self.index = make_backend(self._search_backend, [d.contents for d in self.documents])
        if isinstance(self.source, World):
            self.questions = self.source.sample_questions(self.np_random, self.objectives, self.hops,
                                                          self.comparison_rate, accept=self._accept)
        else:
            self.questions = self.source.sample_questions(self.np_random, self.objectives)
        self._task_text = self._compose_task([q.question for q in self.questions])
        self._last_result = "No search results yet."
        self._tool_result = ""
        self._turn = 0  # the information block shows the turns left of the new episode
        self._start_episode(self._information_block(self._last_result))
        if self.memory_mode == "tools":
            self.store = MemoryStore(self.store_budget, self.count_tokens)
            self._memory = self.store.view(self.show_store)
            self._render_obs()
        info = {
            "episode_id": self._episode_id,
            "questions": [q.question for q in self.questions],
            "question_ids": [q.id for q in self.questions],
            "max_turns": self.max_turns,
            "context_tokens": self._obs_tokens,
        }
        if self.fresh_facts:
            info["world_draw"] = self.source.fingerprint()
            info["world_renamed"] = renamed
        return self._obs, info

    def _parse(self, action: Any) -> tuple[str | None, str | None, str | None, str | None, dict[str, Any]]:
        """Parse and, for a store call, apply ``action``: ``(error, tool, tool input, memory, extra)``; ``tool``
        is ``search``/``answer`` for the env to run, a store call already run (output in ``extra``), or None."""
        if self.memory_mode == "rewrite":
            parsed = parse_action(action, require_memory=self.mode.uses_memory)
            return parsed.error, parsed.tool, parsed.argument, parsed.memory, {}
        extra: dict[str, Any] = dict(NO_STORE_RESULT)
        call = parse_tool_call(action, QA_TOOLS)
        if not call.valid or call.name not in STORE_TOOLS:
            return call.error, call.name, call.argument if call.valid else None, None, extra
        try:
            output, result = run_store_call(self.store, call, self.search_k, sanitize)
        except StoreError as err:
            return f"<{call.name}>: {err}", None, None, None, extra
        extra["retrieved_entries"] = result.pop("retrieved_ids", [])
        extra.update(result, tool_output=output)
        tool_input = call.argument if call.entry_id is None else f"id={call.entry_id} {call.argument}".strip()
        return None, call.name, tool_input, None, extra

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        memory_before = self._begin_step()
        error, tool, argument, memory, extra = self._parse(action)
        valid = error is None
        reward, terminated, scores = 0.0, False, None
        tool_output, notice, memory_cut = "", None, 0
        if not valid:
            reward = -self.invalid_penalty
            notice = sanitize(f"invalid action, state unchanged: {error}")
            information = self._information_block(self._last_result, notice)
            tool_output = notice
        else:
            if memory is not None:
                memory_cut = self._set_memory(memory)
            if tool in STORE_TOOLS:
                tool_output = self._tool_result = extra.pop("tool_output")
                information = self._information_block(self._last_result)
            elif tool == "search":
                hits = self.retrieve(argument)
                tool_output = self.format_documents(hits)
                extra["retrieved_ids"] = [d.id for d in hits]
                self._last_result, self._tool_result = tool_output, ""
                information = self._information_block(tool_output)
            else:  # answer
                preds = split_answers(argument, len(self.questions))
                scores = score_objectives(preds, [q.answers for q in self.questions])
                reward = float(scores["f1_mean"])
                terminated = True
                tool_output = f"answers submitted; F1 {reward:.3f}"
                extra["answer_f1"], extra["answer_em"] = list(scores["f1"]), list(scores["em"])
                information = self._information_block(tool_output)
        truncated = not terminated and self._turn >= self.max_turns
        store_keys: dict[str, int] = {}
        if self.memory_mode == "tools":
            self._memory = self.store.view(self.show_store)
            store_keys = {"store_entries": len(self.store), "store_tokens": self.store.used}
        snapshot = self._record(
            action=action, memory_before=memory_before, tool=tool if valid else None,
            tool_input=argument if valid else None, tool_output=tool_output, valid=valid,
            error=error, reward=reward, memory_truncated_tokens=memory_cut, **extra, **store_keys,
        )
        self._advance(information, action if isinstance(action, str) else repr(action))
        info: dict[str, Any] = {"invocation": snapshot}
        if terminated or truncated:
            self._done = True
            scores = scores or score_objectives([""] * len(self.questions), [q.answers for q in self.questions])
            answers = split_answers(argument, len(self.questions)) if terminated else []
            info["summary"] = self._episode_info(scores["em"], scores["f1"], answers, terminated,
                                                 memory_mode=self.memory_mode, **store_keys)
        return self._obs, reward, terminated, truncated, info
