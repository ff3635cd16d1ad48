"""memenv's top-level packages (agents, tasks, distill) clashing with another distribution's: one line that says
what clashes and what to do, in both directions (a foreign ``agents`` hiding memenv's, memenv's hiding it)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import memenv
from memenv.packages import PackageClashError, check_packages, clash_lines

ROOT = Path(__file__).resolve().parents[1]


def _foreign_agents(root: Path, *, distribution: bool = True) -> Path:
    """A stand-in for openai-agents: a top-level ``agents`` package with ``Agent``, and (``distribution``) the
    metadata of an installed distribution ``fake-openai-agents`` that provides it."""
    (root / "agents").mkdir(parents=True)
    (root / "agents" / "__init__.py").write_text("class Agent:\n    pass\n")
    if distribution:
        info = root / "fake_openai_agents-0.1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-openai-agents\nVersion: 0.1.0\n")
        (info / "top_level.txt").write_text("agents\n")
        (info / "RECORD").write_text("agents/__init__.py,,\n")
    return root


def _run(code: str, path: list[Path], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, path))}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=cwd, timeout=120)


def test_nothing_clashes_here() -> None:
    assert clash_lines() == []
    check_packages()
    memenv._check_agents_package()


def test_a_foreign_agents_in_sys_modules_is_one_line_naming_it(tmp_path, monkeypatch) -> None:
    foreign = _foreign_agents(tmp_path, distribution=False)
    monkeypatch.syspath_prepend(str(foreign))
    for name in [n for n in sys.modules if n == "agents" or n.startswith("agents.")]:
        monkeypatch.delitem(sys.modules, name)
    with pytest.raises(PackageClashError) as err:
        memenv._check_agents_package()
    message = str(err.value)
    assert "\n" not in message
    assert f"'agents' imported here is {foreign / 'agents'}" in message and "not memenv's" in message
    assert "rename it or run from another directory" in message and "virtual environment" in message


def test_an_agents_overwritten_in_place_is_a_clash(tmp_path, monkeypatch) -> None:
    """Installed (not editable), memenv's agents and another distribution's share site-packages/agents: the one
    installed last wrote __init__.py. In memenv's place but without its first line, it is a clash."""
    import memenv.packages as packages

    site = _foreign_agents(tmp_path, distribution=False)
    monkeypatch.setattr(packages, "_ROOT", site)
    monkeypatch.setattr(packages, "_origin", lambda name: str(site / name / "__init__.py"))
    assert len(clash_lines(("agents",))) == 1
    (site / "agents" / "__init__.py").write_text((ROOT / "agents" / "__init__.py").read_text())
    assert clash_lines(("agents",)) == []


def test_cli_and_import_memenv_say_which_distribution_shadows_agents(tmp_path) -> None:
    """An installed distribution with a top-level ``agents`` first on the path (as site-packages comes before
    memenv's editable finder): the ``memenv`` command stops with one line and exit 2 naming the distribution
    and the way out; the envs, which need no ``agents``, and the other distribution's code still work."""
    foreign = _foreign_agents(tmp_path / "site")
    run = _run("from memenv.cli import main; raise SystemExit(main(['bench', '--help']))", [foreign, ROOT], tmp_path)
    assert run.returncode == 2, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("memenv: error: the top-level package 'agents' imported here is ")
    assert "(installed by fake-openai-agents), not memenv's" in lines[0]
    assert "cannot share one Python environment" in lines[0] and "python -m venv" in lines[0]
    run = _run("import warnings; warnings.simplefilter('error')\nimport gymnasium as gym, memenv\n"
               "gym.make('MemQA-v0').reset(seed=0)\nfrom agents import Agent\nprint('both work')", [foreign, ROOT], tmp_path)
    assert run.stdout.strip() == "both work", run.stderr  # the envs need no agents; the other's code works


def test_another_tasks_first_on_the_path_stops_import_memenv_with_one_line(tmp_path) -> None:
    """A ``tasks.py`` of the user's (invoke's task file, say) in the folder Python starts in hides memenv's
    ``tasks``, which the envs import: ``import memenv`` fails with one line naming it."""
    (tmp_path / "tasks.py").write_text("def build(c):\n    pass\n")
    run = _run("import sys; sys.path.insert(0, '')\nimport memenv", [ROOT], tmp_path)
    assert run.returncode == 1
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith(f"memenv.packages.PackageClashError: the top-level package 'tasks' imported here is "
                           f"{tmp_path / 'tasks.py'}, not memenv's (at {ROOT / 'tasks'})")
    assert "rename it or run from another directory" in last


def test_memenvs_agents_hiding_another_says_so_on_a_missing_name(tmp_path) -> None:
    """The other way round: memenv's ``agents`` first, the foreign distribution's behind it. memenv works;
    ``from agents import Agent`` (meant for the other) is one line naming both and what to do."""
    foreign = _foreign_agents(tmp_path / "site")
    run = _run("import agents, pickle\nfrom agents import scripted, make_strategy\n"
               "print('ours', hasattr(agents, '_x'), hasattr(agents, 'Agent'), len(pickle.dumps(make_strategy)) > 0)\n"
               "try:\n    agents.Runner\nexcept AttributeError as e:\n    print(e)\n"
               "from agents import Agent", [ROOT, foreign], tmp_path)
    out = run.stdout.strip().splitlines()
    assert out[0] == "ours False False True", run.stderr
    assert out[1].startswith("agents.Runner: the top-level package 'agents' here is memenv's")
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("memenv.packages.PackageClashError: agents.Agent: the top-level package 'agents' here "
                           "is memenv's")
    assert "fake-openai-agents installs a package 'agents' too" in last and "virtual environment" in last


def test_a_missing_name_of_agents_without_a_clash_is_a_plain_attribute_error() -> None:
    import agents

    with pytest.raises(AttributeError, match="module 'agents' has no attribute 'Agent'"):
        agents.Agent  # noqa: B018
    assert not hasattr(agents, "no_such_thing")
