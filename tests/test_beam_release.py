"""BEAM's official release layout (fixtures written by us in its exact layout and types, see
tests/fixtures/make_beam_release.py): it loads and plays, the oracle stores the source_chat_ids of every shape,
and both the judge-free and the judged score run (the judge is a stand-in server on 127.0.0.1)."""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import pytest

import memenv  # noqa: F401
from agents.scripted.bench import run_episode
from agents.scripted.strategies.qa_strategies import make_strategy
from memenv.scoring.judges import JudgeError, OpenAIJudge, parse_score
from tasks.beam import ABILITIES, BeamConversation, find_conversations, iter_chat_batches, load_probing_questions

from standin_openai import standin_server

RELEASE = Path(__file__).resolve().parent / "fixtures" / "beam_release"
CONV = RELEASE / "chats" / "128K" / "1"
REFERENCE_KEY = {"abstention": "ideal_response", "contradiction_resolution": "ideal_answer",
                 "event_ordering": "answer", "information_extraction": "answer",
                 "instruction_following": "expected_compliance", "knowledge_update": "answer",
                 "multi_session_reasoning": "answer", "preference_following": "expected_compliance",
                 "summarization": "ideal_summary", "temporal_reasoning": "answer"}


def test_fixture_has_the_release_types() -> None:
    """The fixture itself is in the release's layout (so the tests below test what they claim)."""
    chat = json.loads((CONV / "chat.json").read_text())
    assert all(b["time_anchor"] is None and isinstance(b["batch_number"], int) for b in chat)
    sizes = {len(turn) for b in chat for turn in b["turns"]}
    assert sizes == {2, 4, 6}
    users = [m for b in chat for t in b["turns"] for m in t if m["role"] == "user"]
    assert all(isinstance(m["id"], int) and isinstance(m["index"], str) and m["content"].endswith(f"->-> {m['index']}")
               for m in users)
    assert {m["question_type"] for m in users} == {"main_question", "followup_question", "answer_ai_question"}
    assert sum("time_anchor" in m for m in users) == 2
    probing = json.loads((CONV / "probing_questions" / "probing_questions.json").read_text())
    assert sorted(probing) == sorted(ABILITIES) and all(len(v) == 2 for v in probing.values())
    shapes = {type(i.get("source_chat_ids")).__name__ + ("-mixed" if isinstance(i.get("source_chat_ids"), list) and
                                                        any(isinstance(x, list) for x in i["source_chat_ids"]) else "")
              for v in probing.values() for i in v}
    assert shapes == {"list", "list-mixed", "dict", "NoneType"}
    assert (CONV / "chat_trunecated.json").is_file() and (CONV / "chat.pickle").is_file()


def test_release_folders_are_found_and_extra_files_ignored() -> None:
    found = find_conversations(RELEASE)
    assert [p.relative_to(RELEASE).as_posix() for p in found] == ["chats/128K/1", "chats/128K/2", "chats/1M/1"]
    conv = BeamConversation.open(CONV)  # chat_trunecated.json (broken on purpose) is never read
    assert (conv.n_batches, conv.n_messages) == (5, 26)


def test_batches_and_messages_keep_the_release_fields() -> None:
    batches = list(iter_chat_batches(CONV / "chat.json"))
    assert [b.number for b in batches] == [1, 2, 3, 4, 5]
    # time_anchor null at batch level: the batch takes its first message anchor, else none ("")
    assert [b.time_anchor for b in batches] == ["", "March-15-2024", "", "April-02-2024", ""]
    first = batches[1].messages[0]
    assert (first.role, first.id, first.index, first.question_type) == ("user", 6, "2,1", "main_question")
    assert first.content == "I ordered 12 raised beds today."  # the "->-> 2,1" marker is cut (kept as index)
    assert batches[1].messages[1].content == "Twelve beds is a good start."


def test_every_reference_key_and_evidence_shape_loads() -> None:
    questions = load_probing_questions(CONV / "probing_questions" / "probing_questions.json", "c1")
    assert len(questions) == 20
    by = {(q.kind, q.meta["index"]): q for q in questions}
    for q in questions:
        assert q.meta["reference_key"] == REFERENCE_KEY[q.kind] and q.answers[0]
        assert q.meta["rubric"] and isinstance(q.meta["difficulty"], str)
    assert by[("contradiction_resolution", 0)].meta["evidence"] == ["20", "22"]  # dict of named lists
    assert by[("contradiction_resolution", 1)].meta["evidence"] == ["20", "22"]  # ints mixed with lists
    assert by[("knowledge_update", 0)].meta["evidence"] == ["6", "12"]  # {"original_info", "updated_info"}
    assert by[("information_extraction", 0)].meta["evidence"] == ["2"]  # list of ints
    assert by[("abstention", 0)].meta["evidence"] == []  # none (plan_reference instead)
    assert by[("instruction_following", 0)].meta["compliance_indicators"] == ["grams", "g"]
    assert by[("event_ordering", 0)].meta["order"] == ["basil", "peppers", "squash"]


@pytest.mark.parametrize("ability, index", [("contradiction_resolution", 0), ("contradiction_resolution", 1),
                                            ("knowledge_update", 0), ("multi_session_reasoning", 1),
                                            ("information_extraction", 0)])
def test_oracle_stores_the_source_chat_ids_of_each_shape(ability: str, index: int) -> None:
    env = gym.make("MemDialog-BEAM-v0", data_path=str(RELEASE), conversation=0, abilities=[ability])
    env.reset(seed=0)
    question = env.unwrapped.questions[index]
    policy = make_strategy("oracle", "MemDialog-BEAM-v0")
    policy.reset(env.unwrapped)
    policy._evidence = set(question.meta["evidence"])  # this question's evidence only
    obs, _ = env.reset(seed=0)
    stored = []
    while env.unwrapped.reading:
        action = policy.act(obs)
        if action.startswith("<mem_add>"):
            stored.append(action)
        obs, *_ = env.step(action)
    texts = {m.id: m.content for b in iter_chat_batches(CONV / "chat.json") for m in b.messages}
    assert len(stored) == len(question.meta["evidence"]) >= 1
    for mid, action in zip(question.meta["evidence"], stored):
        assert texts[int(mid)] in action


def test_release_plays_judge_free_with_every_strategy() -> None:
    env = gym.make("MemDialog-BEAM-v0", data_path=str(RELEASE), conversation=0)
    scores = {}
    for name in ("oracle", "rag", "relevance", "recency"):
        summary, _ = run_episode(env, make_strategy(name, "MemDialog-BEAM-v0"), 0)
        assert summary["answered"] and set(summary["score_by_ability"]) == set(ABILITIES)
        assert summary["scoring"].startswith("approximate")
        scores[name] = summary["score"]
    assert scores["oracle"] >= scores["rag"] > scores["recency"]
    # the in-message time anchor is shown where it differs from the session's
    obs, _ = env.reset(seed=0)
    while "[session 4/5" not in obs:
        obs, *_ = env.step("<next/>")
    assert "User (#18): Last, I planted the squash." in obs and "[session 4/5, April-02-2024]" in obs


def test_release_plays_with_a_judge() -> None:
    def reply(prompt: str) -> str:
        return "1" if "heirloom" in prompt.lower() else "0.5"
    with standin_server(reply) as server:
        env = gym.make("MemDialog-BEAM-v0", data_path=str(RELEASE), conversation=0,
                       abilities=["preference_following", "information_extraction"],
                       judge=f"openai:judge@{server.url}")
        summary, _ = run_episode(env, make_strategy("rag", "MemDialog-BEAM-v0"), 0)
    assert summary["scoring"] == "judge"
    rows = {r["ability"]: r for r in summary["per_question"]}
    assert rows["preference_following"]["method"] == "judge"
    assert {r["score"] for r in summary["per_question"] if r["ability"] == "information_extraction"} == {0.5}
    assert server.requests and all(r["model"] == "judge" and r["max_tokens"] <= 16 for r in server.requests)
    assert "LLM response should state: Porto" in "\n".join(server.prompts())


@pytest.mark.parametrize("reply", ["0.75", "-1", "2", "1 because it is right", "yes", "", "0.5 0.5", "10"])
def test_judge_replies_off_the_scale_are_errors_naming_judge_and_reply(reply: str) -> None:
    assert parse_score(reply) is None
    with standin_server(lambda prompt: reply) as server:
        judge = OpenAIJudge("strict-judge", server.url, retries=0)
        with pytest.raises(JudgeError) as err:
            judge.grade("q", "item", "answer")
    assert f"strict-judge@{server.url}" in str(err.value) and repr(reply) in str(err.value)


@pytest.mark.parametrize("reply, score", [("1", 1.0), ("0", 0.0), ("0.5", 0.5), (".5", 0.5), ("1.0", 1.0),
                                          ("Score: 0.5", 0.5), (" 0 \n", 0.0), ("1.", 1.0)])
def test_judge_replies_on_the_scale_parse(reply: str, score: float) -> None:
    assert parse_score(reply) == score
