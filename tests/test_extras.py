"""Each extra of pyproject.toml carries what its features import: the requirement set an extra resolves to
(its own requirements, memenv[...] references followed, then every distribution's own requirements as installed
here) must hold the distributions of the modules its features need. A dependency missing from an extra (the
``real`` extra once lacked accelerate, which transformers needs to load a GGUF file) fails here, not in a
newcomer's first ``memenv models prepare``."""

from __future__ import annotations

import functools
import importlib.metadata as metadata
import re
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]

# extra -> modules its features import (beyond the base dependencies), and why
NEEDS = {
    "llm": {"torch", "transformers", "tokenizers", "peft"},  # agents.llm: models, tokenizers, trainers, adapters
    "real": {"gguf", "accelerate", "transformers", "torch"},  # memenv models prepare: transformers reads the GGUF
                                                            # through gguf and refuses without accelerate
    "trl": {"trl", "transformers", "torch"},               # agents.llm.adapters.trl, distill.trl
    "sb3": {"stable_baselines3", "sb3_contrib"},           # examples/sb3_ppo.py, memenv.wrappers with SB3
    "openenv": {"openenv"},                                # memenv serve, memenv.openenv
    "bench": {"bm25s"},                                    # benchmarks/search_speed.py
    "exchange": {"tinker"},                                # agents.llm.records.exchange: real tinker.Datum rows
    "gem": {"gem", "requests"},                            # memenv.hubs.gem (GEM's wrapper factory needs requests)
    "skyrl": {"skyrl_gym"},                                # memenv.hubs.skyrl
    "test": {"pytest", "xdist", "hypothesis", "torch", "transformers", "gguf", "accelerate", "stable_baselines3",
             "openenv", "tinker", "skyrl_gym"},
}


def _pyproject() -> dict:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def _applies(req: Requirement, extras: set[str]) -> bool:
    if req.marker is None:
        return True
    return any(req.marker.evaluate({"extra": extra}) for extra in (extras or {""}))


def own_requirements(extra: str) -> list[Requirement]:
    """The requirements ``memenv[extra]`` adds, memenv[...] references followed (from this checkout's pyproject)."""
    project = _pyproject()
    groups, seen, out = [extra], set(), []
    while groups:
        group = groups.pop()
        if group in seen:
            continue
        seen.add(group)
        if group not in project["optional-dependencies"]:
            raise AssertionError(f"memenv[{group}] is referenced but pyproject.toml has no such extra")
        for text in project["optional-dependencies"][group]:
            req = Requirement(text)
            if canonicalize_name(req.name) == "memenv":
                groups += sorted(req.extras)
            elif _applies(req, set()):
                out.append(req)
    return out


def closure(requirements: list[Requirement]) -> set[str]:
    """Canonical names of ``requirements`` and of every distribution they pull in, as the installed
    distributions declare their own requirements (one not installed here ends its branch)."""
    todo = [(req, set(req.extras)) for req in requirements]
    names: set[str] = set()
    while todo:
        req, extras = todo.pop()
        name = canonicalize_name(req.name)
        if name in names:
            continue
        names.add(name)
        try:
            requires = metadata.requires(req.name) or []
        except metadata.PackageNotFoundError:
            continue
        for text in requires:
            sub = Requirement(text)
            if _applies(sub, extras):
                todo.append((sub, set(sub.extras)))
    return names


def resolved(extra: str) -> set[str]:
    """Every distribution ``memenv[extra]`` pulls in: the base dependencies, the extra's own, and theirs."""
    return closure([Requirement(text) for text in _pyproject()["dependencies"]] + own_requirements(extra))


@functools.lru_cache(maxsize=1)
def _module_owners() -> dict[str, list[str]]:
    return metadata.packages_distributions()


def _distributions(module: str) -> set[str]:
    return {canonicalize_name(d) for d in _module_owners().get(module, [])}


def test_every_extra_is_checked():
    assert set(_pyproject()["optional-dependencies"]) == set(NEEDS)


@pytest.mark.parametrize("extra", sorted(NEEDS))
def test_an_extra_resolves_to_what_its_features_import(extra):
    names = resolved(extra)
    missing = []
    for module in sorted(NEEDS[extra]):
        dists = _distributions(module)
        if not dists:
            pytest.skip(f"{module} is not installed here, so its distribution is unknown")
        if not dists & names:
            missing.append(f"{module} (from {', '.join(sorted(dists))})")
    assert not missing, f"memenv[{extra}] does not pull in {', '.join(missing)}"


@pytest.mark.parametrize("extra", sorted(NEEDS))
def test_the_installed_versions_meet_the_extras_requirements(extra):
    """What the test environment installed satisfies each requirement the extra states (a raised minimum that
    the locked environment does not meet shows here)."""
    wrong = []
    for req in own_requirements(extra):
        try:
            have = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            continue
        if req.specifier and not req.specifier.contains(have, prereleases=True):
            wrong.append(f"{req.name} {have} (memenv[{extra}] asks {req.specifier})")
    assert not wrong, "; ".join(wrong)


def test_the_check_sees_a_missing_dependency():
    """Without gguf in ``real``, the resolution above would not find it: nothing else pulls it in. (accelerate,
    the example of the module doc, now also comes through ``llm``'s peft.)"""
    project = _pyproject()
    assert any(re.match(r"gguf\b", text) for text in project["optional-dependencies"]["real"])
    without = [Requirement(t) for t in project["dependencies"] + project["optional-dependencies"]["llm"]]
    assert "gguf" not in closure(without)
