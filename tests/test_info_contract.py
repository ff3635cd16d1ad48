"""The info contract, uniform across steps and envs, and memenv under the ecosystem's wrappers.

- every step of an env returns the same ``info["invocation"]`` keys with the same types (a vector env
  batches each key into one array: an int array cannot take a None, and a dict cannot mix with a None);
- :func:`memenv.vector.sub_env_info` gives back exactly what the sub-env wrote, and None-safe access on a
  NEXT_STEP reset step, where the vector info has no ``"invocation"`` at all;
- the Text spaces print short, still pickle, and warn when ``AsyncVectorEnv(shared_memory=True)`` is built;
- under Gymnasium's ``RecordEpisodeStatistics`` and SB3's ``Monitor`` (single and vector), ``info["episode"]``
  is theirs and ``info["summary"]`` keeps memenv's F1 and snapshots.
"""

from __future__ import annotations

import functools
import pickle
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AsyncVectorEnv, SyncVectorEnv
from gymnasium.vector.utils import create_shared_memory

import memenv  # noqa: F401 - registers the environments
from agents.scripted.strategies.qa_strategies import STRATEGY_FAMILIES, env_family
from memenv.envs.base import SHARED_MEMORY_WARNING, MemText
from memenv.registration import ENVIRONMENTS
from memenv.vector import sub_env_info
from memenv.wrappers import MemQANumeric, masked_random_action

ROOT = Path(__file__).resolve().parents[1]
NONE_ALLOWED = {"tool", "tool_input", "error"}  # object arrays in a vector env: None mixes with str there
ANSWER = "<memory>m</memory><answer>nobody</answer>"


def _kwargs(env_id: str, data_paths: dict[str, str]) -> dict:
    dataset = ENVIRONMENTS[env_id][1].get("dataset")
    return {"data_path": data_paths[dataset]} if dataset else {}


def _invocations(env_id: str, kwargs: dict, seed: int) -> list[dict]:
    """Every invocation of one episode: a malformed action, an empty memory rewrite, then the oracle."""
    env = gym.make(env_id, **kwargs)
    policy = STRATEGY_FAMILIES[env_family(env_id, kwargs.get("memory_mode"))]["oracle"]()
    obs, _ = env.reset(seed=seed)
    policy.reset(env.unwrapped)
    found = []
    for action in ("not protocol text", "<memory></memory>"):
        obs, _, terminated, truncated, info = env.step(action)
        found.append(info["invocation"])
    while not (terminated or truncated):
        obs, _, terminated, truncated, info = env.step(policy.act(obs))
        found.append(info["invocation"])
    env.close()
    return found


@pytest.mark.parametrize("env_id", ["MemQA-v0", "MemQA-v0:memory_mode=tools", "MemQA-Hotpot-v0", "MemRead-v0",
                                    "MemDialog-v0", "MemDialog-LoCoMo-v0"])
def test_every_step_has_the_same_invocation_keys_and_types(env_id, data_paths):
    env_id, _, memory_mode = env_id.partition(":memory_mode=")
    kwargs = {**_kwargs(env_id, data_paths), **({"memory_mode": memory_mode} if memory_mode else {})}
    steps = _invocations(env_id, kwargs, seed=1) + _invocations(env_id, kwargs, seed=2)
    tools = {s["tool"] for s in steps}
    assert "answer" in tools and None in tools and len(steps) >= 4  # the contract is checked on every kind
    keys = set(steps[0])
    assert all(set(s) == keys for s in steps), [sorted(set(s) ^ keys) for s in steps]
    assert {"retrieved_ids", "answer_f1", "answer_em", "memory_truncated_tokens"} <= keys
    for key in keys:
        kinds = {type(s[key]) for s in steps} - {type(None)}
        assert len(kinds) <= 1, (key, kinds)  # one type per key: vector envs batch it into one array
        if key not in NONE_ALLOWED:
            assert all(s[key] is not None for s in steps), key
    for s in steps:
        assert s["retrieved_ids"] == [] or s["tool"] == "search"
        assert (s["answer_f1"] != []) == (s["tool"] == "answer")
        assert len(s["answer_em"]) == len(s["answer_f1"])
    if env_id.startswith("MemQA"):
        assert any(s["retrieved_ids"] for s in steps)
    final = steps[-1]
    assert final["tool"] == "answer" and final["answer_f1"] and all(0.0 <= f <= 1.0 for f in final["answer_f1"])


def test_memqa_tools_every_call_kind_has_the_rewrite_keys_plus_the_store_keys():
    """MemQA's tools mode: every call kind (and invalid ones) gives the rewrite mode's keys plus the store's;
    ``retrieved_ids`` stays the corpus search's documents, ``retrieved_entries`` the store search's entries."""
    rewrite = _invocations("MemQA-v0", {}, seed=1)
    env = gym.make("MemQA-v0", memory_mode="tools")
    env.reset(seed=1)
    script = ["not protocol text", "<memory>m</memory><search>x</search>", "<search>Wigei</search>",
              "<mem_add>Wigei is a city.</mem_add>", "<mem_update id=1>Wigei lies in Wubuxora.</mem_update>",
              "<mem_search>Wigei</mem_search>", "<mem_delete id=1/>", "<mem_delete id=1/>", "<answer>a; b</answer>"]
    steps = [env.step(action)[4]["invocation"] for action in script]
    assert [s["tool"] for s in steps] == [None, None, "search", "mem_add", "mem_update", "mem_search", "mem_delete",
                                          None, "answer"]
    keys = set(steps[0])
    assert all(set(s) == keys for s in steps)
    assert keys == set(rewrite[0]) | {"entry_id", "retrieved_entries", "store_entries", "store_tokens"}
    for key in keys:
        kinds = {type(s[key]) for s in steps} - {type(None)}
        assert len(kinds) <= 1, (key, kinds)
        if key not in NONE_ALLOWED:
            assert all(s[key] is not None for s in steps), key
    assert [s["entry_id"] for s in steps] == [-1, -1, -1, 1, 1, -1, 1, -1, -1]
    assert [bool(s["retrieved_ids"]) for s in steps] == [s["tool"] == "search" for s in steps]
    assert [s["retrieved_entries"] for s in steps] == [[], [], [], [], [], [1], [], [], []]
    assert [s["store_entries"] for s in steps] == [0, 0, 0, 1, 1, 1, 0, 0, 0]
    assert all(s["memory_truncated_tokens"] == 0 for s in steps)


def _beam_invocations(memory_mode: str, seed: int) -> list[dict]:
    """Every invocation of one MemDialog-BEAM episode with strategy refinement: malformed actions, each store
    tool, then the oracle (tools) or a rewrite-and-answer script, then a strategy rewrite."""
    env = gym.make("MemDialog-BEAM-v0", memory_mode=memory_mode, chat_tokens=8_000, questions=4,
                   refine_strategy=True)
    policy = STRATEGY_FAMILIES[env_family("MemDialog-BEAM-v0")]["oracle"]()
    obs, _ = env.reset(seed=seed)
    policy.reset(env.unwrapped)
    base = env.unwrapped
    script = ["not protocol text", "<memory></memory>", 5]
    if memory_mode == "tools":
        script += ["<mem_add>x</mem_add>", "<mem_update id=1>y</mem_update>", "<mem_search>y</mem_search>",
                   "<mem_delete id=1/>", "<mem_delete id=1/>"]
    found, terminated, truncated = [], False, False
    while not (terminated or truncated):
        if script:
            action = script.pop(0)
        elif base._phase == "strategy":
            action = "<strategy>keep every date</strategy>"
        elif memory_mode == "tools":
            action = policy.act(obs)
        else:
            action = "<memory>m</memory>" if base.reading else "<memory>m</memory><answer>a</answer>"
        obs, _, terminated, truncated, info = env.step(action)
        found.append(info["invocation"])
    assert terminated and info["summary"]["strategy_history"]
    env.close()
    return found


@pytest.mark.parametrize("memory_mode", ["tools", "rewrite"])
def test_beam_every_step_has_the_same_invocation_keys_and_types(memory_mode):
    steps = _beam_invocations(memory_mode, seed=1) + _beam_invocations(memory_mode, seed=2)
    tools = {s["tool"] for s in steps}
    assert {"answer", "strategy", None} <= tools
    if memory_mode == "tools":
        assert {"mem_add", "mem_update", "mem_delete", "mem_search", "next"} <= tools
    keys = set(steps[0])
    assert all(set(s) == keys for s in steps), [sorted(set(s) ^ keys) for s in steps]
    assert {"retrieved_ids", "answer_f1", "answer_em", "memory_truncated_tokens", "entry_id", "question_index",
            "answer_score", "store_entries", "store_tokens"} <= keys
    for key in keys:
        kinds = {type(s[key]) for s in steps} - {type(None)}
        assert len(kinds) <= 1, (key, kinds)
        if key not in NONE_ALLOWED:
            assert all(s[key] is not None for s in steps), key
    for s in steps:
        assert s["retrieved_ids"] == [] or s["tool"] == "mem_search"
        assert (s["answer_f1"] != []) == (s["tool"] == "answer") == (s["question_index"] >= 0)
        assert len(s["answer_em"]) == len(s["answer_f1"]) == len(s["answer_score"])
        assert (s["entry_id"] >= 1) == (s["tool"] in ("mem_add", "mem_update", "mem_delete"))
    if memory_mode == "tools":
        assert any(s["retrieved_ids"] for s in steps)
        assert all(0.0 <= f <= 1.0 for s in steps for f in s["answer_score"])
    else:
        assert any(s["memory_truncated_tokens"] == 0 and s["tool"] is None and s["valid"] for s in steps)


def test_beam_invocations_batch_in_a_vector_env():
    fns = [functools.partial(gym.make, "MemDialog-BEAM-v0", chat_tokens=8_000) for _ in range(2)]
    vec = SyncVectorEnv(fns)
    try:
        vec.reset(seed=0)
        _, _, _, _, info = vec.step(("<mem_add>sister Maya</mem_add>", "bad"))
        assert info["invocation"]["entry_id"].tolist() == [1, -1]
        _, _, _, _, info = vec.step(("<mem_search>sister</mem_search>", "<next/>"))
        assert sub_env_info(info, 0)["invocation"]["retrieved_ids"] == [1]
        assert sub_env_info(info, 1)["invocation"]["retrieved_ids"] == []
        assert info["invocation"]["tool"].tolist() == ["mem_search", "next"]
    finally:
        vec.close()


def test_sub_env_info_returns_what_the_env_wrote_and_none_on_a_reset_step():
    fns = [functools.partial(gym.make, "MemQA-v0", objectives=1) for _ in range(2)]
    vec = SyncVectorEnv(fns)
    single = gym.make("MemQA-v0", objectives=1)
    try:
        vec.reset(seed=5)
        single.reset(seed=5)  # sub-env 0 gets seed 5
        actions = ("<memory>a</memory><search>the capital</search>", ANSWER)
        _, _, terminated, _, info = vec.step(actions)
        _, _, _, _, expected = single.step(actions[0])
        assert sub_env_info(info, 0)["invocation"] == expected["invocation"]  # Python values, as written
        assert terminated.tolist() == [False, True]
        assert sub_env_info(info, 1)["summary"]["answered"] is True
        _, _, terminated, _, info = vec.step((ANSWER, "ignored: the reset step"))
        assert sub_env_info(info, 1).get("invocation") is None and "invocation" in sub_env_info(info, 0)
        # both reset on the same step: no sub-env produced an invocation, and the key is absent altogether
        vec.reset(seed=6)
        _, _, terminated, _, info = vec.step((ANSWER, ANSWER))
        assert terminated.all()
        _, _, _, _, info = vec.step(("ignored", "ignored"))
        assert "invocation" not in info
        assert [sub_env_info(info, i).get("invocation") for i in range(2)] == [None, None]
    finally:
        vec.close()


def test_text_spaces_print_short_and_still_work():
    env = gym.make("MemQA-v0")
    space = env.observation_space
    assert isinstance(space, MemText) and isinstance(space, gym.spaces.Text)
    text = repr(space)
    assert len(text) < 100 and "1000000" in text and f"{len(space.character_set):,} characters" in text
    assert str(env.action_space).startswith("MemText(0, 100000,")
    clone = pickle.loads(pickle.dumps(space))
    assert type(clone) is MemText and clone == space and clone.contains("<task> a question")
    assert not space.contains("\x00") and space.contains(space.sample(mask=(50, None)))
    batched = gym.vector.utils.batch_space(space, 3)
    assert len(repr(batched)) < 400
    env.close()


def test_shared_memory_allocation_warns_and_the_documented_path_does_not():
    space = gym.make("MemQA-v0").observation_space
    with pytest.warns(RuntimeWarning, match="shared_memory=False") as record:
        buffer = create_shared_memory(space, n=2)  # what AsyncVectorEnv(shared_memory=True) calls
    assert str(record[0].message) == SHARED_MEMORY_WARNING and len(buffer) == 2 * space.max_length
    fns = [functools.partial(gym.make, "MemQA-v0", objectives=1)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning at all on the documented paths
        vec = AsyncVectorEnv(fns, shared_memory=False)
        obs, _ = vec.reset(seed=0)
        vec.close()
        SyncVectorEnv(fns).close()
    assert obs[0].startswith("<task>")


def test_shared_memory_warning_is_shown_once_per_process():
    code = textwrap.dedent("""
        import functools, gymnasium as gym, memenv
        from gymnasium.vector import AsyncVectorEnv
        for _ in range(2):
            AsyncVectorEnv([functools.partial(gym.make, "MemQA-v0", objectives=1)]).close()
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env={"PYTHONPATH": str(ROOT), "PATH": ""})
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("RuntimeWarning: AsyncVectorEnv(shared_memory=True)") == 1


# ----------------------------------------------------------------------------- the ecosystem's wrappers
def _oracle_episode(env, seed: int = 0) -> dict:
    base = env.unwrapped
    obs, _ = env.reset(seed=seed)
    action = "<memory>m</memory><answer>" + "; ".join(q.answers[0] for q in base.questions) + "</answer>"
    obs, _, terminated, truncated, info = env.step("<memory>m</memory><search>the capital</search>")
    assert not (terminated or truncated)
    obs, reward, terminated, truncated, info = env.step(action)
    assert terminated and reward == 1.0
    return info


def _check_summary(summary: dict, turns: int = 2) -> None:
    assert summary["f1"] == 1.0 and summary["em"] == 1.0 and summary["turns"] == turns
    assert [s["turn"] for s in summary["snapshots"]] == list(range(1, turns + 1))


def test_gymnasium_record_episode_statistics_single():
    env = gym.wrappers.RecordEpisodeStatistics(gym.make("MemQA-v0", objectives=1))
    for seed in range(2):  # the second episode too: nothing raises at or after the first episode end
        info = _oracle_episode(env, seed)
        assert info["episode"]["l"] == 2 and info["episode"]["r"] == 1.0
        _check_summary(info["summary"])


def test_sb3_monitor_single(tmp_path):
    monitor = pytest.importorskip("stable_baselines3.common.monitor")
    env = monitor.Monitor(gym.make("MemQA-v0", objectives=1), filename=str(tmp_path / "run"))
    for seed in range(2):
        info = _oracle_episode(env, seed)
        assert info["episode"]["l"] == 2 and info["episode"]["r"] == 1.0
        _check_summary(info["summary"])
    assert env.get_episode_rewards() == [1.0, 1.0]
    env.close()


def test_gymnasium_record_episode_statistics_vector():
    from gymnasium.wrappers.vector import RecordEpisodeStatistics

    fns = [functools.partial(gym.make, "MemQA-v0", objectives=1) for _ in range(2)]
    vec = RecordEpisodeStatistics(SyncVectorEnv(fns))
    try:
        vec.reset(seed=0)
        search = "<memory>m</memory><search>the capital</search>"
        _, _, _, _, info = vec.step((ANSWER, search))  # the first episode end (used to raise ValueError)
        assert info["_episode"].tolist() == [True, False] and info["episode"]["l"][0] == 1
        assert info["_summary"].tolist() == [True, False]
        summary = sub_env_info(info, 0)["summary"]
        assert summary["f1"] == 0.0 and len(summary["snapshots"]) == 1 and summary["answered"]
        gold = "; ".join(q.answers[0] for q in vec.unwrapped.envs[1].unwrapped.questions)
        _, _, terminated, _, info = vec.step(("ignored", f"<memory>m</memory><answer>{gold}</answer>"))
        assert terminated.tolist() == [False, True] and info["episode"]["r"][1] == 1.0
        assert info["episode"]["l"][1] == 2
        _check_summary(sub_env_info(info, 1)["summary"])
        for _ in range(3):  # keep going across further episode ends
            vec.step((ANSWER, ANSWER))
    finally:
        vec.close()


def test_sb3_vector_monitor_keeps_the_summary():
    pytest.importorskip("stable_baselines3")
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecMonitor

    for vec in (make_vec_env(MemQANumeric, n_envs=2, seed=0),  # Monitor per sub-env
                VecMonitor(make_vec_env(MemQANumeric, n_envs=2, seed=0, wrapper_class=None))):
        # make_vec_env always wraps in Monitor; VecMonitor on top then records too: both must keep "summary"
        rng = np.random.default_rng(0)
        vec.reset()
        ended = []
        for _ in range(200):
            actions = [masked_random_action(_unwrap(vec, i), rng) for i in range(2)]
            _, _, dones, infos = vec.step(np.array(actions))
            ended += [info for info, done in zip(infos, dones) if done]
            if len(ended) >= 3:
                break
        assert len(ended) >= 3
        for info in ended:
            assert set(info["episode"]) >= {"r", "l", "t"}
            summary = info["summary"]
            assert 0.0 <= summary["f1"] <= 1.0 and info["f1"] == summary["f1"]
            assert len(summary["snapshots"]) == summary["turns"] >= 1
        vec.close()


def _unwrap(vec, i: int):
    """The MemQANumeric wrapper of sub-env ``i`` of an SB3 (Vec)Monitor'd DummyVecEnv."""
    inner = vec.venv if hasattr(vec, "venv") else vec
    env = inner.envs[i]
    while not isinstance(env, MemQANumeric):
        env = env.env
    return env
