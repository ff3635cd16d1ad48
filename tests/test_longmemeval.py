"""MemDialog-LongMemEval: the streaming loader (shared dev slice and our own files in the official layout), both
memory modes, abstention, question_date, the per-type judge (a stand-in server on 127.0.0.1) and the judge-free
score."""

from __future__ import annotations

import json
import tracemalloc
from collections import Counter
from pathlib import Path

import gymnasium as gym
import pytest

import memenv  # noqa: F401
from agents.scripted.bench import run_episode
from agents.scripted.strategies.qa_strategies import make_strategy
from memenv.scoring.judges import JudgeError, OpenAIJudge, parse_verdict
from memenv.scoring.longmemeval import judge_free_correct, judge_prompt, score_longmemeval_answer
from tasks.longmemeval import (QUESTION_TYPES, LongMemEvalSource, index_longmemeval, iter_item_sessions,
                               write_synthetic_longmemeval)
from tasks.types import DataFormatError, Question

from standin_openai import standin_server

DEV = Path(__file__).resolve().parents[2] / "shared" / "data" / "longmemeval" / "longmemeval_dev.json"
needs_dev = pytest.mark.skipif(not DEV.is_file(), reason="shared LongMemEval dev slice not present")


def _item(qid: str = "q1", qtype: str = "single-session-user", sessions: int = 2, **over) -> dict:
    item = {"question_id": qid, "question_type": qtype, "question": "What is my dog called?", "answer": "Biscuit",
            "question_date": "2023/05/30 (Tue) 10:00",
            "haystack_dates": [f"2023/05/{20 + s} (Sat) 09:00" for s in range(sessions)],
            "haystack_session_ids": [f"s{s}" for s in range(sessions)],
            "haystack_sessions": [[{"role": "user", "content": f"Hello from session {s}.", "has_answer": False},
                                   {"role": "assistant", "content": "Hi!", "has_answer": False}]
                                  for s in range(sessions)],
            "answer_session_ids": ["s1"]}
    item["haystack_sessions"][-1].append({"role": "user", "content": "My dog is called Biscuit.", "has_answer": True})
    item.update(over)
    return item


def _write(path: Path, items) -> str:
    path.write_text(items if isinstance(items, str) else json.dumps(items, indent=2), encoding="utf-8")
    return str(path)


# ---------------------------------------------------------------------------------------------------- loader
@needs_dev
def test_dev_slice_indexes_and_streams_exactly() -> None:
    items = index_longmemeval(DEV)
    assert len(items) == 120 and sum(it.abstention for it in items) == 12
    assert Counter(it.question_type for it in items) == {"single-session-user": 21, "single-session-assistant": 21,
                                                         "single-session-preference": 15, "temporal-reasoning": 21,
                                                         "knowledge-update": 21, "multi-session": 21}
    data = json.loads(DEV.read_text(encoding="utf-8"))
    for it in items[::7]:
        raw = data[it.position]
        assert it.question_id == raw["question_id"] and it.answer == str(raw["answer"])
        assert [turns for _, turns in iter_item_sessions(DEV, it)] == raw["haystack_sessions"]
        evidence = [f"{s + 1}:{t + 1}" for s, ss in enumerate(raw["haystack_sessions"]) for t, tt in enumerate(ss)
                    if tt.get("has_answer")]
        assert list(it.evidence) == evidence
    assert all(it.evidence for it in items if not it.abstention)  # every non-abstention item has evidence


def test_own_file_maps_onto_batches_and_a_question(tmp_path: Path) -> None:
    path = _write(tmp_path / "lme.json", [_item(), _item("q2_abs", "knowledge-update", answer=3)])
    first, second = index_longmemeval(path)
    assert (first.n_sessions, first.n_messages, first.evidence) == (2, 5, ("2:3",))
    assert second.abstention and second.answer == "3"  # an int answer becomes a string
    source = LongMemEvalSource(path, first)
    batches = list(source.iter_batches())
    assert [b.number for b in batches] == ["s0", "s1"] and batches[1].time_anchor == "2023/05/21 (Sat) 09:00"
    assert batches[1].messages[2].render() == "User (#2:3): My dog is called Biscuit."
    q = source.questions[0]
    assert (q.kind, q.answers, q.meta["question_date"], q.meta["evidence"]) == (
        "single-session-user", ("Biscuit",), "2023/05/30 (Tue) 10:00", ["2:3"])
    assert [b.position for b in source.iter_batches(1)] == [1]


def test_sessions_stream_one_at_a_time(tmp_path: Path) -> None:
    """Decoding an item session by session: the traced peak of a 10x longer item (3.2 MB) is about that of the
    short one (one session plus the read buffer), far below its size."""
    peaks, sizes = [], []
    for sessions in (40, 400):
        path = write_synthetic_longmemeval(tmp_path / f"item{sessions}.json", 1, sessions, 10, 100)
        (item,) = index_longmemeval(path)
        tracemalloc.start()
        n = sum(1 for _ in LongMemEvalSource(str(path), item).iter_batches())
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
        sizes.append(path.stat().st_size)
        assert n == sessions and item.n_tokens >= sessions * 1000
    assert peaks[1] < 1.5 * peaks[0] + 100_000, f"peaks {peaks} bytes for items of {sizes} bytes"
    assert peaks[1] < sizes[1] / 4


def _bad(mutate):
    def build():
        items = [_item(), _item("q2")]
        mutate(items)
        return json.dumps(items)
    return build


@pytest.mark.parametrize("content, fragments", [
    (lambda: "", ["empty file"]),
    (lambda: '{"question_id": "x"}', ["expected a JSON array"]),
    (lambda: json.dumps([_item()])[:-40], ["item 0 (q1)", "truncated"]),
    (_bad(lambda items: items[1].pop("question")), ["item 1 (q2)", "missing key 'question'"]),
    (_bad(lambda items: items[1].update(question_type="single-hop")), ["item 1 (q2)", "unknown question_type"]),
    (_bad(lambda items: items[0].update(haystack_dates=["2023/05/20"])), ["item 0 (q1)", "haystack_dates has 1"]),
    (_bad(lambda items: items[0]["haystack_sessions"][1].append({"role": "bot", "content": "x"})),
     ["item 0 (q1)", "haystack_sessions[1][3]", "role"]),
    (_bad(lambda items: items[0]["haystack_sessions"][0][0].update(content=5)), ["haystack_sessions[0][0]", "content"]),
    (_bad(lambda items: items[1].update(question_id="q1")), ["item 1 (q1)", "duplicate question_id"]),
    (_bad(lambda items: items[0].update(answer=None)), ["item 0 (q1)", "answer: empty answer"]),
    (lambda: json.dumps([_item()]) + "[]", ["unexpected data after the JSON array"]),
])
def test_malformed_file_names_file_item_and_field(tmp_path: Path, content, fragments) -> None:
    path = _write(tmp_path / "bad.json", content())
    with pytest.raises(DataFormatError) as err:
        index_longmemeval(path)
    assert str(path) in str(err.value)
    for fragment in fragments:
        assert fragment in str(err.value)


def test_not_utf8_and_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "latin.json"
    path.write_bytes(json.dumps([_item()]).encode()[:-10] + b"\xff\xfe" + b'"}]')
    with pytest.raises(DataFormatError, match="not UTF-8"):
        index_longmemeval(path)
    with pytest.raises(FileNotFoundError, match="not found"):
        index_longmemeval(tmp_path / "nope.json")


# ---------------------------------------------------------------------------------------------------- env
@pytest.mark.parametrize("mode", ["tools", "rewrite"])
def test_env_plays_both_memory_modes_with_question_date(tmp_path: Path, mode: str) -> None:
    path = _write(tmp_path / "lme.json", [_item(), _item("q2_abs", "multi-session")])
    env = gym.make("MemDialog-LongMemEval-v0", data_path=path, memory_mode=mode)
    obs, info = env.reset(seed=1)  # seed s plays item s mod 2
    assert info["question_ids"] == ["q2_abs"] and info["sessions"] == 2
    step = "<next/>" if mode == "tools" else "<memory>m</memory>"
    while env.unwrapped.reading:
        obs, *_ = env.step(step)
    assert "[asked on 2023/05/30 (Tue) 10:00]\nWhat is my dog called?\n" in obs
    obs, reward, terminated, truncated, info = env.step("<answer>Not mentioned in the conversation</answer>")
    assert terminated and reward == 1.0  # an abstention item: abstaining is right
    summary = info["summary"]
    assert summary["official_metric"] == "accuracy" and summary["accuracy"] == 1.0
    assert summary["score_by_ability"] == {"multi-session": 1.0}
    assert summary["scoring"].startswith("approximate")


def test_oracle_stores_the_evidence_turns(tmp_path: Path) -> None:
    path = write_synthetic_longmemeval(tmp_path / "s.json", items=2, sessions=40, turns=4, words=30)
    env = gym.make("MemDialog-LongMemEval-v0", data_path=str(path))
    summary, _ = run_episode(env, make_strategy("oracle", "MemDialog-LongMemEval-v0"), 0)
    assert summary["sessions"] == 40 and summary["store_entries"] == 1  # the one has_answer turn
    assert summary["accuracy"] == 1.0  # its answer sentence names the dog
    summary, _ = run_episode(env, make_strategy("rag", "MemDialog-LongMemEval-v0"), 0)
    assert summary["store_entries"] > 40


def test_bad_kwargs_name_the_parameter(tmp_path: Path) -> None:
    path = _write(tmp_path / "lme.json", [_item(), _item("q2", "temporal-reasoning")])
    with pytest.raises(ValueError, match="needs data_path="):
        gym.make("MemDialog-LongMemEval-v0")
    with pytest.raises(ValueError, match="questions=2 is more than every item of .* at most 1"):
        gym.make("MemDialog-LongMemEval-v0", data_path=path, questions=2)
    with pytest.raises(ValueError, match="conversation must be an index in 0..0"):
        gym.make("MemDialog-LongMemEval-v0", data_path=path, conversation=1, abilities=["temporal-reasoning"])
    with pytest.raises(ValueError, match="no item of .* abilities=\\('multi-session',\\)"):
        gym.make("MemDialog-LongMemEval-v0", data_path=path, abilities=["multi-session"])
    with pytest.raises(ValueError, match="abilities"):
        gym.make("MemDialog-LongMemEval-v0", data_path=path, abilities=["summarization"])
    with pytest.raises(ValueError, match="chat_tokens"):
        gym.make("MemDialog-LongMemEval-v0", data_path=path, chat_tokens=8000)
    env = gym.make("MemDialog-LongMemEval-v0", data_path=path, abilities=["temporal-reasoning"])
    assert env.reset(seed=0)[1]["question_ids"] == ["q2"]


@needs_dev
def test_dev_slice_plays_every_type_in_both_modes() -> None:
    items = index_longmemeval(DEV)
    picks = {}
    for i, it in enumerate(items):
        picks.setdefault((it.question_type, it.abstention), i)
    for mode, name in (("tools", "rag"), ("rewrite", "bm25")):
        env = gym.make("MemDialog-LongMemEval-v0", data_path=str(DEV), memory_mode=mode,
                       context="memory" if mode == "tools" else "none")
        for (qtype, abstention), i in picks.items():
            summary, _ = run_episode(env, make_strategy(name, "MemDialog-LongMemEval-v0", mode), i)
            assert summary["answered"] and summary["question_types"] == [qtype]
            assert summary["sessions"] == items[i].n_sessions


# ---------------------------------------------------------------------------------------------------- scoring
def _question(kind: str, answer: str, qid: str = "x") -> Question:
    return Question(qid, "How many days did it take?", (answer,), kind=kind,
                    meta={"abstention": "_abs" in qid, "ability": kind})


def test_judge_free_score() -> None:
    assert judge_free_correct("It took 3 days in all.", _question("temporal-reasoning", "3 days"))
    assert judge_free_correct("three days", _question("temporal-reasoning", "3 days"))
    assert not judge_free_correct("It took 4 days.", _question("temporal-reasoning", "3 days"))
    assert judge_free_correct("You did not mention that.", _question("multi-session", "n/a", "x_abs"))
    assert not judge_free_correct("Five.", _question("multi-session", "n/a", "x_abs"))
    pref = _question("single-session-preference", "The user would prefer Sony compatible lenses and tripods")
    assert judge_free_correct("Try a Sony compatible lens and a sturdy tripod.", pref)
    assert not judge_free_correct("Buy a Canon camera.", pref)


def test_judge_prompts_follow_the_type() -> None:
    assert "off-by-one" in judge_prompt(_question("temporal-reasoning", "3 days"), "r")
    assert "updated answer" in judge_prompt(_question("knowledge-update", "3"), "r")
    assert "Rubric:" in judge_prompt(_question("single-session-preference", "likes Sony"), "r")
    assert "unanswerable" in judge_prompt(_question("knowledge-update", "n/a", "x_abs"), "r")
    shared = judge_prompt(_question("single-session-user", "3 days"), "It took 3 days")
    assert "Correct answer: 3 days" in shared and "Model response: It took 3 days" in shared


def test_judged_score_through_a_stand_in_judge(tmp_path: Path) -> None:
    path = _write(tmp_path / "lme.json", [_item(), _item("q2_abs", "multi-session")])
    with standin_server(lambda prompt: "Yes." if "Biscuit" in prompt.split("Model response:")[-1] else "no") as server:
        env = gym.make("MemDialog-LongMemEval-v0", data_path=path, memory_mode="rewrite", context="none",
                       judge=f"openai:lme-judge@{server.url}")
        env.reset(seed=0)
        while env.unwrapped.reading:
            env.step("")
        *_, info = env.step("<answer>Your dog is Biscuit.</answer>")
    assert info["summary"]["scoring"] == "judge" and info["summary"]["accuracy"] == 1.0
    assert info["summary"]["per_question"][0]["method"] == "judge"
    (request,) = server.requests
    assert request["model"] == "lme-judge" and "Correct answer: Biscuit" in request["messages"][0]["content"]


@pytest.mark.parametrize("reply", ["maybe", "yes and no", "Yes, because", "1", "", "no!"])
def test_judge_verdicts_off_the_scale_are_errors(reply: str) -> None:
    assert parse_verdict(reply) is None
    with standin_server(lambda prompt: reply) as server:
        judge = OpenAIJudge("lme-judge", server.url, retries=0)
        with pytest.raises(JudgeError) as err:
            score_longmemeval_answer("x", _question("multi-session", "3"), judge)
    assert f"lme-judge@{server.url}" in str(err.value) and repr(reply) in str(err.value)


def test_judge_verdicts_on_the_scale_parse() -> None:
    assert [parse_verdict(r) for r in ("yes", "Yes.", " NO \n", "no.")] == [True, True, False, False]
    assert set(QUESTION_TYPES) == {"single-session-user", "single-session-assistant", "single-session-preference",
                                   "temporal-reasoning", "knowledge-update", "multi-session"}


def test_env_survives_pickling_mid_episode(tmp_path: Path) -> None:
    """Vector envs copy envs mid-episode: the session stream re-opens at the item's next session."""
    import pickle

    path = write_synthetic_longmemeval(tmp_path / "s.json", items=2, sessions=6, turns=4, words=10)
    env = gym.make("MemDialog-LongMemEval-v0", data_path=str(path), memory_mode="rewrite", context="none").unwrapped
    env.reset(seed=1)
    env.step("")
    env.step("")
    copy = pickle.loads(pickle.dumps(env))
    for _ in range(3):
        a, b = env.step(""), copy.step("")
        assert a[0] == b[0] and "[session" in a[0]
    vec = gym.vector.SyncVectorEnv([lambda: gym.make("MemDialog-LongMemEval-v0", data_path=str(path))] * 2)
    obs, info = vec.reset(seed=[0, 1])
    assert list(info["question_ids"]) == [["synth00000000"], ["synth00000001"]]
    vec.close()


def test_a_data_file_rewritten_under_a_live_env_is_read_again_at_reset(tmp_path: Path) -> None:
    """Before: the env indexed the file at make and scored every later episode against that copy (and read the
    sessions at offsets of the old file). Now a reset after the file changed reads it as it is now; a rewrite
    that the env's settings cannot serve is refused at that reset, naming the file, and the old copy is kept."""
    path = _write(tmp_path / "lme.json", [_item()])
    env = gym.make("MemDialog-LongMemEval-v0", data_path=path, memory_mode="tools")

    def play(answer: str) -> float:
        env.reset(seed=0)
        while env.unwrapped.reading:
            env.step("<next/>")
        *_, info = env.step(f"<answer>{answer}</answer>")
        return info["summary"]["score"]

    assert play("Biscuit") == 1.0
    _write(tmp_path / "lme.json", [_item(answer="Pepper", sessions=3)])  # rewritten: another answer, offsets
    assert play("Biscuit") == 0.0 and play("Pepper") == 1.0
    assert env.unwrapped.n_sessions == 3
    _write(tmp_path / "lme.json", [_item(qtype="multi-session")])
    picky = gym.make("MemDialog-LongMemEval-v0", data_path=path, abilities=["multi-session"])
    _write(tmp_path / "lme.json", [_item()])
    with pytest.raises(ValueError, match=f"no item of {path} has a question type in abilities"):
        picky.reset(seed=0)


@pytest.mark.parametrize("env_id, kwargs", [
    ("MemDialog-LoCoMo-v0", {"questions": 2, "question_types": ["single-hop"]}),
    ("MemDialog-BEAM-v0", {"dataset": "locomo", "questions": 2, "abilities": ["single-hop"]})])
def test_a_locomo_file_rewritten_under_a_live_env_is_read_again_at_reset(tmp_path: Path, env_id, kwargs) -> None:
    from conftest import _tiny_locomo

    data = _tiny_locomo()
    path = tmp_path / "locomo.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    env = gym.make(env_id, data_path=str(path), **kwargs)
    env.reset(seed=0)
    assert not any(a.startswith("new ") for q in env.unwrapped.questions for a in q.answers)
    for qa in data[0]["qa"]:
        qa["answer"] = f"new {qa.get('answer', '')}"
    path.write_text(json.dumps(data), encoding="utf-8")
    env.reset(seed=0)
    answers = [a for q in env.unwrapped.questions for a in q.answers]
    assert answers and all(a.startswith("new ") for a in answers), answers
    for qa in data[0]["qa"]:
        qa["category"] = 3 if qa["category"] == 4 else qa["category"]  # no single-hop question left
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(ValueError, match="no question left in"):
        env.reset(seed=0)


def test_a_data_file_rewritten_mid_episode_fails_naming_it_rather_than_mixing_versions(tmp_path: Path) -> None:
    """Issue 64: a file rewritten during an episode made the episode read sessions of the new file under the old
    question. Now the next session read names the file and says it changed; a reset reads the new file."""
    from tasks.types import DataFormatError

    path = _write(tmp_path / "lme.json", [_item(sessions=4)])
    env = gym.make("MemDialog-LongMemEval-v0", data_path=path, memory_mode="tools")
    env.reset(seed=0)
    env.step("<next/>")
    _write(tmp_path / "lme.json", [_item(answer="Pepper", sessions=4)])
    with pytest.raises(DataFormatError, match=r"lme.json: changed while an episode was reading item 0"):
        while env.unwrapped.reading:
            env.step("<next/>")
    env.reset(seed=0)  # a new episode: the new file, whole
    while env.unwrapped.reading:
        env.step("<next/>")
    *_, info = env.step("<answer>Pepper</answer>")
    assert info["summary"]["score"] == 1.0
