"""The seeded synthetic BEAM chat (:class:`SyntheticBeamChat`, rendered batch by batch from a plan of its facts)
and :func:`write_beam_directory`, which writes a chat in BEAM's layout."""

from __future__ import annotations

import datetime as _dt
import json
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tasks.beam.chat import CHAT_FILE, BeamBatch, BeamMessage
from tasks.beam.questions import ABILITIES, QUESTIONS_FILE
from tasks.beam.sources import BeamConversation
from tasks.types import Question


# The key the synthetic generator writes per ability (the one BEAM's release uses for it).
_WRITE_KEY = {
    "abstention": "ideal_response", "contradiction_resolution": "ideal_answer", "event_ordering": "answer",
    "information_extraction": "answer", "instruction_following": "expected_compliance",
    "knowledge_update": "answer", "multi_session_reasoning": "answer", "preference_following": "expected_compliance",
    "summarization": "ideal_summary", "temporal_reasoning": "answer",
}

_NAMES = ("Maya", "Jonas", "Priya", "Tomas", "Lena", "Omar", "Sofia", "Ravi", "Elena", "Kenji", "Noor", "Felix",
          "Ines", "Marco", "Zara", "Hugo", "Leila", "Arjun", "Clara", "Mateo")
_RELATIONS = ("sister", "brother", "cousin", "manager", "mentor", "landlord", "dentist", "neighbour", "roommate",
              "accountant", "coach", "tutor")
_COUNTRIES = ("Japan", "Peru", "Iceland", "Kenya", "Portugal", "Vietnam", "Norway", "Morocco", "Chile", "Greece")
_ITEMS = ("gym membership", "phone plan", "parking spot", "streaming bundle", "music lessons", "storage unit",
          "language course", "bike insurance")
_PROJECTS = ("garden shed", "mobile app", "kitchen remodel", "podcast", "novel draft", "wedding plan",
             "science fair robot", "community mural")
_MILESTONES = ("drew the first sketches", "bought the materials", "built the frame", "painted everything",
               "tested the prototype", "showed it to friends", "fixed the last bugs", "published the result")
_COURSES = ("pottery course", "sailing licence", "first aid training", "Spanish module", "coding bootcamp",
            "photography workshop", "yoga teacher training", "baking class")
_BOOKS = ("The Silent Harbor", "Glass Orchards", "Northern Lanterns", "The Copper Key", "Paper Moons",
          "The Last Cartographer", "Salt and Cedar", "Winter Arithmetic")
_PREFERENCES = (("window seats", "aisle seats", "a seat for my flight"), ("green tea", "coffee", "a drink for my morning"),
                ("paperback books", "e-books", "a format for my next book"), ("trains", "planes", "a way to travel to the coast"),
                ("morning workouts", "evening workouts", "a time for my workout"), ("vegetarian dishes", "meat dishes", "a dish for dinner"))
_INSTRUCTIONS = (("my budget", "always state amounts in euros"), ("my travel plans", "always list the departure time first"),
                 ("my workouts", "always include a rest day"), ("my reading list", "always give the page count"),
                 ("my schedule", "always mention the time zone CET"), ("my recipes", "always give quantities in grams"))
_UNMENTIONED = ("godmother", "piano teacher", "business partner", "pen pal", "veterinarian", "wedding planner")
_TOPICS = ("sourdough bread", "a home network", "houseplants", "a budget spreadsheet", "a bicycle chain", "a job interview",
           "a vegetable bed", "a compost bin", "a slide deck", "a camping trip", "a resume", "noise in the attic",
           "a leaking tap", "a chess opening", "a birthday party", "a laptop battery")
_FILLER = (
    "The first step is to gather what you need and set aside enough time so that nothing feels rushed.",
    "Many people find it helps to write the plan down and check each part off as it is done.",
    "If something goes wrong, pause, look at what changed last, and undo that change before trying again.",
    "A small test run on a tiny scale saves a lot of trouble compared with doing everything at once.",
    "Keep notes of the settings you used, because the details are easy to forget after a few weeks.",
    "Quality matters more than speed here, and patience usually pays off in the final result.",
    "It is worth comparing two or three options before committing, since prices and features vary a lot.",
    "Ask someone with experience for a second opinion when a decision is expensive to reverse.",
    "Regular maintenance prevents most problems, so a short monthly check is a good habit.",
    "Safety comes first: wear protection, work in good light, and keep tools out of reach of children.",
    "The instructions from the manufacturer are the best reference when in doubt about a specific model.",
    "Breaking the task into smaller steps makes it easier to see progress and stay motivated.",
    "Common mistakes include skipping the preparation and using the wrong size or amount of material.",
    "Online forums often have detailed walkthroughs with photos that make each step clearer.",
    "Once the basics work, you can refine the details and adjust them to your own taste.",
    "Budget a little extra for surprises, since small costs tend to add up along the way.",
)
_USER_OPENERS = ("Can you explain how to handle {t}?", "I have a question about {t}.", "What is the best way to deal with {t}?",
                 "Could you give me tips on {t}?", "I was wondering about {t} today.")
# First-person statements in filler messages that look like facts but are never asked about: they compete
# with the real facts for a relevance-pruned store and for retrieval.
_DISTRACTORS = ("My neighbour {n} just adopted a {a}.", "My colleague's name is {n}, and she loves {a}s.",
                "My {thing} costs {k} dollars a year.", "Today I cleaned the {thing} with my friend {n}.",
                "I much prefer {a}s over cats, says my friend {n}.", "My classmate {n} visited Oslo last {month}.",
                "I have never tried to repair a {thing} before.", "This week I finally sorted my {thing} receipts.")
_ANIMALS = ("parrot", "beagle", "hamster", "tortoise", "kitten", "goldfish")
_THINGS = ("garage", "bike", "balcony", "printer", "attic", "car seat", "desk", "aquarium")
_MONTHS = ("January", "March", "June", "October")
_ACKS = ("Thanks for telling me, I will keep that in mind.", "Noted, that is good to know.",
         "Got it, I will remember that for later.", "Thank you for the update.")


@dataclass(frozen=True)
class _Fact:
    batch: int
    text: str  # the user's sentence that carries the fact
    key: str   # which question(s) it supports


def _days(a: str, b: str) -> int:
    return (_dt.date.fromisoformat(b) - _dt.date.fromisoformat(a)).days


@dataclass
class SyntheticBeamChat:
    """A seeded synthetic BEAM conversation of about ``chat_tokens`` whitespace tokens, rendered lazily.

    ``iter_batches()`` renders batch after batch from a per-batch seed (memory: one batch);
    :func:`write_beam_directory` writes the same chat in BEAM's layout. ``questions`` holds
    ``questions_per_ability`` questions for each of the ten abilities (see the module docstring).
    """

    seed: int
    chat_tokens: int = 128_000
    questions_per_ability: int = 2
    batch_tokens: int = 2_000
    start_date: str = "2024-01-01"
    days: int = 365
    questions: list[Question] = field(init=False)
    n_batches: int = field(init=False)
    id: str = field(init=False)

    def __post_init__(self) -> None:
        if not isinstance(self.chat_tokens, int) or self.chat_tokens < 4_000:
            raise ValueError(f"chat_tokens must be an int >= 4000, got {self.chat_tokens!r}")
        if not isinstance(self.questions_per_ability, int) or not 1 <= self.questions_per_ability <= 4:
            raise ValueError(f"questions_per_ability must be an int in 1..4, got {self.questions_per_ability!r}")
        self.n_batches = max(8, self.chat_tokens // self.batch_tokens)
        self._batch_budget = self.chat_tokens // self.n_batches  # <= batch_tokens: short chats get shorter batches
        self.id = f"synthetic-{self.seed}-{self.chat_tokens}"
        self._plan()

    # ------------------------------------------------------------------ plan (facts and questions, no text)
    def date(self, batch: int) -> str:
        start = _dt.date.fromisoformat(self.start_date)
        return (start + _dt.timedelta(days=batch * self.days // self.n_batches)).isoformat()

    def _plan(self) -> None:
        rng = np.random.default_rng([self.seed, 0])
        B, n = self.n_batches, self.questions_per_ability
        user = str(rng.choice(_NAMES))
        self.user = user
        facts: list[_Fact] = []
        qs: list[Question] = []

        def when(lo: float, hi: float) -> int:  # a batch in the [lo, hi) fraction of the chat
            return int(rng.integers(int(lo * B), max(int(lo * B) + 1, int(hi * B))))

        def add(ability: str, i: int, question: str, reference: str, rubric: list[str], evidence: list[str], **meta) -> None:
            qs.append(Question(id=f"{self.id}/{ability}/{i}", question=question, answers=(reference,), kind=ability,
                               meta={"ability": ability, "reference_key": _WRITE_KEY[ability], "rubric": rubric,
                                     "difficulty": meta.pop("difficulty", "medium"), "evidence": evidence,
                                     "compliance_indicators": meta.pop("indicators", []),
                                     "abstention": ability == "abstention", "index": i, **meta}))

        def fact(batch: int, text: str, key: str) -> str:
            facts.append(_Fact(batch, text, key))
            return key

        pick = lambda pool, k: [pool[int(j)] for j in rng.choice(len(pool), size=k, replace=False)]  # noqa: E731
        relations = pick(_RELATIONS, 2 * n)
        names = pick(_NAMES, 2 * n + 1)
        for i in range(n):  # information extraction: a relative's name
            rel, name = relations[i], names[i]
            key = fact(when(0, 0.9), f"My {rel}'s name is {name}, by the way.", f"ie{i}")
            add("information_extraction", i, f"What is the name of my {rel}?", name, [name], [key])
        items = pick(_ITEMS, n)
        for i, item in enumerate(items):  # knowledge update: a price that changes
            old, new = int(rng.integers(10, 60)), int(rng.integers(61, 120))
            k1 = fact(when(0, 0.4), f"My {item} costs {old} dollars a month.", f"ku{i}a")
            k2 = fact(when(0.5, 0.95), f"Update: my {item} now costs {new} dollars a month.", f"ku{i}b")
            add("knowledge_update", i, f"How much does my {item} cost per month now?", f"{new} dollars",
                [f"{new} dollars"], [k1, k2], old_value=f"{old} dollars")
        countries = pick(_COUNTRIES, n)
        for i, country in enumerate(countries):  # contradiction: never been vs visited
            k1 = fact(when(0, 0.45), f"I have never been to {country} in my life.", f"cr{i}a")
            k2 = fact(when(0.5, 0.95), f"I loved the food when I visited {country} last spring.", f"cr{i}b")
            add("contradiction_resolution", i, f"Have I ever been to {country}?",
                f"There is contradictory information: you said you have never been to {country}, but you also "
                f"mentioned that you visited {country} last spring. Could you clarify which is correct?",
                [f"never been to {country}", f"visited {country} last spring"], [k1, k2])
        projects = pick(_PROJECTS, 2 * n)
        for i in range(n):  # event ordering: four milestones of a project, in chat order
            project = projects[i]
            steps = pick(_MILESTONES, 4)
            batches = sorted(when(0, 0.95) for _ in range(4))
            keys = [fact(b, f"Today I {s} for my {project} project.", f"eo{i}{j}") for j, (b, s) in enumerate(zip(batches, steps))]
            add("event_ordering", i, f"In what order did I complete the steps of my {project} project?",
                "\n".join(f"{j + 1}. {s}" for j, s in enumerate(steps)), list(steps), keys, order=list(steps))
        for i in range(n):  # summarization: a second project's milestones
            project = projects[n + i]
            steps = pick(_MILESTONES, 3)
            keys = [fact(when(0, 0.95), f"This week I {s} for my {project} project.", f"su{i}{j}") for j, s in enumerate(steps)]
            add("summarization", i, f"Can you summarize what I told you about my {project} project?",
                f"For your {project} project you " + ", then ".join(steps) + ".",
                [f"{project} project"] + list(steps), keys)
        courses = pick(_COURSES, n)
        for i, course in enumerate(courses):  # temporal reasoning: days between start and finish
            b1 = when(0, 0.45)
            b2 = when(0.5, 0.95)
            k1 = fact(b1, f"I started my {course} today.", f"tr{i}a")
            k2 = fact(b2, f"I finished my {course} today.", f"tr{i}b")
            days = _days(self.date(b1), self.date(b2))
            add("temporal_reasoning", i, f"How many days did it take me to finish my {course}?", f"{days} days",
                [f"{days} days"], [k1, k2])
        for i in range(n):  # multi-session reasoning: count things read across sessions
            count = 2 + i % 2
            chosen = pick(_BOOKS, count)
            tag = ("novel", "comic", "cookbook", "biography")[i]
            keys = [fact(when(0, 0.95), f"I just read the {tag} {b} and liked it.", f"ms{i}{j}") for j, b in enumerate(chosen)]
            add("multi_session_reasoning", i, f"How many different {tag}s did I tell you I read?",
                f"{count} {tag}s: " + ", ".join(chosen), [f"{count} {tag}s"] + list(chosen), keys)
        prefs = pick(list(range(len(_PREFERENCES))), n)
        for i, p in enumerate(prefs):  # preference following
            liked, disliked, ask = _PREFERENCES[p]
            key = fact(when(0, 0.8), f"I much prefer {liked} over {disliked}.", f"pf{i}")
            add("preference_following", i, f"Can you recommend {ask}?", f"Recommends {liked}, not {disliked}.",
                [liked], [key], indicators=[liked])
        instr = pick(list(range(len(_INSTRUCTIONS))), n)
        for i, p in enumerate(instr):  # instruction following
            topic, rule = _INSTRUCTIONS[p]
            key = fact(when(0, 0.8), f"From now on, whenever we talk about {topic}, {rule}.", f"if{i}")
            add("instruction_following", i, f"Can you help me with {topic} this week?",
                f"The answer should follow the instruction: {rule}.", [rule], [key], indicators=[rule])
        absent = pick(_UNMENTIONED, n)
        for i, who in enumerate(absent):  # abstention: never mentioned
            add("abstention", i, f"What is the name of my {who}?",
                f"Based on the chat, there is no information available about your {who}.",
                ["there is no information available"], [])
        self._facts: dict[int, list[_Fact]] = {}
        for f in facts:
            self._facts.setdefault(f.batch, []).append(f)
        self.questions = sorted(qs, key=lambda q: (ABILITIES.index(q.kind), q.meta["index"]))
        self._keys = {}  # filled while rendering: fact key -> message id (ids are deterministic per batch)
        # Message ids are <batch>*1000 + k so evidence ids are known without rendering anything.
        for batch, fs in self._facts.items():
            for j, f in enumerate(fs):
                self._keys[f.key] = str(batch * 1000 + 2 * j)
        for q in self.questions:
            q.meta["evidence"] = [self._keys[k] for k in q.meta["evidence"]]

    # ------------------------------------------------------------------ rendering
    @property
    def n_tokens(self) -> int:
        """The planned length (rendered batches overshoot it by at most one message each)."""
        return self.n_batches * self._batch_budget

    def render_batch(self, b: int) -> BeamBatch:
        """Batch ``b`` (0-based), rendered from its own seed: the same text every time."""
        if not 0 <= b < self.n_batches:
            raise IndexError(f"batch must be in 0..{self.n_batches - 1}, got {b}")
        rng = np.random.default_rng([self.seed, 1, b])
        date = self.date(b)
        turns, next_id, budget = [], b * 1000, self._batch_budget

        def message(role: str, text: str) -> BeamMessage:
            nonlocal next_id, budget
            m = BeamMessage(role, str(next_id), next_id - b * 1000, text, date)
            next_id += 1
            budget -= len(text.split())
            return m

        for f in self._facts.get(b, ()):  # fact turns first so their ids are predictable (see _plan)
            opener = str(rng.choice(_USER_OPENERS)).format(t=str(rng.choice(_TOPICS)))
            turns.append((message("user", f"{f.text} {opener}"),
                          message("assistant", f"{rng.choice(_ACKS)} " + self._filler(rng, 60))))
        while budget > 0:
            topic = str(rng.choice(_TOPICS))
            ask = str(rng.choice(_USER_OPENERS)).format(t=topic)
            if rng.random() < 0.5:
                ask = str(rng.choice(_DISTRACTORS)).format(
                    n=str(rng.choice(_NAMES)), a=str(rng.choice(_ANIMALS)), thing=str(rng.choice(_THINGS)),
                    k=int(rng.integers(20, 400)), month=str(rng.choice(_MONTHS))) + " " + ask
            turns.append((message("user", ask),
                          message("assistant", f"Here is how to approach {topic}. " + self._filler(rng, min(900, max(40, budget))))))
        return BeamBatch(b, b + 1, date, tuple(turns))

    @staticmethod
    def _filler(rng: np.random.Generator, words: int) -> str:
        out, n = [], 0
        idx = rng.integers(len(_FILLER), size=max(1, words // 12 + 1))
        for i in idx:
            s = _FILLER[int(i)]
            out.append(s)
            n += s.count(" ") + 1
            if n >= words:
                break
        return " ".join(out)

    def iter_batches(self, start: int = 0) -> Iterator[BeamBatch]:
        for b in range(start, self.n_batches):
            yield self.render_batch(b)


def write_beam_directory(chat: SyntheticBeamChat | BeamConversation, path: str | os.PathLike) -> Path:
    """Write ``chat`` in BEAM's layout under ``path`` (``chat.json`` streamed batch by batch; each file
    written to a temporary sibling and renamed, so a reader never sees half a file)."""
    path = Path(path)
    (path / "probing_questions").mkdir(parents=True, exist_ok=True)

    def atomic(target: Path, write) -> None:
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                write(f)
            os.replace(tmp, target)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    def write_chat(f) -> None:
        f.write("[")
        for i, batch in enumerate(chat.iter_batches()):
            f.write(("," if i else "") + "\n" + json.dumps(batch.to_json()))
        f.write("\n]\n")

    def write_questions(f) -> None:
        by_ability: dict[str, list[dict]] = {}
        for q in chat.questions:
            item = {"question": q.question, q.meta.get("reference_key", "answer"): q.answers[0],
                    "rubric": list(q.meta.get("rubric", [])), "difficulty": q.meta.get("difficulty"),
                    "evidence": list(q.meta.get("evidence", []))}
            if q.meta.get("compliance_indicators"):
                item["compliance_indicators"] = list(q.meta["compliance_indicators"])
            if "order" in q.meta:
                item["order"] = list(q.meta["order"])
            by_ability.setdefault(q.kind, []).append(item)
        json.dump(by_ability, f, indent=1)

    atomic(path / CHAT_FILE, write_chat)
    atomic(path / QUESTIONS_FILE, write_questions)
    return path
