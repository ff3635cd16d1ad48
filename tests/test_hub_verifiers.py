"""memenv in verifiers (environments/memenv_memqa, docs/hubs.md): verifiers' own evaluation path (``vf-eval``'s
``main``, which builds the env with ``load_environment``) plays memenv episodes against a stand-in
OpenAI-compatible server on 127.0.0.1 whose replies are a scripted policy's, and gets exactly the rewards of the
in-process env (and ``memenv bench``'s F1) on the same seeds; each model call's prompt is the observation the env
rebuilt from the memory, each invocation its own branch of the trace; bad input is what it is in-process.

verifiers 0.4 pins ``mcp==2.0.0`` and openenv 0.10 (memenv's ``openenv`` extra) needs ``mcp<2``, so verifiers
never goes into the project's environment: it lives in a virtual environment of its own,
``$MEMENV_CACHE/verifiers-VERSION`` (verifiers plus memenv's base dependencies, ~9 min and ~0.9 GiB on a busy
2-core machine), built by the ``verifiers_python`` fixture under a file lock and reused by every later run that
names the same ``MEMENV_CACHE`` (CI does; without it the suite's cache is a temporary folder per session, as for
the vLLM environment); ``$MEMENV_VERIFIERS_PYTHON`` names an interpreter of an environment built elsewhere.
memenv itself (this checkout) and the environment package (installed with pip into a temporary folder, from its
pyproject) reach it through ``PYTHONPATH``. The tests that need it are slow; they skip, saying why, where it
cannot be installed.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

import gymnasium as gym
import pytest

import memenv  # noqa: F401
from agents.llm.models.prompts import PROTOCOL_SYSTEM_PROMPT
from agents.scripted import make_strategy
from agents.scripted.bench.run import run_bench
from agents.scripted.bench.specs import EnvSpec, bench_env_kwargs
from hub_venvs import VERIFIERS_VERSION, ensure_verifiers_env
from standin_openai import standin_server

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10 (verifiers itself needs 3.11)
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "environments" / "memenv_memqa"
PYTHON_ENV = "MEMENV_VERIFIERS_PYTHON"

# (env id, env kwargs, scripted strategy): rewards that differ from seed to seed, and memory-tools mode. Behind the
# server each episode gets its own strategy (told apart by the task block every observation starts with), so a
# stateful strategy (rag) plays as in-process.
CASES = [
    ("MemQA-v0", {"objectives": 2}, "last-observation"),
    ("MemQA-v0", {"objectives": 2, "memory_mode": "tools"}, "rag"),
    ("MemRead-v0", {}, "keep-all"),
    ("MemDialog-v0", {}, "last-observation"),
]
SEED, EPISODES = 5, 3
TASK_BLOCK = re.compile(r"<task>.*?</task>", re.DOTALL)


# ---------------------------------------------------------------------- the package, without verifiers
def test_package_layout_is_what_verifiers_loads():
    project = tomllib.loads((PACKAGE / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert project["name"] == "memenv-memqa" and (PACKAGE / "README.md").is_file()
    # memenv's base install only, no extra of it; verifiers' v1 API
    assert sorted(project["dependencies"]) == ["memenv", "verifiers>=0.4,<0.5"]
    tree = ast.parse((PACKAGE / "memenv_memqa" / "__init__.py").read_text(encoding="utf-8"))
    exported = next(ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                    and any(getattr(t, "id", "") == "__all__" for t in n.targets))
    # verifiers finds the taskset, the harness and the env by id through __all__: exactly one of each
    assert {"MemenvTaskset", "MemenvHarness", "MemenvEnv"} <= set(exported)
    for path in (PACKAGE / "memenv_memqa").glob("*.py"):
        assert len(path.read_text(encoding="utf-8").splitlines()) <= 650, path.name


# ---------------------------------------------------------------------- verifiers' own environment
@pytest.fixture(scope="session")
def verifiers_python() -> Path:
    override = os.environ.get(PYTHON_ENV)
    if override:
        return Path(override)
    try:
        return ensure_verifiers_env()
    except RuntimeError as exc:  # no registry, no network: nothing to test against
        pytest.skip(f"verifiers=={VERIFIERS_VERSION} cannot be installed here: {exc}")


@pytest.fixture(scope="session")
def package_path(verifiers_python, tmp_path_factory) -> str:
    """PYTHONPATH for the verifiers environment: this checkout (memenv) and the environment package as pip
    installs it from its pyproject (into a temporary folder; its dependencies are already there)."""
    target = tmp_path_factory.mktemp("memenv_memqa_installed")
    build = tmp_path_factory.mktemp("memenv_memqa_source") / "memenv_memqa"
    shutil.copytree(PACKAGE, build, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    out = subprocess.run([str(verifiers_python), "-m", "pip", "install", "--no-deps", "--no-build-isolation",
                          "--no-index", "--target", str(target), str(build)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert (target / "memenv_memqa" / "harness.py").is_file()
    return os.pathsep.join([str(target), str(ROOT)])


# ---------------------------------------------------------------------- the model server
@contextmanager
def served_policy(act: Callable[[str], str]) -> Iterator[tuple[str, list[dict]]]:
    """``act(observation) -> action`` behind tests/standin_openai.py's stand-in server (its replies carry the
    OpenAI schema's fields verifiers validates). Yields its ``/v1`` URL and its request log."""
    with standin_server(act) as standin:
        yield standin.url, standin.requests


def _policy(env_id: str, kwargs: dict, name: str):
    policy = make_strategy(name, env_id, kwargs.get("memory_mode"))
    policy.reset()
    return policy


def _env_kwargs(env_id: str, kwargs: dict, name: str) -> dict:
    """The kwargs `memenv bench` makes the env with for this strategy (what the taskset is given too)."""
    return bench_env_kwargs(EnvSpec(env_id, dict(kwargs)), _policy(env_id, kwargs, name))


def _per_episode(env_id: str, kwargs: dict, name: str) -> Callable[[str], str]:
    """The strategy as the server plays it: a fresh one per episode, the episode known by its task block (the
    questions differ from seed to seed); concurrent episodes get their own."""
    policies, lock = {}, threading.Lock()

    def act(observation: str) -> str:
        task = TASK_BLOCK.search(observation)
        assert task is not None, observation[:200]
        with lock:
            policy = policies.setdefault(task.group(0), _policy(env_id, kwargs, name))
        return policy.act(observation)
    return act


# ---------------------------------------------------------------------- running verifiers
# Runs vf-eval's own entry point once per argv list in one interpreter; prints one JSON line per run: the exit
# (0, or SystemExit's code / message), the episodes it wrote to traces.jsonl and their traces.
DRIVER = textwrap.dedent("""
    import json, sys, pathlib
    from verifiers.v1.cli.eval.main import main
    for argv in json.loads(sys.argv[1]):
        try:
            main(argv)
            code = 0
        except SystemExit as exc:
            code = exc.code if exc.code is not None else 0
        out = pathlib.Path(argv[argv.index("-o") + 1])
        episodes = [json.loads(line) for path in sorted(out.glob("*/traces.jsonl")) for line in open(path)]
        traces = [trace for episode in episodes for trace in episode["traces"]]
        print("RESULT " + json.dumps({"exit": code, "episodes": episodes, "traces": traces}), flush=True)
""")


def run_vf_eval(python: Path, pythonpath: str, runs: list[list[str]], timeout: float = 900) -> list[dict]:
    env = {**os.environ, "PYTHONPATH": pythonpath, "OPENAI_API_KEY": "stand-in", "PRIME_DISABLE_VERSION_CHECK": "1"}
    out = subprocess.run([str(python), "-c", DRIVER, json.dumps(runs)], capture_output=True, text=True,
                         timeout=timeout, env=env, cwd=ROOT)
    results = [json.loads(line[7:]) for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    assert out.returncode == 0 and len(results) == len(runs), out.stdout[-3000:] + out.stderr[-3000:]
    for result in results:
        result["stderr"] = out.stderr
    return results


def eval_argv(url: str, out: Path, env_id: str, kwargs: dict, *, seed: int = SEED, n: int = EPISODES,
              extra: tuple[str, ...] = ()) -> list[str]:
    return ["memenv_memqa", "-m", "stand-in", "--client.base-url", url, "--client.api-key-var", "OPENAI_API_KEY",
            "-n", str(n), "--env.taskset.env-id", env_id, "--env.taskset.env-kwargs", json.dumps(kwargs),
            "--env.taskset.seed", str(seed), "--no-push", "--no-rich", "-o", str(out), *extra]


def _in_process(env_id: str, kwargs: dict, name: str, seed: int) -> dict:
    """One episode of the strategy on the in-process env: its observations, step rewards, snapshots, summary."""
    env = gym.make(env_id, **_env_kwargs(env_id, kwargs, name))
    act = _policy(env_id, kwargs, name).act
    obs, _ = env.reset(seed=seed)
    episode = {"observations": [], "rewards": [], "invocations": []}
    while True:
        episode["observations"].append(obs)
        obs, reward, terminated, truncated, info = env.step(act(obs))
        episode["rewards"].append(reward)
        episode["invocations"].append(json.loads(json.dumps(info["invocation"])))
        if terminated or truncated:
            episode["summary"] = info["summary"]
            return episode


def _leaves(trace: dict) -> list[int]:
    parents = {node.get("parent") for node in trace["nodes"]}
    return [i for i in range(len(trace["nodes"])) if i not in parents]


# ---------------------------------------------------------------------- the tests
slow = pytest.mark.slow


@pytest.fixture(scope="module")
def evaluated(verifiers_python, package_path, tmp_path_factory) -> list[dict]:
    """Every case of CASES through vf-eval (one interpreter), each with its own stand-in policy server."""
    out = tmp_path_factory.mktemp("vf_eval")
    results = []
    with contextlib.ExitStack() as stack:
        runs, logs = [], []
        for i, (env_id, kwargs, name) in enumerate(CASES):
            url, requests = stack.enter_context(served_policy(_per_episode(env_id, kwargs, name)))
            runs.append(eval_argv(url, out / str(i), env_id, _env_kwargs(env_id, kwargs, name)))
            logs.append(requests)
        for case, result, requests in zip(CASES, run_vf_eval(verifiers_python, package_path, runs), logs):
            results.append({"case": case, **result, "requests": list(requests)})
    return results


@slow
@pytest.mark.parametrize("case", range(len(CASES)), ids=[f"{c[0]}-{c[2]}" for c in CASES])
def test_vf_eval_rewards_equal_in_process_and_bench(evaluated, case):
    env_id, kwargs, name = CASES[case]
    result = evaluated[case]
    assert result["exit"] == 0
    traces = sorted(result["traces"], key=lambda t: t["task"]["data"]["seed"])
    assert [t["task"]["data"]["seed"] for t in traces] == [SEED + i for i in range(EPISODES)]
    bench = run_bench([name], [EnvSpec(env_id, dict(kwargs))], episodes=EPISODES, seed=SEED, progress=False)[1]
    assert list(bench.seed) == [SEED + i for i in range(EPISODES)]
    for i, trace in enumerate(traces):
        assert trace["ok"] and not trace["errors"], trace["errors"]
        record = trace["info"]["memenv"]
        reference = _in_process(env_id, kwargs, name, SEED + i)
        assert record["finished"] and record["rewards"] == reference["rewards"]  # every step's reward, exactly
        total = 0.0
        for reward in reference["rewards"]:
            total += reward
        assert trace["rewards"] == {"episode_return": {"score": total, "weight": 1.0}}  # the return, exactly
        assert record["invocations"] == reference["invocations"]  # every snapshot, key for key
        assert trace["metrics"]["f1"] == reference["summary"]["f1"]
        assert trace["metrics"]["turns"] == reference["summary"]["turns"] == len(reference["rewards"])
        assert trace["metrics"]["f1"] == bench.f1.iloc[i]  # memenv bench, the same seed
        # Each invocation is its own branch, [system, the observation, the reply]: nothing accreted.
        leaves = _leaves(trace)
        assert len(leaves) == len(reference["rewards"])
        users = [n["message"]["content"] for n in trace["nodes"] if n["message"]["role"] == "user"]
        assert users == reference["observations"]
    rewards = [r for t in traces for r in t["info"]["memenv"]["rewards"]]
    assert len(set(rewards)) > 1 or len({t["metrics"]["f1"] for t in traces}) > 1  # not one constant
    # What the server was sent: per call the protocol system prompt and that turn's observation, nothing more.
    assert len(result["requests"]) == sum(len(t["info"]["memenv"]["rewards"]) for t in traces)
    for request in result["requests"]:
        messages = request["messages"]
        assert [m["role"] for m in messages] == ["system", "user"]
        assert messages[0]["content"] == PROTOCOL_SYSTEM_PROMPT


def _in_process_error(env_id: str, kwargs: dict) -> str:
    with pytest.raises(Exception) as info:
        gym.make(env_id, **kwargs)
    return str(info.value)


BAD_CONFIGS = [("MemQA-v9", {}), ("MemQA-v0", {"colour": "red"}), ("MemQA-v0", {"objectives": 0})]
BAD_SEED = -1


@slow
def test_bad_input_is_what_it_is_in_process(verifiers_python, package_path, tmp_path):
    replies = ["garbage", "", "<memory>only a memory</memory>", "<search>no memory block</search>"]
    garbage_kwargs = {"objectives": 1, "max_turns": 6, "invalid_penalty": 0.25}
    calls = iter(range(10**6))
    with served_policy(lambda obs: replies[next(calls) % len(replies)]) as (url, requests):
        runs = [eval_argv(url, tmp_path / f"bad{i}", env_id, kwargs, n=1)
                for i, (env_id, kwargs) in enumerate(BAD_CONFIGS)]
        runs.append(eval_argv(url, tmp_path / "seed", "MemQA-v0", {}, seed=BAD_SEED, n=1))
        runs.append(eval_argv(url, tmp_path / "garbage", "MemQA-v0", garbage_kwargs, n=1))
        results = run_vf_eval(verifiers_python, package_path, runs)
    # An unknown id, a refused kwarg, a bad value, a bad seed: vf-eval stops before any rollout with gym.make's one-line
    # message, word for word (SystemExit's message: printed alone, exit status 1).
    for (env_id, kwargs), result in zip(BAD_CONFIGS, results):
        assert result["exit"] == _in_process_error(env_id, kwargs) and "\n" not in result["exit"]
        assert result["traces"] == []
    with pytest.raises(ValueError) as refused:
        gym.make("MemQA-v0").reset(seed=BAD_SEED)
    assert results[-2]["exit"] == str(refused.value) and results[-2]["traces"] == []  # reset's refusal
    # Malformed replies: invalid steps in the episode, as in-process (penalty, notice, snapshot's error).
    (trace,) = results[-1]["traces"]
    assert trace["ok"] and not trace["errors"]
    record = trace["info"]["memenv"]
    env = gym.make("MemQA-v0", **garbage_kwargs)
    obs, _ = env.reset(seed=SEED)
    for step, reply in enumerate(replies * 2):
        obs, reward, terminated, truncated, info = env.step(reply)
        assert record["rewards"][step] == reward == -0.25
        snapshot = record["invocations"][step]
        assert snapshot == json.loads(json.dumps(info["invocation"])) and not snapshot["valid"] and snapshot["error"]
        if terminated or truncated:
            break
    assert record["finished"] and len(record["rewards"]) == step + 1 == garbage_kwargs["max_turns"]
    assert trace["rewards"]["episode_return"]["score"] == -0.25 * garbage_kwargs["max_turns"]


@slow
def test_load_environment_and_the_taskset_through_verifiers_python_api(verifiers_python, package_path):
    """The Hub's loader: `load_environment(config)` gives memenv's Env, `Taskset.load()` its seeded tasks."""
    code = textwrap.dedent("""
        import json
        from verifiers.v1.utils.loaders import load_environment, load_taskset, resolve_env_config
        config = resolve_env_config({"taskset": {"id": "memenv_memqa", "env_id": "MemRead-v0", "seed": 3,
                                                 "num_tasks": 4}})
        env = load_environment(config)
        tasks = list(load_taskset(config.taskset))
        print(json.dumps({"env": type(env).__name__, "runtime": config.agent.runtime.type,
                          "harness": config.agent_harnesses()["agent"].id,
                          "seeds": [t.data.seed for t in tasks], "ids": sorted({t.data.env_id for t in tasks}),
                          "keys": len({t.key for t in tasks})}))
    """)
    out = subprocess.run([str(verifiers_python), "-c", code], capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PYTHONPATH": package_path})
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.splitlines()[-1]) == {"env": "MemenvEnv", "runtime": "subprocess",
                                                       "harness": "memenv_memqa", "seeds": [3, 4, 5, 6],
                                                       "ids": ["MemRead-v0"], "keys": 4}
