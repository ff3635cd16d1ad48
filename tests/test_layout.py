"""The package layout: memenv in rooms (envs, search, scoring), the LLM stack in rooms (models, generation, records,
training, adapters) that import each other in one direction and never a floor above them, imports only down the
layers, no two modules that import each other (directly or round a longer circle), and names that are what they
say (``agents.llm.rollout`` is the function)."""

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


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph(root: Path) -> dict[str, dict[str, int]]:
    """module -> {project module it imports: first line}, for every import of the layers' packages, those inside
    functions included (a circle closed by a function-level import is still a circle). ``from a.b import c``
    counts as importing ``a.b.c`` when that is a module, else ``a.b``."""
    modules = {_module_name(root, path): path for package in LAYERS for path in sorted((root / package).rglob("*.py"))}

    def project_module(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, dict[str, int]] = {}
    for name, path in modules.items():
        edges: dict[str, int] = {}
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the package holding this module, up level - 1 packages
                    package = name.split(".")[:len(name.split(".")) - (path.name != "__init__.py")]
                    base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
                targets = [f"{base}.{alias.name}" for alias in node.names]
            else:
                continue
            for target in targets:
                found = project_module(target)
                if found is not None and found != name:
                    edges.setdefault(found, node.lineno)
        graph[name] = edges
    return graph


def _import_circles(graph: dict[str, dict[str, int]]) -> list[str]:
    """Every group of modules that reach each other through imports (a strongly connected component of two or
    more), each as ``a (line N) -> b (line M) -> ... -> a``: one circle through the group, with the line of each
    import."""
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(module: str) -> None:  # Tarjan's algorithm
        order[module] = low[module] = len(order)
        stack.append(module)
        for other in graph[module]:
            if other not in order:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], order[other])
        if low[module] == order[module]:
            group = []
            while not group or group[-1] != module:
                group.append(stack.pop())
            if len(group) > 1:
                groups.append(sorted(group))

    for module in sorted(graph):
        if module not in order:
            visit(module)
    return sorted(_circle_through(group, graph) for group in groups)


def _at(where: int | str) -> str:
    return f"line {where}" if isinstance(where, int) else where


def _circle_through(group: list[str], graph: dict[str, dict[str, int]]) -> str:
    """A shortest way from the group's first module back to itself, through the group, with the import lines."""
    start, members = group[0], set(group)
    paths, frontier = {start: [start]}, [start]
    while frontier:
        following = []
        for module in frontier:
            for other in sorted(graph[module]):
                if other == start:
                    path = paths[module] + [start]
                    return " -> ".join(f"{a} ({_at(graph[a][b])})" for a, b in zip(path, path[1:])) + f" -> {start}"
                if other in members and other not in paths:
                    paths[other] = paths[module] + [other]
                    following.append(other)
        frontier = following
    raise AssertionError(f"{group} is not a circle")


def test_no_import_circles():
    # Two modules that import each other (even inside a function) cannot be read, tested or moved alone: the
    # piece both need belongs in a module below them.
    assert _import_circles(_import_graph(ROOT)) == []


def test_the_checker_sees_an_import_circle(tmp_path, monkeypatch):
    # The test above would pass vacuously if the graph missed imports: plant circles (one closed inside a
    # function, one through a package's __init__ and a relative import, one of three) and see each caught.
    for package in LAYERS:
        (tmp_path / package).mkdir()
    (tmp_path / "tasks" / "a.py").write_text("import tasks.b\n")
    (tmp_path / "tasks" / "b.py").write_text("def f():\n    from tasks import a\n")
    (tmp_path / "memenv" / "__init__.py").write_text("from .c import X\n")
    (tmp_path / "memenv" / "c.py").write_text("import os\nfrom memenv import Y\n")
    (tmp_path / "agents" / "x.py").write_text("from agents import y\n")
    (tmp_path / "agents" / "y.py").write_text("import agents.z\n")
    (tmp_path / "agents" / "z.py").write_text("import agents.x as x\n")
    (tmp_path / "distill" / "alone.py").write_text("import tasks.a\nimport memenv.c\n")
    circles = _import_circles(_import_graph(tmp_path))
    assert circles == ["agents.x (line 1) -> agents.y (line 1) -> agents.z (line 1) -> agents.x",
                       "memenv (line 1) -> memenv.c (line 2) -> memenv",
                       "tasks.a (line 1) -> tasks.b (line 2) -> tasks.a"]


# agents/ by concern (issue 60): the LLM stack in sub-packages whose names say what they hold, each importing only
# those before it here (models <- generation <- records <- training; adapters on top), and nothing left on a floor
# above a room for the room to import back from.
LLM_SUBPACKAGES = ("models", "generation", "records", "training", "adapters")
# The scripted room likewise: the strategies and the bench that runs them, siblings (the bench reads the strategies
# from agents/scripted/strategies, not from a floor above it).
SCRIPTED_SUBPACKAGES = ("strategies", "bench")
# Imports that still run up a floor; may only shrink. Emptied when the strategies moved out of agents/scripted/ into
# their own room (issue 60).
STILL_UPWARD: set[str] = set()


def _is_package(root: Path, module: str) -> bool:
    return (root / module.replace(".", "/") / "__init__.py").exists()


def _floor(root: Path, module: str) -> str:
    """The package a module lives in (a package's ``__init__`` lives in the package itself)."""
    return module if _is_package(root, module) else module.rpartition(".")[0]


def _upward_floor_imports(root: Path, package: str = "agents") -> list[str]:
    """``module:line -> target`` for every import, inside ``package``, of a module that lives on a floor above the
    importer: in a package that holds the importer's own package (``agents.llm.training.sft`` importing
    ``agents.llm`` or a module directly in ``agents/``). A sibling sub-package is not a floor above."""
    graph = _import_graph(root)
    found = []
    for module, edges in sorted(graph.items()):
        if not module.startswith(package + "."):
            continue
        home = _floor(root, module)
        for target, line in sorted(edges.items()):
            floor = _floor(root, target)
            if home.startswith(floor + ".") and floor.startswith(package):
                found.append(f"{module}:{line} -> {target}")
    return found


def _subpackage_graph(root: Path, package: str) -> dict[str, dict[str, str]]:
    """sub-package -> {sub-package it imports: the first import that does, ``module line N``}, for the direct
    sub-packages of ``package`` (a module anywhere inside one counts for it)."""
    def sub(module: str) -> str | None:
        rest = module[len(package) + 1:].split(".") if module.startswith(package + ".") else []
        return f"{package}.{rest[0]}" if rest and _is_package(root, f"{package}.{rest[0]}") else None

    graph: dict[str, dict[str, str]] = {}
    for module, edges in sorted(_import_graph(root).items()):
        if (here := sub(module)) is None:
            continue
        graph.setdefault(here, {})
        for target, line in sorted(edges.items(), key=lambda item: item[1]):
            there = sub(target)
            if there is not None and there != here:
                graph[here].setdefault(there, f"{module} line {line}")
                graph.setdefault(there, {})
    return graph


def test_no_room_imports_from_a_floor_above_it():
    # A module in agents/llm/training may use agents/llm/models (a sibling room), never agents/llm/*.py or
    # agents/*.py: a floor above imports its rooms, so the reverse is a circle waiting to happen, and a room that
    # needs something from above cannot be read alone (the shared piece belongs in a room below, or in memenv).
    found = {line.split(":")[0] + " -> " + line.split(" -> ")[1] for line in _upward_floor_imports(ROOT)}
    assert found == STILL_UPWARD, sorted(found ^ STILL_UPWARD)


def test_the_llm_stack_is_in_rooms_with_nothing_on_the_floors_above():
    assert sorted(p.name for p in (ROOT / "agents" / "llm").iterdir() if p.suffix == ".py") == ["__init__.py"]
    assert sorted(p.name for p in (ROOT / "agents").iterdir() if p.suffix == ".py") == ["__init__.py"]
    rooms = {p.name for p in (ROOT / "agents" / "llm").iterdir() if (p / "__init__.py").exists()}
    assert rooms == set(LLM_SUBPACKAGES)


def test_the_scripted_room_holds_rooms_only():
    # agents/scripted/ has its __init__ (re-exports) and two rooms, the strategies below the bench that runs them.
    assert sorted(p.name for p in (ROOT / "agents" / "scripted").iterdir() if p.suffix == ".py") == ["__init__.py"]
    rooms = {p.name for p in (ROOT / "agents" / "scripted").iterdir() if (p / "__init__.py").exists()}
    assert rooms == set(SCRIPTED_SUBPACKAGES)
    graph = _subpackage_graph(ROOT, "agents.scripted")
    assert graph["agents.scripted.strategies"] == {}, graph  # the strategies never import the bench


def test_the_llm_rooms_import_each_other_in_one_direction():
    # models <- generation <- records <- training, adapters on top: no circle between the rooms, even where no
    # two modules form one (a circle of rooms means neither can be understood, tested or replaced without the
    # other). The order is also the one the rooms' docstrings and agents/llm/__init__.py give.
    graph = _subpackage_graph(ROOT, "agents.llm")
    assert _import_circles(graph) == []
    order = [f"agents.llm.{name}" for name in LLM_SUBPACKAGES]
    assert all(order.index(other) < order.index(room) for room, edges in graph.items() for other in edges), graph


@pytest.mark.parametrize("room", LLM_SUBPACKAGES)
def test_each_llm_room_says_what_lives_in_it(room):
    _says_what_lives_in_it("agents.llm", room)


def test_the_strategies_room_says_what_lives_in_it():
    _says_what_lives_in_it("agents.scripted", "strategies")


def _says_what_lives_in_it(package: str, room: str) -> None:
    folder = ROOT.joinpath(*package.split("."), room)
    doc = ast.get_docstring(ast.parse((folder / "__init__.py").read_text(encoding="utf-8")))
    assert doc and len(doc.split()) >= 30, f"{folder.relative_to(ROOT)}/__init__.py: a paragraph on what lives here"
    for path in sorted(folder.glob("*.py")):  # ... and names every module it holds
        assert path.name == "__init__.py" or f"{package}.{room}.{path.stem}`" in doc, (room, path.name)


def test_the_room_checkers_see_an_upward_import_and_a_circle_of_rooms(tmp_path):
    # The tests above would pass vacuously if the checkers missed imports: plant an import of each floor above
    # (absolute, relative, inside a function), a sibling import that is allowed, and a circle of two rooms that no
    # two modules form.
    for folder in ("distill", "memenv", "tasks", "agents/llm/a", "agents/llm/b"):
        (tmp_path / folder).mkdir(parents=True)
        if folder.startswith("agents"):
            for level in range(2, folder.count("/") + 2):
                (tmp_path / "/".join(folder.split("/")[:level]) / "__init__.py").write_text("")
    (tmp_path / "agents" / "files.py").write_text("")
    (tmp_path / "agents" / "llm" / "flat.py").write_text("")
    (tmp_path / "agents" / "llm" / "a" / "x.py").write_text(
        "import agents.files\nfrom agents.llm.b import y\nfrom .. import flat\n"
        "def f():\n    from agents.llm import rollout\n")
    (tmp_path / "agents" / "llm" / "a" / "w.py").write_text("")
    (tmp_path / "agents" / "llm" / "b" / "y.py").write_text("")
    (tmp_path / "agents" / "llm" / "b" / "z.py").write_text("from agents.llm.a import w\n")
    assert _upward_floor_imports(tmp_path) == ["agents.llm.a.x:1 -> agents.files", "agents.llm.a.x:5 -> agents.llm",
                                               "agents.llm.a.x:3 -> agents.llm.flat"]
    assert _import_circles(_import_graph(tmp_path)) == []  # no two modules import each other ...
    assert _import_circles(_subpackage_graph(tmp_path, "agents.llm")) == [  # ... but the rooms do
        "agents.llm.a (agents.llm.a.x line 2) -> agents.llm.b (agents.llm.b.z line 1) -> agents.llm.a"]


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
    code = ("import agents.llm.records.rollouts, inspect\nfrom agents.llm import rollout, records_of\n"
            "assert inspect.isfunction(rollout) and inspect.isfunction(records_of), (rollout, records_of)\n"
            "print(rollout.__module__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "agents.llm.records.rollouts"


def test_old_flat_module_paths_are_gone():
    # One name per thing: the flat modules moved into rooms, no second copy left behind.
    for old in ("base", "memqa", "memread", "memdialog", "beam", "index", "remote", "http", "beam_scoring"):
        assert not (ROOT / "memenv" / f"{old}.py").exists(), old
    assert inspect.ismodule(importlib.import_module("memenv.search"))


# Sizes a reader can hold: no module over ~600 lines outside tests and benchmarks, no trainer function over ~80
# (issue 49). The limits carry a margin over the round figures, so that a docstring growing by a line is not a
# failure; what is over them today is named below and may only shrink.
MAX_MODULE_LINES = 650
MAX_TRAINER_FUNCTION_LINES = 90
TRAINER_MODULES = ("agents/llm/training/ppo.py", "agents/llm/training/ppo_update.py", "agents/llm/training/actor.py",
                   "agents/llm/training/advantages.py", "agents/llm/training/sft.py", "agents/llm/training/common.py",
                   "agents/llm/adapters/trl.py", "agents/llm/adapters/verl.py",
                   "distill/trainer.py", "distill/trl.py")
# Over the limits today, to be split (then removed here); may only shrink. Issue 49's item 2 emptied it (train_rl
# as a loop of named steps, train_sft likewise).
STILL_TOO_LONG: set[str] = set()


def _long_modules(root: Path, limit: int) -> set[str]:
    found = set()
    for package in LAYERS:
        for path in (root / package).rglob("*.py"):
            if len(path.read_text(encoding="utf-8").splitlines()) > limit:
                found.add(str(path.relative_to(root)))
    return found


def _long_functions(root: Path, modules: tuple[str, ...], limit: int) -> set[str]:
    found = set()
    for name in modules:
        path = root / name
        if not path.exists():
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > limit:
                found.add(f"{name}:{node.name}")
    return found


def test_no_module_is_too_long_to_read():
    assert _long_modules(ROOT, MAX_MODULE_LINES) == {m for m in STILL_TOO_LONG if ":" not in m}


def test_no_trainer_function_is_too_long_to_read():
    assert _long_functions(ROOT, TRAINER_MODULES, MAX_TRAINER_FUNCTION_LINES) == {m for m in STILL_TOO_LONG
                                                                                  if ":" in m}


def test_the_size_checkers_see_a_long_module_and_a_long_function(tmp_path):
    (tmp_path / "agents").mkdir()
    (tmp_path / "agents" / "big.py").write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    body = "\n".join(f"    y{i} = {i}" for i in range(MAX_TRAINER_FUNCTION_LINES))  # one line over, with the def
    (tmp_path / "agents" / "trainer.py").write_text(f"def short():\n    pass\n\n\nasync def long():\n{body}\n")
    assert _long_modules(tmp_path, MAX_MODULE_LINES) == {"agents/big.py"}
    assert _long_functions(tmp_path, ("agents/trainer.py",), MAX_TRAINER_FUNCTION_LINES) == {"agents/trainer.py:long"}
