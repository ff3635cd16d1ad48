"""What a bench runs: env specs (``ID:key=value,...``) and strategies by name (scripted, served, a
checkpoint), and the kwargs an env is made with."""

from __future__ import annotations

import argparse
import ast
import functools
import inspect
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym

import memenv  # noqa: F401 - registers the environments
from agents.scripted.strategies.qa_strategies import STRATEGY_FAMILIES, env_family, make_strategy
from agents.scripted.strategies.text_strategies import is_text_served, make_text_strategy
from agents.scripted.strategies.user_strategies import (entry_point_names, is_import_path, load_factory,
                                                       make_user_strategy)
from agents.llm.adapters.served import ServedPolicy, ServedSpec, is_served
from memenv.cli_common import CommandError


DEFAULT_ENVS = ("MemQA-v0", "MemQA-v0:objectives=8,hops=3", "MemQA-v0:objectives=16,context_budget=800")
DEFAULT_EPISODES = 30
# every scripted strategy name of any env family (MemQA's first; MemDialog-BEAM adds tool strategies such as rag)
ALL_STRATEGY_NAMES = tuple(dict.fromkeys(name for family in STRATEGY_FAMILIES.values() for name in family))

@dataclass(frozen=True)
class EnvSpec:
    env_id: str
    kwargs: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, spec: str) -> "EnvSpec":
        env_id, _, rest = spec.partition(":")
        kwargs: dict[str, Any] = {}
        for item in filter(None, (part.strip() for part in split_top_level(rest))):
            if "=" not in item:
                raise ValueError(f"bad env spec {spec!r}: {item!r} is not key=value")
            key, value = item.split("=", 1)
            try:
                kwargs[key.strip()] = ast.literal_eval(value.strip())
            except (ValueError, SyntaxError):
                kwargs[key.strip()] = value.strip()
        if env_id not in gym.registry:
            raise ValueError(f"unknown environment {env_id!r} in spec {spec!r}; registered memenv envs: "
                             + ", ".join(k for k in gym.registry if k.startswith("Mem")))
        return cls(env_id, kwargs)

    @property
    def label(self) -> str:
        return self.env_id + ("" if not self.kwargs else ":" + ",".join(f"{k}={v}" for k, v in self.kwargs.items()))


def split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside brackets (so ``hops=(1,2)`` stays one item)."""
    parts, depth, current = [], 0, ""
    for char in text:
        depth += char in "([{"
        depth -= char in ")]}"
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    return parts + [current]

def is_model_path(name: str) -> bool:
    """A local checkpoint folder (``config.json`` inside) or a registered pretrained model
    (:mod:`agents.llm.models.pretrained`, e.g. ``smollm2-135m-instruct``): run as a greedy LLM policy."""
    from agents.llm.models.pretrained import is_registered

    return (Path(name) / "config.json").is_file() or is_registered(name)


def resolve_strategy(name: str, env_id: str, memory_mode: str | None = None):
    """A strategy by name: a scripted one (:func:`make_strategy`, for ``env_id`` in ``memory_mode``), a served
    model ``openai:MODEL@URL`` (:class:`agents.llm.adapters.served.ServedPolicy`) or a local checkpoint folder
    (:class:`agents.llm.adapters.bench_strategy.CheckpointStrategy`; needs the ``llm`` extra)."""
    if is_model_path(name):  # a folder by its absolute path; a registered model name as it is
        return _checkpoint_strategy(str(Path(name).resolve()) if Path(name).exists() else name)
    if name not in ALL_STRATEGY_NAMES and (is_import_path(name) or name in entry_point_names()):
        try:  # the user's own strategy (agents.scripted.strategies.user_strategies)
            return make_user_strategy(name)
        except ValueError as exc:
            raise CommandError(str(exc)) from None
    if is_text_served(name):  # a real-text dialog strategy with a served model: KIND+openai:MODEL@URL
        return make_text_strategy(name, env_family(env_id, memory_mode))
    return ServedPolicy(name) if is_served(name) else make_strategy(name, env_id, memory_mode)


@functools.lru_cache(maxsize=8)
def _checkpoint_strategy(path: str):
    """One loaded checkpoint per folder: the set-up check, the pre-run check and every env of the run share it
    (it is greedy and resets per episode), so the weights are read once."""
    try:  # optional dependency: torch/transformers only when a model is benchmarked
        from agents.llm.adapters.bench_strategy import CheckpointStrategy
    except ImportError as err:
        raise CommandError(f"--strategies {path}: a model checkpoint needs the LLM stack "
                           f"(pip install -e '.[llm]'): {err}") from err
    from agents.llm.models.pretrained import check_checkpoint

    check_checkpoint(path, "--strategies")  # a damaged folder is one line, before its weights are read
    return CheckpointStrategy(path)


@functools.lru_cache(maxsize=None)
def env_accepts(env_id: str, kwarg: str) -> bool:
    """Whether the env ``env_id``'s constructor takes the keyword ``kwarg``."""
    creator = gym.envs.registration.load_env_creator(gym.spec(env_id).entry_point)
    return kwarg in inspect.signature(creator).parameters


def bench_env_kwargs(spec: EnvSpec, policy) -> dict[str, Any]:
    """The kwargs the bench makes ``spec``'s env with: the policy's context and env kwargs, then the spec's.

    The bench reads only the episode summary's scores and counters, never its snapshots, so envs that take
    ``keep_snapshots`` get ``False`` unless the spec sets it (a 10M-token BEAM chat would keep gigabytes).
    """
    kwargs = {"context": policy.context, **getattr(policy, "env_kwargs", {}), **spec.kwargs}
    if "keep_snapshots" not in kwargs and env_accepts(spec.env_id, "keep_snapshots"):
        kwargs["keep_snapshots"] = False
    return kwargs


def strategy_name(name: str) -> str:
    """argparse type of ``--strategies``: a scripted strategy or ``openai:MODEL@URL``."""
    if is_served(name):
        ServedSpec.parse(name)
    elif is_text_served(name):
        ServedSpec.parse(name.partition("+")[2])
    elif name not in ALL_STRATEGY_NAMES and (is_import_path(name) or name in entry_point_names()):
        try:  # importable now, or refused before the bench starts
            load_factory(name)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    elif name not in ALL_STRATEGY_NAMES and not is_model_path(name):
        raise argparse.ArgumentTypeError(f"unknown strategy {name!r}: choose from {', '.join(ALL_STRATEGY_NAMES)}, "
                                         f"openai:MODEL@URL, a local checkpoint folder (with config.json) or your "
                                         f"own as module:Class or file.py:Class (docs/bench.md)")
    return name
