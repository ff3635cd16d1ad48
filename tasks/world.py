"""The synthetic knowledge world: seeded entities, typed relations, documents and multi-hop questions.

A world holds entities of five kinds (people, organisations, cities, countries, works) linked by typed
relations (a person is born in a city and works for an organisation, an organisation is founded by a person,
and so on) and carrying numeric attributes (years, populations). Every entity has one document that states
its facts in varied sentences, mixed with distractor sentences that mention other entities without stating
a relation. A share of entities get *look-alike* names (same first name, same stem, "Port X" next to "X"), so
that a search must be precise.

Questions are bridge chains ("What is the founding year of the employer of the creator of The Silent
Harbor?") of 1 to 4 hops, or comparisons between two chains ("Who was born earlier, the founder of X or the
founder of Y?"). Every question carries its gold answer and the ids of its supporting documents in reading
order, and ``meta["facts"]`` lists the gold (subject, relation, object) triples a reader needs.

The natural-language surface (question and sentence templates) is exported as :data:`RELATIONS` and
:data:`COMPARISONS` so that scripted readers in ``agents/`` can be written against the language, not against
the world's internals. Same seed, same world: all randomness comes from one ``numpy.random.Generator``.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from tasks.types import Document, Question

KINDS = ("person", "organisation", "city", "country", "work")


@dataclass(frozen=True)
class Relation:
    """A typed relation (``target`` is an entity kind, or ``None`` for a numeric attribute)."""

    name: str
    source: str
    target: str | None
    noun_phrase: str  # "{x}" is the subject noun phrase; used for nested (inner) hops
    questions: tuple[str, ...]  # outermost-hop question templates over "{x}"
    sentences: tuple[str, ...]  # document sentences over "{s}" (subject name) and "{o}" (object)


RELATIONS: dict[str, Relation] = {
    r.name: r
    for r in (
        Relation(
            "born_in", "person", "city", "the birthplace of {x}",
            ("In which city was {x} born?", "What is the birthplace of {x}?"),
            ("{s} was born in {o}.", "{s} is a native of {o}.", "The birthplace of {s} is {o}."),
        ),
        Relation(
            "works_for", "person", "organisation", "the employer of {x}",
            ("Which organisation employs {x}?", "What is the employer of {x}?"),
            ("{s} works for {o}.", "{s} is employed by {o}.", "{s} holds a position at {o}."),
        ),
        Relation(
            "birth_year", "person", None, "the birth year of {x}",
            ("In which year was {x} born?", "What is the birth year of {x}?"),
            ("{s} was born in the year {o}.", "The year of birth of {s} is {o}.", "{s} was born in {o}."),
        ),
        Relation(
            "founded_by", "organisation", "person", "the founder of {x}",
            ("Who founded {x}?", "Who is the founder of {x}?"),
            ("{s} was founded by {o}.", "{o} founded {s}.", "{s} was established by {o}."),
        ),
        Relation(
            "headquartered_in", "organisation", "city", "the headquarters city of {x}",
            ("In which city is {x} headquartered?", "What is the headquarters city of {x}?"),
            ("{s} is headquartered in {o}.", "{s} has its head office in {o}.", "The headquarters of {s} are in {o}."),
        ),
        Relation(
            "founded_year", "organisation", None, "the founding year of {x}",
            ("In which year was {x} founded?", "What is the founding year of {x}?"),
            ("{s} was founded in {o}.", "{s} has existed since {o}.", "The founding year of {s} is {o}."),
        ),
        Relation(
            "located_in", "city", "country", "the country of {x}",
            ("In which country is {x}?", "What is the country of {x}?"),
            ("{s} is a city in {o}.", "{s} lies in {o}.", "{s} is located in {o}."),
        ),
        Relation(
            "population", "city", None, "the population of {x}",
            ("How many people live in {x}?", "What is the population of {x}?"),
            ("{s} has a population of {o}.", "The population of {s} is {o}.", "{o} people live in {s}."),
        ),
        Relation(
            "capital", "country", "city", "the capital of {x}",
            ("What is the capital of {x}?", "Which city is the capital of {x}?"),
            ("The capital of {s} is {o}.", "{o} is the capital city of {s}.", "{s} is governed from its capital {o}."),
        ),
        Relation(
            "created_by", "work", "person", "the creator of {x}",
            ("Who created {x}?", "Who is the creator of {x}?"),
            ("{s} was written by {o}.", "{o} is the author of {s}.", "{s} was created by {o}."),
        ),
        Relation(
            "published_year", "work", None, "the publication year of {x}",
            ("In which year was {x} published?", "What is the publication year of {x}?"),
            ("{s} was published in {o}.", "{s} first appeared in {o}.", "The publication year of {s} is {o}."),
        ),
    )
}

RELATIONS_BY_KIND: dict[str, tuple[Relation, ...]] = {
    kind: tuple(r for r in RELATIONS.values() if r.source == kind) for kind in KINDS
}


@dataclass(frozen=True)
class Comparison:
    """A comparison over a numeric attribute: the answer is the name of the winning side's entity."""

    attribute: str
    question: str  # over "{a}" and "{b}"
    smaller_wins: bool


COMPARISONS: dict[str, Comparison] = {
    c.attribute: c
    for c in (
        Comparison("birth_year", "Who was born earlier, {a} or {b}?", True),
        Comparison("founded_year", "Which was founded earlier, {a} or {b}?", True),
        Comparison("published_year", "Which was published earlier, {a} or {b}?", True),
        Comparison("population", "Which has the larger population, {a} or {b}?", False),
    )
}

# Sentences that mention other entities without stating a relation: they make documents noisy and make
# naive "grab the nearest name" readers fail. ``{s}`` is the subject, ``{e}`` another entity, ``{y}`` a year.
DISTRACTOR_SENTENCES = (
    "{s} is sometimes confused with {e}.",
    "A report from {y} compared {s} with {e}.",
    "{s} appeared in a documentary filmed near {e}.",
    "Visitors often associate {s} with {topic}.",
    "In {y}, a newspaper profile of {s} focused on {topic}.",
    "{s} has no known connection to {e}.",
    "Critics rarely mention {s} when they discuss {topic}.",
    "An exhibition about {topic} once featured {s} next to {e}.",
)
TOPICS = (
    "river trade", "early radio", "glass making", "mountain railways", "folk music", "chess clubs",
    "weather records", "harbour lights", "paper mills", "night markets", "bee keeping", "street maps",
    "tin mining", "silk weaving", "lighthouse keepers", "postal history", "clock towers", "salt roads",
)

_ONSETS = ("b", "br", "c", "d", "dr", "f", "g", "gr", "h", "k", "kr", "l", "m", "n", "p", "r", "s", "st",
           "t", "tr", "v", "z", "sh", "th", "j", "w")
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ei", "ou", "ia")
_CODAS = ("", "", "", "n", "r", "l", "s", "m", "x", "nd", "rt")
_ORG_SUFFIXES = ("Labs", "Group", "Systems", "Works", "Institute", "Foundation", "Partners", "Holdings",
                 "Collective", "Studios")
_CITY_PREFIXES = ("Port", "North", "New", "Upper", "Saint")
_COUNTRY_ENDINGS = ("ia", "land", "stan", "ora", "mark")
_WORK_ADJECTIVES = ("Silent", "Hidden", "Broken", "Golden", "Distant", "Winter", "Crimson", "Hollow",
                    "Endless", "Quiet", "Burning", "Paper", "Iron", "Velvet", "Last", "Northern")
_WORK_NOUNS = ("Harbor", "Garden", "Mirror", "Orchard", "Lantern", "Voyage", "Archive", "Bridge",
               "Meadow", "Tower", "River", "Compass", "Letter", "Season", "Island", "Machine")


@dataclass
class Entity:
    id: str
    kind: str
    name: str
    facts: dict[str, object] = field(default_factory=dict)  # relation name -> entity id | int


@dataclass(frozen=True)
class WorldConfig:
    """Knobs of a world. ``n_documents`` is the corpus size (one document per entity)."""

    n_documents: int = 1200
    lookalike_rate: float = 0.3
    distractor_sentences: int = 3
    seed: int = 0

    def __post_init__(self) -> None:
        if self.n_documents < 50:
            raise ValueError(f"WorldConfig.n_documents must be >= 50, got {self.n_documents}")
        if not 0.0 <= self.lookalike_rate <= 1.0:
            raise ValueError(f"WorldConfig.lookalike_rate must be in [0, 1], got {self.lookalike_rate}")
        if self.distractor_sentences < 0:
            raise ValueError(f"WorldConfig.distractor_sentences must be >= 0, got {self.distractor_sentences}")


class World:
    """A generated knowledge world: entities, one document per entity, and a question sampler."""

    # Share of the corpus per kind; every country needs at least one city.
    _PROPORTIONS = {"person": 0.40, "organisation": 0.15, "city": 0.17, "country": 0.05, "work": 0.23}

    def __init__(self, config: WorldConfig | None = None) -> None:
        self.config = config or WorldConfig()
        rng = np.random.default_rng(self.config.seed)
        self.entities: dict[str, Entity] = {}
        self._names: set[str] = set()
        self._names_by_kind: dict[str, list[str]] = {k: [] for k in KINDS}
        counts = self._counts()
        for kind in ("country", "city", "person", "organisation", "work"):
            for i in range(counts[kind]):
                eid = f"{kind[:3]}{i:05d}"
                self.entities[eid] = Entity(eid, kind, self._new_name(rng, kind))
        self._draw_facts(rng)

    def _draw_facts(self, rng: np.random.Generator, populations: tuple[int, ...] | None = None) -> None:
        """Link the entities (every relation and attribute) and render their documents, all from ``rng``."""
        self._by_kind = {k: [e for e in self.entities.values() if e.kind == k] for k in KINDS}
        self._link(rng, populations)
        self._all = list(self.entities.values())
        if populations is None:
            self.documents: list[Document] = [self._document(rng, e) for e in self._all]
        else:  # a fresh draw happens at every episode's reset: its random numbers are drawn in bulk
            self.documents = self._documents_in_bulk(rng)
        self.doc_index = {d.id: i for i, d in enumerate(self.documents)}

    def with_fresh_facts(self, rng: np.random.Generator, *, fresh_names: bool = False) -> World:
        """A world over this world's *inventory* with every fact drawn afresh from ``rng``: the same entity ids,
        kinds and names (look-alikes included), years from the same ranges and populations from this world's own
        city populations, but who is born where, works for whom, founded what and when, which city lies in which
        country... are new, and so are the documents that state them (their distractor sentences too). Questions
        sampled from it have this draw's answers: the same question has another answer in another draw, so
        only reading the documents can answer it. Fast (no name generation): ~1,200 documents in tens of ms.

        ``fresh_names``: every entity is also renamed, first from ``rng`` (same kinds, look-alikes at the same
        rate, no name of this world's inventory): a model trained on such draws cannot learn anything about an
        entity by its name, only to copy names it reads (issue 45: subjects no training question asks about)."""
        fresh = object.__new__(World)
        fresh.config = self.config
        if fresh_names:  # unique among themselves and apart from the inventory's names
            fresh._names, fresh._names_by_kind = set(self._names), {k: [] for k in KINDS}
            fresh.entities = {eid: Entity(eid, e.kind, fresh._new_name(rng, e.kind))
                              for eid, e in self.entities.items()}
        else:
            fresh._names, fresh._names_by_kind = self._names, self._names_by_kind
            fresh.entities = {eid: Entity(eid, e.kind, e.name) for eid, e in self.entities.items()}
        fresh._draw_facts(rng, self.population_inventory)
        return fresh

    @functools.cached_property
    def population_inventory(self) -> tuple[int, ...]:
        """The city populations of this world (sorted): the values a fresh draw gives populations from."""
        return tuple(sorted({int(c.facts["population"]) for c in self._by_kind["city"]}))

    def fingerprint(self) -> str:
        """A short hash of every fact of this world (entity, relation, value): equal draws, equal fingerprints."""
        digest = hashlib.sha256()
        for entity in self.entities.values():
            for relation, value in entity.facts.items():
                digest.update(f"{entity.id}|{relation}|{value}\n".encode())
        return digest.hexdigest()[:16]

    def facts(self) -> set[tuple[str, str, str]]:
        """Every fact of this world as a ``(subject name, relation, value text)`` triple, as questions'
        ``meta["facts"]`` list them."""
        return {(e.name, rel, self.value_text(v)) for e in self.entities.values() for rel, v in e.facts.items()}

    # ------------------------------------------------------------------ generation
    def _counts(self) -> dict[str, int]:
        n = self.config.n_documents
        counts = {k: max(2, int(round(p * n))) for k, p in self._PROPORTIONS.items()}
        counts["person"] += n - sum(counts.values())  # exact corpus size
        return counts

    def _word(self, rng: np.random.Generator, syllables: int) -> str:
        parts = [
            _ONSETS[rng.integers(len(_ONSETS))] + _VOWELS[rng.integers(len(_VOWELS))]
            for _ in range(syllables)
        ]
        return ("".join(parts) + _CODAS[rng.integers(len(_CODAS))]).capitalize()

    def _fresh_name(self, rng: np.random.Generator, kind: str) -> str:
        if kind == "person":
            return f"{self._word(rng, 2)} {self._word(rng, int(rng.integers(2, 4)))}"
        if kind == "organisation":
            return f"{self._word(rng, int(rng.integers(2, 4)))} {_ORG_SUFFIXES[rng.integers(len(_ORG_SUFFIXES))]}"
        if kind == "city":
            return self._word(rng, int(rng.integers(2, 4)))
        if kind == "country":
            return self._word(rng, 2) + _COUNTRY_ENDINGS[rng.integers(len(_COUNTRY_ENDINGS))]
        adjective = _WORK_ADJECTIVES[rng.integers(len(_WORK_ADJECTIVES))]
        return f"The {adjective} {_WORK_NOUNS[rng.integers(len(_WORK_NOUNS))]} of {self._word(rng, 2)}"

    def _lookalike(self, rng: np.random.Generator, kind: str, base: str) -> str:
        """A name that shares most of its words with ``base`` (so that only a precise search finds it)."""
        words = base.split()
        if kind == "person":  # same first name, near-identical family name
            return f"{words[0]} {words[1][:-1]}{_VOWELS[rng.integers(len(_VOWELS))]}{_CODAS[rng.integers(1, len(_CODAS))]}"
        if kind == "organisation":  # same stem, other suffix
            return f"{words[0]} {_ORG_SUFFIXES[rng.integers(len(_ORG_SUFFIXES))]}"
        if kind == "city":
            return f"{_CITY_PREFIXES[rng.integers(len(_CITY_PREFIXES))]} {base}"
        if kind == "country":
            return base[:-2] + _COUNTRY_ENDINGS[rng.integers(len(_COUNTRY_ENDINGS))]
        return " ".join(words[:-1] + [self._word(rng, 2)])  # same title, other place

    def _new_name(self, rng: np.random.Generator, kind: str) -> str:
        same_kind = self._names_by_kind[kind]
        for _ in range(1000):
            if same_kind and rng.random() < self.config.lookalike_rate:
                name = self._lookalike(rng, kind, same_kind[rng.integers(len(same_kind))])
            else:
                name = self._fresh_name(rng, kind)
            if name not in self._names:
                self._names.add(name)
                same_kind.append(name)
                return name
        raise RuntimeError(f"could not draw a unique {kind} name")  # pragma: no cover

    def _pick(self, rng: np.random.Generator, kind: str) -> Entity:
        pool = self._by_kind[kind]
        return pool[rng.integers(len(pool))]

    def _link(self, rng: np.random.Generator, populations: tuple[int, ...] | None = None) -> None:
        countries, cities = self._by_kind["country"], self._by_kind["city"]
        if populations is not None:  # a fresh draw: the cities swap countries and populations
            order = rng.permutation(len(cities))
            cities = [cities[i] for i in order]
        for i, city in enumerate(cities):
            # The first cities go round-robin so that every country has one (its capital).
            country = countries[i] if i < len(countries) else self._pick(rng, "country")
            city.facts["located_in"] = country.id
            if populations is None:
                city.facts["population"] = int(rng.integers(2, 900)) * 1000 + int(rng.integers(0, 1000))
            else:
                city.facts["population"] = int(populations[rng.integers(len(populations))])
        cities = self._by_kind["city"]
        for country in countries:
            own = [c for c in cities if c.facts["located_in"] == country.id]
            country.facts["capital"] = own[rng.integers(len(own))].id
        for person in self._by_kind["person"]:
            person.facts["born_in"] = self._pick(rng, "city").id
            person.facts["birth_year"] = int(rng.integers(1900, 1990))
        for org in self._by_kind["organisation"]:
            founder = self._pick(rng, "person")
            org.facts["founded_by"] = founder.id
            org.facts["headquartered_in"] = self._pick(rng, "city").id
            org.facts["founded_year"] = int(founder.facts["birth_year"]) + int(rng.integers(20, 50))
        for person in self._by_kind["person"]:
            person.facts["works_for"] = self._pick(rng, "organisation").id
        for work in self._by_kind["work"]:
            creator = self._pick(rng, "person")
            work.facts["created_by"] = creator.id
            work.facts["published_year"] = int(creator.facts["birth_year"]) + int(rng.integers(18, 60))

    def value_text(self, value: object) -> str:
        """Surface form of a fact's object: an entity's name, or the number as digits."""
        return self.entities[value].name if isinstance(value, str) else str(value)

    def _document(self, rng: np.random.Generator, entity: Entity) -> Document:
        sentences = []
        for rel_name, value in entity.facts.items():
            templates = RELATIONS[rel_name].sentences
            sentences.append(templates[rng.integers(len(templates))].format(s=entity.name, o=self.value_text(value)))
        n_distractors = self.config.distractor_sentences
        picks = rng.choice(len(DISTRACTOR_SENTENCES), size=n_distractors, replace=n_distractors > len(DISTRACTOR_SENTENCES))
        for pick in picks:
            template = DISTRACTOR_SENTENCES[pick]
            other = self._all[rng.integers(len(self._all))]
            sentences.append(template.format(
                s=entity.name, e=other.name, y=int(rng.integers(1950, 2020)), topic=TOPICS[rng.integers(len(TOPICS))]
            ))
        order = rng.permutation(len(sentences))
        return Document(id=entity.id, title=entity.name, text=" ".join(sentences[i] for i in order))

    def _documents_in_bulk(self, rng: np.random.Generator) -> list[Document]:
        """Every entity's document, as :meth:`_document` writes them (its fact sentences in random templates,
        ``distractor_sentences`` distractors, shuffled), with the random numbers drawn as arrays: ~10x faster than
        one generator call per choice, which matters when a world is redrawn at every reset."""
        n, k = len(self._all), self.config.distractor_sentences
        width = max(len(e.facts) for e in self._all) + k
        template_u = rng.random((n, width)).tolist()
        if k <= len(DISTRACTOR_SENTENCES):  # without replacement, as rng.choice(..., replace=False)
            picks = rng.random((n, len(DISTRACTOR_SENTENCES))).argsort(axis=1)[:, :k].tolist()
        else:
            picks = rng.integers(0, len(DISTRACTOR_SENTENCES), (n, k)).tolist()
        others = rng.integers(0, n, (n, k)).tolist()
        years = rng.integers(1950, 2020, (n, k)).tolist()
        topics = rng.integers(0, len(TOPICS), (n, k)).tolist()
        order_keys = rng.random((n, width)).tolist()
        documents = []
        for i, entity in enumerate(self._all):
            sentences = []
            for j, (rel_name, value) in enumerate(entity.facts.items()):
                templates = RELATIONS[rel_name].sentences
                template = templates[int(template_u[i][j] * len(templates))]
                sentences.append(template.format(s=entity.name, o=self.value_text(value)))
            for j in range(k):
                sentences.append(DISTRACTOR_SENTENCES[picks[i][j]].format(
                    s=entity.name, e=self._all[others[i][j]].name, y=years[i][j], topic=TOPICS[topics[i][j]]))
            keys = order_keys[i]
            order = sorted(range(len(sentences)), key=keys.__getitem__)
            documents.append(Document(id=entity.id, title=entity.name, text=" ".join(sentences[o] for o in order)))
        return documents

    # ------------------------------------------------------------------ questions
    def _walk(self, rng: np.random.Generator, length: int, end_kind: str | None = None,
              final_attribute: bool | None = None) -> tuple[Entity, list[Relation]] | None:
        """A random relation chain of ``length`` hops without revisiting an entity, or None on a dead end.

        ``end_kind`` forces the kind of the last entity reached (used by comparisons); ``final_attribute``
        forces (True) or forbids (False) a numeric attribute as the last hop.
        """
        start = self._pick(rng, KINDS[rng.integers(len(KINDS))])
        current, seen, chain = start, {start.id}, []
        for hop in range(length):
            last = hop == length - 1
            options = [
                r for r in RELATIONS_BY_KIND[current.kind]
                if (r.target is not None or (last and final_attribute is not False))
                and not (last and final_attribute is True and r.target is not None)
                and (r.target is None or current.facts[r.name] not in seen)
                and not (last and end_kind is not None and r.target != end_kind)
            ]
            if not options:
                return None
            rel = options[rng.integers(len(options))]
            chain.append(rel)
            if rel.target is not None:
                current = self.entities[current.facts[rel.name]]
                seen.add(current.id)
        if length == 0 and end_kind is not None and start.kind != end_kind:
            return None
        return start, chain

    def _follow(self, start: Entity, chain: list[Relation]) -> tuple[list[tuple[str, str, str]], list[str], object]:
        """Gold facts, supporting doc ids (reading order) and the final value of a chain."""
        facts, support, current = [], [], start
        value: object = start.id
        for rel in chain:
            support.append(current.id)
            value = current.facts[rel.name]
            facts.append((current.name, rel.name, self.value_text(value)))
            if rel.target is not None:
                current = self.entities[value]
        return facts, support, value

    @staticmethod
    def noun_phrase(name: str, chain: list[Relation]) -> str:
        phrase = name
        for rel in chain:
            phrase = rel.noun_phrase.format(x=phrase)
        return phrase

    def sample_question(self, rng: np.random.Generator, hops: int = 2, kind: str = "bridge") -> Question:
        """One question of ``hops`` hops; ``kind`` is "bridge" or "comparison".

        A comparison of ``hops`` h compares two chains of h - 1 relation hops each, followed by a numeric
        attribute; it needs 2h documents (h per side), so its depth matches a bridge question's.
        """
        if not 1 <= hops <= 6:
            raise ValueError(f"hops must be in 1..6, got {hops}")
        for _ in range(10_000):
            q = self._bridge(rng, hops) if kind == "bridge" else self._comparison(rng, hops)
            if q is not None:
                return q
        raise RuntimeError(f"could not sample a {kind} question with {hops} hops")  # pragma: no cover

    def _bridge(self, rng: np.random.Generator, hops: int) -> Question | None:
        walk = self._walk(rng, hops)
        if walk is None:
            return None
        start, chain = walk
        facts, support, value = self._follow(start, chain)
        templates = chain[-1].questions
        inner = self.noun_phrase(start.name, chain[:-1])
        text = templates[rng.integers(len(templates))].format(x=inner)
        answer = self.value_text(value)
        return Question(
            id=f"b{hops}-{start.id}-" + "-".join(r.name for r in chain), question=text, answers=(answer,),
            supporting_ids=tuple(support), hops=hops, kind="bridge",
            meta={"facts": facts, "chain": [r.name for r in chain], "start": start.name},
        )

    def _comparison(self, rng: np.random.Generator, hops: int) -> Question | None:
        attribute = list(COMPARISONS)[rng.integers(len(COMPARISONS))]
        comp, end_kind = COMPARISONS[attribute], RELATIONS[attribute].source
        sides = []
        for _ in range(2):
            walk = self._walk(rng, hops - 1, end_kind=end_kind, final_attribute=False)
            if walk is None:
                return None
            sides.append(walk)
        (start_a, chain_a), (start_b, chain_b) = sides
        facts_a, support_a, end_a = self._follow(start_a, chain_a)
        facts_b, support_b, end_b = self._follow(start_b, chain_b)
        if end_a == end_b:
            return None
        ent_a, ent_b = self.entities[end_a], self.entities[end_b]
        val_a, val_b = ent_a.facts[attribute], ent_b.facts[attribute]
        if val_a == val_b or set(support_a) & set(support_b):
            return None
        a_wins = (val_a < val_b) == comp.smaller_wins
        text = comp.question.format(a=self.noun_phrase(start_a.name, chain_a), b=self.noun_phrase(start_b.name, chain_b))
        facts = facts_a + [(ent_a.name, attribute, str(val_a))] + facts_b + [(ent_b.name, attribute, str(val_b))]
        return Question(
            id=f"c{hops}-{start_a.id}-{start_b.id}-{attribute}", question=text,
            answers=((ent_a if a_wins else ent_b).name,),
            supporting_ids=tuple(support_a + [ent_a.id] + support_b + [ent_b.id]), hops=hops, kind="comparison",
            meta={"facts": facts, "attribute": attribute},
        )

    def sample_questions(self, rng: np.random.Generator, n: int, hops: int | tuple[int, ...] = 2,
                         comparison_rate: float = 0.25,
                         accept: Callable[[Question], bool] | None = None) -> list[Question]:
        """``n`` distinct questions (objectives) whose supporting documents do not overlap.

        ``hops`` is one depth or a tuple of depths to draw from uniformly. ``accept``: only questions it accepts
        are drawn (a question pool, e.g. :func:`question_pool`'s split).
        """
        depths = (hops,) if isinstance(hops, int) else tuple(hops)
        questions: list[Question] = []
        used: set[str] = set()
        for _ in range(n * 1000):
            if len(questions) == n:
                break
            depth = int(depths[rng.integers(len(depths))])
            kind = "comparison" if depth >= 1 and rng.random() < comparison_rate else "bridge"
            q = self.sample_question(rng, depth, kind)
            if accept is not None and not accept(q):
                continue
            # Disjoint support keeps objectives independent (MEM1's multi-objective composition).
            if used.isdisjoint(q.supporting_ids) and q.answers[0] not in {x.answers[0] for x in questions}:
                questions.append(q)
                used.update(q.supporting_ids)
        if len(questions) < n:
            raise RuntimeError(f"world too small for {n} independent objectives")
        return questions


QUESTION_POOLS = ("all", "train", "heldout")


def question_pool(question: Question, heldout_fraction: float, salt: str = "") -> str:
    """``"heldout"`` or ``"train"``: a split of the world's questions fixed before any training, by their
    subject (the first supporting document: the entity the question starts from). A stable hash of
    ``salt:subject`` puts a ``heldout_fraction`` share of the entities in the held-out pool, so every question
    about a held-out entity, whatever its relation or wording, is held out, and no training question starts
    from it."""
    key = f"{salt}:{question.supporting_ids[0]}".encode()
    u = int.from_bytes(hashlib.sha256(key).digest()[:8], "big") / 2.0**64
    return "heldout" if u < heldout_fraction else "train"


def objective_capacity(n_documents: int, hops: int | tuple[int, ...] = 2, comparison_rate: float = 0.25) -> int:
    """How many objectives :meth:`World.sample_questions` can draw, quickly and for any seed, from a world of
    ``n_documents`` documents: the most an env accepts.

    Objectives need disjoint supporting documents: a bridge question of depth h uses h documents, a comparison
    2h, so a question uses ``h * (1 + comparison_rate)`` documents on average (over the depths drawn). Random
    greedy draws stall well before a perfect packing: measured over worlds of 50 to 1,200 documents and depths
    1 to 6 they fill 35% to 75% of the corpus. The capacity takes a quarter of the corpus, below every measured
    stall, so a draw never hangs or fails at ``reset``; it is computed without building the world.
    """
    depths = (hops,) if isinstance(hops, int) else tuple(hops)
    docs_per_question = sum(h * (1 + comparison_rate) for h in depths) / len(depths)
    return int(n_documents / (4 * docs_per_question))


@functools.lru_cache(maxsize=16)
def build_world(n_documents: int = 1200, lookalike_rate: float = 0.3, distractor_sentences: int = 3,
                seed: int = 0) -> World:
    """A cached world: environments with the same knobs share one (worlds are immutable after build)."""
    return World(WorldConfig(n_documents, lookalike_rate, distractor_sentences, seed))


def support_known(question: Question, known_facts: set[tuple[str, str, str]]) -> bool:
    """Whether every supporting fact of ``question`` (``meta["facts"]``) is in ``known_facts``: the facts of the
    training questions, say. In a fixed world such a held-out question can be answered by recalling training
    facts, without reading; where every episode draws its facts afresh, a coincidence of every fact is rare."""
    return all(tuple(f) in known_facts for f in question.meta["facts"])
