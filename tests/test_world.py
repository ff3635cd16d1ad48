"""Tests for the synthetic knowledge world (tasks/world.py)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from agents.scripted.strategies.world_reader import parse_fact, sentences
from tasks.world import (
    COMPARISONS,
    KINDS,
    RELATIONS,
    World,
    WorldConfig,
    build_world,
    _CITY_PREFIXES,
)


def _questions(world: World, seed: int, hops: int, kind: str, n: int) -> list:
    rng = np.random.default_rng(seed)
    return [world.sample_question(rng, hops, kind) for _ in range(n)]


def _doc_by_title(world: World) -> dict:
    return {d.title: d for d in world.documents}


def _lookalike_people(world: World) -> list[tuple[str, str]]:
    """Pairs of people with the same first name whose family names differ only in their ending."""
    people = [e.name.split() for e in world.entities.values() if e.kind == "person"]
    pairs = []
    for (f1, l1), (f2, l2) in itertools.combinations(people, 2):
        if f1 == f2 and (l2.startswith(l1[:-1]) or l1.startswith(l2[:-1])):
            pairs.append((f"{f1} {l1}", f"{f2} {l2}"))
    return pairs


def _lookalike_cities(world: World) -> list[tuple[str, str]]:
    """Pairs ("Port X", "X") of city names."""
    cities = {e.name for e in world.entities.values() if e.kind == "city"}
    pairs = []
    for name in cities:
        prefix, _, rest = name.partition(" ")
        if prefix in _CITY_PREFIXES and rest in cities:
            pairs.append((name, rest))
    return pairs


# ---------------------------------------------------------------------------------------------- determinism


def test_same_seed_same_world() -> None:
    a = World(WorldConfig(n_documents=300, seed=7))
    b = World(WorldConfig(n_documents=300, seed=7))
    assert a.documents == b.documents
    qa = a.sample_questions(np.random.default_rng(3), 5, hops=(1, 2, 3), comparison_rate=0.5)
    qb = b.sample_questions(np.random.default_rng(3), 5, hops=(1, 2, 3), comparison_rate=0.5)
    assert qa == qb
    assert [q.meta for q in qa] == [q.meta for q in qb]  # meta is excluded from Question.__eq__


def test_different_seed_different_world() -> None:
    a = World(WorldConfig(n_documents=300, seed=1))
    b = World(WorldConfig(n_documents=300, seed=2))
    assert [d.text for d in a.documents] != [d.text for d in b.documents]
    assert {d.title for d in a.documents} != {d.title for d in b.documents}
    # Same world, different question rng: different questions.
    qa = a.sample_questions(np.random.default_rng(0), 4)
    qb = a.sample_questions(np.random.default_rng(1), 4)
    assert [q.question for q in qa] != [q.question for q in qb]


def test_build_world_is_cached_and_matches_config() -> None:
    w = build_world(200, 0.3, 3, 5)
    assert build_world(200, 0.3, 3, 5) is w
    assert w.documents == World(WorldConfig(200, 0.3, 3, 5)).documents


# ---------------------------------------------------------------------------------------------- corpus


@pytest.mark.parametrize("n", [50, 137, 1200])
def test_corpus_size_equals_n_documents(n: int) -> None:
    world = World(WorldConfig(n_documents=n, seed=n))
    assert len(world.documents) == n
    assert len(world.entities) == n
    ids = [d.id for d in world.documents]
    assert len(set(ids)) == n
    assert set(ids) == set(world.entities)
    assert all(world.doc_index[d.id] == i for i, d in enumerate(world.documents))
    assert {e.kind for e in world.entities.values()} == set(KINDS)


def test_entity_names_are_unique() -> None:
    world = build_world()
    names = [e.name for e in world.entities.values()]
    assert len(set(names)) == len(names)  # so an answer (a name) is unambiguous


def test_every_fact_is_stated_in_its_document() -> None:
    world = World(WorldConfig(n_documents=300, seed=3))
    for entity in world.entities.values():
        doc = world.documents[world.doc_index[entity.id]]
        assert doc.title == entity.name
        stated = {parse_fact(s) for s in sentences(doc.text)} - {None}
        for relation, value in entity.facts.items():
            assert (entity.name, relation, world.value_text(value)) in stated


def test_distractor_sentences_knob() -> None:
    world = World(WorldConfig(n_documents=120, distractor_sentences=0, seed=1))
    for entity in world.entities.values():
        doc_sentences = sentences(world.documents[world.doc_index[entity.id]].text)
        assert len(doc_sentences) == len(entity.facts)
        assert all(parse_fact(s) is not None for s in doc_sentences)
    noisy = World(WorldConfig(n_documents=120, distractor_sentences=5, seed=1))
    for entity in noisy.entities.values():
        doc_sentences = sentences(noisy.documents[noisy.doc_index[entity.id]].text)
        assert len(doc_sentences) == len(entity.facts) + 5


# ---------------------------------------------------------------------------------------------- questions


@pytest.mark.parametrize("kind", ["bridge", "comparison"])
@pytest.mark.parametrize("hops", [1, 2, 3, 4])
def test_questions_supported_and_consistent(hops: int, kind: str) -> None:
    world = build_world()
    by_title = _doc_by_title(world)
    for q in _questions(world, seed=100 * hops + len(kind), hops=hops, kind=kind, n=25):
        assert q.hops == hops and q.kind == kind
        facts = [tuple(f) for f in q.meta["facts"]]
        n_docs = hops if kind == "bridge" else 2 * hops
        assert len(facts) == n_docs
        assert len(q.supporting_ids) == n_docs
        assert len(set(q.supporting_ids)) == n_docs
        for doc_id in q.supporting_ids:
            assert doc_id in world.doc_index
        # Each gold fact is stated in the supporting document of its subject, in reading order.
        for doc_id, (subject, relation, obj) in zip(q.supporting_ids, facts):
            doc = world.documents[world.doc_index[doc_id]]
            assert doc.title == subject
            assert by_title[subject].id == doc_id
            assert relation in RELATIONS
            assert (subject, relation, obj) in {parse_fact(s) for s in sentences(doc.text)}
        assert len(q.answers) == 1
        answer = q.answers[0]
        if kind == "bridge":
            assert facts[-1][2] == answer
            assert q.meta["start"] == facts[0][0]
            assert q.meta["chain"] == [f[1] for f in facts]
            for prev, nxt in zip(facts, facts[1:]):  # the chain is connected
                assert prev[2] == nxt[0]
        else:
            attribute = q.meta["attribute"]
            side_a, side_b = facts[:hops], facts[hops:]
            for side in (side_a, side_b):
                for prev, nxt in zip(side, side[1:]):
                    assert prev[2] == nxt[0]
                assert side[-1][1] == attribute
            val_a, val_b = int(side_a[-1][2]), int(side_b[-1][2])
            assert val_a != val_b
            a_wins = (val_a < val_b) == COMPARISONS[attribute].smaller_wins
            assert answer == (side_a[-1][0] if a_wins else side_b[-1][0])
            assert not set(q.supporting_ids[:hops]) & set(q.supporting_ids[hops:])


def test_comparison_direction_follows_smaller_wins() -> None:
    world = build_world()
    seen = set()
    for q in _questions(world, seed=5, hops=1, kind="comparison", n=120):
        (name_a, _, val_a), (name_b, _, val_b) = q.meta["facts"]
        comp = COMPARISONS[q.meta["attribute"]]
        smaller = name_a if int(val_a) < int(val_b) else name_b
        larger = name_b if smaller == name_a else name_a
        assert q.answers[0] == (smaller if comp.smaller_wins else larger)
        seen.add(q.meta["attribute"])
    assert seen == set(COMPARISONS)  # every comparison (incl. population, larger wins) was exercised


@pytest.mark.parametrize("hops", [0, 7])
def test_sample_question_rejects_bad_hops(hops: int) -> None:
    with pytest.raises(ValueError, match="hops"):
        build_world().sample_question(np.random.default_rng(0), hops)


def test_sample_questions_disjoint_and_distinct() -> None:
    world = build_world()
    for seed in range(5):
        qs = world.sample_questions(np.random.default_rng(seed), 16, hops=(1, 2, 3, 4), comparison_rate=0.5)
        assert len(qs) == 16
        support = [d for q in qs for d in q.supporting_ids]
        assert len(support) == len(set(support))
        answers = [q.answers[0] for q in qs]
        assert len(answers) == len(set(answers))
        assert {q.hops for q in qs} <= {1, 2, 3, 4}
    qs = world.sample_questions(np.random.default_rng(0), 8, hops=3, comparison_rate=0.0)
    assert all(q.hops == 3 and q.kind == "bridge" for q in qs)
    qs = world.sample_questions(np.random.default_rng(0), 8, hops=2, comparison_rate=1.0)
    assert all(q.kind == "comparison" for q in qs)


# ---------------------------------------------------------------------------------------------- look-alikes


def test_lookalike_names_exist_when_enabled() -> None:
    world = World(WorldConfig(n_documents=600, lookalike_rate=0.3, seed=0))
    assert len(_lookalike_people(world)) >= 5
    assert len(_lookalike_cities(world)) >= 3


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4])
def test_no_lookalike_names_when_disabled(seed: int) -> None:
    world = World(WorldConfig(n_documents=600, lookalike_rate=0.0, seed=seed))
    assert _lookalike_people(world) == []
    assert _lookalike_cities(world) == []
    assert not any(" " in e.name for e in world.entities.values() if e.kind == "city")


# ---------------------------------------------------------------------------------------------- config


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"n_documents": 49}, "n_documents"),
        ({"n_documents": 0}, "n_documents"),
        ({"lookalike_rate": -0.01}, "lookalike_rate"),
        ({"lookalike_rate": 1.5}, "lookalike_rate"),
        ({"lookalike_rate": float("nan")}, "lookalike_rate"),
        ({"distractor_sentences": -1}, "distractor_sentences"),
    ],
)
def test_world_config_rejects_bad_knobs(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        WorldConfig(**kwargs)


def test_world_config_accepts_edges() -> None:
    WorldConfig(n_documents=50, lookalike_rate=0.0, distractor_sentences=0)
    WorldConfig(n_documents=50, lookalike_rate=1.0)
    world = World(WorldConfig(n_documents=50, lookalike_rate=1.0, seed=0))
    assert len(world.documents) == 50
