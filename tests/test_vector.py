"""Every registered env under Gymnasium's vector envs: text actions, snapshots in infos, autoreset modes.

What Gymnasium 1.x does with memenv's values (asserted below, documented in docs/envs.md, "Vector envs"):

- observations come back as a tuple of strings (``Text`` spaces batch to a ``Tuple``), actions go in as one;
- dict infos are aggregated key by key, recursively: ``info["invocation"]`` is a dict whose values are
  arrays (object arrays for strings/lists, bool/int/float arrays for scalars) with a ``"_<key>"`` mask per
  key, and ``info["_invocation"]`` says which sub-envs produced an invocation this step;
- ``AsyncVectorEnv`` needs ``shared_memory=False``: Gymnasium reads ``Text`` observations out of shared
  memory once, at construction (see Farama-Foundation/Gymnasium#1164), so with shared memory every
  observation would read back as the initial empty buffer.
"""

from __future__ import annotations

import functools
import pickle

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv

import memenv  # noqa: F401 - registers the environments
from memenv.registration import ENVIRONMENTS

NUM_ENVS = 2
MAX_STEPS = 400
IGNORED = "not protocol text: a reset step ignores its action"

def env_kwargs(env_id: str, data_paths: dict[str, str]) -> dict:
    """Kwargs that make ``env_id`` runnable here (the tiny data files of ``conftest.data_paths`` for the
    ``dataset=`` values that need one), or skip when it needs data this test cannot provide."""
    _, defaults = ENVIRONMENTS[env_id]
    dataset = defaults.get("dataset", "synthetic")
    kwargs = {"data_path": data_paths[dataset]} if dataset in data_paths else {}
    try:
        env = gym.make(env_id, **kwargs)
        env.reset(seed=0)
        env.close()
    except (FileNotFoundError, ValueError, TypeError) as exc:
        if "data" in str(exc).lower() or isinstance(exc, FileNotFoundError):
            pytest.skip(f"{env_id} needs data this test cannot provide: {exc}")
        raise
    return kwargs


def policies_for(env_id: str):
    """Scripted text policies of the env's family (pure functions of the observation text)."""
    from agents.scripted.strategies.qa_strategies import STRATEGY_FAMILIES, env_family

    family = STRATEGY_FAMILIES.get(env_family(env_id))
    if not family:
        pytest.skip(f"no scripted strategy for {env_id} to produce protocol text")
    name = "last-observation" if "last-observation" in family else next(n for n in family if n != "oracle")
    return [family[name]() for _ in range(NUM_ENVS)]


def make_vector(kind: str, env_id: str, kwargs: dict, mode: AutoresetMode = AutoresetMode.NEXT_STEP):
    fns = [functools.partial(gym.make, env_id, **kwargs) for _ in range(NUM_ENVS)]
    if kind == "sync":
        return SyncVectorEnv(fns, autoreset_mode=mode)
    return AsyncVectorEnv(fns, shared_memory=False, autoreset_mode=mode)


def unbatch(batched: dict, i: int) -> dict:
    """Sub-env ``i``'s dict out of a vector-aggregated one (nested dicts are aggregated recursively)."""
    return {k: unbatch(v, i) if isinstance(v, dict) else v[i]
            for k, v in batched.items() if not k.startswith("_") and batched["_" + k][i]}


def snapshot_of(info: dict, i: int) -> dict:
    """Sub-env ``i``'s invocation snapshot out of the vector-aggregated info."""
    return unbatch(info["invocation"], i)


def rollout_next_step(kind: str, env_id: str, kwargs: dict) -> list:
    """Run until every sub-env has finished an episode and acted in the next one, checking NEXT_STEP
    semantics on the way; returns the trace (observations, rewards, flags, snapshot actions)."""
    policies = policies_for(env_id)
    vec = make_vector(kind, env_id, kwargs)
    assert vec.metadata["autoreset_mode"] == AutoresetMode.NEXT_STEP  # Gymnasium 1.x default
    obs, _ = vec.reset(seed=11)
    assert isinstance(obs, tuple) and len(obs) == NUM_ENVS and all(isinstance(o, str) and o for o in obs)
    trace = [obs]
    need_reset = np.zeros(NUM_ENVS, bool)  # the previous step ended the sub-env's episode
    last_episode = [None] * NUM_ENVS  # (episode_id, first turn) of the episode that ended
    done = np.zeros(NUM_ENVS, bool)  # finished an episode and acted in the next one
    try:
        for _ in range(MAX_STEPS):
            actions = tuple(IGNORED if need_reset[i] else policies[i].act(obs[i]) for i in range(NUM_ENVS))
            next_obs, rewards, terminated, truncated, info = vec.step(actions)
            assert isinstance(next_obs, tuple) and all(isinstance(o, str) for o in next_obs)
            has_invocation = info.get("_invocation", np.zeros(NUM_ENVS, bool))
            has_episode = info.get("_summary", np.zeros(NUM_ENVS, bool))
            for i in range(NUM_ENVS):
                if need_reset[i]:
                    # The reset step: the sub-env was reset, its action was ignored, nothing was recorded.
                    assert not has_invocation[i] and not has_episode[i]
                    assert rewards[i] == 0 and not terminated[i] and not truncated[i]
                    continue
                assert has_invocation[i]
                snap = snapshot_of(info, i)
                assert snap["observation"] == obs[i]  # the snapshot holds exactly the text the policy saw
                assert snap["action"] == actions[i]
                assert snap["valid"], snap["error"]
                if last_episode[i] is not None and not done[i]:
                    # first invocation after the reset step: a new episode, from its first turn
                    assert snap["episode_id"] != last_episode[i][0]
                    assert snap["turn"] == last_episode[i][1]
                    done[i] = True
                if terminated[i] or truncated[i]:
                    assert has_episode[i]
                    episode = unbatch(info["summary"], i)
                    snapshots = episode["snapshots"]
                    assert isinstance(snapshots, list) and len(snapshots) == episode["turns"]
                    assert snapshots[-1]["action"] == actions[i]
                    assert snapshots[-1]["episode_id"] == snap["episode_id"]
                    assert all(s["episode_id"] == snap["episode_id"] for s in snapshots)
                    assert episode["peak_context_tokens"] == max(s["context_tokens"] for s in snapshots)
                    if last_episode[i] is None:
                        last_episode[i] = (snap["episode_id"], snapshots[0]["turn"])
                else:
                    assert not has_episode[i]
            trace.append((next_obs, rewards.tolist(), terminated.tolist(), truncated.tolist(),
                          [snapshot_of(info, i).get("action") if has_invocation[i] else None for i in range(NUM_ENVS)]))
            obs, need_reset = next_obs, terminated | truncated
            if done.all():
                return trace
    finally:
        vec.close()
    raise AssertionError(f"{env_id}: not every sub-env finished an episode within {MAX_STEPS} steps")


@pytest.mark.parametrize("env_id", list(ENVIRONMENTS))
def test_sync_and_async_run_every_env_with_next_step_autoreset(env_id, data_paths):
    kwargs = env_kwargs(env_id, data_paths)
    sync_trace = rollout_next_step("sync", env_id, kwargs)
    async_trace = rollout_next_step("async", env_id, kwargs)
    assert sync_trace == async_trace  # same seeds, same actions: the same episodes in both


def test_invocation_info_structure():
    """The exact shapes Gymnasium gives memenv's dict infos (what a vector-env user indexes)."""
    vec = SyncVectorEnv([functools.partial(gym.make, "MemQA-v0", objectives=1) for _ in range(NUM_ENVS)])
    obs, info = vec.reset(seed=0)
    assert info["_episode_id"].dtype == bool and info["_episode_id"].all()
    assert info["episode_id"].dtype == object and info["max_turns"].dtype.kind == "i"
    obs, rewards, terminated, truncated, info = vec.step(
        ("<memory>m</memory><answer>nobody</answer>", "<memory>m</memory><search>the capital</search>"))
    assert terminated.tolist() == [True, False]
    assert info["_invocation"].tolist() == [True, True]
    inv = info["invocation"]
    assert isinstance(inv, dict)
    assert inv["valid"].dtype == bool and inv["valid"].tolist() == [True, True]
    assert inv["turn"].tolist() == [1, 1]
    assert inv["tool"].dtype == object and inv["tool"].tolist() == ["answer", "search"]
    # every step has every key: [] where the answer step retrieved nothing, [] where the search scored nothing
    assert all(mask.all() for key, mask in inv.items() if key.startswith("_"))
    assert inv["retrieved_ids"][0] == [] and len(inv["retrieved_ids"][1]) == 3
    assert inv["answer_f1"][0] == [0.0] and inv["answer_f1"][1] == []
    assert info["_summary"].tolist() == [True, False]
    assert isinstance(info["summary"]["snapshots"][0], list) and info["summary"]["snapshots"][0][0]["turn"] == 1
    assert info["summary"]["f1"][0] == 0.0
    vec.close()


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_same_step_autoreset(kind):
    """SAME_STEP works with text observations: the terminal observation and info move to ``final_obs`` /
    ``final_info`` and the returned observation is already the next episode's first one."""
    vec = make_vector(kind, "MemQA-v0", {"objectives": 1}, AutoresetMode.SAME_STEP)
    try:
        obs, _ = vec.reset(seed=3)
        actions = ("<memory>m</memory><answer>nobody</answer>", "<memory>m</memory><search>the capital</search>")
        next_obs, rewards, terminated, truncated, info = vec.step(actions)
        assert terminated.tolist() == [True, False]
        assert info["_final_obs"].tolist() == [True, False] and info["_final_info"].tolist() == [True, False]
        final_obs = info["final_obs"][0]
        assert isinstance(final_obs, str) and "answers submitted" in final_obs
        final = info["final_info"]
        assert final["_invocation"].tolist() == [True, False] and final["_summary"].tolist() == [True, False]
        assert final["invocation"]["action"][0] == actions[0]
        assert final["summary"]["answered"][0]
        # the step info of sub-env 0 is its reset info; sub-env 1 carries its ordinary step info
        assert info["_episode_id"].tolist() == [True, False]
        assert info["_invocation"].tolist() == [False, True]
        new_episode_id = info["episode_id"][0]
        assert new_episode_id != final["invocation"]["episode_id"][0]
        assert "[turns left:" in next_obs[0] and "No search results yet." in next_obs[0]
        # no ignored step: the next action already acts in the new episode
        actions = ("<memory>m</memory><search>the capital</search>",) * 2
        after, _, _, _, info = vec.step(actions)
        snap = snapshot_of(info, 0)
        assert snap["turn"] == 1 and snap["valid"] and snap["observation"] == next_obs[0]
        assert snap["episode_id"] == new_episode_id
    finally:
        vec.close()


def test_disabled_autoreset_needs_a_masked_reset():
    vec = make_vector("sync", "MemQA-v0", {"objectives": 1}, AutoresetMode.DISABLED)
    obs, _ = vec.reset(seed=5)
    actions = ("<memory>m</memory><answer>nobody</answer>", "<memory>m</memory><search>the capital</search>")
    obs2, _, terminated, truncated, _ = vec.step(actions)
    # Stepping a finished sub-env without resetting it is an error (Gymnasium's own assertion in
    # SyncVectorEnv; the env's RuntimeError, re-raised, in AsyncVectorEnv).
    with pytest.raises((AssertionError, RuntimeError)):
        vec.step(actions)
    vec = make_vector("sync", "MemQA-v0", {"objectives": 1}, AutoresetMode.DISABLED)
    vec.reset(seed=5)
    obs2, _, terminated, truncated, _ = vec.step(actions)
    obs3, info = vec.reset(options={"reset_mask": terminated | truncated})
    assert info["_episode_id"].tolist() == [True, False]
    assert obs3[1] == obs2[1] and obs3[0] != obs2[0]
    vec.close()


def test_make_vec_async_with_shared_memory_off():
    vec = gym.make_vec("MemQA-v0", num_envs=NUM_ENVS, vectorization_mode="async",
                       vector_kwargs={"shared_memory": False}, objectives=2)
    try:
        obs, info = vec.reset(seed=0)
        assert all(o.startswith("<task>") and "Question 2:" in o for o in obs)
        obs, *_ , info = vec.step(("<memory></memory><search>x</search>",) * NUM_ENVS)
        assert info["invocation"]["observation"][0].startswith("<task>")
    finally:
        vec.close()


@pytest.mark.parametrize("env_id", list(ENVIRONMENTS))
def test_envs_are_picklable(env_id, data_paths):
    kwargs = env_kwargs(env_id, data_paths)
    env = gym.make(env_id, **kwargs)
    obs, _ = env.reset(seed=4)
    clone = pickle.loads(pickle.dumps(env))
    assert clone.reset(seed=4)[0] == obs
    env.close()
    clone.close()
