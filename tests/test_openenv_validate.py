"""memenv as a validated OpenEnv environment (openenv 0.10's `openenv validate`, the manifest openenv.yaml, the
Dockerfile, the oracle's runtime plan deploy/openenv/runtime.json), at every level this machine can run:

- static: `openenv validate PKG --level static` (the CLI) passes;
- runtime: openenv's runner, graders and policy (run_validation) with the subject as a local `memenv serve`
  process (deploy/openenv/validate_local.py; the CLI's runtime level builds the Dockerfile with Docker, and no
  Docker daemon runs here): startup, observation schema, reward and state contract pass, nothing fails;
- the running-server probe `openenv validate --url` passes every criterion;
- semantic: openenv 0.10 ships no semantic grader (each SKIPs, "grader not implemented in this build"), so the
  checks its oracle_max, floor_gap and determinism describe are made here: the oracle's plan replayed over the
  wire ends at the top of the declared reward range, answering at once scores the bottom, and replaying is
  deterministic.

The package is copied to tmp_path (the working tree is never validated in place: a run fails when its source
changes meanwhile). Skips when openenv is absent (pip install 'memenv[openenv]').
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytest.importorskip("openenv.validation", reason="openenv not installed: pip install 'memenv[openenv]'")

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_FILES = ["openenv.yaml", "Dockerfile", ".dockerignore", "pyproject.toml", "README.md"]
PACKAGE_DIRS = ["deploy", "memenv", "tasks", "agents", "distill"]


def _load(name: str):
    """A script of deploy/openenv/ as a module (under a name of its own: nothing on sys.path changes)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"memenv_deploy_{name}", ROOT / "deploy" / "openenv" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


oracle = _load("oracle")
validate_local = _load("validate_local")


@pytest.fixture(scope="module")
def package(tmp_path_factory) -> Path:
    """The package as `openenv validate` sees it (what the Dockerfile copies, the manifest and the plan)."""
    root = tmp_path_factory.mktemp("pkg")
    for name in PACKAGE_FILES:
        shutil.copy2(ROOT / name, root / name)
    for name in PACKAGE_DIRS:
        shutil.copytree(ROOT / name, root / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return root


def _cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "openenv.cli", "validate", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=ROOT)


def test_the_manifest_names_the_served_env_and_the_plan_is_the_oracles():
    manifest = yaml.safe_load((ROOT / "openenv.yaml").read_text())
    assert manifest["memenv"]["env"] == oracle.ENV_ID and manifest["validation"]["execution"]["probe_path"] == \
        str(oracle.PLAN.relative_to(ROOT))
    assert (ROOT / manifest["validation"]["capabilities"]["oracle"]["location"]).is_file()
    actions, rewards = oracle.oracle_episode()
    assert json.loads(oracle.PLAN.read_text()) == oracle.runtime_plan(actions)  # committed plan is current
    low, high = manifest["validation"]["reward"]["range"]
    assert rewards[-1] == high and all(low <= r <= high for r in rewards)  # the oracle reaches the top in-process


def test_static_level_passes_with_the_openenv_cli(package):
    result = _cli(str(package), "--level", "static", "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["verdict"] == "pass"
    assert [(r["check_id"], r["status"]) for r in report["results"]] == [("static.manifest", "pass")]


def test_runtime_level_passes_on_a_local_process(package, tmp_path):
    report = validate_local.validate(package, "semantic", log_dir=tmp_path)
    status = {r.check_id: r.status.value for r in report.results}
    for check in ("static.manifest", "runtime.startup", "runtime.observation_schema", "runtime.reward_well_formed",
                  "runtime.state_contract"):
        assert status[check] == "pass", (check, [r for r in report.results if r.check_id == check])
    assert not {c for c, s in status.items() if s in ("fail", "error")}, status
    for result in report.results:  # what is skipped is what this openenv build or a process cannot check
        if result.status.value == "skip":
            assert result.evidence in (["grader not implemented in this build"],
                                       ["missing provider capabilities: network_policy"]), result
    assert report.verdict.value == "warn"  # skips make a warn; a fail would be a broken contract
    assert {"semantic.oracle_max", "semantic.floor_gap"} <= {c for c, s in status.items() if s == "skip"}


def test_the_running_server_probe_passes(tmp_path):
    from memenv.openenv import BackgroundServer

    with BackgroundServer("MemQA-v0") as server:
        result = _cli("--url", server.url, "--timeout", "120", "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["passed"] and report["mode"] == "simulation"
    assert {c["id"] for c in report["criteria"] if c["passed"]} == {
        "openapi_version_available", "health_endpoint", "metadata_endpoint", "schema_endpoint", "mcp_endpoint",
        "mode_endpoint_consistency"}


def _replay(url: str, reset: dict, actions: list[dict]) -> list[dict]:
    """The plan played on one raw /ws session, as OpenEnv's collector does: every reply's data."""
    from websockets.sync.client import connect as ws_connect

    replies = []
    with ws_connect(url.replace("http", "ws", 1) + "/ws", open_timeout=30) as ws:
        for message in [{"type": "reset", "data": reset}] + [{"type": "step", "data": a} for a in actions]:
            ws.send(json.dumps(message))
            replies.append(json.loads(ws.recv(timeout=60))["data"])
            if replies[-1]["done"]:
                break
    return replies


def test_semantic_checks_oracle_max_floor_gap_and_determinism_over_the_wire():
    from memenv.openenv import BackgroundServer

    manifest = yaml.safe_load((ROOT / "openenv.yaml").read_text())["validation"]
    low, high = manifest["reward"]["range"]
    plan = json.loads(oracle.PLAN.read_text())
    reset = {**plan["reset"]["options"], "seed": plan["reset"]["seed"], "episode_id": plan["reset"]["episode_id"]}
    with BackgroundServer("MemQA-v0") as server:
        played = _replay(server.url, reset, plan["actions"])
        again = _replay(server.url, reset, plan["actions"])
        floor = _replay(server.url, reset, [{"text": "<memory></memory><answer>unknown; unknown</answer>"}])
    assert len(played) == len(plan["actions"]) + 1 and played[-1]["done"]
    assert played[-1]["reward"] >= high - manifest["reward"]["oracle_tolerance"]  # oracle_max
    assert floor[-1]["done"] and high - floor[-1]["reward"] >= manifest["reward"]["floor_margin"]  # floor_gap
    assert floor[-1]["reward"] == low
    assert again == played  # replayable: the same seed and actions, the same observations, rewards, infos


def test_a_git_work_tree_is_validated_without_its_ignored_files_while_a_job_writes_there(package, tmp_path):
    """validate_local copies the files git does not ignore: a job writing into the git-ignored runs/ during the
    validation (as a README command does) does not make it fail with "package source changed"."""
    import threading

    repo = tmp_path / "repo"
    shutil.copytree(package, repo)
    (repo / ".gitignore").write_text("runs/\n")
    (repo / "runs").mkdir()
    (repo / "runs" / "old.txt").write_text("a job's output")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "package"], check=True)
    (repo / "NEW.md").write_text("untracked, not ignored: part of the package")
    files = validate_local.package_files(repo)
    assert "openenv.yaml" in files and "NEW.md" in files and ".gitignore" in files
    assert not any(name.startswith("runs/") for name in files)
    assert validate_local.package_files(package) is None  # not a git work tree: validated in place
    stop = threading.Event()

    def job() -> None:
        step = 0
        while not stop.is_set():
            (repo / "runs" / f"step{step % 3}.txt").write_text(str(step))
            step += 1
            stop.wait(0.05)

    writer = threading.Thread(target=job)
    writer.start()
    try:
        report = validate_local.validate(repo, "runtime", log_dir=tmp_path)
    finally:
        stop.set()
        writer.join()
    problems = [r for r in report.results if r.status.value in ("fail", "error")]
    assert not problems and report.verdict.value != "fail", problems
