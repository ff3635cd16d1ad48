"""Tests for the MemQA environments: registration, Gymnasium API, seeding, fuzzing, info contract, scoring,
context modes, rendering, real HotpotQA data and vector envs."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from hypothesis import given, settings
from hypothesis import strategies as st

import memenv
from agents.scripted.strategies.qa_strategies import OraclePolicy
from memenv.context import sanitize
from memenv.context import count_words
from memenv.protocol import parse_action
from memenv.registration import ENVIRONMENTS

ROOT = Path(__file__).resolve().parents[1]

INVOCATION_TYPES = {
    "episode_id": str,
    "turn": int,
    "observation": str,
    "memory_before": str,
    "action": str,
    "memory_after": str,
    "tool": (str, type(None)),
    "tool_input": (str, type(None)),
    "tool_output": str,
    "valid": bool,
    "error": (str, type(None)),
    "context_tokens": int,
    "truncated_tokens": int,
}
EPISODE_KEYS = {
    "f1", "em", "f1_sum", "em_sum", "f1_mean", "em_mean", "f1_per_objective", "em_per_objective", "answers",
    "gold", "turns", "peak_context_tokens", "total_context_tokens", "invalid_actions", "snapshots",
}


def gold_answer(env) -> str:
    return "; ".join(q.answers[0] for q in env.unwrapped.questions)


def _gymnasium_warnings(record) -> list[str]:
    return [str(w.message) for w in record if issubclass(w.category, UserWarning) and "WARN" in str(w.message)]


# ---------------------------------------------------------------------------------------------- registration


@pytest.mark.parametrize("env_id", sorted(ENVIRONMENTS))
def test_check_env_passes(env_id: str, data_paths: dict) -> None:
    dataset = ENVIRONMENTS[env_id][1].get("dataset", "synthetic")
    kwargs = {} if dataset == "synthetic" else {"data_path": data_paths[dataset]}
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        env = gym.make(env_id, **kwargs)
        check_env(env.unwrapped)
        env_ansi = gym.make(env_id, render_mode="ansi", **kwargs)
        check_env(env_ansi.unwrapped, skip_render_check=False)
    assert _gymnasium_warnings(record) == []
    assert env.spec.id == env_id


def test_make_after_import() -> None:
    assert "MemQA-v0" in gym.registry
    env = gym.make("MemQA-v0")
    obs, info = env.reset(seed=0)
    assert obs.startswith("<task>")
    assert isinstance(env.unwrapped, memenv.envs.memqa.MemQAEnv)
    memenv.register_envs()  # idempotent
    assert gym.make("MemQA-v0").spec.id == "MemQA-v0"


def test_make_with_module_prefix_in_fresh_interpreter() -> None:
    code = (
        "import sys, gymnasium as gym\n"
        "assert 'memenv' not in sys.modules\n"
        "assert 'MemQA-v0' not in gym.registry\n"
        "env = gym.make('memenv:MemQA-v0')\n"
        "assert 'memenv' in sys.modules\n"
        "obs, info = env.reset(seed=0)\n"
        "obs, r, term, trunc, info = env.step('<memory>m</memory><search>x</search>')\n"
        "assert info['invocation']['valid'] and obs.startswith('<task>')\n"
        "print('OK', env.spec.id)\n"
    )
    environ = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=environ, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "OK MemQA-v0"


# ---------------------------------------------------------------------------------------------- seeding

SCRIPT = [
    "<memory>start</memory><search>founded</search>",
    "not an action",
    "<think>hm</think><memory>note two</memory><search>born in</search>",
    "<memory>note three</memory><search>capital</search>",
    "<memory>final</memory><answer>a; b</answer>",
]


def _play(env, seed: int, actions: list[str]) -> list:
    obs, info = env.reset(seed=seed)
    trace = [(obs, info)]
    for action in actions:
        obs, reward, terminated, truncated, info = env.step(action)
        trace.append((obs, reward, terminated, truncated, info))
        if terminated or truncated:
            break
    return trace


def test_same_seed_same_episode() -> None:
    a = _play(gym.make("MemQA-v0"), 11, SCRIPT)
    b = _play(gym.make("MemQA-v0"), 11, SCRIPT)
    assert len(a) == len(SCRIPT) + 1
    assert a == b  # observations, rewards, flags and infos, snapshots included
    assert a[-1][4]["summary"]["snapshots"] == b[-1][4]["summary"]["snapshots"]
    env = gym.make("MemQA-v0")
    assert _play(env, 11, SCRIPT) == a  # re-seeding an used env restarts the same episode


def test_different_seeds_different_questions() -> None:
    env = gym.make("MemQA-v0")
    seen, ids = set(), set()
    for seed in range(6):
        obs, info = env.reset(seed=seed)
        seen.add(tuple(info["question_ids"]))
        ids.add(info["episode_id"])
    assert len(seen) == 6 and len(ids) == 6


def test_unseeded_resets_continue_the_seeded_stream() -> None:
    def questions(env) -> list:
        out = []
        for i in range(3):
            _, info = env.reset(seed=5) if i == 0 else env.reset()
            out.append(tuple(info["question_ids"]))
        return out

    a, b = questions(gym.make("MemQA-v0")), questions(gym.make("MemQA-v0"))
    assert a == b
    assert len(set(a)) == 3


# ---------------------------------------------------------------------------------------------- fuzz

_FRAGMENTS = st.sampled_from(
    ["<memory>", "</memory>", "<search>", "</search>", "<answer>", "</answer>", "<think>", "</think>", "<", ">",
     "😀", "🧠", "\x00", "\x1b[31m", "\r\n", "\u2028", "\ufeff", "\U0010fffd", "\ud800", "</task>",
     "<information>", "[turns left: 0]", ";", " ", "\n"]
)
_ACTIONS = st.one_of(
    st.text(),
    st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0x1F)),
    st.lists(st.one_of(_FRAGMENTS, st.text(max_size=10)), max_size=20).map("".join),
    st.builds(lambda unit, n: unit * n, st.sampled_from(["a", "😀", "\x00", "word ", "<search>"]),
              st.integers(1000, 3000)),
    st.builds(lambda unit, n: unit * n, st.sampled_from(["a", "😀 ", "\x00", "word "]), st.integers(50_000, 250_000)),
    st.builds(lambda m, q: f"<memory>{m}</memory><search>{q}</search>", st.text(), st.text(min_size=1)),
    st.builds(lambda m, n: f"<memory>{m * n}</memory><search>q</search>", st.sampled_from(["😀", "x ", "\r"]),
              st.integers(10_000, 100_000)),
    st.builds(lambda m, a: f"<memory>{m}</memory><answer>{a}</answer>", st.text(max_size=10), st.text(max_size=10)),
)
_FUZZ_ENVS: dict = {}
_FUZZ_TURNS = 3
_FUZZ_PENALTY = 0.25


def _fuzz_env(context: str):
    if context not in _FUZZ_ENVS:
        _FUZZ_ENVS[context] = gym.make("MemQA-v0", context=context, max_turns=_FUZZ_TURNS,
                                       invalid_penalty=_FUZZ_PENALTY).unwrapped
    return _FUZZ_ENVS[context]


@settings(max_examples=100, deadline=None)
@given(actions=st.lists(_ACTIONS, min_size=1, max_size=_FUZZ_TURNS),
       context=st.sampled_from(["memory", "history", "window:1", "none"]), seed=st.integers(0, 2**16))
def test_fuzz_actions(actions: list[str], context: str, seed: int) -> None:
    env = _fuzz_env(context)
    obs, _ = env.reset(seed=seed)
    assert env.observation_space.contains(obs)
    memory = ""
    for turn, action in enumerate(actions, 1):
        obs_before = obs
        obs, reward, terminated, truncated, info = env.step(action)
        inv = info["invocation"]
        assert inv["turn"] == turn
        assert inv["observation"] == obs_before
        assert inv["memory_before"] == memory
        assert inv["valid"] == parse_action(action, require_memory=context == "memory").valid
        if inv["valid"]:
            assert inv["error"] is None
            memory = inv["memory_after"]
        else:
            assert isinstance(inv["error"], str) and inv["error"]
            assert inv["memory_after"] == memory
            assert inv["tool"] is None
            assert reward == -_FUZZ_PENALTY
            assert not terminated
            assert "invalid action" in obs
        assert isinstance(obs, str)
        assert env.observation_space.contains(obs), repr(obs[:200])
        if terminated or truncated:
            assert "summary" in info
            assert terminated != truncated
            assert truncated == (turn == _FUZZ_TURNS and not terminated)
            assert terminated == (inv["tool"] == "answer")
            assert info["summary"]["turns"] == turn
            assert info["summary"]["invalid_actions"] == sum(not s["valid"] for s in info["summary"]["snapshots"])
            break
        assert "summary" not in info
        assert turn < _FUZZ_TURNS


def test_invalid_action_notice_is_sanitized() -> None:
    # Regression: the parse error quotes raw text (emoji included) and used to reach the observation unsanitized.
    env = gym.make("MemQA-v0").unwrapped
    env.reset(seed=0)
    obs, *_ = env.step("hello 😀")
    assert env.observation_space.contains(obs)


def test_turn_limit_truncates() -> None:
    env = gym.make("MemQA-v0", max_turns=3).unwrapped
    obs, info = env.reset(seed=0)
    assert info["max_turns"] == 3
    assert "[turns left: 3]" in obs
    for turn in (1, 2, 3):
        obs, reward, terminated, truncated, info = env.step("garbage")
        assert info["invocation"]["valid"] is False
        assert not terminated
        assert truncated == (turn == 3)
        assert ("summary" in info) == (turn == 3)
        if turn < 3:
            assert f"[turns left: {3 - turn}]" in obs
    episode = info["summary"]
    assert episode["turns"] == 3 and episode["invalid_actions"] == 3
    assert episode["f1"] == 0.0 and episode["answers"] == []
    with pytest.raises(RuntimeError, match="reset"):
        env.step("<memory>m</memory><search>q</search>")


def test_default_turn_limit() -> None:
    env = gym.make("MemQA-v0", objectives=3, hops=(1, 4)).unwrapped
    assert env.max_turns == 2 * 3 * 4 + 2


# ---------------------------------------------------------------------------------------------- info contract


def _check_invocation(inv: dict) -> None:
    for key, kind in INVOCATION_TYPES.items():
        assert key in inv, key
        assert isinstance(inv[key], kind), (key, inv[key])
    assert not isinstance(inv["turn"], bool) and not isinstance(inv["context_tokens"], bool)
    assert inv["context_tokens"] == count_words(inv["observation"]) or inv["truncated_tokens"] > 0
    assert inv["truncated_tokens"] >= 0


def test_info_contract(run_episode) -> None:
    env = gym.make("MemQA-v0", objectives=3)
    observations = []
    obs, _ = env.reset(seed=2)
    policy = OraclePolicy()
    policy.reset(env)
    invocations = []
    # Mix in one invalid action to cover both shapes.
    actions = iter(["oops"])
    while True:
        observations.append(obs)
        action = next(actions, None) or policy.act(obs)
        obs, reward, terminated, truncated, info = env.step(action)
        inv = info["invocation"]
        _check_invocation(inv)
        invocations.append(inv)
        assert inv["action"] == action
        if inv["valid"]:
            assert inv["tool"] in ("search", "answer") and inv["error"] is None
            assert inv["memory_after"] == parse_action(action).memory
        else:
            assert inv["tool"] is None and inv["tool_input"] is None and inv["error"]
        if inv["tool"] == "search":
            assert inv["tool_input"] == parse_action(action).argument
            assert "Doc 1 (Title:" in inv["tool_output"]
            assert inv["tool_output"] in obs  # the newest result is shown next
        if terminated or truncated:
            break
    assert terminated
    # snapshot["observation"] is the observation the action was taken on.
    assert [s["observation"] for s in invocations] == observations
    assert len({s["episode_id"] for s in invocations}) == 1
    assert [s["turn"] for s in invocations] == list(range(invocations[0]["turn"], invocations[0]["turn"] + len(invocations)))
    for prev, nxt in zip(invocations, invocations[1:]):
        assert nxt["memory_before"] == prev["memory_after"]
    episode = info["summary"]
    assert EPISODE_KEYS <= set(episode)
    assert episode["snapshots"] == invocations
    assert episode["turns"] == len(invocations)
    assert episode["invalid_actions"] == 1
    assert episode["peak_context_tokens"] == max(s["context_tokens"] for s in invocations)
    assert episode["total_context_tokens"] == sum(s["context_tokens"] for s in invocations)
    assert episode["f1"] == episode["f1_mean"] == 1.0 and episode["em"] == episode["em_mean"] == 1.0
    assert episode["f1_sum"] == 3.0 and episode["em_sum"] == 3.0
    assert episode["f1_per_objective"] == [1.0] * 3 and episode["em_per_objective"] == [1.0] * 3
    assert episode["answers"] == [q.answers[0] for q in env.unwrapped.questions]
    assert episode["gold"] == [list(q.answers) for q in env.unwrapped.questions]


def test_reset_info() -> None:
    env = gym.make("MemQA-v0", objectives=2)
    obs, info = env.reset(seed=0)
    assert info["questions"] == [q.question for q in env.unwrapped.questions]
    assert all(f"Question {i}: {q}" in obs for i, q in enumerate(info["questions"], 1))
    assert info["context_tokens"] == count_words(obs)
    assert isinstance(info["episode_id"], str) and info["episode_id"]


# ---------------------------------------------------------------------------------------------- scoring


def _answer(env, text: str) -> tuple[float, dict]:
    _, reward, terminated, truncated, info = env.step(f"<memory>m</memory><answer>{text}</answer>")
    assert terminated and not truncated
    return reward, info["summary"]


def test_gold_answers_score_one() -> None:
    env = gym.make("MemQA-v0", objectives=3)
    for seed in range(3):
        env.reset(seed=seed)
        reward, episode = _answer(env, gold_answer(env))
        assert reward == 1.0
        assert episode["em"] == 1.0 and episode["f1"] == 1.0 and episode["em_sum"] == 3.0
        # SQuAD normalisation: case and punctuation do not matter.
        env.reset(seed=seed)
        shouted = "; ".join(f"  {q.answers[0].upper()}!! " for q in env.unwrapped.questions)
        assert _answer(env, shouted)[0] == 1.0


def test_wrong_answers_score_zero() -> None:
    env = gym.make("MemQA-v0", objectives=2)
    env.reset(seed=0)
    reward, episode = _answer(env, "qqqq; zzzz")
    assert reward == 0.0 and episode["em"] == 0.0 and episode["f1"] == 0.0
    env.reset(seed=0)
    assert _answer(env, "")[0] == 0.0
    env.reset(seed=0)
    reversed_gold = "; ".join(q.answers[0] for q in reversed(env.unwrapped.questions))
    assert _answer(env, reversed_gold)[1]["em"] == 0.0  # answers are matched by position


def test_partial_answers() -> None:
    env = gym.make("MemQA-v0", objectives=2)
    env.reset(seed=0)
    first = env.unwrapped.questions[0].answers[0]
    reward, episode = _answer(env, f"{first}; wrong")
    assert reward == pytest.approx(0.5) and episode["f1_mean"] == pytest.approx(0.5)
    assert episode["em_per_objective"] == [1.0, 0.0] and episode["em_sum"] == 1.0
    # Too few answers: the missing one scores 0; surplus answers are ignored.
    env.reset(seed=0)
    assert _answer(env, first)[0] == pytest.approx(0.5)
    env.reset(seed=0)
    assert _answer(env, gold_answer(env) + "; extra; more")[0] == 1.0
    # Partial token overlap: the first word of a multi-word gold answer.
    for seed in range(50):
        env.reset(seed=seed)
        golds = [q.answers[0] for q in env.unwrapped.questions]
        n_words = len(golds[0].split())
        if n_words >= 2 and not golds[0].lower().startswith(("the ", "a ", "an ")):
            break
    else:
        pytest.fail("no multi-word answer found")
    reward, episode = _answer(env, f"{golds[0].split()[0]}; {golds[1]}")
    expected_f1 = 2 * (1 / n_words) / (1 + 1 / n_words)  # precision 1, recall 1/n
    assert episode["f1_per_objective"][0] == pytest.approx(expected_f1)
    assert reward == pytest.approx((expected_f1 + 1.0) / 2)
    assert episode["em_per_objective"] == [0.0, 1.0]


# ---------------------------------------------------------------------------------------------- context modes


def _search(env, query: str, memory: str | None = "m"):
    mem = "" if memory is None else f"<memory>{memory}</memory>"
    obs, reward, terminated, truncated, info = env.step(f"{mem}<search>{query}</search>")
    assert info["invocation"]["valid"], info["invocation"]["error"]
    return obs, info


def test_memory_mode_shows_memory_just_written() -> None:
    env = gym.make("MemQA-v0")
    obs0, _ = env.reset(seed=0)
    task = obs0[: obs0.index("</task>") + len("</task>")]
    obs, info = _search(env, "founded", memory="NOTE-ALPHA keep this")
    assert obs.startswith(task)
    assert "<memory>\nNOTE-ALPHA keep this\n</memory>" in obs
    assert info["invocation"]["tool_output"] in obs
    assert "<search>founded</search>" not in obs  # no transcript
    obs, info = _search(env, "capital", memory="NOTE-BETA")
    assert "NOTE-BETA" in obs and "NOTE-ALPHA" not in obs  # the memory is rewritten, not appended
    assert obs.count("<information>") == 1


def test_memory_mode_requires_memory() -> None:
    env = gym.make("MemQA-v0")
    env.reset(seed=0)
    _, _, _, _, info = env.step("<search>q</search>")
    assert not info["invocation"]["valid"] and "missing <memory>" in info["invocation"]["error"]


def test_history_mode_shows_transcript() -> None:
    env = gym.make("MemQA-v0", context="history")
    env.reset(seed=0)
    obs1, info1 = _search(env, "founded", memory=None)  # memory is optional
    obs2, info2 = _search(env, "capital", memory="a note")
    for text in ("<search>founded</search>", info1["invocation"]["tool_output"],
                 "<memory>a note</memory><search>capital</search>", info2["invocation"]["tool_output"]):
        assert text in obs2
    assert obs2.count("<information>") == 3
    assert obs2.index("<search>founded</search>") < obs2.index("<search>capital</search>")
    assert obs2.startswith(obs1[: obs1.index("</task>")])


def test_window_mode_shows_last_turns() -> None:
    env = gym.make("MemQA-v0", context="window:1")
    env.reset(seed=0)
    _search(env, "alpha", memory=None)
    _search(env, "beta", memory=None)
    obs, info = _search(env, "gamma", memory=None)
    assert "<search>gamma</search>" in obs and info["invocation"]["tool_output"] in obs
    assert "<search>alpha</search>" not in obs and "<search>beta</search>" not in obs
    assert obs.count("<information>") == 2  # the result acted on, and the newest
    env = gym.make("MemQA-v0", context="window:2")
    env.reset(seed=0)
    for q in ("alpha", "beta", "gamma"):
        obs, _ = _search(env, q, memory=None)
    assert "<search>beta</search>" in obs and "<search>gamma</search>" in obs
    assert "<search>alpha</search>" not in obs


def test_none_mode_shows_no_memory() -> None:
    env = gym.make("MemQA-v0", context="none")
    env.reset(seed=0)
    obs, info = _search(env, "founded", memory="SECRET-NOTE")
    body = obs[obs.index("</task>"):]
    assert "SECRET-NOTE" not in obs and "<memory>" not in body
    assert "<search>founded</search>" not in obs
    assert info["invocation"]["tool_output"] in obs
    obs, _ = _search(env, "capital", memory=None)
    assert "SECRET-NOTE" not in obs


def test_context_budget_bounds_and_reports() -> None:
    budget = 150
    env = gym.make("MemQA-v0", context="history", context_budget=budget)
    obs, _ = env.reset(seed=0)
    task = obs[: obs.index("</task>") + len("</task>")]
    bit = False
    for query in ("founded", "capital", "born", "population", "published", "employer"):
        obs, info = _search(env, query, memory=None)
        assert info["invocation"]["context_tokens"] <= budget
        assert count_words(obs) <= budget
        assert obs.startswith(task)  # the task block survives the cut
        assert info["invocation"]["tool_output"].split("\n")[-1] in obs  # the newest result survives
    _, _, _, _, info = env.step("<answer>x</answer>")
    snapshots = info["summary"]["snapshots"]
    assert all(s["context_tokens"] <= budget for s in snapshots)
    assert info["summary"]["peak_context_tokens"] <= budget
    cut = [s for s in snapshots if s["truncated_tokens"] > 0]
    assert cut and all("[…]" in s["observation"] for s in cut)
    # Without a budget the same episode grows beyond it.
    free = _play(gym.make("MemQA-v0", context="history"), 0,
                 [f"<search>{q}</search>" for q in ("founded", "capital", "born", "population", "published")])
    assert max(step[4]["invocation"]["context_tokens"] for step in free[1:]) > budget
    assert all(step[4]["invocation"]["truncated_tokens"] == 0 for step in free[1:])


def test_context_budget_on_memory() -> None:
    env = gym.make("MemQA-v0", context_budget=120)
    env.reset(seed=0)
    obs, info = _search(env, "founded", memory=" ".join(f"w{i}" for i in range(500)))
    _, _, _, _, info = env.step("<memory>short</memory><search>capital</search>")
    inv = info["invocation"]
    assert inv["observation"] == obs
    assert inv["truncated_tokens"] > 0 and inv["context_tokens"] <= 120
    assert "w499" in obs or "</memory>" in obs


def test_invalid_penalty() -> None:
    env = gym.make("MemQA-v0", invalid_penalty=0.5)
    env.reset(seed=0)
    assert env.step("bad")[1] == -0.5
    assert env.step("<memory>m</memory><search>q</search>")[1] == 0.0
    env = gym.make("MemQA-v0")
    env.reset(seed=0)
    assert env.step("bad")[1] == 0.0


@pytest.mark.parametrize("action", [None, 123, b"<memory>m</memory><search>q</search>", ["<memory>m</memory>"]])
def test_non_string_actions_are_invalid(action) -> None:
    env = gym.make("MemQA-v0").unwrapped
    obs, _ = env.reset(seed=0)
    obs2, reward, terminated, truncated, info = env.step(action)
    inv = info["invocation"]
    assert not inv["valid"] and inv["error"] == f"action must be a string, got {type(action).__name__}"
    assert inv["action"] == repr(action) and inv["turn"] == 1
    assert not terminated and not truncated and reward == 0.0
    assert env.observation_space.contains(obs2)


def test_memory_budget_keeps_the_start() -> None:
    env = gym.make("MemQA-v0", memory_budget=3)
    env.reset(seed=0)
    _, _, _, _, info = env.step("<memory>w1 w2 w3 w4 w5</memory><search>q</search>")
    assert info["invocation"]["memory_after"] == "w1 w2 w3"
    assert info["invocation"]["memory_truncated_tokens"] == 2
    _, _, _, _, info = env.step("<memory>a\nb c</memory><search>q</search>")
    assert info["invocation"]["memory_after"] == "a\nb c"  # within budget: untouched
    assert info["invocation"]["memory_truncated_tokens"] == 0


def test_memory_budget_custom_counter_keeps_the_start() -> None:
    # Regression: with a custom counter, a newline-separated memory used to be erased entirely.
    env = gym.make("MemQA-v0", memory_budget=3, token_counter=lambda s: len(s.split()))
    env.reset(seed=0)
    _, _, _, _, info = env.step("<memory>a\nb\nc\nd\ne</memory><search>q</search>")
    assert info["invocation"]["memory_after"].split() == ["a", "b", "c"]


@pytest.mark.parametrize("kwargs, fragment", [
    ({"context": "bogus"}, "'bogus'"),
    ({"context": "window:0"}, "'window:0'"),
    ({"render_mode": "human"}, "'human'"),
    ({"render_mode": "rgb_array"}, "'rgb_array'"),
    ({"objectives": 0}, "objectives"),
    ({"hops": 7}, "hops"),
    ({"context_budget": 0}, "context_budget"),
    ({"top_k": 0}, "top_k"),
])
def test_bad_kwargs_raise_value_error(kwargs: dict, fragment: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ValueError, match=fragment):
            gym.make("MemQA-v0", **kwargs)


def test_render_ansi() -> None:
    env = gym.make("MemQA-v0", render_mode="ansi")
    obs, _ = env.reset(seed=0)
    text = env.render()
    assert isinstance(text, str) and obs in text
    obs, *_ = env.step("<memory>m</memory><search>founded</search>")
    text = env.render()
    assert obs in text and "<search>founded</search>" in text
    env.step("junk")
    assert "INVALID" in env.render()
    plain = gym.make("MemQA-v0")
    plain.reset(seed=0)
    assert plain.render() is None


# ---------------------------------------------------------------------------------------------- HotpotQA


def test_hotpot_fixture_env(hotpot_path: str, run_episode) -> None:
    env = gym.make("MemQA-Hotpot-v0", data_path=hotpot_path)
    assert env.unwrapped.objectives == 1
    seen = set()
    for seed in range(6):
        _, final = run_episode(env, OraclePolicy(), seed)
        assert final["summary"]["f1"] == 1.0
        seen.add(env.unwrapped.questions[0].id)
    assert len(seen) > 1


def test_hotpot_real_oracle(real_hotpot: str, run_episode) -> None:
    env = gym.make("MemQA-Hotpot-v0", data_path=real_hotpot)
    for seed in range(4):
        infos, final = run_episode(env, OraclePolicy(), seed)
        assert final["summary"]["f1"] == 1.0 and final["summary"]["em"] == 1.0
        # The oracle really read its supporting documents (one memory line per document).
        memory = final["invocation"]["memory_after"]
        for doc_id in env.unwrapped.questions[0].supporting_ids:
            assert env.unwrapped.document(doc_id).title + ": " in memory


def test_hotpot_without_data_path() -> None:
    with pytest.raises(ValueError, match="data_path"):
        gym.make("MemQA-Hotpot-v0")


def test_hotpot_missing_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nope.json"):
        gym.make("MemQA-Hotpot-v0", data_path=tmp_path / "nope.json")


# ---------------------------------------------------------------------------------------------- vector envs


def _check_vector(venv) -> None:
    obs, info = venv.reset(seed=0)
    assert isinstance(obs, tuple) and len(obs) == 2  # gymnasium 1.x batches Text spaces as tuples of str
    assert all(o.startswith("<task>") for o in obs) and obs[0] != obs[1]
    assert len(info["episode_id"]) == 2 and info["_episode_id"].all()
    actions = ("<memory>m0</memory><search>founded</search>", "bad action")
    obs2, reward, terminated, truncated, info = venv.step(actions)
    assert isinstance(obs2, tuple) and obs2[0] != obs[0]
    assert reward.shape == (2,) and not terminated.any() and not truncated.any()
    # Dict infos become dicts of per-env arrays (with "_key" masks), recursively.
    assert info["_invocation"].tolist() == [True, True]
    inv = info["invocation"]
    assert set(INVOCATION_TYPES) <= set(inv)
    assert list(inv["action"]) == list(actions)
    assert list(inv["observation"]) == list(obs)
    assert inv["valid"].dtype == bool and inv["valid"].tolist() == [True, False]
    assert inv["error"][0] is None and "text outside the protocol tags" in inv["error"][1]
    assert inv["turn"].tolist() == [1, 1]
    assert inv["memory_after"][0] == "m0"
    assert inv["_error"].all()
    # End env 0 only: "summary" is present for it and masked out for env 1.
    obs3, reward, terminated, truncated, info = venv.step(("<memory>m</memory><answer>x; y</answer>", "bad"))
    assert terminated.tolist() == [True, False]
    assert info["_summary"].tolist() == [True, False]
    assert isinstance(info["summary"]["f1"], np.ndarray) and info["summary"]["f1"][0] == 0.0
    assert len(info["summary"]["snapshots"][0]) == 2
    # Next step: env 0 autoresets (NEXT_STEP mode, its action ignored); env 1 steps on.
    obs4, reward, terminated, truncated, info = venv.step(("ignored", "<memory>m1</memory><search>capital</search>"))
    assert obs4[0].startswith("<task>") and "[turns left:" in obs4[0]
    assert info["_invocation"].tolist() == [False, True]
    assert info["invocation"]["turn"][1] == 3
    assert info["_question_ids"].tolist() == [True, False]


def test_sync_vector_env() -> None:
    venv = gym.vector.SyncVectorEnv([lambda: gym.make("MemQA-v0") for _ in range(2)])
    assert venv.metadata["autoreset_mode"] == gym.vector.AutoresetMode.NEXT_STEP
    try:
        _check_vector(venv)
    finally:
        venv.close()


def test_async_vector_env_without_shared_memory() -> None:
    venv = gym.vector.AsyncVectorEnv([lambda: gym.make("MemQA-v0") for _ in range(2)], shared_memory=False)
    try:
        _check_vector(venv)
    finally:
        venv.close()


@pytest.mark.xfail(strict=False, reason="gymnasium 1.x AsyncVectorEnv(shared_memory=True, the default) reads Text "
                   "observations from shared memory once at construction (Farama-Foundation/Gymnasium#1164): every "
                   "observation comes back as max_observation_chars copies of the charset's first character")
def test_async_vector_env_default_shared_memory() -> None:
    venv = gym.vector.AsyncVectorEnv([lambda: gym.make("MemQA-v0") for _ in range(2)])
    try:
        obs, _ = venv.reset(seed=0)
        assert obs[0].startswith("<task>")
    finally:
        venv.close()
