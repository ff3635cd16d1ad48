"""A rule-based reader of the synthetic world's language, shared by the scripted memory strategies.

It knows English as the world writes it (the question and sentence templates of ``tasks.world``), nothing
about a particular world: it reads questions and facts from observation text only. Scripted strategies
differ only in *what they keep in memory*; the reader turns whatever text they can see into answers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from memenv.search.bm25 import tokenize
from tasks.world import COMPARISONS, RELATIONS

NAME = r"[A-Z][A-Za-z'\-]*(?: (?:of )?[A-Z][A-Za-z'\-]*)*"
NUMBER = r"\d+"
_DOC_HEADER = re.compile(r"Doc \d+ \(Title: [^)\n]*\)\s*")
_ENV_NOTICE = re.compile(r"\[(?:turns left|invalid action)[^\]\n]*\]|\[…\]")  # env status lines, the cut mark
_SENTENCE_SPLIT = re.compile(r"(?<=\.)\s+|\n+")
_QUESTION_LINE = re.compile(r"^Question (\d+): (.*)$", re.MULTILINE)
_TURNS_LEFT = re.compile(r"\[turns left: (\d+)\]")
_INFORMATION_BLOCK = re.compile(r"<information>(.*?)</information>", re.DOTALL)


def _template_regex(template: str, slots: dict[str, str]) -> tuple[re.Pattern, str]:
    """Compile a template like "{s} works for {o}." and return it with its longest literal (a prefilter)."""
    pattern, literals = "", []
    for piece in re.split(r"(\{\w\})", template):
        if piece.startswith("{") and piece.endswith("}"):
            pattern += f"(?P<{piece[1]}>{slots[piece[1]]})"
        else:
            pattern += re.escape(piece)
            literals.append(piece)
    return re.compile(pattern), max(literals, key=len)


_FACT_PATTERNS = [
    (rel.name, *_template_regex(t, {"s": NAME, "o": NAME if rel.target else NUMBER}))
    for rel in RELATIONS.values()
    for t in rel.sentences
]
_OUTER_PATTERNS = [(rel.name, _template_regex(t, {"x": ".+"})[0]) for rel in RELATIONS.values() for t in rel.questions]
_NP_PATTERNS = [(rel.name, _template_regex(rel.noun_phrase, {"x": ".+"})[0]) for rel in RELATIONS.values()]
_COMPARISON_PATTERNS = [
    (c.attribute, _template_regex(c.question, {"a": ".+?", "b": ".+"})[0]) for c in COMPARISONS.values()
]
_NAME_RE = re.compile(NAME)

Fact = tuple[str, str, str]  # (subject, relation, object)


def sentences(text: str) -> list[str]:
    """Sentences of observation text, with search-result headers removed."""
    text = _ENV_NOTICE.sub("\n", _DOC_HEADER.sub("\n", text))
    return [s.strip() for s in _SENTENCE_SPLIT.split(text) if s.strip()]


def parse_fact(sentence: str) -> Fact | None:
    """The (subject, relation, object) a sentence states, or None for any other sentence."""
    for relation, pattern, literal in _FACT_PATTERNS:
        if literal in sentence:
            match = pattern.fullmatch(sentence)
            if match:
                return match.group("s"), relation, match.group("o")
    return None


def facts_in(text: str) -> dict[tuple[str, str], str]:
    """Every fact stated in ``text``: {(subject, relation): object}."""
    found = {}
    for sentence in sentences(text):
        fact = parse_fact(sentence)
        if fact:
            found[(fact[0], fact[1])] = fact[2]
    return found


@dataclass(frozen=True)
class Chain:
    start: str
    relations: tuple[str, ...]  # innermost first


@dataclass(frozen=True)
class ComparisonPlan:
    attribute: str
    a: Chain
    b: Chain


def _parse_noun_phrase(text: str) -> Chain | None:
    if _NAME_RE.fullmatch(text):
        return Chain(text, ())
    for relation, pattern in _NP_PATTERNS:
        match = pattern.fullmatch(text)
        if match:
            inner = _parse_noun_phrase(match.group("x"))
            if inner is not None:
                return Chain(inner.start, inner.relations + (relation,))
    return None


def parse_question(question: str) -> Chain | ComparisonPlan | None:
    """A question's plan: a bridge chain or a comparison of two chains (None if not in the world's language)."""
    for attribute, pattern in _COMPARISON_PATTERNS:
        match = pattern.fullmatch(question)
        if match:
            a, b = _parse_noun_phrase(match.group("a")), _parse_noun_phrase(match.group("b"))
            if a and b:
                return ComparisonPlan(attribute, a, b)
    for relation, pattern in _OUTER_PATTERNS:
        match = pattern.fullmatch(question)
        if match:
            inner = _parse_noun_phrase(match.group("x"))
            if inner is not None:
                return Chain(inner.start, inner.relations + (relation,))
    return None


@dataclass(frozen=True)
class Progress:
    """How far the known facts take a question: an answer, or the (entity, relation) still needed.

    ``used`` are the facts the resolution went through (what a memory must keep to not lose progress).
    """

    answer: str | None
    need: tuple[str, str] | None
    used: tuple[Fact, ...]
    evidence: tuple[str, ...] = ()  # open questions: the sentences the answer was read from


def _follow(chain: Chain, facts: dict[tuple[str, str], str], used: list[Fact]) -> tuple[str | None, tuple[str, str] | None]:
    current = chain.start
    for relation in chain.relations:
        value = facts.get((current, relation))
        if value is None:
            return None, (current, relation)
        used.append((current, relation, value))
        current = value
    return current, None


def resolve(plan: Chain | ComparisonPlan | None, facts: dict[tuple[str, str], str]) -> Progress:
    used: list[Fact] = []
    if plan is None:
        return Progress(None, None, ())
    if isinstance(plan, Chain):
        answer, need = _follow(plan, facts, used)
        return Progress(answer, need, tuple(used))
    ends = []
    for side in (plan.a, plan.b):
        end, need = _follow(Chain(side.start, side.relations + (plan.attribute,)), facts, used)
        if need is not None:
            return Progress(None, need, tuple(used))
        ends.append((used[-1][0], int(end)))
    (name_a, val_a), (name_b, val_b) = ends
    smaller_wins = COMPARISONS[plan.attribute].smaller_wins
    return Progress(name_a if (val_a < val_b) == smaller_wins else name_b, None, tuple(used))


# ---------------------------------------------------------------- open questions (outside the world's language)
_YES_NO_START = ("are ", "is ", "was ", "were ", "do ", "does ", "did ", "can ", "has ", "have ")
_CANDIDATE = re.compile(r"(?:[A-Z][\w'\-]*(?:\s+(?:of\s+|the\s+|de\s+)?[A-Z][\w'\-]*)*)|\d[\d,.]*")


def overlap(question_words: set[str], sentence: str) -> int:
    """Number of the question's content words a sentence contains."""
    return len(question_words & set(tokenize(sentence)))


def resolve_open(question: str, candidates: list[str], min_overlap: int = 2) -> Progress:
    """Extractive fallback for free-text questions (HotpotQA and the like).

    The sentence sharing the most content words with the question is the evidence; the answer is "yes" for
    a yes/no question, else the first name or number in it that the question does not already contain.
    Until some sentence shares ``min_overlap`` words, the question itself is the search query.
    """
    words = set(tokenize(question))
    scored = sorted(((overlap(words, s), -i, s) for i, s in enumerate(candidates)), reverse=True)
    if not scored or scored[0][0] < min(min_overlap, max(1, len(words))):
        return Progress(None, (question, "open"), ())
    evidence = tuple(s for score, _, s in scored[:3] if score >= min_overlap)
    if question.lower().startswith(_YES_NO_START):
        return Progress("yes", None, (), evidence)
    for sentence in evidence:
        for match in _CANDIDATE.finditer(sentence):
            if not set(tokenize(match.group())) <= words:
                return Progress(match.group().rstrip(".,"), None, (), evidence)
    return Progress(None, (question, "open"), (), evidence)


@dataclass
class ObservationView:
    """What a text-only agent can read off an observation."""

    questions: list[str]
    memory: str
    information: str  # the newest <information> block
    visible: str  # all text after the task block (the whole transcript in history mode)
    turns_left: int


def read_observation(observation: str) -> ObservationView:
    questions = [q for _, q in sorted(_QUESTION_LINE.findall(observation), key=lambda m: int(m[0]))]
    task_end = observation.find("</task>")
    visible = observation[task_end + 7:] if task_end >= 0 else observation
    memory = ""
    end = visible.find("</memory>")
    if end >= 0:
        # A context budget may have cut the opening <memory> tag away: then the memory runs from the cut.
        start = visible.rfind("<memory>", 0, end)
        memory = visible[start + len("<memory>") if start >= 0 else 0:end].strip("\n")
    blocks = _INFORMATION_BLOCK.findall(visible)
    turns = _TURNS_LEFT.findall(visible)
    return ObservationView(
        questions=questions,
        memory=memory,
        information=blocks[-1] if blocks else "",
        visible=visible,
        turns_left=int(turns[-1]) if turns else 1,
    )
