"""memenv in GEM's registry (memenv.hubs.gem): GEM's own vector env, wrappers and episode printer play scripted
strategies with exactly the rewards of the in-process env and of `memenv bench` on the same seeds; the
observation is the memory-state prompt; bad input is what it is in-process. Skips without gem-llm, which is not part
of the test extra (it pins nltk 3.9.1 and builds pycosat): the slow test at the end runs this file inside GEM's own
virtual environment (tests/hub_venvs.py), so the suite runs GEM's code path either way."""

from __future__ import annotations

import importlib
import subprocess
import sys

import gymnasium as gym
import pytest

import memenv  # noqa: F401
from agents.scripted import make_strategy
from agents.scripted.bench.run import run_bench
from agents.scripted.bench.specs import EnvSpec, bench_env_kwargs
from memenv.hubs import gem_id

# (env id, env kwargs, scripted strategy): rewards that differ from seed to seed (MemQA's last-observation
# scores 0 or 0.5, MemRead's keep-all 1 or 0, MemDialog's last-observation 0.2 or 0.6), and memory-tools mode.
CASES = [
    ("MemQA-v0", {"objectives": 2}, "last-observation"),
    ("MemQA-v0", {"objectives": 2, "memory_mode": "tools"}, "rag"),
    ("MemRead-v0", {}, "keep-all"),
    ("MemDialog-v0", {}, "last-observation"),
]


@pytest.fixture(scope="module")
def gem():
    gem = pytest.importorskip("gem")
    importlib.import_module("memenv.hubs.gem")  # registers memenv's envs with GEM
    return gem


def _policy(env_id: str, kwargs: dict, name: str):
    return make_strategy(name, env_id, kwargs.get("memory_mode"))


def _env_kwargs(env_id: str, kwargs: dict, name: str) -> dict:
    return bench_env_kwargs(EnvSpec(env_id, dict(kwargs)), _policy(env_id, kwargs, name))


def _in_process(env_id: str, kwargs: dict, name: str, seeds: list[int | None], env=None) -> list[dict]:
    """Episodes of the strategy on the in-process env, one after the other on one env (a None seed goes on
    with the env's generator): each episode's observations, rewards and summary."""
    env = env or gym.make(env_id, **_env_kwargs(env_id, kwargs, name))
    policy, episodes = _policy(env_id, kwargs, name), []
    for seed in seeds:
        obs, _ = env.reset(seed=seed)
        policy.reset(env.unwrapped)
        episode = {"observations": [obs], "rewards": []}
        while True:
            obs, reward, terminated, truncated, info = env.step(policy.act(obs))
            episode["observations"].append(obs)
            episode["rewards"].append(reward)
            if terminated or truncated:
                episodes.append({**episode, "summary": info["summary"]})
                break
    return episodes


@pytest.mark.parametrize("env_id, kwargs, name", CASES)
def test_gem_vector_env_rewards_equal_in_process_and_bench(gem, env_id, kwargs, name):
    from gem.wrappers.wrapper_factory import get_wrapper_fns

    from memenv.hubs.gem import PREVIOUS_FINAL_INFO

    n_envs, per_env, seed = 3, 2, 5
    # GEM's make_vec gives env i the constructor seed seed + i; reset() without seeds starts each env's first
    # episode there, and GEM's autoreset starts the second without a seed (the env's generator goes on).
    vec = gem.make_vec([gem_id(env_id)] * n_envs, wrappers=get_wrapper_fns("episode_tracking"), seed=seed,
                       **_env_kwargs(env_id, kwargs, name))
    obs, _ = vec.reset()
    policies = [_policy(env_id, kwargs, name) for _ in range(n_envs)]
    for policy in policies:
        policy.reset()
    rewards = [[[]] for _ in range(n_envs)]
    finished: list[list[dict]] = [[] for _ in range(n_envs)]
    obs = list(obs)
    while any(len(done) < per_env for done in finished):
        actions = {i: policies[i].act(obs[i]) for i in range(n_envs) if len(finished[i]) < per_env}
        new_obs, step_rewards, terminated, truncated, infos = vec.step(actions)
        for k, i in enumerate(actions):
            obs[i] = new_obs[k]
            rewards[i][-1].append(float(step_rewards[k]))
            if terminated[k] or truncated[k]:  # obs and info are already the next episode's (GEM's autoreset)
                finished[i].append({"return": infos[k]["prev_ep_cumulative_rewards"],
                                    "summary": infos[k][PREVIOUS_FINAL_INFO]["summary"]})
                rewards[i].append([])
                policies[i].reset()

    bench = run_bench([name], [EnvSpec(env_id, dict(kwargs))], episodes=n_envs, seed=seed, progress=False)[1]
    assert list(bench.seed) == [seed + i for i in range(n_envs)]
    for i in range(n_envs):
        expected = _in_process(env_id, kwargs, name, [seed + i, None])
        for episode, reference, got_rewards in zip(finished[i], expected, rewards[i]):
            assert got_rewards == reference["rewards"]  # every step's reward, exactly
            total = 0.0
            for reward in reference["rewards"]:
                total += reward
            assert episode["return"] == total  # GEM's EpisodeTrackingWrapper's sum
            assert episode["summary"]["f1"] == reference["summary"]["f1"]
        assert finished[i][0]["summary"]["f1"] == bench.f1.iloc[i]  # memenv bench, the same seed
        assert rewards[i][0][-1] == bench.f1.iloc[i]  # the answer's reward is the episode's F1


def test_gem_episode_printer_plays_the_seeded_episode(gem, capsys):
    from gem.utils.debug import run_and_print_episode
    from gem.wrappers.episode_tracking_wrapper import EpisodeTrackingWrapper

    env_id, kwargs, name = CASES[3]
    for seed in (0, 3):
        env = EpisodeTrackingWrapper(gem.make(gem_id(env_id), seed=seed, **_env_kwargs(env_id, kwargs, name)))
        policy = _policy(env_id, kwargs, name)
        policy.reset()
        run_and_print_episode(env, policy.act)  # GEM's printer: env.reset() without a seed, then steps to the end
        reference = _in_process(env_id, kwargs, name, [seed])[0]
        assert env.cumulative_rewards == sum(reference["rewards"])
        assert env.step_counter == len(reference["rewards"])
        assert "Step 1" in capsys.readouterr().out


def test_observation_is_the_memory_state_prompt_and_info_is_the_envs(gem):
    env_id, kwargs, name = CASES[0]
    env = gem.make(gem_id(env_id), **_env_kwargs(env_id, kwargs, name))
    reference_env = gym.make(env_id, **_env_kwargs(env_id, kwargs, name))
    policy = _policy(env_id, kwargs, name)
    obs, info = env.reset(seed=1)
    ref_obs, ref_info = reference_env.reset(seed=1)
    policy.reset()
    assert (obs, info) == (ref_obs, ref_info)
    first = obs
    while True:
        action = policy.act(obs)
        obs, reward, terminated, truncated, info = env.step(action)
        ref = reference_env.step(action)
        assert (obs, reward, terminated, truncated) == ref[:4]
        assert info["invocation"] == ref[4]["invocation"]  # the snapshot, key for key
        assert info["invocation"]["memory_after"] in obs or terminated or truncated  # the rewritten memory shown
        assert first not in obs or obs == first  # nothing accreted: the first prompt is not carried along
        if terminated or truncated:
            assert info["summary"] == ref[4]["summary"]
            break


def test_bad_input_is_what_it_is_in_process(gem):
    from memenv.hubs.gem import MemenvGemEnv

    def failure(make):
        with pytest.raises(Exception) as caught:
            make()
        return type(caught.value), str(caught.value)

    # A kwarg the env refuses, a bad value, an unknown memenv id: gym.make's own exception and one-line message.
    for kwargs in ({"colour": "red"}, {"objectives": 0}, {"objectives": "two"}):
        expected = failure(lambda: gym.make("MemQA-v0", **kwargs))
        assert failure(lambda: gem.make(gem_id("MemQA-v0"), **kwargs)) == expected
        assert "\n" not in expected[1]
    assert failure(lambda: MemenvGemEnv("MemQA-v9")) == failure(lambda: gym.make("MemQA-v9"))
    # An id GEM's registry does not have is GEM's own one-line refusal, naming it.
    kind, message = failure(lambda: gem.make("memenv:MemQA-v9"))
    assert kind is ValueError and "memenv:MemQA-v9" in message and "\n" not in message

    env, reference = gem.make(gem_id("MemQA-v0")), gym.make("MemQA-v0")
    # A bad seed: the env's refusal, before GEM seeds anything; the episode in progress goes on untouched.
    assert failure(lambda: gem.make(gem_id("MemQA-v0"), seed=-1)) == failure(lambda: reference.reset(seed=-1))
    env.reset(seed=2), reference.reset(seed=2)
    for seed in (-1, 1.5, "7"):
        assert failure(lambda: env.reset(seed=seed)) == failure(lambda: reference.reset(seed=seed))
    # A malformed action never raises: an invalid step with a notice, exactly as in-process.
    for action in ("garbage", "", None, 5, ["<search>x</search>"]):
        got, expected = env.step(action), reference.step(action)
        assert got[:4] == expected[:4] and got[4]["invocation"] == expected[4]["invocation"]
        assert got[4]["invocation"]["error"]
    assert env.memory == reference.unwrapped._memory


def test_without_gem_the_hub_module_says_what_to_install(monkeypatch):
    for name in [name for name in sys.modules if name.split(".")[0] == "gem"] + ["gem"]:
        monkeypatch.setitem(sys.modules, name, None)  # as if gem-llm were not installed
    monkeypatch.delitem(sys.modules, "memenv.hubs.gem", raising=False)
    with pytest.raises(ModuleNotFoundError, match=r"pip install 'memenv\[gem\]'") as caught:
        importlib.import_module("memenv.hubs.gem")
    assert caught.value.name == "gem"


def test_memenv_and_its_hubs_package_import_no_hub():
    code = "import sys, memenv, memenv.hubs; print(sorted({'gem', 'skyrl_gym'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


@pytest.mark.slow  # GEM's own environment: ~2 min to build the first time (cached under MEMENV_CACHE), ~20 s after
def test_this_file_passes_inside_gems_own_environment(tmp_path):
    import importlib.util
    import os
    from pathlib import Path

    from hub_venvs import ensure_gem_env

    if importlib.util.find_spec("gem") is not None:
        pytest.skip("gem-llm is installed here: the tests above ran against it in this process")
    try:
        python = ensure_gem_env()
    except RuntimeError as exc:  # no registry, no compiler for pycosat: nothing to test against
        pytest.skip(f"GEM's environment cannot be built here: {exc}")
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), str(root / "tests")])}
    out = subprocess.run([str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow",
                          "--rootdir", str(tmp_path), "-c", os.devnull, __file__],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    summary = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else out.stderr[-2000:]
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "passed" in summary and "skipped" not in summary and "failed" not in summary, summary
