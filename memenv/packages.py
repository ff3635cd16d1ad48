"""The top-level packages memenv installs beside itself, and a one-line error when another one takes a name.

memenv's distribution installs four top-level packages: ``memenv``, ``tasks``, ``agents`` and ``distill``.
Another distribution may install a top-level package of the same name: openai-agents installs ``agents``. In
one Python environment only one of the two can be imported; the other is shadowed, and the code that needed it
fails far from the cause (``No module named 'agents.scripted'``, or ``cannot import name 'Agent'``).

:func:`check_packages` finds what ``import NAME`` would give for each of memenv's names, without importing it,
and raises :class:`PackageClashError` with one line naming the package that shadows memenv's (its path and
distribution) and what to do. ``import memenv`` checks ``tasks`` (its envs need it), the ``memenv`` command
checks ``agents`` and ``distill`` (``memenv._check_agents_package``) before it loads their commands; the envs
work beside another ``agents``. :func:`shadowed_by_ours` serves the reverse case (memenv's ``agents`` hides
another one), for ``agents``' module ``__getattr__``.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
from pathlib import Path

__all__ = ["OUR_PACKAGES", "PackageClashError", "check_packages", "clash_lines", "shadowed_by_ours"]

#: memenv's top-level packages besides ``memenv`` itself.
OUR_PACKAGES = ("tasks", "agents", "distill")
_ROOT = Path(__file__).resolve().parent.parent  # the folder that holds memenv/ and its sibling packages
_VENV = "python -m venv .venv-memenv && . .venv-memenv/bin/activate && pip install memenv (or -e . from a clone)"


class PackageClashError(ImportError):
    """Another top-level package shadows one of memenv's (the message is one line)."""


def _origin(name: str) -> str | None:
    """The ``__init__.py`` that ``import name`` gives (imported or not), or None when there is none."""
    module = sys.modules.get(name)
    if module is not None:
        return getattr(module, "__file__", None) or "a namespace package (no __init__.py)"
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):  # a broken entry in sys.modules or on the path: not ours to judge
        return None
    if spec is None:
        return None
    return spec.origin if spec.origin not in (None, "namespace") else "a namespace package (no __init__.py)"


# How memenv's own __init__.py of a package begins, where another distribution installed into the same folder
# (pip puts every top-level ``agents`` in site-packages/agents) may have overwritten it.
_MARKERS = {"agents": '"""Agents for memenv'}


def _is_ours(origin: str, name: str) -> bool:
    try:
        if Path(origin).resolve().parent != (_ROOT / name).resolve():
            return False
        marker = _MARKERS.get(name)
        if marker is None:
            return True
        with open(origin, encoding="utf-8", errors="replace") as f:
            return f.read(len(marker)) == marker
    except (OSError, ValueError):
        return False


@functools.lru_cache(maxsize=None)
def _distributions(name: str) -> tuple[str, ...]:
    """The installed distributions, other than memenv, that provide a top-level ``name``."""
    try:
        from importlib.metadata import packages_distributions

        return tuple(sorted({d for d in packages_distributions().get(name, []) if d.lower() != "memenv"}))
    except Exception:  # noqa: BLE001 - broken metadata of another distribution must not hide the clash itself
        return ()


def clash_lines(names: tuple[str, ...] = OUR_PACKAGES) -> list[str]:
    """One line per name of ``names`` that ``import`` resolves to another package than memenv's."""
    lines = []
    for name in names:
        origin = _origin(name)
        if origin is None or _is_ours(origin, name):
            continue
        where = os.path.dirname(origin) if origin.endswith("__init__.py") else origin
        dists = _distributions(name)
        if dists:
            lines.append(f"the top-level package {name!r} imported here is {where} (installed by "
                         f"{', '.join(dists)}), not memenv's: both install a package {name!r}, so they cannot "
                         f"share one Python environment; install memenv in a virtual environment of its own: "
                         f"{_VENV}")
        else:
            lines.append(f"the top-level package {name!r} imported here is {where}, not memenv's (at "
                         f"{_ROOT / name}): it comes first on sys.path; rename it or run from another "
                         f"directory, or install memenv in a virtual environment of its own: {_VENV}")
    return lines


def check_packages(names: tuple[str, ...] = OUR_PACKAGES) -> None:
    """Raise :class:`PackageClashError` (one line) when a package of ``names`` is not memenv's."""
    lines = clash_lines(names)
    if lines:
        raise PackageClashError(lines[0] if len(lines) == 1 else "; and ".join(lines))


def shadowed_by_ours(name: str, attribute: str) -> str | None:
    """For memenv's package ``name`` asked for a missing ``attribute``: the line saying that another installed
    distribution provides a top-level ``name`` which memenv's hides (``from agents import Agent`` of
    openai-agents), or None. Cheap when nothing clashes: it reads metadata only on a missing attribute."""
    if attribute.startswith("_") or importlib.util.find_spec(f"{name}.{attribute}") is not None:
        return None
    dists = _distributions(name)
    if not dists:
        return None
    return (f"{name}.{attribute}: the top-level package {name!r} here is memenv's ({_ROOT / name}), and "
            f"{', '.join(dists)} installs a package {name!r} too, which memenv's hides: the two cannot share one "
            f"Python environment; use a virtual environment for each")
