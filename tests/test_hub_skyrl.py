"""memenv in SkyRL-Gym's registry (memenv.hubs.skyrl): episodes driven through skyrl_gym's API as SkyRL's
generator drives them (make with env_config and a dataset row's extras, init, step until done, metrics) get
exactly the rewards of the in-process env and of `memenv bench` on the same seeds; each observation is the full
new prompt; bad input is what it is in-process. Skips without skyrl-gym."""

from __future__ import annotations

import copy
import importlib
import sys

import gymnasium as gym
import pytest

import memenv  # noqa: F401
from agents.scripted import make_strategy
from agents.scripted.bench.run import run_bench
from agents.scripted.bench.specs import EnvSpec, bench_env_kwargs
from memenv.hubs import skyrl_id

# (env id, env kwargs, scripted strategy): rewards that differ from seed to seed, and memory-tools mode.
CASES = [
    ("MemQA-v0", {"objectives": 2}, "last-observation"),
    ("MemQA-v0", {"objectives": 2, "memory_mode": "tools"}, "rag"),
    ("MemRead-v0", {}, "keep-all"),
    ("MemDialog-v0", {}, "last-observation"),
]
SEEDS = [5, 6, 7]


@pytest.fixture(scope="module")
def skyrl():
    skyrl_gym = pytest.importorskip("skyrl_gym")
    importlib.import_module("memenv.hubs.skyrl")  # registers memenv's envs with SkyRL-Gym
    return skyrl_gym


def _policy(env_id: str, kwargs: dict, name: str):
    return make_strategy(name, env_id, kwargs.get("memory_mode"))


def _env_kwargs(env_id: str, kwargs: dict, name: str) -> dict:
    return bench_env_kwargs(EnvSpec(env_id, dict(kwargs)), _policy(env_id, kwargs, name))


def _in_process(env_id: str, kwargs: dict, name: str, seed: int) -> dict:
    env = gym.make(env_id, **_env_kwargs(env_id, kwargs, name))
    policy = _policy(env_id, kwargs, name)
    obs, _ = env.reset(seed=seed)
    policy.reset(env.unwrapped)
    episode = {"observations": [obs], "rewards": [], "infos": []}
    while True:
        obs, reward, terminated, truncated, info = env.step(policy.act(obs))
        episode["observations"].append(obs)
        episode["rewards"].append(reward)
        episode["infos"].append(info)
        if terminated or truncated:
            return episode


def _generator_episode(skyrl_gym, row: dict, env_config, policy, max_turns: int = 50) -> dict:
    """One row played the way SkyRLGymGenerator.agent_loop calls the env: make(env_class, env_config=...,
    extras=the row's other fields plus max_turns), init(a copy of the prompt), step(output) until done, then
    get_metrics and close; the chat grows by each output and each step's observations."""
    extras = {k: v for k, v in row.items() if k not in ("prompt", "env_class")}
    extras["max_turns"] = max_turns  # the generator writes its own setting into every row's extras
    env = skyrl_gym.make(row["env_class"], env_config=env_config, extras=extras)
    chat, _ = env.init(copy.deepcopy(row["prompt"]))
    policy.reset()
    episode = {"chat_lengths": [len(chat)], "observations": [chat[-1]["content"]], "rewards": [], "metadata": []}
    done = False
    while not done:
        output = policy.act(chat[-1]["content"])
        step = env.step(output)
        assert set(step) == {"observations", "reward", "done", "metadata", "postprocessed_action"}
        chat += [{"role": "assistant", "content": output}] + step["observations"]  # append-only, as SkyRL's
        episode["chat_lengths"].append(len(chat))
        episode["rewards"].append(step["reward"])
        episode["metadata"].append(step["metadata"])
        episode["observations"] += [m["content"] for m in step["observations"]]
        done = step["done"]
    episode["metrics"] = env.get_metrics()
    env.close()
    return episode


@pytest.mark.parametrize("env_id, kwargs, name", CASES)
def test_skyrl_episodes_rewards_equal_in_process_and_bench(skyrl, env_id, kwargs, name):
    from omegaconf import OmegaConf
    from skyrl_gym.metrics import aggregate_for_environment

    from memenv.hubs.skyrl import dataset_rows

    env_kwargs = _env_kwargs(env_id, kwargs, name)
    env_config = OmegaConf.create({"env_kwargs": env_kwargs})  # what the trainer passes: a DictConfig
    rows = dataset_rows(env_id, SEEDS, env_kwargs)
    assert [row["env_class"] for row in rows] == [skyrl_id(env_id)] * len(SEEDS)
    bench = run_bench([name], [EnvSpec(env_id, dict(kwargs))], episodes=len(SEEDS), seed=SEEDS[0],
                      progress=False)[1]
    metrics = []
    for row, seed, bench_f1 in zip(rows, SEEDS, bench.f1):
        played = _generator_episode(skyrl, row, env_config, _policy(env_id, kwargs, name))
        reference = _in_process(env_id, kwargs, name, seed)
        assert played["rewards"] == reference["rewards"]  # every step's reward, exactly
        assert played["rewards"][-1] == bench_f1  # the answer's reward is memenv bench's F1 for that seed
        assert played["metrics"]["f1"] == bench_f1
        assert row["prompt"][0]["content"] == reference["observations"][0] == played["observations"][0]
        # Each step's observation is the full new prompt (none after the last step), its metadata the env's info.
        assert played["observations"] == reference["observations"][:-1]
        assert [m["invocation"] for m in played["metadata"]] == [i["invocation"] for i in reference["infos"]]
        assert played["metadata"][-1]["summary"] == reference["infos"][-1]["summary"]
        # The generator's chat only grows: 1 prompt, then an output and a prompt per step but the last.
        assert played["chat_lengths"] == [1 + 2 * t for t in range(len(reference["rewards"]))] + [
            2 * len(reference["rewards"])]
        metrics.append(played["metrics"])
    aggregated = aggregate_for_environment(skyrl_id(env_id), metrics)  # SkyRL's per-env-class aggregation
    assert aggregated["f1"] == pytest.approx(float(bench.f1.mean()), abs=1e-12)


def test_init_keeps_the_rows_system_messages_and_replaces_the_rest(skyrl):
    prompt = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "stale text"}]
    env = skyrl.make(skyrl_id("MemQA-v0"), env_config={}, extras={"seed": 4})
    chat, info = env.init(prompt)
    reference_obs, reference_info = gym.make("MemQA-v0").reset(seed=4)
    assert chat == [prompt[0], {"role": "user", "content": reference_obs}]
    assert info == reference_info and env.max_turns == reference_info["max_turns"]
    assert env.get_metrics() == {"steps": 0}


def test_bad_input_is_what_it_is_in_process(skyrl):
    from memenv.hubs.skyrl import MemenvTextEnv

    def failure(make):
        """The exception's type and message, less what skyrl_gym.make appends to a TypeError's message (one
        line: ' was raised from the environment creator for ID with kwargs (...)')."""
        with pytest.raises(Exception) as caught:
            make()
        message = str(caught.value)
        assert "\n" not in message
        return type(caught.value), message.partition(" was raised from the environment creator for memenv-")[0]

    def make(**env_kwargs):
        return skyrl.make(skyrl_id("MemQA-v0"), env_config={"env_kwargs": env_kwargs}, extras={})

    # A refused kwarg, a bad value: gym.make's own exception and message.
    assert failure(lambda: make(colour="red")) == failure(lambda: gym.make("MemQA-v0", colour="red"))
    assert failure(lambda: make(objectives="two")) == failure(lambda: gym.make("MemQA-v0", objectives="two"))
    assert failure(lambda: make(objectives=0)) == failure(lambda: gym.make("MemQA-v0", objectives=0))
    assert failure(lambda: MemenvTextEnv(memenv_id="MemQA-v9")) == failure(lambda: gym.make("MemQA-v9"))
    kind, message = failure(lambda: skyrl.make("memenv-MemQA-v9"))
    assert issubclass(kind, skyrl.error.Error) and "memenv-MemQA-v9" in message and "\n" not in message
    # A bad seed in the row: reset's own refusal, when the env is made (before any episode).
    reference = gym.make("MemQA-v0")
    for seed in (-1, 1.5, "7"):
        assert failure(lambda: skyrl.make(skyrl_id("MemQA-v0"), extras={"extra_info": {"seed": seed}})) == \
            failure(lambda: reference.reset(seed=seed))
    kind, message = failure(lambda: skyrl.make(skyrl_id("MemQA-v0"), env_config={"max_turns": 3}))
    assert kind is ValueError and "['max_turns']" in message and "env_kwargs" in message

    # A malformed action never raises: an invalid step with a notice, exactly as in-process.
    env = skyrl.make(skyrl_id("MemQA-v0"), env_config={"env_kwargs": {"invalid_penalty": 0.25}}, extras={"seed": 2})
    env.init([])
    reference = gym.make("MemQA-v0", invalid_penalty=0.25)
    reference.reset(seed=2)
    for action in ("garbage", "", None, 5):
        step = env.step(action)
        obs, reward, terminated, truncated, info = reference.step(action)
        assert (step["observations"], step["reward"], step["done"]) == (
            [{"role": "user", "content": obs}], reward, terminated or truncated)
        assert step["reward"] == -0.25 and step["metadata"]["invocation"] == info["invocation"]
        assert step["metadata"]["invocation"]["error"]
    assert env.memory == reference.unwrapped._memory == ""


def test_without_skyrl_gym_the_hub_module_says_what_to_install(monkeypatch):
    for name in [name for name in sys.modules if name.split(".")[0] == "skyrl_gym"] + ["skyrl_gym"]:
        monkeypatch.setitem(sys.modules, name, None)  # as if skyrl-gym were not installed
    monkeypatch.delitem(sys.modules, "memenv.hubs.skyrl", raising=False)
    with pytest.raises(ModuleNotFoundError, match=r"pip install 'memenv\[skyrl\]'") as caught:
        importlib.import_module("memenv.hubs.skyrl")
    assert caught.value.name == "skyrl_gym"
