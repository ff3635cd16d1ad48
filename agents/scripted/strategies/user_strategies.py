"""Your own memory strategy in ``memenv bench``, without editing memenv: ``--strategies my_module:MyStrategy`` (an
importable module, or a ``path/to/file.py``, then ``:`` and a class or factory), or a name an installed package
registers in the entry-point group ``memenv.strategies``.

A strategy is an object with

- ``act(observation: str) -> str``: the next action text (the env's protocol: ``<memory>...</memory>`` then one
  ``<search>``/``<answer>`` tag, or the memory-tool calls of ``memory_mode="tools"``; docs/design.md);
- optionally ``reset(env)``: called before each episode with the unwrapped env (its seed is the episode's;
  ``env.np_random`` for randomness);
- optionally ``context`` (the env's context mode it is meant for, default ``"memory"``), ``env_kwargs`` (a dict of
  env arguments the bench makes its env with, before the spec's own), ``name``, and ``act_timeout`` (seconds one
  ``act`` or ``reset`` may take, default :data:`DEFAULT_ACT_TIMEOUT`).

The class (or factory) is called with no arguments, once per bench cell. A strategy whose ``act`` raises or returns
something other than a string fails that episode with one line naming the strategy (:class:`StrategyError`; the
bench records it and keeps the other cells). One that does not return within its ``act_timeout`` fails that episode
the same way, and every later episode of its cell at once: its call cannot be stopped from outside (it runs on a
daemon thread, left behind), so the strategy is not called again. One that cannot be imported or made is refused
before the bench starts.
docs/bench.md ("Benchmark your own strategy") has a 20-line example.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
import threading
from pathlib import Path
from typing import Any, Callable

#: The entry-point group installed packages register strategies in (``name = "package.module:Class"``).
ENTRY_POINT_GROUP = "memenv.strategies"
#: Seconds one ``act`` or ``reset`` of a user's strategy may take before its cell is failed (its ``act_timeout``).
DEFAULT_ACT_TIMEOUT = 60.0
_IMPORT_PATH = re.compile(r"(?P<module>[\w.\\/-]+?(?:\.py)?):(?P<attr>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)")


class StrategyError(RuntimeError):
    """A user strategy failed one episode: it raised, or returned something other than the action text."""


def is_import_path(name: str) -> bool:
    """Whether ``name`` reads as ``module:Attr`` or ``file.py:Attr`` (not ``openai:MODEL@URL``, not a URL)."""
    return bool(_IMPORT_PATH.fullmatch(name)) and not name.startswith(("openai:", "http:", "https:"))


def entry_point_names() -> dict[str, Any]:
    """The strategies installed packages register (:data:`ENTRY_POINT_GROUP`): name -> entry point."""
    from importlib.metadata import entry_points

    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def load_factory(name: str) -> Callable[[], Any]:
    """The class or factory ``name`` names (an import path, or an entry point's name). A ``ValueError`` in one line
    naming it where it cannot be imported, lacks the attribute, or is not callable."""
    registered = entry_point_names()
    try:
        if name in registered:
            target = registered[name].load()
        else:
            match = _IMPORT_PATH.fullmatch(name)
            if match is None:
                raise ValueError(f"{name!r} is not module:Class, file.py:Class or an installed strategy")
            module_name, attr = match["module"], match["attr"]
            if module_name.endswith(".py") or "/" in module_name:
                path = Path(module_name)
                if not path.is_file():
                    raise ValueError(f"no such file {module_name}")
                spec = importlib.util.spec_from_file_location(f"memenv_user_strategy_{path.stem}", path)
                module = importlib.util.module_from_spec(spec)
                sys.modules[spec.name] = module
                spec.loader.exec_module(module)
            else:
                module = importlib.import_module(module_name)
            target = module
            for part in attr.split("."):
                target = getattr(target, part)
    except ValueError as exc:
        raise ValueError(f"strategy {name}: {exc}") from None
    except Exception as exc:  # an import error, or anything the user's module raises while it is imported
        raise ValueError(f"strategy {name}: cannot import it ({type(exc).__name__}: {exc})") from None
    if not callable(target):
        raise ValueError(f"strategy {name}: not a class or factory (a {type(target).__name__})")
    return target


def make_user_strategy(name: str) -> "UserStrategy":
    """A new instance of the strategy ``name`` (:func:`load_factory`), checked to have ``act``."""
    factory = load_factory(name)
    try:
        policy = factory()
    except Exception as exc:
        raise ValueError(f"strategy {name}: calling it with no arguments failed ({type(exc).__name__}: {exc})") \
            from None
    if not callable(getattr(policy, "act", None)):
        raise ValueError(f"strategy {name}: its object has no act(observation) method")
    return UserStrategy(policy, name)


class UserStrategy:
    """A user's strategy as the bench runs it: ``act`` checked (a string, or :class:`StrategyError` naming it), each
    call bounded by the strategy's ``act_timeout``."""

    def __init__(self, policy: Any, name: str) -> None:
        self.policy, self.name = policy, name
        self.context = getattr(policy, "context", "memory")
        self.env_kwargs = dict(getattr(policy, "env_kwargs", {}) or {})
        timeout = getattr(policy, "act_timeout", DEFAULT_ACT_TIMEOUT)
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
            raise ValueError(f"strategy {name}: act_timeout must be a positive number of seconds, got {timeout!r}")
        self.act_timeout = float(timeout)
        self.hung: str | None = None  # the call that did not return: the strategy is not called again

    def _call(self, method: str, argument: Any) -> Any:
        """``policy.<method>(argument)`` on a daemon thread, waited for ``act_timeout`` seconds."""
        if self.hung is not None:
            raise StrategyError(f"strategy {self.name}: not called again, its {self.hung} did not return within "
                                f"{self.act_timeout:g} s")
        result: dict[str, Any] = {}

        def target() -> None:
            try:
                result["value"] = getattr(self.policy, method)(argument)
            except BaseException as exc:  # reported on the caller's thread below
                result["error"] = exc

        worker = threading.Thread(target=target, name=f"strategy {self.name}", daemon=True)
        worker.start()
        worker.join(self.act_timeout)
        if worker.is_alive():
            self.hung = method
            raise StrategyError(f"strategy {self.name}: {method} did not return within {self.act_timeout:g} s "
                                "(act_timeout); its later episodes fail at once")
        if "error" in result:
            exc = result["error"]
            if not isinstance(exc, Exception):  # KeyboardInterrupt, SystemExit: not the strategy's failure to name
                raise exc
            raise StrategyError(f"strategy {self.name}: {method} raised {type(exc).__name__}: {exc}") from None
        return result.get("value")

    def reset(self, env: Any = None) -> None:
        if callable(getattr(self.policy, "reset", None)):
            self._call("reset", env)

    def act(self, observation: str) -> str:
        action = self._call("act", observation)
        if not isinstance(action, str):
            raise StrategyError(f"strategy {self.name}: act returned a {type(action).__name__}, not the action text "
                                "(a string)")
        return action


__all__ = ["DEFAULT_ACT_TIMEOUT", "ENTRY_POINT_GROUP", "StrategyError", "is_import_path", "entry_point_names", "load_factory",
           "make_user_strategy", "UserStrategy"]
