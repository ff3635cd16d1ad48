"""Scripted memory strategies for the reading environments (``MemRead``, ``MemDialog``).

The same five strategies as for MemQA (:mod:`agents.scripted.strategies.qa_strategies`), acting only through the
observation text:

- ``oracle``: knows the gold evidence (``reset(env)``); keeps exactly the gold sentences / evidence turns it
  sees and answers the gold answers. The upper bound and a source of expert trajectories.
- ``keep-all``: appends every line that could matter (fact sentences about what the questions name or what
  their chains reached; dialogue turns sharing a keyword with the questions) and never drops anything: once
  the memory budget is full the environment cuts the newest lines.
- ``relevance``: ranks the lines of memory + newest chunk by relevance to the questions and keeps the best
  within the memory budget (read off the instructions), most recent first among equals.
- ``last-observation``: no memory. MemRead: answers while the last chunk is on screen. MemDialog (questions
  only come after the last session): its memory is a verbatim copy of the newest session, nothing older.
- ``history``: no rewriting (context ``history``): reads the whole transcript when asked.

Synthetic-world documents are read with :mod:`agents.scripted.strategies.world_reader`; synthetic conversations with
the dialogue reader below, written against the templates of :mod:`tasks.conversations`; questions outside those
languages (HotpotQA, LoCoMo) fall back to extractive answers
(:func:`agents.scripted.strategies.world_reader.resolve_open`).

Registered as ``STRATEGY_FAMILIES["MemRead"]`` and ``STRATEGY_FAMILIES["MemDialog"]`` on import (see
:func:`agents.scripted.strategies.qa_strategies.make_strategy`).
"""

from __future__ import annotations

import datetime as _dt
import re
from dataclasses import dataclass
from typing import Any, Callable

from agents.scripted.strategies.world_reader import (
    Chain,
    ComparisonPlan,
    Progress,
    facts_in,
    overlap,
    parse_fact,
    parse_question,
    read_observation,
    resolve,
    resolve_open,
    sentences,
)
from agents.scripted.strategies.qa_strategies import STRATEGY_FAMILIES, ScriptedPolicy
from memenv.protocol import format_action
from memenv.search.bm25 import tokenize
from tasks.conversations import (
    ABSTENTION_ANSWER,
    ATTRIBUTES,
    EVENT_STATEMENTS,
    EVENTS,
    ORDER_QUESTIONS,
    RELATIVE_QUESTIONS,
    RELATIVE_STATEMENTS,
    RELATIVES,
    WHEN_QUESTIONS,
    format_date,
)

__all__ = ["DIALOG_STRATEGIES", "READ_STRATEGIES", "DialogReader", "memory_budget_of"]

_BUDGET = re.compile(r"at most (\d+) tokens")
_CHUNK_HEAD = re.compile(r"\[chunk (\d+)/(\d+)\]")
_FINISHED = re.compile(r"\[document finished")
DEFAULT_BUDGET = 256


def memory_budget_of(observation: str) -> int | None:
    """The memory budget the instructions announce (``None``: no limit; default when not stated)."""
    task_end = observation.find("</task>")
    task = observation[:task_end] if task_end >= 0 else observation
    match = _BUDGET.search(task)
    if match:
        return int(match.group(1))
    return None if "no limit" in task else DEFAULT_BUDGET


def _fit(lines: list[str], budget: int | None) -> list[str]:
    """The lines (in the given priority order) that fit in ``budget`` words, skipping ones that do not."""
    if budget is None:
        return lines
    kept, left = [], budget
    for line in lines:
        words = len(line.split())
        if words <= left:
            kept.append(line)
            left -= words
    return kept


# ====================================================================================================== MemRead
def _plans(questions: list[str]) -> list[Chain | ComparisonPlan | None]:
    return [parse_question(q) for q in questions]


def _answer_questions(questions: list[str], text: str) -> list[str]:
    """One answer per question from ``text`` (world language first, extractive fallback)."""
    facts, candidates, answers = facts_in(text), None, []
    for question in questions:
        plan = parse_question(question)
        if plan is None:
            candidates = sentences(text) if candidates is None else candidates
            progress = resolve_open(question, candidates)
        else:
            progress = resolve(plan, facts)
        answers.append(progress.answer or "")
    return answers


def _chain_relations(plan: Chain | ComparisonPlan | None) -> set[str]:
    """Relations of a plan's hops after the first (their subjects are not named in the question)."""
    if isinstance(plan, Chain):
        return set(plan.relations[1:])
    if isinstance(plan, ComparisonPlan):
        return set(plan.a.relations[1:]) | set(plan.b.relations[1:]) | {plan.attribute}
    return set()


def _named(plan: Chain | ComparisonPlan | None) -> set[str]:
    if isinstance(plan, Chain):
        return {plan.start}
    if isinstance(plan, ComparisonPlan):
        return {plan.a.start, plan.b.start}
    return set()


class _ReadPolicy(ScriptedPolicy):
    """Shared MemRead logic: where in the document the observation is."""

    @staticmethod
    def _position(observation: str) -> tuple[int, int, bool]:
        """(chunk, chunks, finished) of the newest information block."""
        view = read_observation(observation)
        match = _CHUNK_HEAD.search(view.information)
        if match:
            return int(match.group(1)), int(match.group(2)), False
        return 0, 0, bool(_FINISHED.search(view.information))


class ReadOraclePolicy(_ReadPolicy):
    """Keeps the gold sentences of the supporting documents as they stream past; answers the gold answers."""

    name = "oracle"

    def __init__(self) -> None:
        self.env = None
        self._gold: list[str] = []

    def reset(self, env: Any = None) -> None:
        if env is None:
            raise ValueError("the oracle needs the env: call policy.reset(env) after env.reset()")
        self.env = getattr(env, "unwrapped", env)
        gold: list[str] = []
        for question in self.env.questions:
            facts = set(map(tuple, question.meta.get("facts", ())))
            for doc_id in question.supporting_ids:
                doc_sentences = sentences(self.env.document(doc_id).text)
                if facts:
                    hits = [s for s in doc_sentences if parse_fact(s) in facts]
                else:
                    answers = [a.lower() for a in question.answers]
                    hits = [s for s in doc_sentences if any(a in s.lower() for a in answers)][:2] or doc_sentences[:1]
                gold.extend(hits)
        self._gold = list(dict.fromkeys(gold))

    def act(self, observation: str) -> str:
        if self.env is None:
            raise ValueError("the oracle needs the env: call policy.reset(env) after env.reset()")
        view = read_observation(observation)
        lines = [line for line in view.memory.split("\n") if line.strip()]
        for sentence in self._gold:
            if sentence not in lines and sentence in view.information:
                lines.append(sentence)
        memory = "\n".join(lines)
        _, _, finished = self._position(observation)
        if finished:
            return format_action(memory, "answer", "; ".join(q.answers[0] for q in self.env.questions))
        return format_action(memory)


class ReadKeepAllPolicy(_ReadPolicy):
    """Appends every fact about an entity the questions name or their chains reached; never drops a line."""

    name = "keep-all"

    def act(self, observation: str) -> str:
        view = read_observation(observation)
        _, _, finished = self._position(observation)
        kept = sentences(view.memory)
        if finished:
            return format_action("\n".join(kept), "answer", "; ".join(_answer_questions(view.questions, view.memory)))
        seen = set(kept)
        new = [s for s in dict.fromkeys(sentences(view.information)) if s not in seen]
        plans = _plans(view.questions)
        facts = facts_in("\n".join(kept + new))
        used = {(f[0], f[1]) for plan in plans if plan is not None for f in resolve(plan, facts).used}
        names = set().union(*(_named(p) for p in plans)) if plans else set()
        words = [set(tokenize(q)) for q, p in zip(view.questions, plans) if p is None]
        for sentence in new:
            fact = parse_fact(sentence)
            if fact is not None:
                if (fact[0], fact[1]) in used or fact[0] in names:
                    kept.append(sentence)
            elif any(overlap(w, sentence) >= 2 for w in words):
                kept.append(sentence)
        return format_action("\n".join(kept))  # the env's budget cuts the newest lines


class ReadRelevancePolicy(_ReadPolicy):
    """Ranks candidate facts: on a question's chain or about a named entity (3), of a relation a later hop
    needs (1; newest first); open questions: sentences sharing content words. Keeps the best in budget."""

    name = "relevance"

    def act(self, observation: str) -> str:
        view = read_observation(observation)
        _, _, finished = self._position(observation)
        if finished:
            return format_action(view.memory, "answer", "; ".join(_answer_questions(view.questions, view.memory)))
        memory = [s for s in sentences(view.memory)]
        chunk = [s for s in sentences(view.information)]
        candidates = list(dict.fromkeys(memory + chunk))
        plans = _plans(view.questions)
        facts = facts_in("\n".join(candidates))
        progress = [resolve(p, facts) if p is not None else None for p in plans]
        used = {(f[0], f[1]) for pr in progress if pr is not None for f in pr.used}
        names = set().union(*(_named(p) for p in plans)) if plans else set()
        wanted = set()
        for plan, pr in zip(plans, progress):
            if pr is not None and pr.answer is None:
                wanted |= _chain_relations(plan)
        words = [set(tokenize(q)) for q, p in zip(view.questions, plans) if p is None]
        scored = []
        for order, sentence in enumerate(candidates):
            fact = parse_fact(sentence)
            if fact is not None:
                score = 3 if (fact[0], fact[1]) in used or fact[0] in names else 1 if fact[1] in wanted else 0
            else:
                best = max((overlap(w, sentence) for w in words), default=0)
                score = 1 + min(best, 5) / 10 if best >= 2 else 0
            if score:
                scored.append((-score, -order, sentence))  # newest first among equals
        kept = _fit([s for _, _, s in sorted(scored)], memory_budget_of(observation))
        return format_action("\n".join(kept))


class ReadLastObservationPolicy(_ReadPolicy):
    """No memory: answers from the last chunk while it is on screen."""

    name = "last-observation"

    def act(self, observation: str) -> str:
        view = read_observation(observation)
        chunk, chunks, finished = self._position(observation)
        if finished or (chunks and chunk >= chunks):
            return format_action("", "answer", "; ".join(_answer_questions(view.questions, view.information)))
        return format_action("")


class ReadHistoryPolicy(_ReadPolicy):
    """No rewriting (context ``history``): an empty action reads on; the answer comes from the transcript."""

    name = "history"
    context = "history"

    def act(self, observation: str) -> str:
        view = read_observation(observation)
        _, _, finished = self._position(observation)
        if finished:
            return format_action(None, "answer", "; ".join(_answer_questions(view.questions, view.visible)))
        return ""


READ_STRATEGIES: dict[str, Callable[[], ScriptedPolicy]] = {
    "oracle": ReadOraclePolicy,
    "keep-all": ReadKeepAllPolicy,
    "relevance": ReadRelevancePolicy,
    "last-observation": ReadLastObservationPolicy,
    "history": ReadHistoryPolicy,
}


# ====================================================================================================== MemDialog
_SESSION_HEAD = re.compile(r"\[session (\d+)/(\d+), ([^\]\n]*)\]")
_QUESTION_HEAD = re.compile(r"\[question (\d+)/(\d+)\]\n(.*)")
_MEMORY_LINE = re.compile(r"^\[(?P<date>[^\]\n]+)\] (?P<speaker>[^:\n]{1,60}): (?P<text>.*)$")
_TURN_LINE = re.compile(r"^(?P<speaker>[A-Z][^:\n\[<]{0,59}): (?P<text>.+)$")
_TURN_SENTENCES = re.compile(r"(?<=[.!?])\s+")
_DATE = re.compile(r"(\d{1,2}) ([A-Z][a-z]+),? (\d{4})")
_QUESTION_TASK_LINE = re.compile(r"^Question (\d+): (.*)$", re.MULTILINE)
_LINE_START = re.compile(r"\s+(?=\[(?!shares )[^\]\n]{1,60}\] [A-Z][^:\n\[\]]{0,59}: )")
_SPEAKERS = re.compile(r"conversation between (.+?) and (.+?), one session")


@dataclass(frozen=True)
class DatedLine:
    """A dialogue turn with the date of its session."""

    date: str
    speaker: str
    text: str

    def render(self) -> str:
        return f"[{self.date}] {self.speaker}: {self.text}"


def parse_date(text: str) -> _dt.date | None:
    """``7 May 2023`` or LoCoMo's ``1:56 pm on 8 May, 2023`` -> a date (None if unreadable)."""
    match = _DATE.search(text)
    if not match:
        return None
    try:
        return _dt.datetime.strptime(f"{match.group(1)} {match.group(2)} {match.group(3)}", "%d %B %Y").date()
    except ValueError:
        return None


def dated_lines(text: str) -> list[DatedLine]:
    """Every dialogue turn in ``text``, in order: memory lines ``[date] Speaker: text`` and session blocks
    (a ``[session i/n, date]`` header dates the ``Speaker: text`` lines under it).

    Memory lines run together on one line (the env's budget cut joins words with single spaces) are split
    again at each ``[date] Speaker:`` start.
    """
    lines, date = [], ""
    for raw in _LINE_START.sub("\n", text).split("\n"):
        line = raw.strip()
        head = _SESSION_HEAD.search(line)
        if head:
            date = head.group(3)
            continue
        match = _MEMORY_LINE.match(line)
        if match:
            lines.append(DatedLine(match.group("date"), match.group("speaker"), match.group("text")))
            continue
        match = _TURN_LINE.match(line)
        if match and date:
            lines.append(DatedLine(date, match.group("speaker"), match.group("text")))
    return lines


@dataclass
class DialogView:
    questions: list[str]
    memory: list[DatedLine]
    session: tuple[int, int, str] | None  # (i, n, date) of the session on screen
    session_lines: list[DatedLine]
    question: tuple[int, int, str] | None  # (j, m, text) of the question asked
    visible: str


def read_dialog(observation: str) -> DialogView:
    view = read_observation(observation)
    task_end = observation.find("</task>")
    task = observation[:task_end] if task_end >= 0 else ""
    questions = [q for _, q in sorted(_QUESTION_TASK_LINE.findall(task), key=lambda m: int(m[0]))]
    session = question = None
    session_lines: list[DatedLine] = []
    head = _SESSION_HEAD.search(view.information)
    if head:
        session = (int(head.group(1)), int(head.group(2)), head.group(3))
        session_lines = dated_lines(view.information)
    asked = _QUESTION_HEAD.search(view.information)
    if asked:
        question = (int(asked.group(1)), int(asked.group(2)), asked.group(3).strip())
    return DialogView(questions, dated_lines(view.memory), session, session_lines, question, view.visible)


def _slot_regex(template: str, slots: dict[str, str]) -> re.Pattern:
    pattern = ""
    for piece in re.split(r"(\{\w+\})", template):
        if piece.startswith("{") and piece.endswith("}"):
            pattern += f"(?P<{piece[1:-1]}>{slots[piece[1:-1]]})"
        else:
            pattern += re.escape(piece)
    return re.compile(pattern)


_NAME = r"[A-Z][a-z]+"
_VALUE = r".+?"
_REL = "|".join(map(re.escape, RELATIVES))
_EVENT_PAST = "|".join(re.escape(past) for past, _ in EVENTS)
_EVENT_BASE = "|".join(re.escape(base) for _, base in EVENTS)
_PAST_TO_BASE = dict(EVENTS)


class DialogReader:
    """Reads the synthetic conversation language (first-person attributes and their updates, relatives,
    dated events) off dated lines, and answers its question templates; latest statement wins."""

    def __init__(self) -> None:
        slots = {"v": _VALUE, "n": _NAME, "r": _REL, "p": _NAME, "e": _EVENT_PAST, "b": _EVENT_BASE,
                 "b1": _EVENT_BASE, "b2": _EVENT_BASE}
        self.statements = [(a.name, _slot_regex(t, slots)) for a in ATTRIBUTES.values() for t in a.statements + a.updates]
        self.third = [(a.name, _slot_regex(t, slots)) for a in ATTRIBUTES.values() for t in a.third_person]
        self.relatives = [_slot_regex(t, slots) for t in RELATIVE_STATEMENTS]
        self.events = [(_slot_regex(t, slots), days) for t, days in EVENT_STATEMENTS]
        self.questions: list[tuple[str, str | None, re.Pattern]] = []
        for a in ATTRIBUTES.values():
            self.questions += [("attr", a.name, _slot_regex(t, slots)) for t in a.questions + a.update_questions]
            self.questions += [("relattr", a.name, _slot_regex(t, slots)) for t in a.relative_questions]
        self.questions += [("relname", None, _slot_regex(t, slots)) for t in RELATIVE_QUESTIONS]
        self.questions += [("when", None, _slot_regex(t, slots)) for t in WHEN_QUESTIONS]
        self.questions += [("order", None, _slot_regex(t, slots)) for t in ORDER_QUESTIONS]

    def parse_question(self, question: str) -> tuple | None:
        for kind, attr, pattern in self.questions:
            m = pattern.fullmatch(question.strip())
            if m:
                g = m.groupdict()
                if kind == "attr":
                    return ("attr", g["p"], attr)
                if kind == "relattr":
                    return ("relattr", g["p"], g["r"], attr)
                if kind == "relname":
                    return ("relname", g["p"], g["r"])
                if kind == "when":
                    return ("when", g["p"], g["b"])
                return ("order", g["p"], g["b1"], g["b2"])
        return None

    def knowledge(self, lines: list[DatedLine]) -> dict[str, dict]:
        attrs, rel_names, rel_attrs, events = {}, {}, {}, {}
        for line in lines:
            for sentence in _TURN_SENTENCES.split(line.text.strip()):
                self._read_sentence(line, sentence.strip(), attrs, rel_names, rel_attrs, events)
        return {"attrs": attrs, "rel_names": rel_names, "rel_attrs": rel_attrs, "events": events}

    def _read_sentence(self, line, sentence, attrs, rel_names, rel_attrs, events) -> None:
        for attr, pattern in self.statements:
            m = pattern.fullmatch(sentence)
            if m:
                attrs[(line.speaker, attr)] = m.group("v")
                return
        for pattern in self.relatives:
            m = pattern.fullmatch(sentence)
            if m:
                rel_names[(line.speaker, m.group("r"))] = m.group("n")
                return
        for attr, pattern in self.third:
            m = pattern.fullmatch(sentence)
            if m:
                rel_attrs[(m.group("n"), attr)] = m.group("v")
                return
        for pattern, days in self.events:
            m = pattern.fullmatch(sentence)
            if m:
                day = parse_date(line.date)
                if day is not None:
                    events[(line.speaker, _PAST_TO_BASE[m.group("e")])] = day - _dt.timedelta(days=days)
                return

    def answer(self, question: str, lines: list[DatedLine]) -> str:
        """The answer to ``question`` from ``lines`` (chronological); the abstention phrase if they do not say."""
        plan = self.parse_question(question)
        if plan is None:
            return _open_answer(question, lines)
        k = self.knowledge(lines)
        value = None
        if plan[0] == "attr":
            value = k["attrs"].get((plan[1], plan[2]))
        elif plan[0] == "relname":
            value = k["rel_names"].get((plan[1], plan[2]))
        elif plan[0] == "relattr":
            name = k["rel_names"].get((plan[1], plan[2]))
            value = None if name is None else k["rel_attrs"].get((name, plan[3]))
        elif plan[0] == "when":
            day = k["events"].get((plan[1], plan[2]))
            value = None if day is None else format_date(day)
        else:
            d1, d2 = k["events"].get((plan[1], plan[2])), k["events"].get((plan[1], plan[3]))
            if d1 is not None and d2 is not None and d1 != d2:
                value = plan[2] if d1 < d2 else plan[3]
        return value if value is not None else ABSTENTION_ANSWER


def _open_answer(question: str, lines: list[DatedLine]) -> str:
    """Free-text questions (LoCoMo): extractive fallback over the turns, abstaining when nothing matches."""
    progress: Progress = resolve_open(question, [f"{line.speaker}: {line.text}" for line in lines])
    return progress.answer or ABSTENTION_ANSWER


_READER: DialogReader | None = None


def dialog_reader() -> DialogReader:
    global _READER
    if _READER is None:
        _READER = DialogReader()
    return _READER


def _keywords(questions: list[str]) -> set[str]:
    return {w for q in questions for w in tokenize(q)} - {"s"}


def _speaker_words(observation: str) -> set[str]:
    """The speakers' names as tokens (read off the instructions): in every greeting, so not topical."""
    match = _SPEAKERS.search(observation[: max(0, observation.find("</task>"))])
    return set(tokenize(f"{match.group(1)} {match.group(2)}")) if match else set()


class _DialogPolicy(ScriptedPolicy):
    """Shared MemDialog logic: answer the asked question from the memory (or transcript)."""

    def _answer(self, view: DialogView, lines: list[DatedLine], memory: str | None) -> str:
        j, _, text = view.question
        return format_action(memory, "answer", dialog_reader().answer(text, lines))

    def act(self, observation: str) -> str:
        view = read_dialog(observation)
        if view.question is not None:
            return self._answer(view, view.memory, "\n".join(line.render() for line in view.memory))
        if view.session is None:  # nothing recognisable on screen: keep the memory as it is
            return format_action("\n".join(line.render() for line in view.memory))
        return format_action("\n".join(line.render() for line in self._rewrite(view, observation)))

    def _rewrite(self, view: DialogView, observation: str) -> list[DatedLine]:
        raise NotImplementedError


class DialogOraclePolicy(_DialogPolicy):
    """Keeps the gold evidence turns (dated) as they are read; answers each question's gold answer."""

    name = "oracle"

    def __init__(self) -> None:
        self.env = None
        self._evidence: set[str] = set()

    def reset(self, env: Any = None) -> None:
        if env is None:
            raise ValueError("the oracle needs the env: call policy.reset(env) after env.reset()")
        self.env = getattr(env, "unwrapped", env)
        evidence = set()
        for question in self.env.questions:
            for dia_id in question.supporting_ids:
                turn = self.env.conversation.turn(dia_id)
                if turn is not None:
                    evidence.add((turn.speaker, turn.text))
        self._evidence = evidence

    def _answer(self, view: DialogView, lines: list[DatedLine], memory: str | None) -> str:
        if self.env is None:
            raise ValueError("the oracle needs the env: call policy.reset(env) after env.reset()")
        j = view.question[0]
        return format_action(memory, "answer", self.env.questions[j - 1].answers[0])

    def _rewrite(self, view: DialogView, observation: str) -> list[DatedLine]:
        kept = list(view.memory)
        for line in view.session_lines:
            if (line.speaker, line.text) in self._evidence and line not in kept:
                kept.append(line)
        return kept


class DialogKeepAllPolicy(_DialogPolicy):
    """Appends every turn that shares a keyword with the questions (speakers' names aside; every turn when
    no question is shown yet); the env's budget cuts the newest."""

    name = "keep-all"

    def _rewrite(self, view: DialogView, observation: str) -> list[DatedLine]:
        words = _keywords(view.questions) - _speaker_words(observation)
        new = [line for line in view.session_lines if not words or words & set(tokenize(line.text))]
        return list(view.memory) + new


class DialogRelevancePolicy(_DialogPolicy):
    """Scores turns by the question keywords they share (speaker included; names met in the best turns
    become keywords too, for multi-hop chains), keeps the best within the budget, newest first among equals,
    and writes them back in chronological order."""

    name = "relevance"

    def _rewrite(self, view: DialogView, observation: str) -> list[DatedLine]:
        candidates = list(dict.fromkeys(view.memory + view.session_lines))
        words = _keywords(view.questions)
        speakers = _speaker_words(observation)
        if words:
            # Topical words in what is said (a name someone is greeted with is not topical), plus one when
            # the speaker is a person the questions ask about.
            said = [set(tokenize(line.text)) - speakers for line in candidates]
            by = [bool(set(tokenize(line.speaker)) & words) for line in candidates]
            scores = [len(words & t) + b for t, b in zip(said, by)]
            bridge = set()
            for line, score in zip(candidates, scores):
                if score >= 2:
                    bridge |= {w.lower() for w in re.findall(r"\b[A-Z][a-z]+\b", line.text)[1:]}
            bridge -= words | speakers
            scores = [s + (1 if bridge & t else 0) for s, t in zip(scores, said)]
            threshold = 2
        else:  # questions not shown yet: first-person statements and named people are what memories keep
            scores = [1 + (" I " in f" {line.text} " or "My " in line.text) for line in candidates]
            threshold = 1
        order = sorted((i for i, s in enumerate(scores) if s >= threshold), key=lambda i: (-scores[i], -i))
        budget = memory_budget_of(observation)
        kept, left = [], budget
        for i in order:
            words_i = len(candidates[i].render().split())
            if left is None or words_i <= left:
                kept.append(i)
                left = None if left is None else left - words_i
        return [candidates[i] for i in sorted(kept)]


class DialogLastObservationPolicy(_DialogPolicy):
    """Remembers nothing older than the newest session: its memory is a copy of that session."""

    name = "last-observation"

    def _rewrite(self, view: DialogView, observation: str) -> list[DatedLine]:
        return list(view.session_lines)


class DialogHistoryPolicy(_DialogPolicy):
    """No rewriting (context ``history``): reads on with empty actions; answers from the transcript."""

    name = "history"
    context = "history"

    def act(self, observation: str) -> str:
        view = read_dialog(observation)
        if view.question is not None:
            return self._answer(view, dated_lines(view.visible), None)
        return ""


DIALOG_STRATEGIES: dict[str, Callable[[], ScriptedPolicy]] = {
    "oracle": DialogOraclePolicy,
    "keep-all": DialogKeepAllPolicy,
    "relevance": DialogRelevancePolicy,
    "last-observation": DialogLastObservationPolicy,
    "history": DialogHistoryPolicy,
}

STRATEGY_FAMILIES["MemRead"] = READ_STRATEGIES
STRATEGY_FAMILIES["MemDialog"] = DIALOG_STRATEGIES
