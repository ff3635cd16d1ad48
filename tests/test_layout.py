"""The package layout: memenv in rooms (envs, search, scoring), imports only down the layers, and names that are
what they say (``agents.llm.rollout`` is the function)."""

from __future__ import annotations

import ast
import importlib
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Layer order: a package may import itself and anything to its right, never to its left.
LAYERS = ("distill", "agents", "memenv", "tasks")


def _imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, module) for every absolute import in a file, including those inside functions."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
    return found


def _upward_imports(package: str, forbidden: tuple[str, ...]) -> list[str]:
    bad = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for line, module in _imported_modules(path):
            if module.split(".")[0] in forbidden or any(module.startswith(f + ".") or module == f for f in forbidden):
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    return bad


@pytest.mark.parametrize("position", range(1, len(LAYERS)))
def test_imports_only_go_down_the_layers(position):
    package, above = LAYERS[position], LAYERS[:position]
    assert _upward_imports(package, above) == []


def test_search_and_scoring_rooms_need_no_environment():
    # The envs are built on search and scoring; the reverse would make a cycle (and load every env to score).
    assert _upward_imports("memenv/search", ("memenv.envs",)) == []
    assert _upward_imports("memenv/scoring", ("memenv.envs",)) == []


def test_the_checker_sees_an_upward_import(tmp_path, monkeypatch):
    # The test above would pass vacuously if the parser missed imports: plant one and see it caught.
    fake = tmp_path / "tasks"
    fake.mkdir()
    (fake / "x.py").write_text("def f():\n    from agents.llm import rollout\n    import memenv.envs.memqa\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert _upward_imports("tasks", ("agents", "memenv")) == ["tasks/x.py:2 imports agents.llm",
                                                             "tasks/x.py:3 imports memenv.envs.memqa"]


@pytest.mark.parametrize("room, modules", [
    ("memenv.envs", ("base", "memqa", "memread", "memdialog", "beam")),
    ("memenv.search", ("bm25", "index", "remote", "http")),
    ("memenv.scoring", ("qa", "beam", "judges")),
])
def test_memenv_rooms(room, modules):
    package = importlib.import_module(room)
    assert Path(package.__file__).name == "__init__.py"
    for name in modules:
        importlib.import_module(f"{room}.{name}")


def test_registered_entry_points_live_in_the_envs_room():
    from memenv.registration import ENVIRONMENTS

    assert {entry.split(":")[0].rsplit(".", 1)[0] for entry, _ in ENVIRONMENTS.values()} == {"memenv.envs"}


def test_rollout_is_the_function_even_after_its_module_is_imported():
    # A fresh interpreter: the module import must not replace the package attribute with the module.
    code = ("import agents.llm.rollouts, inspect\nfrom agents.llm import rollout, records_of\n"
            "assert inspect.isfunction(rollout) and inspect.isfunction(records_of), (rollout, records_of)\n"
            "print(rollout.__module__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "agents.llm.rollouts"


def test_old_flat_module_paths_are_gone():
    # One name per thing: the flat modules moved into rooms, no second copy left behind.
    for old in ("base", "memqa", "memread", "memdialog", "beam", "index", "remote", "http", "beam_scoring"):
        assert not (ROOT / "memenv" / f"{old}.py").exists(), old
    assert inspect.ismodule(importlib.import_module("memenv.search"))
