"""Scripted memory strategies: policies that need no model and act only through the text protocol.

Every strategy except the oracle is a pure function of the observation text (``act(observation)``): whatever
it knows at turn t must have survived in what the environment shows it, that is in its own memory (context
``memory``), in the transcript (``history``) or nowhere (``last-observation``). They share one reader
(:mod:`agents.scripted.world_reader`), so differences in score come from the memory strategy alone.

- ``oracle``: reads the gold supporting documents through the task; searches each by title, keeps the gold
  fact sentences, answers the gold answers. The upper bound, and the source of expert trajectories.
- ``keep-all``: memory accumulates every sentence that states a fact.
- ``relevance``: memory keeps answers found so far and the facts on the open questions' chains, most relevant
  first, within ``memory_budget`` words.
- ``last-observation``: empty memory; answers from the newest result only.
- ``history``: no rewriting; the env keeps the whole transcript (context mode ``history``).
"""

from __future__ import annotations

import re
from typing import Any, Callable

from agents.scripted.world_reader import (
    Fact,
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
from memenv.search import tokenize
from memenv.protocol import format_action

_ANSWER_LINE = re.compile(r"^Answer (\d+): (.*)$")


class ScriptedPolicy:
    """Base class. ``context`` is the env context mode the strategy is meant for."""

    name = "scripted"
    context = "memory"

    def reset(self, env: Any = None) -> None:
        """Called at the start of each episode (only the oracle uses the env)."""

    def act(self, observation: str) -> str:
        raise NotImplementedError

    # Shared decision rule: answer when every question is resolved or this is the last turn; else search
    # for the first entity whose fact is missing (or, for a free-text question, the question itself).
    @staticmethod
    def _decide(questions: list[str], text: str, turns_left: int,
                known_answers: dict[int, str] | None = None) -> tuple[str, str, list[Progress]]:
        known_answers = known_answers or {}
        facts, candidates = facts_in(text), None
        answers, progress_list, query = [], [], None
        for i, question in enumerate(questions, 1):
            plan = parse_question(question)
            if plan is None:
                candidates = sentences(text) if candidates is None else candidates
                progress = resolve_open(question, candidates)
            else:
                progress = resolve(plan, facts)
            progress_list.append(progress)
            answer = progress.answer or known_answers.get(i)
            answers.append(answer or "")
            if answer is None and query is None and progress.need is not None:
                query = progress.need[0]
        if query is None or turns_left <= 1:
            return "answer", "; ".join(answers), progress_list
        return "search", query, progress_list


def _useful(sentence: str, progress: list[Progress], questions: list[str]) -> bool:
    """A sentence worth remembering: a fact on a question's chain or about an entity a question names, or
    evidence for a free-text question."""
    fact = parse_fact(sentence)
    if fact is not None:
        used = {(f[0], f[1]) for p in progress for f in p.used}
        return (fact[0], fact[1]) in used or any(fact[0] in q for q in questions)
    return any(sentence in p.evidence for p in progress)


class KeepAllPolicy(ScriptedPolicy):
    """Never forgets: appends every useful sentence of each result to the memory (see :func:`_useful`)."""

    name = "keep-all"

    def act(self, observation: str) -> str:
        view = read_observation(observation)
        # A fragment left by a truncated window is not kept: only whole sentences with content survive.
        kept = sentences(view.memory)
        seen = set(kept)
        new = [s for s in dict.fromkeys(sentences(view.information)) if s not in seen]
        tool, argument, progress = self._decide(view.questions, "\n".join(kept + new), view.turns_left)
        kept += [s for s in new if _useful(s, progress, view.questions)]
        return format_action(" ".join(kept), tool, argument)


class RelevancePolicy(ScriptedPolicy):
    """Keeps resolved answers (one short line each) and the facts most relevant to still-open questions,
    within ``memory_budget`` words."""

    name = "relevance"

    def __init__(self, memory_budget: int = 80) -> None:
        self.memory_budget = memory_budget

    def act(self, observation: str) -> str:
        view = read_observation(observation)
        known: dict[int, str] = {}
        candidates: list[str] = []
        for line in view.memory.split("\n"):
            match = _ANSWER_LINE.match(line.strip())
            if match:
                known[int(match.group(1))] = match.group(2)
            elif line.strip():
                candidates.extend(sentences(line))
        candidates = list(dict.fromkeys(candidates + sentences(view.information)))
        tool, argument, progress = self._decide(view.questions, "\n".join(candidates), view.turns_left, known)
        for i, p in enumerate(progress, 1):
            if p.answer is not None:
                known[i] = p.answer
        # Relevance: facts a still-open question's chain went through rank first, then facts whose subject
        # is named in an open question, then evidence for open free-text questions; the rest is dropped.
        open_progress = [p for i, p in enumerate(progress, 1) if i not in known]
        open_questions = [q for i, q in enumerate(view.questions, 1) if i not in known]
        on_chain = {(f[0], f[1]) for p in open_progress for f in p.used}
        open_words = [set(tokenize(q)) for q, p in zip(view.questions, progress) if p.answer is None]
        scored = []
        for order, sentence in enumerate(candidates):
            fact = parse_fact(sentence)
            if fact is not None:
                score = 3 if (fact[0], fact[1]) in on_chain else 2 if any(fact[0] in q for q in open_questions) else 0
            else:
                best = max((overlap(w, sentence) for w in open_words), default=0)
                score = 1 if best >= 2 else 0
            if score:
                scored.append((-score, order, sentence))
        # Answer lines first (cheapest progress to keep), then facts, all within the budget.
        lines, budget = [], self.memory_budget
        answer_lines = [f"Answer {i}: {a}" for i, a in sorted(known.items())]
        for line in answer_lines + [sentence for _, _, sentence in sorted(scored)]:
            words = len(line.split())
            if words <= budget:
                lines.append(line)
                budget -= words
        return format_action("\n".join(lines), tool, argument)


class LastObservationPolicy(ScriptedPolicy):
    name = "last-observation"

    def act(self, observation: str) -> str:
        view = read_observation(observation)
        tool, argument, _ = self._decide(view.questions, view.information, view.turns_left)
        return format_action("", tool, argument)


class HistoryPolicy(ScriptedPolicy):
    """Search-R1-style: no memory rewriting; reads whatever of the transcript is still in the window."""

    name = "history"
    context = "history"

    def act(self, observation: str) -> str:
        view = read_observation(observation)
        tool, argument, _ = self._decide(view.questions, view.visible, view.turns_left)
        return format_action(None, tool, argument)


class OraclePolicy(ScriptedPolicy):
    """Reads the gold supporting documents through the task (``reset(env)`` hands it the env).

    Memory holds one line per supporting document read: ``Title: gold sentences``. It is a function of the
    observation and the gold task only, so its trajectories are valid expert demonstrations.
    """

    name = "oracle"

    def __init__(self) -> None:
        self.env = None

    def reset(self, env: Any = None) -> None:
        if env is None:
            raise ValueError("the oracle needs the env: call policy.reset(env) after env.reset()")
        self.env = getattr(env, "unwrapped", env)

    def _gold_sentences(self, question, doc_title: str, doc_text: str) -> list[str]:
        gold: set[Fact] = set(map(tuple, question.meta.get("facts", ())))
        if gold:
            return [s for s in sentences(doc_text) if parse_fact(s) in gold]
        answers = [a.lower() for a in question.answers]
        doc_sentences = sentences(doc_text)
        hits = [s for s in doc_sentences if any(a in s.lower() for a in answers)]
        return hits[:2] or doc_sentences[:1]

    def act(self, observation: str) -> str:
        if self.env is None:
            raise ValueError("the oracle needs the env: call policy.reset(env) after env.reset()")
        view = read_observation(observation)
        lines = [line for line in view.memory.split("\n") if line.strip()]
        read_titles = {line.split(": ", 1)[0] for line in lines}
        docs = {d: self.env.document(d) for q in self.env.questions for d in q.supporting_ids}
        # Keep the gold sentences of every supporting document in the newest result.
        for question in self.env.questions:
            for doc_id in question.supporting_ids:
                doc = docs[doc_id]
                header = f"(Title: {doc.title}) "
                if doc.title not in read_titles and header in view.information:
                    start = view.information.index(header) + len(header)
                    text = view.information[start:].split("\n", 1)[0]
                    lines.append(f"{doc.title}: " + " ".join(self._gold_sentences(question, doc.title, text)))
                    read_titles.add(doc.title)
        pending = [docs[d].title for q in self.env.questions for d in q.supporting_ids if docs[d].title not in read_titles]
        memory = "\n".join(lines)
        if pending and view.turns_left > 1:
            return format_action(memory, "search", pending[0])
        return format_action(memory, "answer", "; ".join(q.answers[0] for q in self.env.questions))


STRATEGIES: dict[str, Callable[[], ScriptedPolicy]] = {
    "oracle": OraclePolicy,
    "keep-all": KeepAllPolicy,
    "relevance": RelevancePolicy,
    "last-observation": LastObservationPolicy,
    "history": HistoryPolicy,
}


# Strategies per environment family (the env id up to its first "-": "MemQA-v0" -> "MemQA"). Reading envs
# (MemRead, MemDialog) register their own implementations of the same strategy names here.
STRATEGY_FAMILIES: dict[str, dict[str, Callable[[], ScriptedPolicy]]] = {"MemQA": STRATEGIES}


def env_family(env_id: str) -> str:
    """The strategy family of ``env_id``: the longest registered family it starts with ("MemDialog-BEAM-v0" ->
    "MemDialog-BEAM"), else the id up to its first "-"."""
    name = env_id.split(":")[-1]
    for family in sorted(STRATEGY_FAMILIES, key=len, reverse=True):
        if name.startswith(family + "-"):
            return family
    return name.split("-", 1)[0]


def make_strategy(name: str, env_id: str = "MemQA-v0", **kwargs: Any) -> ScriptedPolicy:
    """A scripted strategy by name for the env ``env_id`` (see :data:`STRATEGY_FAMILIES`)."""
    family = STRATEGY_FAMILIES.get(env_family(env_id))
    if family is None:
        raise ValueError(f"no scripted strategies for {env_id!r}; families: {', '.join(STRATEGY_FAMILIES)}")
    if name not in family:
        raise ValueError(f"unknown strategy {name!r} for {env_id}: choose from {', '.join(family)}")
    return family[name](**kwargs)
