"""The MemQA oracle as an honest expert: it answers only from evidence in its memory, reformulates a search that
missed its document, never repeats a missed query, and abstains without evidence
(agents/scripted/strategies/qa_strategies.py)."""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import pytest

import memenv  # noqa: F401 - registers the envs
from agents.scripted.strategies.qa_strategies import FAILED_SEARCHES, OraclePolicy
from memenv.scoring.qa import normalize_answer
from memenv.search.bm25 import tokenize

# A corpus where the founder's page ("Ilsa Brandt (producer)") is buried under pages that repeat her name (its
# title and bare name find only those), but the sentence naming her in the label's page finds it; and a page
# ("Ostvale", id "ostvale") that no query built from its title or its question reaches: four same-titled pages
# repeat every word of both more often.
CORPUS = [
    {"id": "velmora", "title": "Velmora Records", "text": "Velmora Records is a folk label founded by Ilsa Brandt."},
    {"id": "ilsa", "title": "Ilsa Brandt (producer)",
     "text": "Ilsa Brandt, a folk singer born in Tarsk, founded a label."},
    *({"id": f"ilsa-{k}", "title": f"Ilsa Brandt (producer) {k}",
       "text": f"Ilsa Brandt the producer: {k} of Ilsa Brandt, producer."}
      for k in ("discography", "tours", "awards", "interviews")),
    {"id": "ostvale", "title": "Ostvale", "text": "The Marrow flows through it."},
    *({"id": f"ostvale-{k}", "title": "Ostvale",
       "text": f"Ostvale river {k}: which river flows through Ostvale? A river flows through Ostvale {k}."}
      for k in ("north", "south", "east", "west")),
    *({"id": f"filler-{k}", "title": f"Filler {k}", "text": f"Filler {k} is a place with {k} houses."}
      for k in range(40)),
    {"id": "fair", "title": "Glass fair", "text": "The glass fair of Keld opens in 1911."},
]
QUESTIONS = [
    {"id": "bridge", "question": "In which city was the founder of Velmora Records born?", "answers": ["Tarsk"],
     "supporting_ids": ["velmora", "ilsa"]},
    {"id": "lost", "question": "Which river flows through Ostvale?", "answers": ["Marrow"],
     "supporting_ids": ["ostvale"]},
    {"id": "open", "question": "When does the glass fair of Keld open?", "answers": ["1911"]},
]


def _write_pair(tmp_path: Path, questions: list[dict]) -> dict:
    corpus, qs = tmp_path / "corpus.jsonl", tmp_path / "questions.jsonl"
    corpus.write_text("\n".join(json.dumps(d) for d in CORPUS), encoding="utf-8")
    qs.write_text("\n".join(json.dumps(q) for q in questions), encoding="utf-8")
    return {"corpus_path": corpus, "questions_path": qs}


def _search_terms(queries: list[str]) -> list[tuple[str, ...]]:
    return [tuple(sorted(tokenize(q))) for q in queries]


def test_reformulates_a_missed_search_and_finds_the_bridge(tmp_path: Path, run_episode) -> None:
    env = gym.make("MemQA-v0", objectives=1, **_write_pair(tmp_path, QUESTIONS[:1]))
    index, position = env.unwrapped.index, {d.id: i for i, d in enumerate(env.unwrapped.documents)}
    assert position["ilsa"] not in index.search("Ilsa Brandt (producer)", 3)  # the premise: the title misses
    policy = OraclePolicy()
    infos, final = run_episode(env, policy, 0)
    assert final["summary"]["f1"] == 1.0 and policy.evidence_complete and policy.supported == [True]
    queries = [i["invocation"]["tool_input"] for i in infos if i["invocation"]["tool"] == "search"]
    assert queries == policy.queries
    assert queries[:3] == ["Velmora Records", "Ilsa Brandt (producer)", "Ilsa Brandt"]  # title, then bare title
    # ... then the sentence of the label's page that names her (the bridge entity in context) finds her page.
    assert queries[3] == "Velmora Records is a folk label founded by Ilsa Brandt."
    assert "ilsa" in infos[3]["invocation"]["retrieved_ids"]
    assert len(set(_search_terms(queries))) == len(queries)
    memory = final["invocation"]["memory_after"]
    assert "Ilsa Brandt (producer): Ilsa Brandt, a folk singer born in Tarsk" in memory
    assert FAILED_SEARCHES + "Ilsa Brandt (producer) | Ilsa Brandt" in memory


@pytest.mark.parametrize("max_turns", [6, 30])
def test_abstains_when_the_evidence_is_unreachable(tmp_path: Path, max_turns: int, run_episode) -> None:
    env = gym.make("MemQA-v0", objectives=1, max_turns=max_turns, **_write_pair(tmp_path, QUESTIONS[1:2]))
    policy = OraclePolicy()
    infos, final = run_episode(env, policy, 0)
    retrieved = [d for i in infos for d in i["invocation"].get("retrieved_ids", ())]
    assert "ostvale" not in retrieved and retrieved  # same-titled pages came back, never the gold one
    assert final["invocation"]["tool"] == "answer"
    assert final["summary"]["answers"] == ["unknown"] and final["summary"]["f1"] == 0.0
    assert not policy.evidence_complete and policy.supported == [False]
    assert "Marrow" not in final["invocation"]["memory_after"]
    terms = _search_terms(policy.queries)
    assert len(set(terms)) == len(terms) >= 2 and policy.queries[0] == "Ostvale"
    if max_turns == 30:  # out of untried queries long before out of turns: it stops searching
        assert len(infos) == len(policy.queries) + 1 < max_turns


def test_titles_only_oracle_searches_each_title_once(tmp_path: Path, run_episode) -> None:
    env = gym.make("MemQA-v0", objectives=2, max_turns=20, **_write_pair(tmp_path, QUESTIONS[:2]))
    policy = OraclePolicy(reformulate=False, abstain_answer="no idea")
    infos, final = run_episode(env, policy, 0)
    assert sorted(policy.queries) == ["Ilsa Brandt (producer)", "Ostvale", "Velmora Records"]
    assert final["summary"]["answers"] == ["no idea", "no idea"]  # "Tarsk" was never read


def test_question_without_supporting_documents_needs_a_sentence_with_the_answer(tmp_path: Path, run_episode) -> None:
    env = gym.make("MemQA-v0", objectives=1, **_write_pair(tmp_path, QUESTIONS[2:]))
    policy = OraclePolicy()
    _, final = run_episode(env, policy, 0)
    assert policy.queries[0] == "When does the glass fair of Keld open?"
    assert final["summary"]["f1"] == 1.0
    assert "Glass fair: The glass fair of Keld opens in 1911." in final["invocation"]["memory_after"]


def test_context_budget_cut_turns_evidence_into_answer_lines(run_episode) -> None:
    """Under a context budget that hides the start of its memory, the oracle concludes what it can still see
    (``Answer i: ...`` lines) instead of forgetting it, so it stays perfect and every answer has a line."""
    env = gym.make("MemQA-v0", objectives=16, context_budget=800)
    cut_seen = False
    for seed in range(2, 5):  # seed 3 overflows the budget, 2 and 4 do not
        policy = OraclePolicy()
        infos, final = run_episode(env, policy, seed)
        assert final["summary"]["f1"] == 1.0 and policy.evidence_complete
        memory = final["invocation"]["memory_after"]
        cut_seen |= "Answer " in memory
        for i, q in enumerate(env.unwrapped.questions, 1):
            titles = [env.unwrapped.document(d).title for d in q.supporting_ids]
            assert f"Answer {i}: {q.answers[0]}" in memory or all(f"{t}: " in memory for t in titles)
    assert cut_seen


def test_real_hotpot_never_answers_gold_without_evidence(real_hotpot: str, run_episode) -> None:
    env = gym.make("MemQA-Hotpot-v0", data_path=real_hotpot)
    abstained = 0
    for seed in range(400):
        policy = OraclePolicy()
        infos, final = run_episode(env, policy, seed)
        question = env.unwrapped.questions[0]
        answer = final["summary"]["answers"][0]
        memory = final["invocation"]["memory_after"]
        terms = _search_terms(policy.queries)
        assert len(set(terms)) == len(terms), policy.queries
        titles = [env.unwrapped.document(d).title for d in question.supporting_ids]
        all_read = all(f"{t}: " in memory for t in titles)
        assert policy.evidence_complete == all_read
        if answer == question.answers[0]:
            gold = normalize_answer(answer)
            assert all_read or (gold not in ("yes", "no") and f" {gold} " in f" {normalize_answer(memory)} "), seed
        else:
            assert answer == "unknown" and not all_read
            abstained += 1
    assert abstained  # the file has supporting pages no query reaches (about 3% of items)
