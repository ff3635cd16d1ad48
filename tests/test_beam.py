"""MemDialog-BEAM: the BEAM loader (layout written by the tests), streaming, scoring, memory tools, the judge."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env
from scipy.stats import kendalltau

import memenv  # noqa: F401
from memenv.envs.beam import MemDialogBeamEnv
from memenv.scoring.beam import (JudgeError, OpenAIJudge, event_order_score, make_judge, nugget_recall,
                                 official_rubric_score, rubric_nugget, score_beam_answer)
from memenv.scoring.judges import JUDGE_SPEC_HELP, OFFICIAL_JUDGE_MODELS
from memenv.memory_tools import MemoryStore, StoreError, parse_tool_call
from memenv.scoring.qa import f1_score
from tasks.beam import (ABILITIES, BeamConversation, SyntheticBeamChat, find_conversations, iter_chat_batches,
                        load_probing_questions, write_beam_directory)
from tasks.types import DataFormatError, Question

from standin_openai import standin_server


def _message(i: int, role: str, content: str) -> dict:
    return {"role": role, "id": i, "index": f"1,{i}", "content": content, "time_anchor": "March-01-2024"}


def _write_conv(root: Path, batches: list | str, questions: dict | None = None) -> Path:
    (root / "probing_questions").mkdir(parents=True, exist_ok=True)
    text = batches if isinstance(batches, str) else json.dumps(batches)
    (root / "chat.json").write_text(text)
    questions = questions if questions is not None else {
        "information_extraction": [{"question": "What is my sister's name?", "answer": "Maya",
                                    "rubric": ["LLM response should state: Maya"], "difficulty": "easy"}],
        "event_ordering": [{"question": "Order?", "answer": "1. woke up\n2. ate lunch", "rubric": ["woke up"],
                            "difficulty": "hard"}],
        "instruction_following": [{"question": "Budget?", "expected_compliance": "Uses euros",
                                   "compliance_indicators": ["euros"], "rubric": ["uses euros"], "difficulty": "medium"}],
    }
    (root / "probing_questions" / "probing_questions.json").write_text(json.dumps(questions))
    return root


BATCHES = [
    {"batch_number": 1, "time_anchor": "March-01-2024",
     "turns": [[_message(0, "user", "My sister's name is Maya."), _message(1, "assistant", "Nice!")]]},
    {"batch_number": 2, "time_anchor": "March-05-2024",
     "turns": [[_message(2, "user", "I woke up early."), _message(3, "assistant", "Good.")],
               [_message(4, "user", "Then I ate lunch."), _message(5, "assistant", "Yum.")]]},
]


# ---------------------------------------------------------------------------------------------------- loader
def test_loader_reads_layout_and_streams(tmp_path: Path) -> None:
    conv = BeamConversation.open(_write_conv(tmp_path / "c1", BATCHES))
    assert (conv.n_batches, conv.n_messages) == (2, 6)
    batches = list(conv.iter_batches())
    assert [b.number for b in batches] == [1, 2]
    assert batches[1].messages[2].content == "Then I ate lunch."
    q = {q.kind: q for q in conv.questions}
    assert q["information_extraction"].answers == ("Maya",)
    assert q["instruction_following"].meta["reference_key"] == "expected_compliance"
    assert q["instruction_following"].meta["compliance_indicators"] == ["euros"]
    assert q["event_ordering"].meta["order"] == ["woke up", "ate lunch"]


def test_streaming_reads_small_buffers(tmp_path: Path) -> None:
    path = _write_conv(tmp_path / "c", BATCHES) / "chat.json"
    assert [b.n_tokens for b in iter_chat_batches(path, read_size=7)] == [b.n_tokens for b in iter_chat_batches(path)]


@pytest.mark.parametrize("mutate, expected", [
    (lambda b: b[1]["turns"][1].__setitem__(0, {"role": "user", "id": 4}), r"batch 1 \(batch_number 2\), turn 1, message 0: missing key 'content'"),
    (lambda b: b[0]["turns"][0][1].__setitem__("role", "system"), r"batch 0 .*message 1: role must be"),
    (lambda b: b[1].pop("turns"), r"batch 1 \(batch_number 2\): missing key 'turns'"),
    (lambda b: b[0].__setitem__("turns", "x"), r"batch 0 .*turns must be a list"),
])
def test_loader_errors_name_file_batch_message(tmp_path: Path, mutate, expected) -> None:
    batches = json.loads(json.dumps(BATCHES))
    mutate(batches)
    root = _write_conv(tmp_path / "bad", batches)
    with pytest.raises(DataFormatError, match=expected) as err:
        BeamConversation.open(root)
    assert "chat.json" in str(err.value)


def test_truncated_and_invalid_json(tmp_path: Path) -> None:
    text = json.dumps(BATCHES)
    root = _write_conv(tmp_path / "t", text[: len(text) - 40])
    with pytest.raises(DataFormatError, match=r"chat.json: batch 1: invalid or truncated JSON"):
        BeamConversation.open(root)
    root = _write_conv(tmp_path / "o", '{"batch_number": 1}')
    with pytest.raises(DataFormatError, match="expected a JSON array"):
        BeamConversation.open(root)


def test_question_errors(tmp_path: Path) -> None:
    root = _write_conv(tmp_path / "q", BATCHES, {"memory_magic": []})
    with pytest.raises(DataFormatError, match="unknown ability 'memory_magic'; valid: abstention"):
        BeamConversation.open(root)
    root = _write_conv(tmp_path / "r", BATCHES, {"summarization": [{"question": "Sum?", "rubric": []}]})
    with pytest.raises(DataFormatError, match=r"summarization\[0\]: no reference: expected one of answer"):
        load_probing_questions(root / "probing_questions" / "probing_questions.json")


def test_find_conversations_sorts_numerically(tmp_path: Path) -> None:
    for name in ("10", "2", "1"):
        _write_conv(tmp_path / "100K" / name, BATCHES)
    assert [p.name for p in find_conversations(tmp_path)] == ["1", "2", "10"]
    with pytest.raises(FileNotFoundError, match="no BEAM conversation"):
        find_conversations(tmp_path / "100K" / "1" / "probing_questions")


# ---------------------------------------------------------------------------------------------------- synthetic
def test_synthetic_covers_abilities_and_round_trips(tmp_path: Path) -> None:
    chat = SyntheticBeamChat(3, 20_000, questions_per_ability=1)
    assert sorted({q.kind for q in chat.questions}) == sorted(ABILITIES)
    batches = list(chat.iter_batches())
    assert abs(sum(b.n_tokens for b in batches) - 20_000) < 0.1 * 20_000
    by_id = {str(m.id): m for b in batches for m in b.messages}
    for q in chat.questions:  # evidence ids point at messages that carry the fact
        for e in q.meta["evidence"]:
            assert by_id[e].role == "user"
    ku = next(q for q in chat.questions if q.kind == "knowledge_update")
    old, new = (by_id[e].content for e in ku.meta["evidence"])
    assert ku.meta["old_value"] in old and ku.answers[0] in new
    tr = next(q for q in chat.questions if q.kind == "temporal_reasoning")
    import datetime as dt
    d0, d1 = (dt.date.fromisoformat(by_id[e].time_anchor) for e in tr.meta["evidence"])
    assert tr.answers[0] == f"{(d1 - d0).days} days"
    root = write_beam_directory(chat, tmp_path / "syn")
    conv = BeamConversation.open(root)
    assert conv.n_batches == chat.n_batches
    assert [q.answers for q in conv.questions] == [q.answers for q in chat.questions]
    assert [m.content for b in conv.iter_batches() for m in b.messages] == [m.content for b in batches for m in b.messages]
    assert chat.render_batch(2) == chat.render_batch(2)  # rendering is a pure function of (seed, batch)


# ---------------------------------------------------------------------------------------------------- scoring
def test_nugget_recall_matches_direct_computation() -> None:
    answer = "Your sister is Maya. You moved to Lisbon in May."
    rubric = ["LLM response should state: Maya", "LLM response should mention: moved to Porto"]
    assert rubric_nugget(rubric[0]) == "Maya"
    words = "your sister is maya you moved to lisbon in may".split()
    windows = {n: [" ".join(words[i:i + k]) for i in range(len(words) - k + 1)] for n, k in (("Maya", 1), ("moved to Porto", 3))}
    direct = [max(f1_score(s, n) for s in ["Your sister is Maya.", "You moved to Lisbon in May.", answer] + windows[n])
              for n in ("Maya", "moved to Porto")]
    assert direct == [1.0, pytest.approx(2 / 3)]
    assert nugget_recall(answer, rubric) == pytest.approx(sum(direct) / 2)
    assert 0 < nugget_recall(answer, rubric) < 1


def test_event_order_score_is_tau_b() -> None:
    order = ["woke up", "ate lunch", "went swimming", "read a book"]
    assert event_order_score("I woke up, ate lunch, went swimming and read a book.", order) == 1.0
    assert event_order_score("read a book; went swimming; ate lunch; woke up", order) == 0.0
    got = event_order_score("ate lunch, then woke up, then went swimming", order)  # read a book missing -> last
    tau = kendalltau([0, 1, 2, 3], [1, 0, 2, 3], variant="b").statistic
    assert got == pytest.approx((tau + 1) / 2)


def test_score_beam_answer_dispatch() -> None:
    chat = SyntheticBeamChat(0, 8_000, questions_per_ability=1)
    q = {q.kind: q for q in chat.questions}
    assert score_beam_answer("Not mentioned in the conversation", q["abstention"])["score"] == 1.0
    assert score_beam_answer(q["abstention"].answers[0], q["abstention"])["score"] == 1.0  # "no information available"
    assert score_beam_answer("It is Bob", q["abstention"])["score"] == 0.0
    eo = q["event_ordering"]
    assert score_beam_answer(", ".join(eo.meta["order"]), eo) == {"score": 1.0, "official_score": 1.0,
                                                                   "method": "kendall_tau", "items": []}
    ie = q["information_extraction"]
    assert score_beam_answer(ie.answers[0], ie)["score"] == 1.0


# ---------------------------------------------------------------------------------------------------- tools
def test_tool_parser() -> None:
    assert parse_tool_call("<think>hm</think><mem_update id=3>new</mem_update>") .entry_id == 3
    assert parse_tool_call("<mem_delete id=12/>").name == "mem_delete"
    assert parse_tool_call("<next/>").name == "next"
    for bad, msg in [("<mem_add></mem_add>", "empty text"), ("<mem_update id=x>t</mem_update>", "id must be"),
                     ("<mem_add>a</mem_add><next/>", "exactly one tool call"),
                     ("<mem_search>a</mem_search><mem_search>b</mem_search>", "exactly one"),
                     ("hello", "text outside"), ("", "empty action"), (None, "must be a string")]:
        call = parse_tool_call(bad)
        assert not call.valid and msg in call.error, (bad, call.error)
    assert "not available now" in parse_tool_call("<answer>x</answer>", ("next",)).error


def test_store_budget_and_search() -> None:
    store = MemoryStore(budget=10)
    a = store.add("sister Maya lives in Porto")
    b = store.add("dog named Rex")
    assert store.search("where does Maya live", 3) == [a]
    with pytest.raises(StoreError, match="store full: 8/10"):
        store.add("one two three")
    store.delete(a)
    assert store.used == 3 and store.search("Maya", 3) == []
    with pytest.raises(StoreError, match=f"no entry {a}"):
        store.update(a, "x")
    store.update(b, "cat named Tom")
    assert store.search("Tom", 1) == [b]


def test_tools_env_invalid_calls_never_raise_and_snapshot() -> None:
    env = MemDialogBeamEnv(memory_mode="tools", chat_tokens=8_000, memory_budget=20, questions=2)
    obs, _ = env.reset(seed=0)
    for bad in ["<mem_delete id=99/>", "<answer>x</answer>", "garbage", 5, "<mem_add>" + "w " * 30 + "</mem_add>"]:
        obs2, r, te, tr, info = env.step(bad)
        inv = info["invocation"]
        assert inv["valid"] is False and inv["error"] and not te
        assert "invalid action, state unchanged" in obs2 and len(env.store) == 0
    _, _, _, _, info = env.step("<mem_add>my sister is Maya</mem_add>")
    inv = info["invocation"]
    assert inv["tool"] == "mem_add" and inv["entry_id"] == 1 and inv["store_entries"] == 1
    expected = {"episode_id", "turn", "observation", "memory_before", "action", "memory_after", "tool",
                "tool_input", "tool_output", "valid", "error", "context_tokens", "truncated_tokens"}
    assert expected <= set(inv)
    _, _, _, _, info = env.step("<mem_search>sister</mem_search>")
    assert info["invocation"]["retrieved_ids"] == [1] and "[1] my sister is Maya" in info["invocation"]["tool_output"]


def test_tool_call_limit_moves_on() -> None:
    env = MemDialogBeamEnv(memory_mode="tools", chat_tokens=8_000, max_tool_calls=2, questions=1)
    env.reset(seed=1)
    env.step("<mem_add>a</mem_add>")
    _, _, _, _, info = env.step("<mem_add>b</mem_add>")
    assert "limit 2 reached" in info["invocation"]["tool_output"] and env._session == 1


@pytest.mark.parametrize("kwargs", [{}, {"memory_mode": "rewrite"}, {"memory_mode": "rewrite", "context": "history"}])
def test_check_env(kwargs) -> None:
    env = gym.make("MemDialog-BEAM-v0", chat_tokens=8_000, **kwargs)
    check_env(env.unwrapped)


def test_data_path_env_and_bad_kwargs(tmp_path: Path) -> None:
    root = _write_conv(tmp_path / "c", BATCHES)
    env = gym.make("MemDialog-BEAM-v0", data_path=str(tmp_path), memory_mode="tools")
    obs, info = env.reset(seed=0)
    assert info["sessions"] == 2 and "My sister's name is Maya" in obs
    env.step("<mem_add>sister Maya</mem_add>")
    env.step("<next/>")
    env.step("<next/>")
    _, _, _, _, info = env.step("<mem_search>sister name</mem_search>")
    for j in range(3):
        _, r, te, _, info = env.step("<answer>Maya; woke up then ate lunch; euros</answer>")
    assert te and info["summary"]["per_question"][0]["used_entries"] == [1]
    assert info["summary"]["score_by_ability"]["information_extraction"] == 1.0
    with pytest.raises(ValueError, match="unknown memory_mode 'vector': valid options are 'rewrite', 'tools'"):
        MemDialogBeamEnv(memory_mode="vector")
    with pytest.raises(ValueError, match=r"conversation must be an index in 0..0 \(.* holds 1\), got 3"):
        MemDialogBeamEnv(data_path=root, conversation=3)
    with pytest.raises(ValueError, match="memory_mode='tools' needs context='memory'"):
        MemDialogBeamEnv(context="history")
    with pytest.raises(ValueError, match="unknown abilities entry 'telepathy': valid options are 'abstention'"):
        MemDialogBeamEnv(abilities=["telepathy"])


@pytest.mark.parametrize("mode, read", [("rewrite", "<memory>nothing</memory>"), ("tools", "<next/>")])
def test_strategy_refinement_carries_across_episodes(mode: str, read: str) -> None:
    env = MemDialogBeamEnv(chat_tokens=8_000, questions=1, refine_strategy=True, memory_mode=mode)
    for episode in range(2):
        obs, info = env.reset(seed=episode)
        if episode == 1:
            assert "keep every date" in obs and info["strategy"] == "keep every date"
        while env.reading:
            env.step(read)
        obs, r, te, _, _ = env.step("<answer>no idea</answer>")
        assert not te and "[feedback]" in obs and "Scores per ability" in obs
        _, _, _, _, bad = env.step("<memory>x</memory>")
        assert not bad["invocation"]["valid"]
        _, _, te, _, info = env.step("<strategy>keep every date</strategy>")
        assert te
    assert [h["strategy"] for h in info["summary"]["strategy_history"]] == ["keep every date"] * 2


# ---------------------------------------------------------------------------------------------------- judge
class _Judge(BaseHTTPRequestHandler):
    scores: list[str] = []
    seen: list[dict] = []
    fail_first = 0

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).seen.append(body)
        if type(self).fail_first > 0:
            type(self).fail_first -= 1
            self.send_response(503)
            self.end_headers()
            return
        content = type(self).scores.pop(0)
        data = json.dumps({"choices": [{"message": {"role": "assistant", "content": content}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def judge_server():
    server = HTTPServer(("127.0.0.1", 0), _Judge)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    _Judge.seen, _Judge.fail_first = [], 0
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


def test_judge_scores_rubric_items(judge_server: str) -> None:
    chat = SyntheticBeamChat(0, 8_000, questions_per_ability=1)
    q = next(q for q in chat.questions if q.kind == "summarization")  # 4 rubric items
    _Judge.scores = ["1", "0.5", "Score: 0", "1"]
    _Judge.fail_first = 1  # one 503 first: retried
    judge = make_judge(f"openai:tiny-judge@{judge_server}")
    judge.backoff = 0.01
    out = score_beam_answer("some summary", q, judge)
    assert out == {"score": pytest.approx(2.5 / 4), "official_score": pytest.approx(2 / 4), "method": "judge",
                   "items": [1.0, 0.5, 0.0, 1.0]}
    assert len(_Judge.seen) == 5 and _Judge.seen[-1]["model"] == "tiny-judge"
    assert q.meta["rubric"][3] in _Judge.seen[-1]["messages"][0]["content"]


def test_judge_down_names_url() -> None:
    judge = OpenAIJudge("m", "http://127.0.0.1:9/v1", timeout=0.5, retries=1, backoff=0.01)
    with pytest.raises(JudgeError, match=r"http://127.0.0.1:9/v1/chat/completions unreachable after 2 tries"):
        judge.grade("q", "item", "answer")
    with pytest.raises(ValueError, match="openai:MODEL@URL"):
        make_judge("gpt@localhost")


def test_official_rubric_score_truncates_every_grade_but_event_orderings() -> None:
    grades = [1.0, 0.5, 0.5, 0.0]
    assert official_rubric_score(grades, "summarization") == 0.25  # int(0.5) == 0
    assert official_rubric_score(grades, "event_ordering") == 0.5  # BEAM keeps these floats
    assert official_rubric_score([0.5, 0.5], "abstention") == 0.0 and official_rubric_score([], "abstention") == 0.0


def _grader(grades: dict[str, str]):
    """A stand-in judge's reply: the grade of the rubric item named in the prompt."""
    return lambda prompt: grades[prompt.split("Rubric item: ")[1].split("\n")[0]]


def test_judged_answer_both_ways_through_a_stand_in_judge() -> None:
    summary = Question("s", "Sum up my trip.", ("a trip",), kind="summarization",
                       meta={"ability": "summarization", "rubric": ["Lisbon", "May", "the train", "the hotel"]})
    order = Question("e", "In what order?", ("1. a\n2. b",), kind="event_ordering",
                     meta={"ability": "event_ordering", "rubric": ["packed", "flew"]})  # no order: judged
    grades = {"Lisbon": "1", "May": "0.5", "the train": "0.5", "the hotel": "0", "packed": "0.5", "flew": "1"}
    with standin_server(_grader(grades)) as server:
        judge = make_judge(f"openai:{OFFICIAL_JUDGE_MODELS['BEAM']}@{server.url}")
        got = score_beam_answer("We went to Lisbon in May.", summary, judge)
        assert got == {"score": pytest.approx(2 / 4), "official_score": pytest.approx(1 / 4), "method": "judge",
                       "items": [1.0, 0.5, 0.5, 0.0]}  # the two differ by the 0.5 grades
        got = score_beam_answer("I packed, then flew.", order, judge)
        assert got["score"] == got["official_score"] == pytest.approx(0.75)  # event ordering keeps 0.5
    assert len(server.requests) == 6
    assert {(r["model"], r["temperature"]) for r in server.requests} == {("gpt-4.1-mini", 0.0)}
    assert "gpt-4.1-mini" in JUDGE_SPEC_HELP and "gpt-4o-2024-08-06" in JUDGE_SPEC_HELP


def test_env_reports_beam_score_official_and_float(tmp_path: Path) -> None:
    questions = {
        "information_extraction": [{"question": "What is my sister's name?", "answer": "Maya",
                                    "rubric": ["LLM response should state: Maya", "she is older"]}],
        "summarization": [{"question": "Sum up.", "ideal_summary": "Maya; a day", "rubric": ["Maya", "woke", "March"]}],
        "event_ordering": [{"question": "Order?", "answer": "1. woke up\n2. ate lunch", "rubric": ["woke up"]}],
    }
    _write_conv(tmp_path / "c", BATCHES, questions)
    grades = {"LLM response should state: Maya": "1", "she is older": "0.5", "Maya": "0.5", "woke": "0.5",
              "March": "0"}
    with standin_server(_grader(grades)) as server:
        env = gym.make("MemDialog-BEAM-v0", data_path=str(tmp_path), memory_mode="rewrite", context="none",
                       judge=f"openai:gpt-4.1-mini@{server.url}")
        env.reset(seed=0)
        while env.unwrapped.reading:
            env.step("<memory>Maya</memory>")
        te = False
        while not te:
            _, _, te, _, info = env.step("<answer>Maya; woke up then ate lunch</answer>")
    summary = info["summary"]
    rows = {r["ability"]: (r["score"], r["official_score"]) for r in summary["per_question"]}
    assert rows["information_extraction"] == (pytest.approx(0.75), pytest.approx(0.5))
    assert rows["summarization"] == (pytest.approx(1 / 3), 0.0)
    assert rows["event_ordering"] == (1.0, 1.0)  # Kendall tau: nothing to truncate, the two agree
    assert summary["official_metric"] == "beam_score" and summary["scoring"] == "judge"
    assert summary["beam_score"] == pytest.approx(1.5 / 3)
    assert summary["beam_score_float"] == summary["score"] == pytest.approx((0.75 + 1 / 3 + 1.0) / 3)
    assert len(server.requests) == 5  # 2 + 3 rubric items; event ordering is not judged


# ---------------------------------------------------------------------------------------------------- strategies
def test_strategy_ordering_on_small_chat() -> None:
    from agents.scripted.bench import run_bench

    summary, rows = run_bench(["oracle", "rag", "relevance", "recency"],
                              ["MemDialog-BEAM-v0:chat_tokens=24000,memory_budget=6000"], episodes=2, progress=False)
    score = dict(zip(summary.strategy, summary.score))
    assert score["oracle"] >= score["rag"] >= score["recency"]
    assert score["oracle"] > score["recency"] + 0.3  # the store's content, not the reader, makes the gap
    assert score["relevance"] > score["rag"]  # a fact-only store outlives FIFO eviction under a small budget
    assert {f"score:{a}" for a in ABILITIES} <= set(summary.columns)
    oracle = summary[summary.strategy == "oracle"].iloc[0]
    assert oracle["score:event_ordering"] == 1.0 and oracle["score:temporal_reasoning"] == 1.0
    assert (rows.invalid_actions == 0).all()


def test_oracle_stores_exactly_the_evidence() -> None:
    from agents.scripted import make_strategy
    from agents.scripted.bench import run_episode

    policy = make_strategy("oracle", "MemDialog-BEAM-v0")
    env = MemDialogBeamEnv(chat_tokens=12_000, **policy.env_kwargs)
    summary, _ = run_episode(env, policy, 4)
    evidence = {e for q in env.questions for e in q.meta["evidence"]}
    assert summary["store_entries"] == len(evidence)
    stored_ids = {text.split("#")[0] for text in env.store.entries.values()}
    assert len(stored_ids) == len(evidence)
    used = [r["used_entries"] for r in summary["per_question"] if r["ability"] == "information_extraction"]
    assert all(ids for ids in used)  # every answer is traced to the entries its search returned


def test_bench_sweep_over_chat_length(tmp_path) -> None:
    from agents.scripted.bench import format_sweep, plot_sweep, run_sweep

    table, _ = run_sweep(["relevance", "recency"], ["MemDialog-BEAM-v0:questions=10"], "chat_tokens=8000,16000",
                         episodes=1, progress=False)
    assert sorted(zip(table.strategy, table.chat_tokens)) == [("recency", 8000), ("recency", 16000), ("relevance", 8000), ("relevance", 16000)]
    assert "score vs chat_tokens" in format_sweep(table, "chat_tokens")
    plot_sweep(table, "chat_tokens", tmp_path / "sweep.png")
    assert (tmp_path / "sweep.png").stat().st_size > 1000


def test_streaming_holds_one_batch(tmp_path) -> None:
    """The env pulls batches from a generator: after reading k sessions, k+1 batches were parsed, not all."""
    chat = SyntheticBeamChat(5, 30_000, questions_per_ability=1)
    root = write_beam_directory(chat, tmp_path / "conv")
    env = MemDialogBeamEnv(data_path=root, memory_mode="rewrite")
    env.reset(seed=0)
    pulled = []
    inner = env._batches
    env._batches = (pulled.append(b.position) or b for b in inner)
    for _ in range(3):
        env.step("<memory>x</memory>")
    assert pulled == [1, 2, 3] and env.n_sessions == chat.n_batches > 4
    env._batches = inner
    import pickle
    clone = pickle.loads(pickle.dumps(env))  # mid-episode: the copy re-opens chat.json where the env was
    obs = [e.step("<memory>x</memory>")[0] for e in (env, clone)]
    assert obs[0] == obs[1] and "[session 5/" in obs[1]


@pytest.mark.parametrize("dataset", ["memdialog", "locomo"])
def test_tools_mode_on_memdialog_and_locomo_conversations(dataset: str, locomo_path: str) -> None:
    from agents.scripted import make_strategy
    from agents.scripted.bench import run_episode

    kwargs = {"data_path": locomo_path} if dataset == "locomo" else {"sessions": 4}
    policy = make_strategy("oracle", "MemDialog-BEAM-v0")
    env = gym.make("MemDialog-BEAM-v0", dataset=dataset, questions=4, **kwargs)
    check_env(env.unwrapped)
    summary, _ = run_episode(env, policy, 0)
    conv = env.unwrapped.source.conversation
    evidence = {e for q in env.unwrapped.questions for e in q.supporting_ids if conv.turn(e) is not None}
    assert summary["invalid_actions"] == 0 and summary["questions_answered"] == 4
    assert summary["store_entries"] == len(evidence)  # the oracle found every evidence turn by its dia_id
    speakers = {s for s in conv.speakers}
    assert all(text.split("] ", 1)[1].split(":", 1)[0] in speakers for text in env.unwrapped.store.entries.values())
    with pytest.raises(ValueError, match="unknown abilities entry 'summarization': valid options are 'single-hop'"):
        MemDialogBeamEnv(dataset="memdialog", abilities=["summarization"])
