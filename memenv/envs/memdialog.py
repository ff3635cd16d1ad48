"""MemDialog: a long multi-session conversation read session by session, then questions answered from memory.

Task sources: a seeded synthetic conversation per episode (default; :mod:`tasks.conversations`, question types
single-hop, multi-hop, temporal, knowledge-update, abstention) or the LoCoMo file (``data_path=``; one of its
10 conversations per episode, drawn with ``np_random`` unless ``conversation=`` fixes it).

Turns (context mode ``memory``)::

    turn i (1..S)      observation: task + memory + "[session i/S, DATE]" and the session's turns "Speaker: text"
                       action: <memory>...</memory>
    turn S+j (1..Q)    observation: task + memory + "[question j/Q]" and question j
                       action: [<memory>...</memory>]<answer>...</answer>    (one answer, to question j)

Questions are asked one per turn (so an episode with many questions never needs one giant answer); the
memory may still be rewritten while answering (omitted: unchanged). With ``questions_upfront=True`` (default)
the task block lists every question from the start, as MemAgent shows its question while reading; with
``False`` the reader learns them only after the last session (the LoCoMo/BEAM memory-probing setting).

In the ``history``, ``window:K`` and ``none`` modes the memory is not shown: an empty action (or a lone
``<think>``) reads the next session. An invalid action repeats the same session or question with a notice;
the turn is used. The turn limit defaults to ``2 * (sessions + questions)``; unanswered questions score 0.

Scoring: SQuAD F1/EM against the gold answers; on an abstention question (synthetic ``abstention``, LoCoMo
category 5) any answer that abstains scores 1.0 (it contains "not mentioned" or "no information available",
see :data:`tasks.conversations.ABSTENTION_ANSWER`). Reward at the end: mean F1 over the questions.
``info["summary"]`` adds ``f1_by_type``/``em_by_type``/``count_by_type`` per question type. On LoCoMo it also
holds LoCoMo's official score (:mod:`memenv.scoring.locomo`: Porter-stemmed token F1 with the per-category rules)
as ``locomo_f1`` (mean), ``locomo_f1_per_question`` and ``locomo_f1_by_type``, and ``official_metric`` names it.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import numpy as np

from memenv.envs.base import MemEnvBase, file_stamps, required_data_file, sanitize
from memenv.context import TokenCounter
from memenv.envs.memread import blank_action
from memenv.protocol import parse_action
from memenv.validation import (DEFAULT_KEPT_SNAPSHOTS, check_bool, check_choice, check_int, check_keep_snapshots,
                               check_path, check_str_tuple)
from memenv.scoring.locomo import locomo_score
from memenv.scoring.qa import best_em_f1
from tasks.conversations import (
    ABSTENTION_ANSWER,
    QUESTION_TYPES,
    Conversation,
    generate_conversation,
    is_abstention_answer,
    min_questions_by_type,
    sample_questions,
)
from tasks.locomo import CATEGORY_TYPES, load_locomo
from tasks.types import Question, answer_text

__all__ = ["MemDialogEnv", "score_answer"]

DIALOG_DATASETS = ("synthetic", "locomo")
#: Limits of the synthetic conversation generator (its work grows with sessions * turns_per_session).
MAX_SESSIONS = 1000
MAX_TURNS_PER_SESSION = 1000

INSTRUCTIONS = {
    True: (
        "You are reading a long conversation between {a} and {b}, one session at a time. You will not see a "
        "session again: after each session, rewrite your memory inside <memory>...</memory> (at most {budget}); "
        "it is all you keep. After the last session you will be asked {n} question(s), one at a time; answer each "
        "with <memory>...</memory><answer>...</answer>. If the conversation does not contain the answer, answer "
        "\"{abstain}\"."
    ),
    False: (
        "You are reading a long conversation between {a} and {b}, one session at a time. Reply with an empty "
        "action (or <think>...</think>) to read the next session. After the last session you will be asked {n} "
        "question(s), one at a time; answer each with <answer>...</answer>. If the conversation does not contain "
        "the answer, answer \"{abstain}\"."
    ),
}


def score_answer(prediction: str | None, question: Question) -> tuple[float, float]:
    """``(em, f1)`` of one prediction (see the module docstring for abstention questions)."""
    prediction = answer_text(prediction)  # a number is its text (0 is "0", not no answer)
    if question.meta.get("abstention"):
        if is_abstention_answer(prediction):
            return 1.0, 1.0
        others = [a for a in question.answers if a != ABSTENTION_ANSWER]
        return best_em_f1(prediction, others) if others else (0.0, 0.0)
    return best_em_f1(prediction, question.answers)


@functools.lru_cache(maxsize=4)
def _load_locomo(path: str, stamps: tuple) -> tuple[Conversation, ...]:
    return tuple(load_locomo(path))


class MemDialogEnv(MemEnvBase):
    """Long-conversation memory (LoCoMo/BEAM style) with explicit memory rewrites.

    Args:
        questions: questions per episode (``None``: every question of the conversation). Synthetic questions
            are drawn stratified by type, so 5 covers all five types.
        sessions: synthetic: sessions per conversation (default 8); LoCoMo: keep only the first ``sessions``
            sessions and the questions whose evidence lies in them (default: all).
        turns_per_session: synthetic: dialogue turns per session (at least; more when a session has a lot to say).
        dataset: ``synthetic`` or ``locomo`` (implied by ``data_path``).
        data_path: the LoCoMo JSON file.
        conversation: LoCoMo: a fixed conversation index (default: drawn with ``np_random`` at each reset).
        question_types: keep only questions of these types (e.g. ``("single-hop", "temporal")``).
        questions_upfront: list the questions in the task block while reading (default) or only after.
        memory_budget: memory cap in tokens (the start is kept), shown in the instructions.
        max_turns: turn limit (default ``2 * (sessions + questions)``, per episode).
        keep_snapshots: the invocation snapshots ``info["summary"]["snapshots"]`` keeps: the last 256 by default
            (``DEFAULT_KEPT_SNAPSHOTS``: memory stays bounded over long inputs), ``True`` every one, ``False`` none, N
            the last N; ``snapshots_dropped`` counts the others.
        context, context_budget, token_counter, invalid_penalty, render_mode: see :class:`MemEnvBase`.
    """

    def __init__(
        self,
        questions: int | None = 5,
        sessions: int | None = None,
        *,
        turns_per_session: int = 20,
        dataset: str = "synthetic",
        data_path: str | os.PathLike | None = None,
        conversation: int | None = None,
        question_types: tuple[str, ...] | list[str] | None = None,
        questions_upfront: bool = True,
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
        self.n_questions = check_int("questions", questions, minimum=1, allow_none=True)
        check_int("sessions", sessions, minimum=1, maximum=MAX_SESSIONS, allow_none=True)
        turns_per_session = check_int("turns_per_session", turns_per_session, minimum=4, maximum=MAX_TURNS_PER_SESSION)
        self._max_turns_arg = check_int("max_turns", max_turns, minimum=1, allow_none=True)
        dataset = check_choice("dataset", dataset, DIALOG_DATASETS)
        data_path = check_path("data_path", data_path)
        conversation = check_int("conversation", conversation, minimum=0, allow_none=True)
        self.questions_upfront = check_bool("questions_upfront", questions_upfront)
        self.keep_snapshots = check_keep_snapshots(keep_snapshots)
        self.conversations: tuple[Conversation, ...] = ()
        if data_path is not None or dataset == "locomo":
            self.question_types = check_str_tuple("question_types", question_types,
                                                  tuple(CATEGORY_TYPES.values()))
            path = required_data_file(data_path, "MemDialog-LoCoMo-v0", "the LoCoMo JSON file",
                                      "../shared/data/locomo/locomo10.json", "LoCoMo")
            self.dataset, self.sessions, self._data_file = "locomo", sessions, path
            self._read_locomo(conversation)
        else:
            self.question_types = check_str_tuple("question_types", question_types, QUESTION_TYPES)
            if conversation is not None:
                raise ValueError("conversation= selects a LoCoMo conversation; it needs data_path=")
            self.dataset = "synthetic"
            self.sessions = 8 if sessions is None else sessions
            if self.sessions < 2:
                raise ValueError(f"sessions must be an int >= 2 for a synthetic conversation, got {sessions!r}")
            minimum = min_questions_by_type(self.sessions)
            holds = sum(minimum[k] for k in self.question_types or QUESTION_TYPES)
            if holds == 0:
                raise ValueError(f"question_types={self.question_types} has no guaranteed question in a synthetic "
                                 f"conversation of sessions={self.sessions}")
            if self.n_questions is not None and self.n_questions > holds:
                types = "" if self.question_types is None else f" of question_types={self.question_types}"
                raise ValueError(f"questions={self.n_questions} is more than every synthetic conversation of "
                                 f"sessions={self.sessions} holds{types}: at most {holds}")
        n_shown = self.n_questions if self.questions_upfront and self.n_questions is not None else 0
        self._check_context_budget(self._compose_task(("", ""), self.n_questions or 1, [""] * n_shown))
        self.turns_per_session = turns_per_session
        self.conversation_index = conversation
        self.conversation: Conversation | None = None
        self.questions: list[Question] = []
        self.max_turns = self._max_turns_arg or 0
        self._session = 0
        self._question = 0
        self._task_text = ""
        self._answers: list[str] = []
        self._scores: list[tuple[float, float]] = []

    # ------------------------------------------------------------------ text
    def _task_block(self) -> str:
        return self._task_text

    def _compose_task(self, speakers: tuple[str, ...], n_questions: int, shown: list[str]) -> str:
        budget = "no limit" if self.memory_budget is None else f"{self.memory_budget} tokens"
        names = [sanitize(s) for s in speakers] + ["", ""]
        lines = [INSTRUCTIONS[self.mode.uses_memory].format(a=names[0], b=names[1], budget=budget,
                                                            n=n_questions, abstain=ABSTENTION_ANSWER)]
        lines += [f"Question {i}: {sanitize(q)}" for i, q in enumerate(shown, 1)]
        return "<task>\n" + "\n".join(lines) + "\n</task>"

    def _read_locomo(self, conversation: int | None) -> None:
        """Read and check the LoCoMo file: at make, and at a reset after the file changed (its stamps), so an
        episode never plays or scores a stale copy. The loader caches on the stamps."""
        path, stamps = self._data_file, file_stamps(self._data_file)
        kept, self.conversations = self.conversations, _load_locomo(path, stamps)
        try:
            if conversation is not None and conversation >= len(self.conversations):
                raise ValueError(f"conversation must be an index in 0..{len(self.conversations) - 1} "
                                 f"({path} holds {len(self.conversations)}), got {conversation!r}")
            self._check_locomo_capacity(conversation, path)
        except ValueError:
            self.conversations = kept
            raise
        self._data_stamps = stamps

    def _check_locomo_capacity(self, conversation: int | None, path: str) -> None:
        """Refuse ``sessions``, ``question_types`` or ``questions`` that the LoCoMo conversations cannot serve.

        With ``conversation=None`` each episode draws a conversation, so ``questions`` must fit the smallest
        question pool (after the session cut and the type filter) and ``sessions`` the longest conversation.
        """
        pool = self.conversations if conversation is None else (self.conversations[conversation],)
        longest = max(len(c.sessions) for c in pool)
        if self.sessions is not None and self.sessions > longest:
            raise ValueError(f"sessions must be at most {longest} (the most sessions a conversation of {path} "
                             f"has), got {self.sessions}")
        counts = []
        for conv in pool:
            cut = conv if self.sessions is None else conv.first_sessions(self.sessions)
            counts.append(sum(1 for q in cut.questions if self.question_types is None or q.kind in self.question_types))
        filters = ", ".join(f"{k}={v!r}" for k, v in (("sessions", self.sessions), ("question_types", self.question_types),
                                                      ("conversation", conversation)) if v is not None)
        where = f"{path}" + (f" with {filters}" if filters else "")
        if min(counts) == 0:
            raise ValueError(f"no question left in a conversation of {where}: widen question_types or sessions")
        if self.n_questions is not None and self.n_questions > min(counts):
            every = "the conversation" if conversation is not None else "every conversation"
            raise ValueError(f"questions={self.n_questions} is more than {every} of {where} holds: at most "
                             f"{min(counts)}")

    @property
    def n_sessions(self) -> int:
        return 0 if self.conversation is None else len(self.conversation.sessions)

    @property
    def reading(self) -> bool:
        """Whether a session is being shown (``False`` once the questions are asked)."""
        return self._session < self.n_sessions

    def session_text(self, i: int) -> str:
        """The dialogue of session ``i`` (0-based): one ``Speaker: text`` line per turn."""
        session = self.conversation.sessions[i]
        if not session.turns:
            return "(no dialogue in this session)"
        return "\n".join(sanitize(t.render()) for t in session.turns)

    def _information_block(self, notice: str | None = None) -> str:
        tail = f"\n[{notice}]" if notice else ""
        if self.reading:
            session = self.conversation.sessions[self._session]
            head = f"[session {self._session + 1}/{self.n_sessions}, {sanitize(session.date)}]"
            return f"<information>{head}{tail}\n{self.session_text(self._session)}\n</information>"
        if self._question >= len(self.questions):
            return "<information>[all questions answered]\n</information>"
        question = sanitize(self.questions[self._question].question)
        how = "<memory>...</memory><answer>...</answer>" if self.mode.uses_memory else "<answer>...</answer>"
        return (f"<information>[question {self._question + 1}/{len(self.questions)}]{tail}\n{question}\n"
                f"Answer it now with {how}.\n</information>")

    # ------------------------------------------------------------------ gymnasium API
    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        super().reset(seed=seed)
        if self.dataset == "locomo" and file_stamps(self._data_file) != self._data_stamps:
            self._read_locomo(self.conversation_index)  # rewritten since the last episode: read as it is now
        if self.dataset == "locomo":
            index = self.conversation_index
            if index is None:
                index = int(self.np_random.integers(len(self.conversations)))
            conv = self.conversations[index]
            if self.sessions is not None:
                conv = conv.first_sessions(self.sessions)
        else:
            conv = generate_conversation(self.np_random, self.sessions, self.turns_per_session)
        self.conversation = conv
        self.questions = sample_questions(self.np_random, conv, self.n_questions, self.question_types)
        self.max_turns = self._max_turns_arg or 2 * (len(conv.sessions) + len(self.questions))
        shown = [q.question for q in self.questions] if self.questions_upfront else []
        self._task_text = self._compose_task(conv.speakers, len(self.questions), shown)
        self._session = 0
        self._question = 0
        self._turn = 0
        self._answers = [""] * len(self.questions)
        self._scores = [(0.0, 0.0)] * len(self.questions)
        self._official = [0.0] * len(self.questions)
        self._start_episode(self._information_block())
        info = {
            "episode_id": self._episode_id,
            "conversation_id": conv.id,
            "questions": [q.question for q in self.questions],
            "question_ids": [q.id for q in self.questions],
            "question_types": [q.kind for q in self.questions],
            "sessions": len(conv.sessions),
            "max_turns": self.max_turns,
            "context_tokens": self._obs_tokens,
        }
        return self._obs, info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        memory_before = self._begin_step()
        shown = ("session", self._session) if self.reading else ("question", self._question)
        reward, terminated, extra = 0.0, False, {"question_index": -1}  # -1: this step answered no question
        memory_cut, tool, tool_input, memory, error = 0, None, None, None, None
        if not (not self.mode.uses_memory and blank_action(action) and self.reading):
            parsed = parse_action(action, require_memory=False, tools=("answer",), allow_memory_only=True)
            error, memory, tool, tool_input = parsed.error, parsed.memory, parsed.tool, parsed.argument
            if error is None and self.reading and tool == "answer":
                error = "the questions come after the last session: rewrite your memory with <memory>...</memory>"
            elif error is None and not self.reading and tool != "answer":
                error = "answer the question with <answer>...</answer>"
        valid = error is None
        if not valid:
            reward = -self.invalid_penalty
            notice = sanitize(f"invalid action, state unchanged: {error}")
            tool, tool_input, tool_output = None, None, notice
            information = self._information_block(notice)
        else:
            if memory is not None:
                memory_cut = self._set_memory(memory)
            if tool == "answer":
                j = self._question
                self._answers[j] = tool_input
                self._scores[j] = score_answer(tool_input, self.questions[j])
                if self.dataset == "locomo":
                    q = self.questions[j]
                    self._official[j] = locomo_score(tool_input, q.answers[0], q.meta["category"])
                extra["question_index"] = j
                extra["answer_em"], extra["answer_f1"] = [self._scores[j][0]], [self._scores[j][1]]
                tool_output = f"answer {j + 1}/{len(self.questions)} recorded"
                self._question += 1
                terminated = self._question >= len(self.questions)
                if terminated:
                    reward = float(np.mean([f for _, f in self._scores]))
            else:
                self._session += 1
                tool_output = (f"session {self._session + 1}/{self.n_sessions} shown next" if self.reading
                               else "conversation finished; questions follow")
            information = self._information_block()
        truncated = not terminated and self._turn >= self.max_turns
        snapshot = self._record(
            action=action, memory_before=memory_before, tool=tool, tool_input=tool_input, tool_output=tool_output,
            valid=valid, error=error, reward=reward, memory_truncated_tokens=memory_cut,
            phase=shown[0], index=shown[1], **extra,
        )
        return self._close_step(snapshot, information, action, reward, terminated, truncated,
                                lambda: self._episode_summary(terminated))

    def _episode_summary(self, answered: bool) -> dict[str, Any]:
        em = [e for e, _ in self._scores]
        f1 = [f for _, f in self._scores]
        by_type: dict[str, list[int]] = {}
        for i, q in enumerate(self.questions):
            by_type.setdefault(q.kind, []).append(i)
        official = {}
        if self.dataset == "locomo":  # LoCoMo's own score (memenv.scoring.locomo) beside the SQuAD F1
            locomo = list(getattr(self, "_official", [0.0] * len(self.questions)))
            official = {"locomo_f1": float(np.mean(locomo)) if locomo else 0.0, "locomo_f1_per_question": locomo,
                        "locomo_f1_by_type": {k: float(np.mean([locomo[i] for i in idx])) for k, idx in by_type.items()},
                        "official_metric": "locomo_f1"}
        return self._episode_info(
            em, f1, list(self._answers), answered, **official,
            question_types=[q.kind for q in self.questions],
            f1_by_type={k: float(np.mean([f1[i] for i in idx])) for k, idx in by_type.items()},
            em_by_type={k: float(np.mean([em[i] for i in idx])) for k, idx in by_type.items()},
            count_by_type={k: len(idx) for k, idx in by_type.items()},
            questions_answered=self._question,
            conversation_id=self.conversation.id,
            sessions=self.n_sessions,
            sessions_read=min(self._session, self.n_sessions),
        )
