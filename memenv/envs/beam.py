"""MemDialog-BEAM: BEAM-style conversations (128K to 10M tokens) read batch by batch, then probing questions.

Task sources: a seeded synthetic chat per episode (default; :class:`tasks.beam.SyntheticBeamChat`, about
``chat_tokens`` whitespace tokens) or BEAM's layout (``data_path=`` a conversation directory or a folder of
them; one per episode, drawn with ``np_random`` unless ``conversation=`` fixes it). Either way the chat is
streamed: one batch (= one session) is held at a time, so memory stays flat up to 10M tokens (with
``keep_snapshots=False``; see ``benchmarks/beam_rss.py``). A message longer than an observation can hold
(:data:`tasks.beam.MAX_MESSAGE_CHARS`, 1,000,000 characters) is shown cut, with the count of characters not
loaded, and costs ~1 MB whatever its size; an action over the action space's 100,000 characters is refused
unread (``benchmarks/huge_inputs.py``).

LongMemEval (``dataset="longmemeval"``, registered as ``MemDialog-LongMemEval-v0``; ``data_path=`` its oracle, S or M
file): one item per episode (``reset(seed=s)`` plays item ``s`` mod the item count unless ``conversation=`` fixes
it), its sessions streamed one at a time from the file (:mod:`tasks.longmemeval`), its one question shown with its
``question_date``; ``abilities=`` takes question types; scored by :mod:`memenv.scoring.longmemeval` (per-type
yes/no judge with ``judge=``, else a judge-free approximation). BEAM's release layout (null batch
``time_anchor``, ``->-> B,T`` markers, ``source_chat_ids``) is read as released (:mod:`tasks.beam`).
``info["summary"]["official_metric"]`` names the source's headline score, also stored under that name:
``beam_score``, ``accuracy`` (LongMemEval) or ``locomo_f1`` (LoCoMo's official F1). BEAM is reported both ways:
``beam_score`` as BEAM's official scorer aggregates the judge's grades (each through ``int()``, so a 0.5 counts
0, except in event ordering) and ``beam_score_float`` with the grades as given (:mod:`memenv.scoring.beam`).

Two memory modes (``memory_mode=``):

* ``tools`` (the default; :mod:`memenv.memory_tools`): the memory is a store of entries under ``memory_budget`` tokens;
  each action is one tool call (``<mem_add>``, ``<mem_update id=N>``, ``<mem_delete id=N/>``,
  ``<mem_search>``), ``<next/>`` ends a session, ``<answer>`` answers the question shown. At most
  ``max_tool_calls`` calls per session or question (then the env moves on by itself).

Scoring (:mod:`memenv.scoring.beam`): per question an approximation of BEAM's score without a judge (LoCoMo's
abstention rule, rubric-nugget token-F1 recall, (tau_b+1)/2 for event ordering), or BEAM's rubric judging with
``judge="openai:MODEL@URL"``. Reward at the last answer: the mean score (the judge's grades as given).
``info["summary"]`` adds ``score``, ``score_by_ability``, ``per_question`` (question, ability, answer, score,
``official_score`` (BEAM's ``int()`` truncation of the grades), method, per-item scores and, in tools
mode, ``used_entries``: the ids the searches for that question returned) and SQuAD ``f1``/``em`` against the
reference.

Feedback and strategy refinement (``refine_strategy=True``, the SelfMem loop): after the last answer the env
shows the per-ability and per-question scores and the current *memory-strategy text* and asks for
``<strategy>…</strategy>``; the new text is kept on the env across resets and shown in the next episode's
task block. ``info["summary"]["strategy_history"]`` lists every (episode, strategy, score).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from typing import Any

import numpy as np

from memenv.envs.base import MemEnvBase, file_stamps, required_data_file, sanitize
from memenv.scoring.beam import make_judge, score_beam_answer
from memenv.context import TokenCounter
from memenv.memory_tools import (MEMORY_MODES, STORE_TOOLS, MemoryStore, StoreError, check_tools_context,
                                 parse_tool_call, run_store_call)
from memenv.envs.memread import blank_action
from memenv.protocol import parse_action
from memenv.scoring.qa import best_em_f1
from memenv.envs.memdialog import MAX_SESSIONS, _load_locomo
from memenv.validation import (DEFAULT_KEPT_SNAPSHOTS, ArgumentTypeError, check_bool, check_choice, check_int,
                               check_keep_snapshots, check_path, check_str_tuple)
from tasks.beam import (ABILITIES, QUESTIONS_FILE, BatchStream, BeamBatch, BeamConversation, ConversationSource,
                        SyntheticBeamChat, conversation_files, find_conversations, load_probing_questions)
from tasks.conversations import ABSTENTION_ANSWER, QUESTION_TYPES, generate_conversation, min_questions_by_type
from tasks.locomo import CATEGORY_TYPES
from tasks.longmemeval import QUESTION_TYPES as LONGMEMEVAL_TYPES
from tasks.longmemeval import LongMemEvalItem, LongMemEvalSource, index_longmemeval
from memenv.scoring.locomo import locomo_score
from memenv.scoring.longmemeval import score_longmemeval_answer
from tasks.types import DataFormatError, Question

__all__ = ["MemDialogBeamEnv"]

# The env's own invocation keys on a step that did not produce them (every step has every key, one type per
# key, as vector envs batch them): no entry touched (ids start at 1), no question answered, nothing cut.
NO_STEP_RESULT = {"entry_id": -1, "question_index": -1, "answer_score": [], "memory_truncated_tokens": 0}
DEFAULT_BUDGET = {"rewrite": 256, "tools": 32_768}
BEAM_DATASETS = ("beam", "memdialog", "locomo", "longmemeval")
# The names ``abilities=`` accepts per task source (MemDialog's and LoCoMo's question types stand for abilities).
_ABILITY_NAMES = {"synthetic": ABILITIES, "beam": ABILITIES, "memdialog": QUESTION_TYPES,
                  "locomo": tuple(CATEGORY_TYPES.values()), "longmemeval": LONGMEMEVAL_TYPES}
#: The name of each task source's headline score in ``info["summary"]`` (``official_metric`` names it): BEAM's
#: rubric score, LongMemEval's accuracy (judged, or the judge-free approximation; ``scoring`` says which),
#: LoCoMo's official F1 (memenv.scoring.locomo); none for MemDialog's synthetic conversations.
OFFICIAL_METRIC = {"synthetic": "beam_score", "beam": "beam_score", "memdialog": "", "locomo": "locomo_f1",
                   "longmemeval": "accuracy"}
#: Synthetic chat lengths, in whitespace tokens: the generator's floor, and 10x BEAM's longest chats.
MIN_CHAT_TOKENS = 4_000
MAX_CHAT_TOKENS = 100_000_000
MAX_QUESTIONS_PER_ABILITY = 4

INSTRUCTIONS = {
    "rewrite": (
        "You are reading a long chat between a user and an assistant, one session at a time; you will not see a "
        "session again. After each session rewrite your memory inside <memory>...</memory> (at most {budget}). "
        "After the last session you will be asked {n} question(s) as the assistant, one at a time; answer each "
        "with <memory>...</memory><answer>...</answer>. If the chat does not contain the answer, say \"{abstain}\"."
    ),
    "tools": (
        "You are reading a long chat between a user and an assistant, one session at a time; you will not see a "
        "session again. Your memory is a store of entries (at most {budget}). Act with one tool call per turn: "
        "<mem_add>text</mem_add>, <mem_update id=N>text</mem_update>, <mem_delete id=N/>, "
        "<mem_search>query</mem_search>; <next/> shows the next session. After the last session you will be "
        "asked {n} question(s) as the assistant, one at a time: search your store, then <answer>...</answer>. "
        "If the chat does not contain the answer, say \"{abstain}\"."
    ),
    "none": (
        "You are reading a long chat between a user and an assistant, one session at a time. Reply with an empty "
        "action to read the next session. After the last session you will be asked {n} question(s) as the "
        "assistant, one at a time; answer each with <answer>...</answer>. If the chat does not contain the "
        "answer, say \"{abstain}\"."
    ),
}


@functools.lru_cache(maxsize=16)
def _open_conversation(path: str, stamps: tuple) -> BeamConversation:
    return BeamConversation.open(path)


@functools.lru_cache(maxsize=4)
def _longmemeval_index(path: str, stamps: tuple) -> tuple[LongMemEvalItem, ...]:
    return tuple(index_longmemeval(path))


def _probing_questions(path: str) -> list[Question]:
    """The probing questions of one conversation (``path``: its ``probing_questions.json``), checked as
    :meth:`BeamConversation.open` checks them."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"BEAM conversation {os.path.dirname(os.path.dirname(path))}: missing {QUESTIONS_FILE}")
    questions = load_probing_questions(path)
    if not questions:
        raise DataFormatError(f"{path}: no probing questions")
    return questions


def _check_index(conversation: int | None, count: int, path: str | os.PathLike) -> None:
    if conversation is not None and conversation >= count:
        raise ValueError(f"conversation must be an index in 0..{count - 1} ({path} holds {count}), "
                         f"got {conversation!r}")


class MemDialogBeamEnv(MemEnvBase):
    """BEAM long-conversation memory with a rewrite or a tool-based memory (see the module docstring).

    Args:
        data_path: a BEAM conversation directory or a folder of them (default: synthetic chats); with
            ``dataset="locomo"`` the LoCoMo JSON file.
        dataset: ``beam`` (synthetic, or BEAM's layout with ``data_path``), ``memdialog`` (MemDialog-v0's
            synthetic conversations: ``sessions`` sessions) or ``locomo`` (the LoCoMo file): the tools mode and
            its strategies then run over those conversations (their question types stand for the abilities).
        sessions: ``dataset="memdialog"``: sessions per conversation (default 8).
        conversation: with ``data_path``: a fixed conversation index (default: drawn at each reset).
        chat_tokens: synthetic: the chat's length in whitespace tokens (default 128,000; 4,000 to 100,000,000).
        questions_per_ability: synthetic: questions per ability (default 2; 1..4).
        questions: questions per episode, stratified over abilities (``None``: all); at most what every
            conversation the episode may draw holds.
        abilities: keep only questions of these abilities (:data:`tasks.beam.ABILITIES`; with
            ``dataset="memdialog"`` or ``"locomo"`` their question types).
        memory_mode: ``tools`` (default) or ``rewrite``.
        memory_budget: tokens of memory (rewrite: 256; tools: 32,768 by default).
        search_k: entries a ``<mem_search>`` returns.
        max_tool_calls: tools mode: calls per session or question before the env moves on.
        show_store: tools mode: list every entry in the observation (default: only the store's size).
        judge: ``"openai:MODEL@URL"`` for BEAM's rubric judging or LongMemEval's yes/no judging (default: the
            judge-free approximation); the official judge models are BEAM's gpt-4.1-mini and LongMemEval's
            gpt-4o-2024-08-06 (:data:`memenv.scoring.judges.OFFICIAL_JUDGE_MODELS`).
        refine_strategy: ask for a memory-strategy rewrite at the end of each episode (kept across resets).
        strategy: the initial memory-strategy text.
        max_turns: turn limit (default from the sessions, questions and ``max_tool_calls``).
        keep_snapshots, context, context_budget, token_counter, invalid_penalty, render_mode: see
            :class:`MemEnvBase`.

    Every argument is checked here (:mod:`memenv.validation`): a wrong type, a value out of range, a knob of
    another task source (``chat_tokens`` with ``data_path``), or more ``questions`` than a conversation holds
    raise at ``gym.make`` naming the parameter and what it accepts. With ``data_path`` the probing questions
    are read here too; ``chat.json`` is streamed at reset, where a malformed batch raises
    :class:`~tasks.types.DataFormatError` naming the file and the batch.
    """

    def __init__(
        self,
        data_path: str | os.PathLike | None = None,
        *,
        dataset: str = "beam",
        sessions: int | None = None,
        conversation: int | None = None,
        chat_tokens: int | None = None,
        questions_per_ability: int | None = None,
        questions: int | None = None,
        abilities: tuple[str, ...] | list[str] | None = None,
        memory_mode: str = "tools",
        memory_budget: int | None = None,
        search_k: int = 8,
        max_tool_calls: int = 256,
        show_store: bool = False,
        judge: str | None = None,
        refine_strategy: bool = False,
        strategy: str = "",
        max_turns: int | None = None,
        context: str = "memory",
        context_budget: int | None = None,
        token_counter: TokenCounter | None = None,
        invalid_penalty: float = 0.0,
        keep_snapshots: bool | int = DEFAULT_KEPT_SNAPSHOTS,
        render_mode: str | None = None,
    ) -> None:
        memory_mode = check_choice("memory_mode", memory_mode, MEMORY_MODES)
        memory_budget = check_int("memory_budget", memory_budget, minimum=0, allow_none=True)
        budget = DEFAULT_BUDGET[memory_mode] if memory_budget is None else memory_budget
        super().__init__(context=context, context_budget=context_budget, token_counter=token_counter,
                         memory_budget=None if memory_mode == "tools" else budget,
                         invalid_penalty=invalid_penalty, render_mode=render_mode)
        check_tools_context(memory_mode, self.mode.uses_memory, context)
        self.n_questions = check_int("questions", questions, minimum=1, allow_none=True)
        self.search_k = check_int("search_k", search_k, minimum=1)
        self.max_tool_calls = check_int("max_tool_calls", max_tool_calls, minimum=1)
        self._max_turns_arg = check_int("max_turns", max_turns, minimum=1, allow_none=True)
        conversation = check_int("conversation", conversation, minimum=0, allow_none=True)
        sessions = check_int("sessions", sessions, minimum=2, maximum=MAX_SESSIONS, allow_none=True)
        chat_tokens = check_int("chat_tokens", chat_tokens, minimum=MIN_CHAT_TOKENS, maximum=MAX_CHAT_TOKENS,
                                allow_none=True)
        questions_per_ability = check_int("questions_per_ability", questions_per_ability, minimum=1,
                                          maximum=MAX_QUESTIONS_PER_ABILITY, allow_none=True)
        self.show_store = check_bool("show_store", show_store)
        self.refine_strategy = check_bool("refine_strategy", refine_strategy)
        self.keep_snapshots = check_keep_snapshots(keep_snapshots)
        if judge is not None and not isinstance(judge, str):
            raise ArgumentTypeError(f"judge must be a string 'openai:MODEL@URL' or None, got {judge!r} "
                                    f"({type(judge).__name__})")
        if not isinstance(strategy, str):
            raise ArgumentTypeError(f"strategy must be a string (the initial memory-strategy text), got "
                                    f"{strategy!r} ({type(strategy).__name__})")
        dataset = check_choice("dataset", dataset, BEAM_DATASETS)
        data_path = check_path("data_path", data_path)
        self.dataset = dataset if dataset != "beam" else "synthetic" if data_path is None else "beam"
        # Knobs of one source only: given with another, they would be ignored silently.
        for name, value, applies in (("sessions", sessions, "memdialog"), ("chat_tokens", chat_tokens, "synthetic"),
                                     ("questions_per_ability", questions_per_ability, "synthetic")):
            if value is not None and self.dataset != applies:
                where = "dataset='memdialog'" if applies == "memdialog" else "synthetic chats (no data_path=)"
                raise ValueError(f"{name}={value!r} applies to {where} only; it has no effect with "
                                 f"dataset={dataset!r}" + (f" and data_path={data_path!r}" if data_path else ""))
        self.abilities = check_str_tuple("abilities", abilities, _ABILITY_NAMES[self.dataset])
        self.memory_mode = memory_mode
        self.store_budget = budget
        self.judge = make_judge(judge)
        self.strategy_text = strategy
        self.strategy_history: list[dict[str, Any]] = []
        self.chat_tokens = 128_000 if chat_tokens is None else chat_tokens
        self.questions_per_ability = 2 if questions_per_ability is None else questions_per_ability
        self.n_dialog_sessions = 8 if sessions is None else sessions
        self.conversations: tuple = ()
        self.paths: list[str] = []
        if self.dataset in ("locomo", "longmemeval"):
            self._data_file = required_data_file(data_path, *(
                ("MemDialog-BEAM-v0", "the LoCoMo JSON file with dataset='locomo'",
                 "../shared/data/locomo/locomo10.json", "LoCoMo") if self.dataset == "locomo" else
                ("MemDialog-LongMemEval-v0", "a LongMemEval JSON file: the oracle, S or M variant",
                 "../shared/data/longmemeval/longmemeval_dev.json", "LongMemEval")))
            self._read_data_file(conversation)
        elif self.dataset == "memdialog":
            if data_path is not None or conversation is not None:
                raise ValueError("dataset='memdialog' generates its conversations: no data_path= or conversation=")
            minimum = min_questions_by_type(self.n_dialog_sessions)
            pools = [[kind for kind, count in minimum.items() for _ in range(count)]]
            where = f"every synthetic MemDialog conversation of sessions={self.n_dialog_sessions}"
        elif self.dataset == "beam":
            self.paths = [str(p) for p in find_conversations(data_path)]
            _check_index(conversation, len(self.paths), data_path)
            # The probing questions are small: read them now, so a bad file or count fails at make time. chat.json
            # (up to 10M tokens) is streamed at reset, where its errors name the file and batch.
            pools = [[q.kind for q in _probing_questions(os.path.join(p, QUESTIONS_FILE))] for p in self.paths]
            where = str(data_path)
        else:
            if conversation is not None:
                raise ValueError("conversation= selects a BEAM conversation directory; it needs data_path=")
            pools = [[a for a in ABILITIES for _ in range(self.questions_per_ability)]]
            where = f"every synthetic chat of questions_per_ability={self.questions_per_ability}"
        if self.dataset not in ("locomo", "longmemeval"):
            self._check_question_capacity(pools, where, conversation)
        n_skeleton = self.n_questions or 1
        self._check_context_budget(self._compose_task(n_skeleton))
        self.conversation_index = conversation
        self.source: BeamConversation | SyntheticBeamChat | None = None
        self.questions: list[Question] = []
        self.store = MemoryStore(budget, token_counter)
        self.max_turns = 0
        self._batches: Iterator[BeamBatch] = iter(())
        self._batch: BeamBatch | None = None
        self._session = 0
        self._n_sessions = 0
        self._question = 0
        self._phase = "done"
        self._calls = 0
        self._result = ""
        self._retrieved: list[int] = []
        self._task_text = ""
        self._answers: list[str] = []
        self._results: list[dict[str, Any]] = []

    # ------------------------------------------------------------------ text
    def _task_block(self) -> str:
        return self._task_text

    def _compose_task(self, n_questions: int) -> str:
        """The task block: the instructions for this memory mode and the current memory-strategy text."""
        kind = self.memory_mode if self.mode.uses_memory else "none"
        lines = [INSTRUCTIONS[kind].format(budget=f"{self.store_budget} tokens", n=n_questions,
                                           abstain=ABSTENTION_ANSWER)]
        if self.strategy_text:
            lines.append("Your memory strategy (refined from earlier episodes): " + sanitize(self.strategy_text))
        return "<task>\n" + "\n".join(lines) + "\n</task>"

    def _read_data_file(self, conversation: int | None) -> None:
        """Read and check the LoCoMo or LongMemEval file: at make, and at a reset after the file changed (its
        stamps), so an episode never plays or scores a stale copy. The loaders cache on the stamps."""
        path, stamps = self._data_file, file_stamps(self._data_file)
        if self.dataset == "locomo":
            conversations = _load_locomo(path, stamps)
            _check_index(conversation, len(conversations), path)
            pools, where = [[q.kind for q in c.questions] for c in conversations], path
        else:  # one question per item: abilities= (question types) picks the items
            items = tuple(it for it in _longmemeval_index(path, stamps)
                          if self.abilities is None or it.question_type in self.abilities)
            if not items:
                raise ValueError(f"no item of {path} has a question type in abilities={self.abilities}")
            _check_index(conversation, len(items), path)
            pools, where = [[items[0].question_type]], f"every item of {path} (one question each)"
        self._check_question_capacity(pools, where, conversation)
        if self.dataset == "locomo":
            self.conversations = conversations
        else:
            self.lme_path, self.lme_items = path, items
        self._data_stamps = stamps

    def _check_question_capacity(self, pools: list[list[str]], where: str, conversation: int | None) -> None:
        """Refuse ``abilities`` or ``questions`` that a conversation cannot serve, rather than cut silently.

        ``pools``: the abilities of the questions of each conversation an episode may draw (the guaranteed
        ones for generated conversations), so the smallest count is the limit; ``where`` names them.
        """
        if self.dataset in ("locomo", "beam") or (self.dataset == "longmemeval" and conversation is not None):
            if conversation is not None and self.dataset == "longmemeval":
                pools, where = [pools[0]], f"item {conversation} of {self._data_file}"
            elif conversation is not None:
                pools, where = [pools[conversation]], f"conversation {conversation} of {where}"
            else:
                where = f"every conversation of {where}" if len(pools) > 1 else f"the conversation of {where}"
        counts = [sum(1 for kind in pool if self.abilities is None or kind in self.abilities) for pool in pools]
        filters = "" if self.abilities is None else f" with abilities={self.abilities}"
        if min(counts) == 0:
            raise ValueError(f"no question left in {where}{filters}: widen abilities")
        if self.n_questions is not None and self.n_questions > min(counts):
            raise ValueError(f"questions={self.n_questions} is more than {where}{filters} holds: "
                             f"at most {min(counts)}")

    @property
    def n_sessions(self) -> int:
        return self._n_sessions

    @property
    def reading(self) -> bool:
        return self._phase == "read"

    def _tools_allowed(self) -> tuple[str, ...]:
        edits = ("mem_add", "mem_update", "mem_delete", "mem_search")
        return {"read": edits + ("next",), "question": edits + ("answer",), "strategy": ("strategy",)}[self._phase]

    def session_text(self, batch: BeamBatch) -> str:
        """One line per message; a message's own time anchor (BEAM's release puts a few on user messages) is
        shown before its text where it differs from the session's."""
        lines = [sanitize(m.render() if not m.time_anchor or m.time_anchor == batch.time_anchor else
                          m.render().replace(": ", f": [{m.time_anchor}] ", 1)) for m in batch.messages]
        return "\n".join(lines) if lines else "(no messages in this session)"

    def _information_block(self, notice: str | None = None) -> str:
        tail = f"\n[{notice}]" if notice else ""
        tools = self.memory_mode == "tools" and self.mode.uses_memory
        result = f"\n[result] {self._result}" if tools and self._result else ""
        left = f" [tool calls left: {self.max_tool_calls - self._calls}]" if tools else ""
        if self._phase == "read":
            date = sanitize(self._batch.time_anchor) or "date not given"
            head = f"[session {self._session + 1}/{self._n_sessions}, {date}]{left}"
            return f"<information>{head}{tail}\n{self.session_text(self._batch)}{result}\n</information>"
        if self._phase == "question":
            q = self.questions[self._question]
            question = sanitize(q.question)
            # LongMemEval: the date the question is asked on, in the header (the question line stays the question)
            asked = f" [asked on {sanitize(q.meta['question_date'])}]" if q.meta.get("question_date") else ""
            how = ("search your store with <mem_search>...</mem_search>, then answer with <answer>...</answer>" if tools
                   else "answer with <memory>...</memory><answer>...</answer>" if self.mode.uses_memory
                   else "answer with <answer>...</answer>")
            head = f"[question {self._question + 1}/{len(self.questions)}]{left}{asked}"
            return (f"<information>{head}{tail}\n{question}\n"
                    f"Now {how}.{result}\n</information>")
        if self._phase == "strategy":
            return f"<information>[feedback]{tail}\n{self._feedback()}\n</information>"
        return "<information>[episode finished]\n</information>"

    def _feedback(self) -> str:
        summary = self._scores_by_ability()
        lines = ["Scores per ability: " + ", ".join(f"{a} {s:.2f}" for a, s in summary.items())]
        for r in self._results:
            lines.append(f"- ({r['ability']}) {r['question']} -> score {r['score']:.2f}; your answer: {r['answer'][:120]}")
        lines.append("Current memory strategy: " + (self.strategy_text or "(none)"))
        lines.append("Rewrite your memory strategy for the next episode with <strategy>...</strategy>.")
        return sanitize("\n".join(lines))

    def _scores_by_ability(self) -> dict[str, float]:
        by: dict[str, list[float]] = {}
        for r in self._results:
            by.setdefault(r["ability"], []).append(r["score"])
        return {a: float(np.mean(v)) for a, v in sorted(by.items())}

    def _sync_memory(self) -> None:
        if self.memory_mode == "tools":
            self._memory = self.store.view(self.show_store)

    # ------------------------------------------------------------------ questions
    def _select_questions(self, questions: list[Question]) -> list[Question]:
        pool = [q for q in questions if self.abilities is None or q.kind in self.abilities]
        if self.n_questions is None or self.n_questions >= len(pool):
            return pool
        by: dict[str, list[Question]] = {}
        for q in pool:
            by.setdefault(q.kind, []).append(q)
        queues = [[v[int(i)] for i in self.np_random.permutation(len(v))] for _, v in sorted(by.items())]
        chosen: list[Question] = []
        while len(chosen) < self.n_questions:  # round robin over abilities: every ability before any twice
            for queue in queues:
                if queue and len(chosen) < self.n_questions:
                    chosen.append(queue.pop(0))
        order = {id(q): i for i, q in enumerate(pool)}
        return sorted(chosen, key=lambda q: order[id(q)])

    # ------------------------------------------------------------------ gymnasium API
    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        super().reset(seed=seed)
        if self.dataset in ("locomo", "longmemeval") and file_stamps(self._data_file) != self._data_stamps:
            self._read_data_file(self.conversation_index)  # rewritten since the last episode: read as it is now
        if self.dataset == "locomo":
            index = self.conversation_index
            if index is None:
                index = int(self.np_random.integers(len(self.conversations)))
            self.source = ConversationSource(self.conversations[index])
        elif self.dataset == "memdialog":
            self.source = ConversationSource(generate_conversation(self.np_random, self.n_dialog_sessions, 20))
        elif self.dataset == "longmemeval":
            index = self.conversation_index
            if index is None:  # reset(seed=s) plays item s (mod the count), so seeds 0..n-1 visit every item
                index = seed % len(self.lme_items) if seed is not None else int(self.np_random.integers(len(self.lme_items)))
            self.source = LongMemEvalSource(self.lme_path, self.lme_items[index])
        elif self.dataset == "beam":
            index = self.conversation_index
            if index is None:
                index = int(self.np_random.integers(len(self.paths)))
            path = self.paths[index]
            self.source = _open_conversation(path, file_stamps(*conversation_files(path)))
        else:
            self.source = SyntheticBeamChat(int(self.np_random.integers(2**31)), self.chat_tokens, self.questions_per_ability)
        self._n_sessions = self.source.n_batches
        self.questions = self._select_questions(list(self.source.questions))
        self._batches = BatchStream(self.source)
        self._batch = next(self._batches)
        self._session, self._question, self._calls, self._phase = 0, 0, 0, "read"
        self._result, self._retrieved = "", []
        self._answers = [""] * len(self.questions)
        self._results = []
        self.store = MemoryStore(self.store_budget, self.token_counter)
        per_phase = self.max_tool_calls + 1 if self.memory_mode == "tools" else 2
        self.max_turns = self._max_turns_arg or per_phase * (self._n_sessions + len(self.questions) + 1)
        self._task_text = self._compose_task(len(self.questions))
        self._start_episode("")
        self._sync_memory()
        self._information = self._information_block()
        self._transcript = [self._information]
        self._render_obs()
        info = {
            "episode_id": self._episode_id, "conversation_id": self.source.id,
            "questions": [q.question for q in self.questions], "question_ids": [q.id for q in self.questions],
            "question_types": [q.kind for q in self.questions], "sessions": self._n_sessions,
            "max_turns": self.max_turns, "context_tokens": self._obs_tokens, "memory_mode": self.memory_mode,
            "strategy": self.strategy_text,
        }
        return self._obs, info

    def _next_session(self) -> None:
        self._session += 1
        self._calls = 0
        self._result = ""
        if self._session < self._n_sessions:
            self._batch = next(self._batches)
        else:
            self._batch, self._batches = None, iter(())
            self._phase = "question" if self.questions else "done"

    def _record_answer(self, answer: str) -> None:
        j = self._question
        q = self.questions[j]
        self._answers[j] = answer
        scored = (score_longmemeval_answer(answer, q, self.judge) if self.dataset == "longmemeval"
                  else score_beam_answer(answer, q, self.judge))
        em, f1 = best_em_f1(answer, q.answers)
        self._results.append({
            "id": q.id, "ability": q.kind, "question": q.question, "answer": answer, "reference": q.answers[0],
            "score": scored["score"], "official_score": scored.get("official_score", scored["score"]),
            "method": scored["method"], "items": scored["items"], "f1": f1, "em": em,
            "used_entries": list(dict.fromkeys(self._retrieved)),
            **({"locomo_f1": locomo_score(answer, q.answers[0], q.meta["category"])} if self.dataset == "locomo" else {}),
        })
        self._question += 1
        self._calls, self._result, self._retrieved = 0, "", []
        if self._question >= len(self.questions):
            self._phase = "strategy" if self.refine_strategy else "done"

    def _tool_step(self, action: Any) -> tuple[bool, str | None, str | None, str | None, str, dict]:
        """One tool call; returns (valid, error, tool, tool_input, tool_output, extra)."""
        call = parse_tool_call(action, self._tools_allowed())
        extra: dict[str, Any] = {}
        if not call.valid:
            return False, call.error, None, None, "", extra
        tool, argument = call.name, call.argument
        tool_input = argument if call.entry_id is None else f"id={call.entry_id} {argument}".strip()
        try:
            if tool in STORE_TOOLS:
                output, extra = run_store_call(self.store, call, self.search_k, sanitize)
                if tool == "mem_search" and self._phase == "question":
                    self._retrieved.extend(extra["retrieved_ids"])
            elif tool == "next":
                self._next_session()
                return True, None, tool, "", "next session" if self.reading else "chat finished; questions follow", extra
            elif tool == "answer":
                j = self._question
                self._record_answer(argument)
                extra.update(self._answer_extra(j))
                return True, None, tool, argument, f"answer {j + 1}/{len(self.questions)} recorded", extra
            else:  # strategy
                self._set_strategy(argument)
                return True, None, tool, argument, "strategy saved for the next episode", extra
        except StoreError as err:
            return False, f"<{tool}>: {err}", None, None, "", extra
        self._calls += 1
        self._result = output
        if self._calls >= self.max_tool_calls:  # the per-phase cap: move on by ourselves
            output += f" (tool-call limit {self.max_tool_calls} reached: moving on)"
            if self._phase == "read":
                self._next_session()
            elif self._phase == "question":
                self._record_answer("")
        return True, None, tool, tool_input, output, extra

    def _answer_extra(self, j: int) -> dict[str, Any]:
        """The invocation keys of a step that answered question ``j`` (lists, as ``answer_f1`` in every env)."""
        result = self._results[-1]
        return {"question_index": j, "answer_score": [result["score"]], "answer_f1": [result["f1"]],
                "answer_em": [result["em"]]}

    def _set_strategy(self, text: str) -> None:
        self.strategy_text = sanitize(text)
        self.strategy_history.append({"episode_id": self._episode_id, "strategy": self.strategy_text,
                                      "score": float(np.mean([r["score"] for r in self._results])) if self._results else 0.0})
        self._phase = "done"

    def _rewrite_step(self, action: Any) -> tuple[bool, str | None, str | None, str | None, str, dict]:
        extra: dict[str, Any] = {}
        if self._phase == "strategy":
            call = parse_tool_call(action, ("strategy",))
            if not call.valid:
                return False, call.error, None, None, "", extra
            self._set_strategy(call.argument)
            return True, None, "strategy", call.argument, "strategy saved for the next episode", extra
        if not self.mode.uses_memory and blank_action(action) and self.reading:
            self._next_session()
            return True, None, None, None, "next session", extra
        parsed = parse_action(action, require_memory=False, tools=("answer",), allow_memory_only=True)
        error = parsed.error
        if error is None and self.reading and parsed.tool == "answer":
            error = "the questions come after the last session: rewrite your memory with <memory>...</memory>"
        elif error is None and not self.reading and parsed.tool != "answer":
            error = "answer the question with <answer>...</answer>"
        if error is not None:
            return False, error, None, None, "", extra
        if parsed.memory is not None and self.mode.uses_memory:
            extra["memory_truncated_tokens"] = self._set_memory(parsed.memory)
        if parsed.tool == "answer":
            j = self._question
            self._record_answer(parsed.argument)
            extra.update(self._answer_extra(j))
            return True, None, "answer", parsed.argument, f"answer {j + 1}/{len(self.questions)} recorded", extra
        self._next_session()
        return True, None, None, None, "next session" if self.reading else "chat finished; questions follow", extra

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        memory_before = self._begin_step()
        phase, index = self._phase, (self._session if self._phase == "read" else self._question)
        step = self._tool_step if self.memory_mode == "tools" else self._rewrite_step
        valid, error, tool, tool_input, tool_output, extra = step(action)
        reward, notice = 0.0, None
        if not valid:
            reward = -self.invalid_penalty
            notice = sanitize(f"invalid action, state unchanged: {error}")
            tool_output = notice
        answered_all = phase == "question" and self._phase in ("strategy", "done")
        if answered_all:
            reward += float(np.mean([r["score"] for r in self._results])) if self._results else 0.0
        terminated = self._phase == "done"
        truncated = not terminated and self._turn >= self.max_turns
        self._sync_memory()
        information = self._information_block(notice)
        snapshot = self._record(
            action=action, memory_before=memory_before, tool=tool, tool_input=tool_input, tool_output=tool_output,
            valid=valid, error=error, reward=reward, phase=phase, index=index, store_entries=len(self.store),
            store_tokens=self.store.used, **{**NO_STEP_RESULT, **extra},
        )
        return self._close_step(snapshot, information, action, reward, terminated, truncated,
                                lambda: self._episode_summary(terminated))

    def _episode_summary(self, answered: bool) -> dict[str, Any]:
        scores = {r["id"]: r for r in self._results}
        rows = [scores.get(q.id, {"score": 0.0, "official_score": 0.0, "f1": 0.0, "em": 0.0}) for q in self.questions]
        counts: dict[str, int] = {}
        for q in self.questions:
            counts[q.kind] = counts.get(q.kind, 0) + 1
        by_ability: dict[str, list[float]] = {}
        for q, r in zip(self.questions, rows):
            by_ability.setdefault(q.kind, []).append(r["score"])
        score = float(np.mean([r["score"] for r in rows])) if rows else 0.0
        official = OFFICIAL_METRIC[self.dataset]
        benchmark = "LongMemEval accuracy" if self.dataset == "longmemeval" else "BEAM score"
        value = float(np.mean([r.get("locomo_f1", 0.0) for r in rows])) if official == "locomo_f1" and rows else score
        if official == "beam_score":  # BEAM's official truncation of the judge's grades, and the grades as given
            value = float(np.mean([r["official_score"] for r in rows])) if rows else 0.0
        both = {"beam_score_float": score} if official == "beam_score" else {}
        return self._episode_info(
            [r["em"] for r in rows], [r["f1"] for r in rows], list(self._answers), answered,
            score=score, official_metric=official, **({official: value} if official else {}), **both,
            score_by_ability={a: float(np.mean(v)) for a, v in sorted(by_ability.items())},
            count_by_ability=counts, per_question=list(self._results),
            scoring="judge" if self.judge is not None else f"approximate (judge-free; not the official {benchmark})",
            question_types=[q.kind for q in self.questions], questions_answered=self._question,
            conversation_id=self.source.id, sessions=self._n_sessions,
            sessions_read=min(self._session, self._n_sessions), memory_mode=self.memory_mode,
            store_entries=len(self.store), store_tokens=self.store.used,
            strategy=self.strategy_text, strategy_history=list(self.strategy_history),
        )

