"""Long multi-session conversations: data types, the abstention convention, and a seeded synthetic generator.

A :class:`Conversation` is two speakers talking over dated sessions, plus probing questions
(:class:`tasks.types.Question`: ``kind`` is the question type, ``supporting_ids`` the ``dia_id`` of the
evidence turns). LoCoMo files load into the same types (:mod:`tasks.locomo`).

Abstention
    When the conversation does not contain the answer, the gold answer is :data:`ABSTENTION_ANSWER`
    ("Not mentioned in the conversation") and ``question.meta["abstention"]`` is ``True``. A prediction
    *abstains* when its SQuAD-normalised text contains one of :data:`ABSTENTION_MARKERS` ("not mentioned",
    "no information available": the rule of LoCoMo's own category-5 evaluation); an abstaining prediction
    scores F1 = EM = 1.0 on an abstention question, whatever else it says. So answering exactly
    ``ABSTENTION_ANSWER`` is always safe. See :func:`is_abstention_answer`.

The synthetic generator (:func:`generate_conversation`) writes conversations in a small fixed language (the
templates below are exported so scripted readers in ``agents/`` can be written against the language, not
against the generator's internals). Each speaker states some personal attributes (job, city, hobby, ...),
introduces relatives and says things about them, reports dated events ("I ran a half marathon today!"), and
sometimes changes an attribute in a later session; neighbours' facts and chit-chat are distractors. Question
types (:data:`QUESTION_TYPES`):

* ``single-hop``: one stated fact ("What is the name of Ava's dog?");
* ``multi-hop``: a relative's attribute, needing the turn that names the relative and the turn about them
  ("What does Ava's sister do for a living?");
* ``temporal``: the date of an event, resolved against the session date ("today", "yesterday"), or the
  order of two events ("Which did Ava do first, ...?");
* ``knowledge-update``: an attribute stated in one session and changed in a later one; the gold is the
  latest value (``meta["old_value"]`` holds the earlier one);
* ``abstention``: an attribute or relative never mentioned for that speaker (sometimes a neighbour has one:
  "My neighbour Leo has a dog named Rex." must not answer "What is the name of Ava's dog?").
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field

import numpy as np

from tasks.types import Question, answer_text

__all__ = [
    "ABSTENTION_ANSWER",
    "ABSTENTION_MARKERS",
    "ATTRIBUTES",
    "EVENTS",
    "QUESTION_TYPES",
    "Conversation",
    "Session",
    "Turn",
    "format_date",
    "generate_conversation",
    "is_abstention_answer",
    "min_questions_by_type",
    "sample_questions",
]

ABSTENTION_ANSWER = "Not mentioned in the conversation"
ABSTENTION_MARKERS = ("not mentioned", "no information available")
QUESTION_TYPES = ("single-hop", "multi-hop", "temporal", "knowledge-update", "abstention")
# Per speaker, the generator states this many personal attributes, names this many relatives (inclusive
# range) and reports this many dated events (at most one per session).
_ATTRIBUTES_STATED = 4
_RELATIVES_NAMED = (1, 2)
_EVENTS_REPORTED = 3


def _normalise(text: str) -> str:
    # The SQuAD normalisation (lowercase, no punctuation, no articles, single spaces), kept local so that
    # this layer imports nothing of memenv.
    import re
    import string

    text = "".join(ch for ch in answer_text(text).lower() if ch not in set(string.punctuation))
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", text).split())


def is_abstention_answer(text: str) -> bool:
    """Whether a prediction abstains ("the conversation does not say"): see the module docstring."""
    norm = _normalise(text)
    return any(marker in norm for marker in ABSTENTION_MARKERS)


# ---------------------------------------------------------------------------------------------------- types
@dataclass(frozen=True)
class Turn:
    """One dialogue turn. ``text`` is what is shown after ``"Speaker: "`` (image captions included)."""

    speaker: str
    text: str
    dia_id: str = ""

    def render(self) -> str:
        return f"{self.speaker}: {self.text}"


@dataclass(frozen=True)
class Session:
    """A dated session (``index`` is 1-based, as in LoCoMo's ``session_<n>``)."""

    index: int
    date: str
    turns: tuple[Turn, ...]


@dataclass(frozen=True)
class Conversation:
    """Two speakers, their sessions in order, and the probing questions about them."""

    id: str
    speakers: tuple[str, ...]
    sessions: tuple[Session, ...]
    questions: tuple[Question, ...]
    meta: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def n_turns(self) -> int:
        return sum(len(s.turns) for s in self.sessions)

    def turn(self, dia_id: str) -> Turn | None:
        """The turn with ``dia_id`` (None if there is none)."""
        for session in self.sessions:
            for turn in session.turns:
                if turn.dia_id == dia_id:
                    return turn
        return None

    def first_sessions(self, n: int) -> "Conversation":
        """The conversation cut after session ``n``, keeping the questions whose evidence lies in it.

        A question's evidence sessions come from its ``dia_id`` s (``D<session>:<turn>``); a question with no
        readable evidence is kept only when nothing is cut.
        """
        if n >= len(self.sessions):
            return self
        keep = {s.index for s in self.sessions[:n]}
        questions = []
        for q in self.questions:
            sessions = _evidence_sessions(q.supporting_ids)
            if sessions and sessions <= keep:
                questions.append(q)
        return Conversation(self.id, self.speakers, self.sessions[:n], tuple(questions), dict(self.meta))


def _evidence_sessions(dia_ids) -> set[int]:
    import re

    found = set()
    for dia_id in dia_ids:
        for m in re.finditer(r"D(\d+):\d+", str(dia_id)):
            found.add(int(m.group(1)))
    return found


def format_date(day: _dt.date) -> str:
    """``7 May 2023`` (the style of LoCoMo's gold answers)."""
    return f"{day.day} {day.strftime('%B')} {day.year}"


# ---------------------------------------------------------------------------------------------------- language
@dataclass(frozen=True)
class Attribute:
    """A personal attribute. Templates use ``{v}`` (value), ``{p}`` (speaker), ``{n}`` (a relative's name),
    ``{r}`` (relation word). ``updates`` are first-person changes (empty: never updated); ``third_person``
    states a relative's value (empty: relatives never get it)."""

    name: str
    values: tuple[str, ...]
    statements: tuple[str, ...]
    updates: tuple[str, ...]
    questions: tuple[str, ...]
    update_questions: tuple[str, ...]
    third_person: tuple[str, ...] = ()
    relative_questions: tuple[str, ...] = ()


ATTRIBUTES: dict[str, Attribute] = {
    a.name: a
    for a in (
        Attribute(
            "job",
            ("nurse", "teacher", "architect", "pilot", "baker", "librarian", "carpenter", "dentist",
             "photographer", "chef", "journalist", "pharmacist", "electrician", "lawyer", "veterinarian",
             "accountant", "firefighter", "translator"),
            ("I work as a {v} these days.", "I have been working as a {v} for a few years now."),
            ("I changed jobs and I am a {v} now.", "Big news, I started a new job as a {v}."),
            ("What does {p} do for a living?", "What is {p}'s job?"),
            ("What does {p} do for a living now?", "What is {p}'s job now?"),
            ("{n} works as a {v}.", "{n} just started working as a {v}."),
            ("What does {p}'s {r} do for a living?", "What is the job of {p}'s {r}?"),
        ),
        Attribute(
            "city",
            ("Lisbon", "Denver", "Osaka", "Glasgow", "Porto", "Austin", "Bergen", "Leipzig", "Halifax", "Cork",
             "Tucson", "Malmo", "Perth", "Quebec", "Seville", "Tallinn", "Krakow", "Adelaide"),
            ("I live in {v}.", "I have been living in {v} for years."),
            ("We moved and I live in {v} now.", "I just moved to {v}."),
            ("Where does {p} live?", "In which city does {p} live?"),
            ("Where does {p} live now?", "In which city does {p} live now?"),
            ("{n} lives in {v}.", "{n} moved to {v} last year."),
            ("Where does {p}'s {r} live?", "In which city does {p}'s {r} live?"),
        ),
        Attribute(
            "hobby",
            ("pottery", "rock climbing", "birdwatching", "salsa dancing", "knitting", "chess", "surfing",
             "gardening", "archery", "calligraphy", "kayaking", "woodworking", "fencing", "origami"),
            ("I have really gotten into {v} lately.", "My favourite hobby is {v}."),
            ("I gave up my old hobby and now I am all about {v}.",),
            ("What is {p}'s hobby?", "Which hobby is {p} into?"),
            ("What is {p}'s hobby now?", "Which hobby is {p} into now?"),
            ("{n} is really into {v}.",),
            ("What is the hobby of {p}'s {r}?",),
        ),
        Attribute(
            "instrument",
            ("piano", "violin", "cello", "guitar", "drums", "flute", "saxophone", "trumpet", "harp", "ukulele"),
            ("I am learning to play the {v}.", "I practise the {v} every evening."),
            ("I switched instruments and I am learning the {v} now.",),
            ("Which instrument is {p} learning to play?",),
            ("Which instrument is {p} learning to play now?",),
        ),
        Attribute(
            "dog",
            ("Biscuit", "Rex", "Luna", "Pepper", "Milo", "Daisy", "Bruno", "Hazel", "Ziggy", "Maple"),
            ("My dog {v} loves the beach.", "I have a dog named {v}."),
            (),
            ("What is the name of {p}'s dog?",),
            (),
        ),
        Attribute(
            "cat",
            ("Whiskers", "Mochi", "Tiger", "Olive", "Simba", "Nala", "Pumpkin", "Smokey", "Clover", "Juniper"),
            ("My cat {v} sleeps all day.", "I adopted a cat named {v}."),
            (),
            ("What is the name of {p}'s cat?",),
            (),
        ),
    )
}

RELATIVES = ("sister", "brother", "cousin", "best friend")
RELATIVE_STATEMENTS = ("My {r} {n} is visiting next week.", "I had dinner with my {r} {n} last night.")
RELATIVE_QUESTIONS = ("What is the name of {p}'s {r}?", "What is {p}'s {r} called?")

# (past tense, base form) of dated events; statements carry how many days before the session they happened.
EVENTS: tuple[tuple[str, str], ...] = (
    ("ran a half marathon", "run a half marathon"),
    ("went to a jazz concert", "go to a jazz concert"),
    ("visited the aquarium", "visit the aquarium"),
    ("took a cooking class", "take a cooking class"),
    ("went camping by the lake", "go camping by the lake"),
    ("painted the kitchen", "paint the kitchen"),
    ("baked a birthday cake", "bake a birthday cake"),
    ("volunteered at the food bank", "volunteer at the food bank"),
    ("climbed the old volcano", "climb the old volcano"),
    ("went to a wine tasting", "go to a wine tasting"),
    ("watched a meteor shower", "watch a meteor shower"),
    ("planted tomatoes in the garden", "plant tomatoes in the garden"),
    ("went to a pottery fair", "go to a pottery fair"),
    ("fixed the garden fence", "fix the garden fence"),
)
EVENT_STATEMENTS: tuple[tuple[str, int], ...] = (
    ("I {e} today!", 0),
    ("Guess what, I {e} today.", 0),
    ("Yesterday I {e}.", 1),
    ("I {e} yesterday and it was great.", 1),
)
WHEN_QUESTIONS = ("When did {p} {b}?",)
ORDER_QUESTIONS = ("Which did {p} do first, {b1} or {b2}?",)

NEIGHBOUR_STATEMENTS = (
    ("My neighbour {n} has a dog named {v}.", "dog"),
    ("My neighbour {n} has a cat named {v}.", "cat"),
    ("My coworker {n} works as a {v}.", "job"),
    ("A friend of mine, {n}, lives in {v}.", "city"),
    ("My neighbour {n} is learning to play the {v}.", "instrument"),
)

NAMES = (
    "Ava", "Ben", "Chloe", "Daniel", "Emma", "Felix", "Grace", "Hugo", "Iris", "Jonas", "Kira", "Liam", "Maya",
    "Noah", "Olivia", "Paul", "Quinn", "Rosa", "Sam", "Tara", "Umar", "Vera", "Wes", "Yara", "Zoe", "Leo", "Nina",
    "Omar", "Priya", "Ravi", "Sofia", "Theo", "Elena", "Marco", "Hana", "Ivan", "Julia", "Karl", "Lena", "Mateo",
)
GREETINGS = ("Hey {o}! Good to see you.", "Hi {o}, how have you been?", "Hello {o}! It has been a while.")
CLOSINGS = ("Talk soon, {o}!", "Take care, {o}.", "Bye {o}, see you next time!")
FILLER = (
    "How have you been?", "It has been a busy week.", "That sounds wonderful!", "Oh wow, tell me more.",
    "I totally understand.", "The weather has been lovely lately.", "I am so happy for you!",
    "Thanks for asking!", "I have been reading a lot recently.", "Work has been hectic but fine.",
    "That made my day.", "I can relate to that.", "Haha, that is hilarious.", "I watched a great movie last night.",
    "We should grab coffee sometime.", "What have you been up to?", "That must have been exhausting.",
    "I could use a holiday soon.", "My week was pretty quiet.", "That is such good news.",
    "I tried a new recipe for dinner.", "The traffic this morning was terrible.", "I slept in on Sunday.",
    "It is always nice to talk to you.", "I am still thinking about what you said last time.",
)


# ---------------------------------------------------------------------------------------------------- generator
def _pick(rng: np.random.Generator, items):
    return items[int(rng.integers(len(items)))]


@dataclass
class _Statement:
    session: int  # 0-based
    speaker: str
    text: str
    key: str = ""  # evidence key for questions ("" for distractors)
    turn: Turn | None = None


def generate_conversation(rng: np.random.Generator, sessions: int = 6, turns_per_session: int = 14,
                          conversation_id: str | None = None) -> Conversation:
    """A seeded synthetic conversation (all randomness from ``rng``) with its full question pool.

    Every question type of :data:`QUESTION_TYPES` is present for ``sessions >= 2``.
    """
    if not isinstance(sessions, (int, np.integer)) or sessions < 2:
        raise ValueError(f"sessions must be an int >= 2, got {sessions!r}")
    if not isinstance(turns_per_session, (int, np.integer)) or turns_per_session < 4:
        raise ValueError(f"turns_per_session must be an int >= 4, got {turns_per_session!r}")
    S = int(sessions)
    names = [NAMES[i] for i in rng.permutation(len(NAMES))]
    speakers, others = names[:2], names[2:]
    start = _dt.date(2022, 1, 3) + _dt.timedelta(days=int(rng.integers(0, 600)))
    dates = [start]
    for _ in range(S - 1):
        dates.append(dates[-1] + _dt.timedelta(days=int(rng.integers(3, 40))))

    statements: list[_Statement] = []
    questions: list[tuple[str, str, tuple[str, ...], tuple[str, ...], dict]] = []  # (type, text, answers, keys, meta)

    def say(session: int, speaker: str, text: str, key: str = "") -> str:
        statements.append(_Statement(session, speaker, text, key))
        return key

    attr_names = list(ATTRIBUTES)
    relation_pool = list(RELATIVES)
    used_events: set[int] = set()
    for si, p in enumerate(speakers):
        # Personal attributes: four of six; one updatable attribute changes in a later session.
        chosen = [attr_names[i] for i in rng.permutation(len(attr_names))[:_ATTRIBUTES_STATED]]
        updatable = [a for a in chosen if ATTRIBUTES[a].updates]
        updated = _pick(rng, updatable) if updatable else None
        for a in chosen:
            attr = ATTRIBUTES[a]
            value = _pick(rng, attr.values)
            if a == updated:
                s0 = int(rng.integers(0, S - 1))
                s1 = int(rng.integers(s0 + 1, S))
                new = _pick(rng, [v for v in attr.values if v != value])
                k0 = say(s0, p, _pick(rng, attr.statements).format(v=value), f"{p}/{a}/0")
                k1 = say(s1, p, _pick(rng, attr.updates).format(v=new), f"{p}/{a}/1")
                questions.append(("knowledge-update", _pick(rng, attr.update_questions).format(p=p), (new,),
                                  (k0, k1), {"old_value": value, "attribute": a, "speaker": p}))
            else:
                k = say(int(rng.integers(0, S)), p, _pick(rng, attr.statements).format(v=value), f"{p}/{a}")
                questions.append(("single-hop", _pick(rng, attr.questions).format(p=p), (value,), (k,),
                                  {"attribute": a, "speaker": p}))
        for a in attr_names:
            if a not in chosen:
                questions.append(("abstention", _pick(rng, ATTRIBUTES[a].questions).format(p=p),
                                  (ABSTENTION_ANSWER,), (), {"attribute": a, "speaker": p, "abstention": True}))
        # Relatives: one or two, each named once; some of their attributes are mentioned in any session.
        kinds = [relation_pool[i] for i in rng.permutation(len(relation_pool))]
        n_rel = int(rng.integers(_RELATIVES_NAMED[0], _RELATIVES_NAMED[1] + 1))
        for r in kinds[:n_rel]:
            n = others.pop(0)
            kr = say(int(rng.integers(0, S)), p, _pick(rng, RELATIVE_STATEMENTS).format(r=r, n=n), f"{p}/rel/{r}")
            questions.append(("single-hop", _pick(rng, RELATIVE_QUESTIONS).format(p=p, r=r), (n,), (kr,),
                              {"relative": r, "speaker": p}))
            rel_attrs = [a for a in attr_names if ATTRIBUTES[a].third_person]
            for i in rng.permutation(len(rel_attrs))[: int(rng.integers(1, 3))]:
                attr = ATTRIBUTES[rel_attrs[i]]
                value = _pick(rng, attr.values)
                ka = say(int(rng.integers(0, S)), p, _pick(rng, attr.third_person).format(n=n, v=value),
                         f"{p}/rel/{r}/{attr.name}")
                questions.append(("multi-hop", _pick(rng, attr.relative_questions).format(p=p, r=r), (value,),
                                  (kr, ka), {"relative": r, "name": n, "attribute": attr.name, "speaker": p}))
        for r in kinds[n_rel:]:
            questions.append(("abstention", _pick(rng, RELATIVE_QUESTIONS).format(p=p, r=r), (ABSTENTION_ANSWER,),
                              (), {"relative": r, "speaker": p, "abstention": True}))
        # Dated events, in distinct sessions (so their order is well defined).
        n_events = min(_EVENTS_REPORTED, S)
        free = [i for i in range(len(EVENTS)) if i not in used_events]
        event_ids = [free[int(i)] for i in rng.permutation(len(free))[:n_events]]
        used_events.update(event_ids)
        event_sessions = sorted(int(s) for s in rng.permutation(S)[:n_events])
        order = rng.permutation(n_events)
        dated = []
        for j, ei in enumerate(event_ids):
            past, base = EVENTS[int(ei)]
            session = event_sessions[int(order[j])]
            template, days = _pick(rng, EVENT_STATEMENTS)
            when = dates[session] - _dt.timedelta(days=days)
            k = say(session, p, template.format(e=past), f"{p}/event/{base}")
            dated.append((when, base, k))
            questions.append(("temporal", _pick(rng, WHEN_QUESTIONS).format(p=p, b=base), (format_date(when),),
                              (k,), {"event": base, "speaker": p, "date": when.isoformat()}))
        for a_i in range(len(dated)):
            for b_i in range(a_i + 1, len(dated)):
                (wa, ba, ka), (wb, bb, kb) = dated[a_i], dated[b_i]
                if wa == wb:
                    continue
                first = ba if wa < wb else bb
                questions.append(("temporal", _pick(rng, ORDER_QUESTIONS).format(p=p, b1=ba, b2=bb), (first,),
                                  (ka, kb), {"events": [ba, bb], "speaker": p, "order": True}))
    # Distractors: neighbours' and coworkers' facts, never asked about.
    for _ in range(int(rng.integers(2, 4))):
        template, a = _pick(rng, NEIGHBOUR_STATEMENTS)
        say(int(rng.integers(0, S)), _pick(rng, speakers), template.format(n=others.pop(0),
                                                                           v=_pick(rng, ATTRIBUTES[a].values)))

    # Lay the statements out as alternating turns, session by session: a greeting, then each speaker's
    # statements on randomly chosen turns of theirs (sometimes after a bit of chit-chat), then a closing.
    session_list = []
    by_key: dict[str, Turn] = {}
    for s in range(S):
        pending = {p: [st for st in statements if st.session == s and st.speaker == p] for p in speakers}
        need = max(len(v) for v in pending.values())
        n_turns = max(int(turns_per_session), 2 * need + 2)
        first = int(rng.integers(2))
        speaker_at = [speakers[(first + t) % 2] for t in range(n_turns)]
        placed: dict[int, _Statement] = {}
        for p in speakers:
            slots = [t for t in range(1, n_turns - 1) if speaker_at[t] == p]
            picks = sorted(int(i) for i in rng.permutation(len(slots))[: len(pending[p])])
            for slot_i, st_i in zip(picks, rng.permutation(len(pending[p]))):
                placed[slots[slot_i]] = pending[p][int(st_i)]
        turns = []
        for t in range(n_turns):
            p, o = speaker_at[t], speakers[(first + t + 1) % 2]
            st = placed.get(t)
            if st is not None:
                text = st.text if rng.random() < 0.5 else f"{_pick(rng, FILLER)} {st.text}"
            elif t == 0:
                text = _pick(rng, GREETINGS).format(o=o)
            elif t == n_turns - 1:
                text = _pick(rng, CLOSINGS).format(o=o)
            else:
                text = _pick(rng, FILLER)
            turn = Turn(p, text, f"D{s + 1}:{t + 1}")
            if st is not None and st.key:
                by_key[st.key] = turn
            turns.append(turn)
        session_list.append(Session(s + 1, format_date(dates[s]), tuple(turns)))

    conv_id = conversation_id or f"synthetic-{int(rng.integers(2**31)):08x}"
    built = []
    for i, (kind, text, answers, keys, meta) in enumerate(questions):
        evidence = tuple(by_key[k].dia_id for k in keys)
        meta = {"abstention": False, **meta}
        built.append(Question(id=f"{conv_id}/q{i}", question=text, answers=answers, supporting_ids=evidence,
                              hops=max(1, len(evidence)), kind=kind, meta=meta))
    return Conversation(conv_id, tuple(speakers), tuple(session_list), tuple(built), {"source": "synthetic"})


def min_questions_by_type(sessions: int) -> dict[str, int]:
    """The fewest questions of each type that every synthetic conversation of ``sessions`` sessions holds.

    Per speaker (two speakers): of the stated attributes one is updated (a knowledge-update question) whenever
    an updatable attribute is among them, the others are single-hop, the unstated ones abstention; each named
    relative gives one single-hop and at least one multi-hop question, each unnamed relation an abstention;
    each dated event a temporal question, and every pair of events an order question (events sit in distinct
    sessions, at least 3 days apart, and happen at most a day before their session, so no two share a date).
    """
    n_attributes = len(ATTRIBUTES)
    n_updatable = sum(1 for a in ATTRIBUTES.values() if a.updates)
    always_updated = n_attributes - n_updatable < _ATTRIBUTES_STATED  # an updatable one is always stated
    fewest_relatives, most_relatives = _RELATIVES_NAMED
    events = min(_EVENTS_REPORTED, sessions)
    per_speaker = {
        "single-hop": _ATTRIBUTES_STATED - (1 if n_updatable else 0) + fewest_relatives,
        "multi-hop": fewest_relatives,
        "temporal": events + events * (events - 1) // 2,
        "knowledge-update": 1 if always_updated else 0,
        "abstention": n_attributes - _ATTRIBUTES_STATED + len(RELATIVES) - most_relatives,
    }
    return {kind: 2 * count for kind, count in per_speaker.items()}


def sample_questions(rng: np.random.Generator, conversation: Conversation, n: int | None,
                     types: tuple[str, ...] | None = None) -> list[Question]:
    """``n`` distinct questions of ``conversation`` (all when ``n`` is None), drawn with ``rng``.

    Stratified by type: types are visited round-robin (in a random order), drawing one question of each in
    turn, so five questions of the synthetic pool cover all five types. ``types`` keeps only those kinds.
    """
    pool = [q for q in conversation.questions if types is None or q.kind in types]
    if not pool:
        raise ValueError(f"conversation {conversation.id!r} has no question of types {types}")
    if n is None:
        return pool
    if n < 1:
        raise ValueError(f"n must be a positive int or None, got {n!r}")
    if n > len(pool):
        raise ValueError(f"asked for {n} questions but conversation {conversation.id!r} holds only {len(pool)}"
                         + (f" of types {types}" if types is not None else ""))
    by_type: dict[str, list[Question]] = {}
    for q in pool:
        by_type.setdefault(q.kind, []).append(q)
    kinds = sorted(by_type)
    kinds = [kinds[i] for i in rng.permutation(len(kinds))]
    queues = {k: [by_type[k][i] for i in rng.permutation(len(by_type[k]))] for k in kinds}
    chosen: list[Question] = []
    while len(chosen) < n and any(queues.values()):
        for k in kinds:
            if queues[k] and len(chosen) < n:
                chosen.append(queues[k].pop(0))
    return chosen
