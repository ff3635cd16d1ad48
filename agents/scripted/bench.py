"""``memenv bench``: memory strategies x environments x episodes -> a table, ``results.csv`` and a PNG.

    memenv bench                                   # the default below, < 1 minute on 2 cores
                                                   # (measured: 15 CPU-s, 39 s wall at load average 8)
    memenv bench --strategies relevance history --envs "MemQA-v0:objectives=8,context_budget=800" -n 50

An env spec is ``ID`` or ``ID:key=value,key=value`` (values parsed as Python literals).

Horizon sweep (the figure MEM1 uses to show constant memory): ``--sweep KEY=V1,V2,...`` sets the env kwarg
``KEY`` to each value in turn on every ``--envs`` spec (default ``MemQA-v0`` when sweeping) and writes, per
strategy, F1 and peak context tokens against the value: ``sweep.csv``, ``sweep_episodes.csv`` and
``sweep.png`` (two panels: F1 and peak context vs the value, one line per strategy).

    memenv bench --sweep objectives=1,2,4,8,16 --strategies relevance keep-all history -n 20

A spec's ``memory_mode=tools`` picks the env family's tools-mode strategies (``MemQA-v0:memory_mode=tools``:
``oracle``, ``rag``). Envs that take ``keep_snapshots`` run with ``False`` unless the spec sets it.

Resuming: each finished cell (strategy x env) is written to ``OUT/cells/`` as soon as it ends, and ``OUT/bench.json``
records the settings. Running the same command again with the same ``--out`` skips the finished cells (after
Ctrl-C, a stop on failures, a crash); ``--fresh`` runs them all again. An ``--out`` that holds a bench of other
settings, or result files this command did not write, is refused before any episode.

Failures: an episode that fails on a served model, a retrieval server or a judge (unreachable, error status,
unusable reply) is counted in the ``failed`` column and left out of the means; a cell with failed episodes runs
again on the next resume. Past ``--max-failures`` failed episodes the run stops (exit status 1), keeping the
finished cells. A cell none of whose episodes finished (each failed, even fewer than ``--max-failures``) ends
the run with one line and exit status 1, after the tables are written. Ctrl-C ends the run with one line (exit
status 130), keeping the finished cells.
"""

from __future__ import annotations

import argparse
import ast
import functools
import hashlib
import inspect
import json
import signal
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

import gymnasium as gym
import pandas as pd
from tqdm.auto import tqdm

import memenv  # noqa: F401 - registers the environments
import agents.served
import memenv.scoring.judges
import memenv.search.http
import memenv.search.remote
from agents.files import write_atomic, write_text_atomic
from agents.scripted.qa_strategies import STRATEGIES, STRATEGY_FAMILIES, env_family, make_strategy
from agents.scripted.text_strategies import is_text_served, make_text_strategy
from agents.scripted.bench_tables import format_benchmark_tables, official_columns
from agents.served import ServedPolicy, ServedSpec, ServerError, ServerUnreachableError, is_served
from memenv.cli_common import (CommandError, CommandInterrupted, HelpFormatter, check_out_dir, non_negative_int,
                               positive_int, prepare_out_dir, user_input)
from tasks.types import DataFormatError

DEFAULT_ENVS = ("MemQA-v0", "MemQA-v0:objectives=8,hops=3", "MemQA-v0:objectives=16,context_budget=800")
DEFAULT_EPISODES = 30
# every scripted strategy name of any env family (MemQA's first; MemDialog-BEAM adds tool strategies such as rag)
ALL_STRATEGY_NAMES = tuple(dict.fromkeys(name for family in STRATEGY_FAMILIES.values() for name in family))
SWEEP_ENVS = ("MemQA-v0",)  # the base specs of ``--sweep`` when --envs is not given
SUMMARY_COLUMNS = ["env", "strategy", "episodes", "failed", "f1", "em", "peak_context_tokens",
                   "total_context_tokens", "invocations", "invalid_rate", "steps_per_s"]
#: Failed episodes a run tolerates before it stops (``--max-failures``): a few flaky requests do not cost the
#: run, a server that went away stops it within a few episodes.
DEFAULT_MAX_FAILURES = 5
MANIFEST = "bench.json"  # OUT/bench.json: the settings of the bench whose cells are in OUT/cells
CELLS = "cells"
BENCH_FORMAT = "memenv-bench/1"
#: Files the bench writes into OUT (an OUT that holds one of them without a bench.json is not ours to replace).
RESULT_FILES = ("results.csv", "episodes.csv", "f1_vs_peak_context.png", "sweep.csv", "sweep_episodes.csv",
                "sweep.png")


def _errors_defined_in(*modules) -> tuple[type[BaseException], ...]:
    """Every exception class defined in ``modules`` (so that one added there is caught as well)."""
    found = []
    for module in modules:
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, Exception) and value.__module__ == module.__name__:
                found.append(value)
    return tuple(dict.fromkeys(found))


#: What a failed request to a served model, a retrieval server or a judge raises during an episode: such an
#: episode counts as failed instead of ending the run. Anything else is a bug and keeps its traceback.
_SERVICE_BASE = getattr(memenv.search.http, "ServiceError", None)  # the base of every service failure
SERVICE_ERRORS = tuple(dict.fromkeys(
    ((_SERVICE_BASE,) if _SERVICE_BASE is not None else _errors_defined_in(memenv.search.http, agents.served))
    + (ServerError, memenv.search.remote.RetrieverError, memenv.scoring.judges.JudgeError)))


@dataclass(frozen=True)
class EnvSpec:
    env_id: str
    kwargs: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, spec: str) -> "EnvSpec":
        env_id, _, rest = spec.partition(":")
        kwargs: dict[str, Any] = {}
        for item in filter(None, (part.strip() for part in _split_top_level(rest))):
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


def _split_top_level(text: str) -> list[str]:
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


class Stopped(Exception):
    """An episode abandoned because the run is stopping (Ctrl-C, or too many failed episodes)."""


def run_episode(env: gym.Env, policy, seed: int, stop: threading.Event | None = None) -> tuple[dict[str, Any], int]:
    """One episode of ``policy`` on ``env``; returns ``info["summary"]`` and the number of steps. When ``stop``
    is set between two steps the episode is abandoned (:class:`Stopped`)."""
    obs, _ = env.reset(seed=seed)
    policy.reset(env.unwrapped)
    steps = 0
    while True:
        if stop is not None and stop.is_set():
            raise Stopped
        obs, _, terminated, truncated, info = env.step(policy.act(obs))
        steps += 1
        if terminated or truncated:
            return info["summary"], steps


def is_model_path(name: str) -> bool:
    """A local checkpoint folder (``config.json`` inside) or a registered pretrained model
    (:mod:`agents.llm.pretrained`, e.g. ``smollm2-135m-instruct``): run as a greedy LLM policy."""
    from agents.llm.pretrained import is_registered

    return (Path(name) / "config.json").is_file() or is_registered(name)


def resolve_strategy(name: str, env_id: str, memory_mode: str | None = None):
    """A strategy by name: a scripted one (:func:`make_strategy`, for ``env_id`` in ``memory_mode``), a served
    model ``openai:MODEL@URL`` (:class:`agents.served.ServedPolicy`) or a local checkpoint folder
    (:class:`agents.llm.strategy.CheckpointStrategy`; needs the ``llm`` extra)."""
    if is_model_path(name):  # a folder by its absolute path; a registered model name as it is
        return _checkpoint_strategy(str(Path(name).resolve()) if Path(name).exists() else name)
    if is_text_served(name):  # a real-text dialog strategy with a served model: KIND+openai:MODEL@URL
        return make_text_strategy(name, env_family(env_id, memory_mode))
    return ServedPolicy(name) if is_served(name) else make_strategy(name, env_id, memory_mode)


@functools.lru_cache(maxsize=8)
def _checkpoint_strategy(path: str):
    """One loaded checkpoint per folder: the set-up check, the pre-run check and every env of the run share it
    (it is greedy and resets per episode), so the weights are read once."""
    try:  # optional dependency: torch/transformers only when a model is benchmarked
        from agents.llm.strategy import CheckpointStrategy
    except ImportError as err:
        raise CommandError(f"--strategies {path}: a model checkpoint needs the LLM stack "
                           f"(pip install -e '.[llm]'): {err}") from err
    from agents.llm.cli import check_checkpoint

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
    elif name not in ALL_STRATEGY_NAMES and not is_model_path(name):
        raise argparse.ArgumentTypeError(f"unknown strategy {name!r}: choose from {', '.join(ALL_STRATEGY_NAMES)}, "
                                         f"openai:MODEL@URL or a local checkpoint folder (with config.json)")
    return name


class TooManyFailures(CommandError):
    """More than ``max_failures`` episodes failed on a service: the run stopped (exit status 1)."""

    def __init__(self, message: str, failures: list[str]) -> None:
        super().__init__(message, status=1)
        self.failures = failures


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split()) or type(error).__name__
    return text if len(text) <= 300 else text[:297] + "..."


_STOPPED, _FAILED = "memenv_bench_stopped", "memenv_bench_failed"  # keys of an episode that did not finish


class _EpisodeRunner:
    """Runs episodes for :func:`run_bench`: a service failure becomes a failed episode; past ``max_failures``
    of them, or on Ctrl-C (``stop``), the episodes not yet finished are abandoned."""

    def __init__(self, max_failures: int) -> None:
        self.max_failures = max_failures
        self.failures: list[str] = []
        self.stop = threading.Event()
        self.lock = threading.Lock()

    @property
    def too_many(self) -> bool:
        return len(self.failures) > self.max_failures

    def __call__(self, env: gym.Env, policy, seed: int) -> tuple[dict[str, Any], int]:
        try:
            return run_episode(env, policy, seed, self.stop)
        except Stopped:
            return {_STOPPED: True}, 0
        except SERVICE_ERRORS as err:
            message = _one_line(err)
            with self.lock:
                self.failures.append(message)
                if self.too_many:
                    self.stop.set()
            return {_FAILED: message}, 0


@contextmanager
def _interrupt_sets(event: threading.Event) -> Iterator[None]:
    """While inside, Ctrl-C also sets ``event`` (before its KeyboardInterrupt), so that episodes running on
    worker threads stop at their next step instead of running to their end."""
    previous = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or not callable(previous):
        yield
        return

    def handler(signum, frame):
        event.set()
        previous(signum, frame)

    signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _json_default(value: Any) -> Any:
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    raise TypeError(f"cannot store {type(value).__name__} in a bench cell")


class BenchStore:
    """The finished cells of a bench in ``OUT``: ``OUT/bench.json`` (format, settings, run id) and one JSON file
    per finished cell in ``OUT/cells/`` (its summary row and episode rows), each written atomically.

    :meth:`check` reads only (call it before any work); :meth:`start` makes the folder and the manifest."""

    def __init__(self, out: str | Path, settings: dict[str, Any], fresh: bool = False) -> None:
        self.out, self.settings, self.fresh = Path(out), settings, fresh
        self.run_id: str | None = None

    @property
    def manifest_path(self) -> Path:
        return self.out / MANIFEST

    def _manifest(self) -> dict[str, Any] | None:
        """The manifest of an earlier bench in OUT (None when there is none), or a CommandError when OUT holds
        results that are not a resumable bench's."""
        path = self.manifest_path
        if not path.exists():
            theirs = [name for name in RESULT_FILES if (self.out / name).exists()]
            if theirs or (self.out / CELLS).exists():
                found = theirs[0] if theirs else CELLS
                raise CommandError(f"--out {self.out}: holds {found}, not written by a resumable memenv bench "
                                   f"(no {MANIFEST}); choose another --out, or move it away")
            return None
        try:
            manifest = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise CommandError(f"--out {self.out}: {path} is not a bench manifest ({_one_line(exc)}); choose "
                               "another --out, or move it away") from None
        if not isinstance(manifest, dict) or manifest.get("format") != BENCH_FORMAT \
                or not isinstance(manifest.get("settings"), dict) or not isinstance(manifest.get("run"), str):
            raise CommandError(f"--out {self.out}: {path} is not a {BENCH_FORMAT} manifest; choose another --out, "
                               "or move it away")
        return manifest

    def check(self) -> None:
        """Refuse, as a one-line CommandError, an OUT that cannot hold this bench: a file, an unwritable place,
        result files of something else, or (without ``fresh``) a bench of other settings."""
        check_out_dir(self.out)
        manifest = self._manifest()
        if manifest is None or self.fresh:
            return
        theirs = manifest["settings"]
        for key in dict.fromkeys([*self.settings, *theirs]):
            if theirs.get(key) != self.settings.get(key):
                raise CommandError(
                    f"--out {self.out}: holds a bench of other settings ({key}: {_shown(theirs.get(key))} there, "
                    f"{_shown(self.settings.get(key))} here); rerun with the settings in {self.manifest_path} to "
                    "continue it, add --fresh to replace it, or choose another --out")

    def start(self) -> dict[tuple[str, str], dict[str, Any]]:
        """Make OUT, write the manifest (a new one with ``fresh``: the earlier cells are removed) and return
        the finished cells of this bench, by ``(env label, strategy)``."""
        self.check()
        prepare_out_dir(self.out)
        manifest = self._manifest()
        cells_dir = self.out / CELLS
        if manifest is not None and not self.fresh:
            self.run_id = manifest["run"]
        else:
            self.run_id = uuid.uuid4().hex
            if cells_dir.is_dir():  # this bench's own earlier cells (checked: the manifest is ours)
                for old in cells_dir.glob("cell-*.json"):
                    old.unlink()
            write_text_atomic(self.manifest_path, json.dumps(
                {"format": BENCH_FORMAT, "run": self.run_id, "settings": self.settings}, indent=2) + "\n")
        cells_dir.mkdir(exist_ok=True)
        done = {}
        for path in sorted(cells_dir.glob("cell-*.json")):
            try:
                cell = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, ValueError):
                continue  # not a finished cell (never happens with atomic writes): it runs again
            if isinstance(cell, dict) and cell.get("run") == self.run_id:
                done[(cell["env"], cell["strategy"])] = cell
        return done

    def save(self, cell: dict[str, Any]) -> None:
        cell = {"run": self.run_id, **cell}
        write_text_atomic(self.out / CELLS / _cell_file(cell["env"], cell["strategy"]),
                          json.dumps(cell, default=_json_default) + "\n")


def _cell_file(env_label: str, strategy: str) -> str:
    return "cell-" + hashlib.sha1(f"{env_label}\0{strategy}".encode()).hexdigest()[:16] + ".json"


def _shown(value: Any) -> str:
    text = " ".join(map(str, value)) if isinstance(value, list) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def bench_settings(strategies: Iterable[str], specs: Iterable[EnvSpec], episodes: int, seed: int,
                   sweep: str | None = None) -> dict[str, Any]:
    """What the results of a bench depend on (the manifest's ``settings``: a resume needs the same)."""
    strategies = list(strategies)
    settings = {"strategies": strategies, "envs": [spec.label for spec in specs], "episodes": int(episodes),
                "seed": int(seed), "sweep": sweep}
    models = {name: _weights_stamp(name) for name in strategies if is_model_path(name)}
    if models:  # a checkpoint retrained in place is another strategy: its old cells are not reused
        settings["checkpoints"] = models
    return settings


def _weights_stamp(folder: str) -> str:
    """A short digest of the size and modification time of a checkpoint folder's weight files."""
    from agents.llm.pretrained import resolve

    stamp = sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in resolve(folder).iterdir()
                   if p.is_file() and p.suffix in (".safetensors", ".bin"))
    return hashlib.sha1(json.dumps(stamp).encode()).hexdigest()[:12]


def run_bench(strategies: Iterable[str], envs: Iterable[str | EnvSpec], episodes: int = DEFAULT_EPISODES,
              seed: int = 0, progress: bool = True, *, out: str | Path | None = None,
              max_failures: int = DEFAULT_MAX_FAILURES, fresh: bool = False,
              sweep: str | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Run every strategy on every env for ``episodes`` seeded episodes (seeds ``seed..seed+episodes-1``,
    the same for every strategy, so strategies face the same questions).

    With ``out``, each finished cell is written to ``out/cells/`` as it ends and the finished cells of an
    earlier call with the same settings are not run again (``fresh``: they are). An episode that fails on a
    service (:data:`SERVICE_ERRORS`) counts in the ``failed`` column; past ``max_failures`` of them the run
    raises :class:`TooManyFailures`. Ctrl-C raises :class:`memenv.cli_common.CommandInterrupted` saying how many cells
    were kept (with ``out``; a plain KeyboardInterrupt without).

    Returns (summary table, one row per episode).
    """
    specs = [e if isinstance(e, EnvSpec) else EnvSpec.parse(e) for e in envs]
    strategies = list(strategies)
    if max_failures < 0:
        raise ValueError(f"max_failures must be >= 0, got {max_failures}")
    store = None if out is None else BenchStore(out, bench_settings(strategies, specs, episodes, seed, sweep), fresh)
    if store is not None:
        store.check()
    for spec in specs:  # fail before any work on a strategy an env family does not have
        for name in strategies:
            policy = resolve_strategy(name, spec.env_id, spec.kwargs.get("memory_mode"))
            if is_served(name):
                policy.client.check()  # a server that is down fails here, naming its URL
    plan = [(spec, name) for spec in specs for name in strategies]
    done = store.start() if store is not None else {}
    done = {key: cell for key, cell in done.items() if not cell["summary"].get("failed")}  # failed: run again
    resumed = sum((spec.label, name) in done for spec, name in plan)
    if resumed:
        print(f"resuming: {resumed} of {len(plan)} cells already in {store.out} (--fresh runs them again)")
    runner = _EpisodeRunner(max_failures)
    cells: list[dict[str, Any]] = []
    kept = resumed

    def note() -> str:
        return f"{kept} of {len(plan)} cells kept in {store.out} (rerun the same command to continue)"

    bar = tqdm(total=(len(plan) - resumed) * episodes, desc="bench", unit="ep", disable=not progress)
    try:
        with _interrupt_sets(runner.stop):
            for spec, name in plan:
                if (spec.label, name) in done:
                    cells.append(done[(spec.label, name)])
                    continue
                cell = _run_cell(spec, name, episodes, seed, runner, bar)
                if runner.too_many:
                    where = f"; {note()}" if store is not None else ""
                    raise TooManyFailures(f"stopped after {len(runner.failures)} failed episodes (more than "
                                          f"--max-failures {max_failures}); last: {runner.failures[-1]}{where}",
                                          runner.failures)
                if store is not None:
                    store.save(cell)
                    kept += 1
                cells.append(cell)
    except KeyboardInterrupt:
        runner.stop.set()
        if store is None:
            raise
        raise CommandInterrupted(note()) from None
    except DataFormatError as exc:  # a data file of the user's, damaged past what the set-up check reads
        if store is None:
            raise
        raise CommandError(f"{exc}; {note()}") from exc
    finally:
        bar.close()
    summary = [cell["summary"] for cell in cells]
    rows = [row for cell in cells for row in cell["episodes"]]
    scores = sorted({c for row in summary for c in row if c.startswith("score")}, key=lambda c: (c != "score", c))
    extra_columns = [k for k in dict.fromkeys(k for row in summary for k in row)
                     if k not in SUMMARY_COLUMNS and k not in scores] + scores
    return pd.DataFrame(summary, columns=SUMMARY_COLUMNS + extra_columns), pd.DataFrame(rows)


def _run_cell(spec: EnvSpec, name: str, episodes: int, seed: int, runner: _EpisodeRunner, bar) -> dict[str, Any]:
    """One (env, strategy) cell: ``{"env", "strategy", "summary": row, "episodes": rows}``."""
    policy = resolve_strategy(name, spec.env_id, spec.kwargs.get("memory_mode"))
    kwargs = bench_env_kwargs(spec, policy)
    env = gym.make(spec.env_id, **kwargs)
    steps, start = 0, time.perf_counter()
    cell = []
    seeds = [seed + i for i in range(episodes)]
    concurrent = hasattr(policy, "run_episodes")  # served models: episodes run on a thread pool
    try:
        if concurrent:
            progress = {"on_done": lambda: bar.update(1)}
            if "on_invocations" in inspect.signature(policy.run_episodes).parameters:  # a model in this process:
                # its episodes end together after minutes, so the bar shows the invocations as they happen
                progress["on_invocations"] = lambda n: bar.set_postfix_str(
                    f"{name}: {n} invocations, {n / max(1e-9, time.perf_counter() - start):.2f}/s")
            results = policy.run_episodes(lambda: gym.make(spec.env_id, **kwargs), seeds, runner, **progress)
        else:
            results = (runner(env, policy, s) + ({},) for s in seeds)
        for i, (episode, n, extra) in enumerate(results):
            if not concurrent:
                bar.update(1)
            if _STOPPED in episode:
                continue
            steps += n
            row = {"env": spec.label, "strategy": name, "seed": seed + i}
            if _FAILED in episode:
                cell.append({**row, "error": episode[_FAILED]})
                continue
            cell.append({
                **row, "f1": episode["f1"], "em": episode["em"],
                "peak_context_tokens": episode["peak_context_tokens"],
                "total_context_tokens": episode["total_context_tokens"], "invocations": episode["turns"],
                "invalid_actions": episode["invalid_actions"], "answered": episode["answered"], **extra,
                **_ability_scores(episode), **official_columns(episode),
            })
    finally:
        env.close()
    elapsed = time.perf_counter() - start
    frame = pd.DataFrame(cell)
    failed = int(frame["error"].notna().sum()) if "error" in frame else 0
    ok = frame[frame["error"].isna()] if "error" in frame else frame
    ok = ok.reindex(columns=list(dict.fromkeys([*frame.columns, "f1", "em", "peak_context_tokens",
                                                "total_context_tokens", "invocations", "invalid_actions"])))
    summary = {
        "env": spec.label, "strategy": name, "episodes": len(ok), "failed": failed, "f1": ok.f1.mean(),
        "em": ok.em.mean(), "peak_context_tokens": ok.peak_context_tokens.mean(),
        "total_context_tokens": ok.total_context_tokens.mean(), "invocations": ok.invocations.mean(),
        "invalid_rate": ok.invalid_actions.sum() / max(1, ok.invocations.sum()) if len(ok) else float("nan"),
        "steps_per_s": steps / elapsed if elapsed > 0 else float("nan"),
        **{k: ok[k].mean() for k in frame.columns if k.startswith("server_")},  # tokens per episode
        **{c: ok[c].mean() for c in frame.columns if c.startswith(("score", "official:"))},
    }
    return {"env": spec.label, "strategy": name, "summary": summary, "episodes": cell}


def _ability_scores(episode: dict[str, Any]) -> dict[str, float]:
    """MemDialog-BEAM: the episode's score and its score per ability (extra ``score``/``score:<ability>`` columns)."""
    if "score_by_ability" not in episode:
        return {}
    return {"score": episode["score"], **{f"score:{a}": v for a, v in episode["score_by_ability"].items()}}


def plot_tradeoff(summary: pd.DataFrame, path: Path) -> None:
    """F1 against peak context tokens, one marker per strategy, one panel per env."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    envs = list(dict.fromkeys(summary.env))
    strategies = list(dict.fromkeys(summary.strategy))
    colors = {name: plt.cm.tab10(i % 10) for i, name in enumerate(strategies)}
    markers = "osD^vP*X"
    fig, axes = plt.subplots(1, len(envs), figsize=(5.5 * len(envs), 4.2), squeeze=False)
    for ax, env in zip(axes[0], envs):
        part = summary[summary.env == env]
        for _, row in part.iterrows():
            i = strategies.index(row.strategy)
            ax.scatter(row.peak_context_tokens, row.f1, s=70, color=colors[row.strategy],
                       marker=markers[i % len(markers)], label=row.strategy, alpha=0.85)
        ax.set_xlabel("peak context tokens (mean per episode)")
        ax.set_ylabel("F1")
        ax.set_ylim(-0.05, 1.08)
        ax.set_xlim(left=0, right=max(1.0, float(part.peak_context_tokens.max())) * 1.08)  # distances from zero
        ax.set_title(env, fontsize=9)
        ax.grid(alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(strategies), frameon=False)
    fig.suptitle("memenv bench: F1 vs peak context")
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    write_atomic(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
    plt.close(fig)


@dataclass(frozen=True)
class Sweep:
    """``KEY=V1,V2,...``: an env kwarg and the values it takes (parsed as Python literals)."""

    key: str
    values: tuple[Any, ...]

    @classmethod
    def parse(cls, text: str) -> "Sweep":
        key, sep, rest = text.partition("=")
        key = key.strip()
        if not sep or not key.isidentifier():
            raise ValueError(f"bad sweep {text!r}: expected KEY=V1,V2,... (e.g. objectives=1,2,4,8,16)")
        values: list[Any] = []
        for item in filter(None, (part.strip() for part in _split_top_level(rest))):
            try:
                value = ast.literal_eval(item)
            except (ValueError, SyntaxError):
                value = item
            if value not in values:
                values.append(value)
        if not values:
            raise ValueError(f"bad sweep {text!r}: no values after '='")
        return cls(key, tuple(values))

    @property
    def text(self) -> str:
        """``KEY=V1,V2,...`` as parsed (how a bench manifest records the sweep)."""
        return f"{self.key}=" + ",".join(map(repr, self.values))


def run_sweep(strategies: Iterable[str], envs: Iterable[str | EnvSpec], sweep: str | Sweep,
              episodes: int = DEFAULT_EPISODES, seed: int = 0,
              progress: bool = True, **bench_kwargs: Any) -> tuple[pd.DataFrame, pd.DataFrame]:
    """:func:`run_bench` with ``sweep.key = v`` for every value ``v``, on every env spec (``bench_kwargs``:
    ``out``, ``max_failures``, ``fresh`` of :func:`run_bench`).

    Returns (sweep table, one row per episode). The sweep table has one row per (env, strategy, value) and
    the columns ``env`` (the base spec's label), ``strategy``, the swept key (e.g. ``objectives``), then the
    summary metrics of :data:`SUMMARY_COLUMNS` (``episodes``, ``f1``, ``em``, ``peak_context_tokens``, ...).
    """
    sweep = sweep if isinstance(sweep, Sweep) else Sweep.parse(sweep)
    runs = sweep_specs(envs, sweep)
    summary, rows = run_bench(strategies, [spec for spec, _, _ in runs], episodes, seed, progress,
                              sweep=sweep.text, **bench_kwargs)
    where = {spec.label: (base, value) for spec, base, value in runs}
    for frame in (summary, rows):
        labels = list(frame.env)
        frame["env"] = [where[label][0] for label in labels]
        frame.insert(2, sweep.key, [where[label][1] for label in labels])
    return summary, rows


def sweep_specs(envs: Iterable[str | EnvSpec], sweep: Sweep) -> list[tuple[EnvSpec, str, Any]]:
    """``(env spec, the base spec's label, the swept value)`` for every run of a sweep, in run order."""
    reserved = set(SUMMARY_COLUMNS) | {"seed", "invalid_actions", "answered"}
    if sweep.key in reserved:
        raise ValueError(f"cannot sweep {sweep.key!r}: the name clashes with a result column")
    bases = [e if isinstance(e, EnvSpec) else EnvSpec.parse(e) for e in envs]
    return [(EnvSpec(base.env_id, {**base.kwargs, sweep.key: value}), base.label, value)
            for base in bases for value in sweep.values]


def format_sweep(table: pd.DataFrame, key: str) -> str:
    """F1 and peak context tokens against the swept value, one column per strategy (one block per env)."""
    blocks = []
    for env, part in table.groupby("env", sort=False):
        order = list(dict.fromkeys(part.strategy))
        values = list(dict.fromkeys(part[key]))
        for metric, fmt in ((_main_metric(part), "{:.3f}"), ("peak_context_tokens", "{:.0f}")):
            pivot = part.pivot(index=key, columns="strategy", values=metric).reindex(index=values)[order]
            text = pivot.to_string(float_format=lambda v, f=fmt: f.format(v))
            blocks.append(f"{env}: {metric} vs {key}\n{text}")
    return "\n\n".join(blocks)


def _main_metric(table: pd.DataFrame) -> str:
    """``score`` (MemDialog-BEAM) where every row has one, else ``f1``."""
    return "score" if "score" in table and table["score"].notna().all() else "f1"


def tick_label(value: Any) -> str:
    """A swept value as a tick reads: 128000 -> 128K, 1000000 -> 1M, 10000000 -> 10M; others as they are."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and abs(value) >= 1000:
        for size, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "K")):
            if abs(value) >= size:
                return f"{value / size:.3g}{suffix}"
    return str(value)


def coinciding(series: dict[str, list[float]]) -> list[list[str]]:
    """Groups (two or more names) of series equal at every point: lines drawn on top of each other."""
    groups: dict[tuple, list[str]] = {}
    for name, ys in series.items():
        groups.setdefault(tuple(round(float(y), 9) for y in ys), []).append(name)
    return [names for names in groups.values() if len(names) > 1]


_METRIC_LABEL = {"f1": "F1", "score": "score"}


def plot_sweep(table: pd.DataFrame, key: str, path: Path) -> None:
    """:func:`sweep_figure` written to ``path`` (PNG)."""
    import matplotlib.pyplot as plt

    fig = sweep_figure(table, key)
    write_atomic(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
    plt.close(fig)


def sweep_figure(table: pd.DataFrame, key: str):
    """Two panels per env: F1 vs the swept value and peak context tokens vs it, one line per strategy.

    A swept value spanning a factor of 8 or more is on a log axis with readable ticks (128K, 1M, 10M); both
    y axes start at zero, so a drop is drawn to scale. Lines that coincide stay told apart: each strategy has its
    own line style and a marker smaller than the one before (a stack of them shows as rings), and the panel
    names the strategies whose lines are the same."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    envs = list(dict.fromkeys(table.env))
    strategies = list(dict.fromkeys(table.strategy))
    colors = {name: plt.cm.tab10(i % 10) for i, name in enumerate(strategies)}
    markers = "osD^vP*X"
    dashes = ["-", "--", "-.", ":"]
    values = list(dict.fromkeys(table[key]))
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
    positions = {v: (v if numeric else i) for i, v in enumerate(values)}
    fig, axes = plt.subplots(len(envs), 2, figsize=(11, 4.0 * len(envs)), squeeze=False)
    for row, env in zip(axes, envs):
        part = table[table.env == env]
        metric = _main_metric(part)
        for i, name in enumerate(strategies):
            line = part[part.strategy == name]
            xs = [positions[v] for v in line[key]]
            style = dict(color=colors[name], marker=markers[i % len(markers)], label=name, alpha=0.9,
                         linestyle=dashes[i % len(dashes)], markersize=max(4.0, 11.0 - 1.5 * i), zorder=2 + i)
            row[0].plot(xs, line[metric], **style)
            row[1].plot(xs, line.peak_context_tokens, **style)
        row[0].set_ylabel(_METRIC_LABEL.get(metric, metric))
        row[0].set_ylim(-0.05, 1.08)
        row[1].set_ylabel("peak context tokens (mean per episode)")
        row[1].set_ylim(bottom=0, top=max(1.0, float(part.peak_context_tokens.max())) * 1.08)
        for ax, column in ((row[0], metric), (row[1], "peak_context_tokens")):
            by_name = {name: list(part[part.strategy == name].set_index(key).reindex(values)[column])
                       for name in strategies}
            same = [" = ".join(group) for group in coinciding(by_name)]  # named under the title: never on a line
            ax.set_title(env + ("\nsame line: " + "; ".join(same) if same else ""), fontsize=9)
        for ax in row:
            ax.set_xlabel(key)
            ax.grid(alpha=0.3)
            if numeric and min(values) > 0 and max(values) / min(values) >= 8:
                ax.set_xscale("log", base=10 if max(values) / min(values) >= 100 else 2)
            ax.set_xticks([positions[v] for v in values])
            ax.set_xticklabels([tick_label(v) for v in values])
            ax.minorticks_off()
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(strategies), frameon=False)
    main = _main_metric(table)
    fig.suptitle(f"memenv bench: {_METRIC_LABEL.get(main, main)} and peak context vs {key}")
    fig.tight_layout(rect=(0, 0.06 if len(envs) > 1 else 0.09, 1, 1))
    return fig


def format_table(summary: pd.DataFrame) -> str:
    """The summary as text, each column rounded to what it can resolve."""
    digits = {"f1": 3, "em": 3, "peak_context_tokens": 0, "total_context_tokens": 0, "invocations": 1,
              "invalid_rate": 3, "steps_per_s": 0, "server_prompt_tokens": 0, "server_completion_tokens": 0}
    shown = summary.copy()
    digits.update({c: 3 for c in shown.columns if c.startswith("score")})
    for column, n in digits.items():
        if column in shown:
            shown[column] = shown[column].map(lambda v, n=n: f"{v:.{n}f}")
    return shown.to_string(index=False)


def check_setup(strategies: Iterable[str], specs: Iterable[EnvSpec]) -> None:
    """Build every strategy for every env, and every env once (reset included), so that a user's mistake
    (an unknown kwarg, a bad value, a missing data file, a strategy the env family lacks) fails before the
    first episode, as a :class:`memenv.cli_common.CommandError` naming the env spec."""
    strategies = list(strategies)
    for spec in specs:
        with user_input(f"env {spec.label!r}"):
            policies = [resolve_strategy(name, spec.env_id, spec.kwargs.get("memory_mode")) for name in strategies]
            for policy in policies:
                if isinstance(policy, ServedPolicy) or hasattr(policy, "check_server"):
                    try:  # a server that is down fails here, naming its URL
                        policy.client.check() if isinstance(policy, ServedPolicy) else policy.check_server()
                    except ServerError as err:  # down: a service failure (1); not the API: a wrong URL (2)
                        raise CommandError(f"--strategies {policy.name}: {err}",
                                           status=1 if isinstance(err, ServerUnreachableError) else 2) from err
            env = gym.make(spec.env_id, **bench_env_kwargs(spec, policies[0]))  # the kwargs its cells will use
            env.reset(seed=0)
            env.close()


DEFAULT_OUT = "bench_out"


def default_out(settings: dict[str, Any]) -> Path:
    """Where a bench without ``--out`` writes: ``bench_out`` for the default bench, ``bench_out-HASH`` for others
    (HASH: 8 hex digits of the settings), so that commands of other settings run one after another each find
    their own folder, and the same command run again finds its own to resume."""
    default = bench_settings(STRATEGIES, [EnvSpec.parse(spec) for spec in DEFAULT_ENVS], DEFAULT_EPISODES, 0)
    if settings == default:
        return Path(DEFAULT_OUT)
    digest = hashlib.sha1(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:8]
    return Path(f"{DEFAULT_OUT}-{digest}")


def _check_out(args: argparse.Namespace, specs: list[EnvSpec], sweep: str | None = None) -> Path:
    """``--out`` is checked before the set-up and any episode (see :class:`BenchStore`)."""
    settings = bench_settings(args.strategies, specs, args.episodes, args.seed, sweep)
    out = Path(args.out) if args.out is not None else default_out(settings)
    BenchStore(out, settings, args.fresh).check()
    return out


def _bench_kwargs(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    return {"out": out, "max_failures": args.max_failures, "fresh": args.fresh}


def _run_sweep(args: argparse.Namespace) -> int:
    envs = args.envs if args.envs is not None else list(SWEEP_ENVS)
    with user_input("--sweep"):
        sweep = Sweep.parse(args.sweep)
    with user_input("--envs"):
        runs = sweep_specs(envs, sweep)
    out = _check_out(args, [spec for spec, _, _ in runs], sweep.text)
    check_setup(args.strategies, [spec for spec, _, _ in runs])
    table, episodes = run_sweep(args.strategies, envs, sweep, args.episodes, args.seed, progress=not args.quiet,
                                **_bench_kwargs(args, out))
    write_atomic(out / "sweep.csv", lambda tmp: table.to_csv(tmp, index=False))
    write_atomic(out / "sweep_episodes.csv", lambda tmp: episodes.to_csv(tmp, index=False))
    plot_sweep(table, sweep.key, out / "sweep.png")
    print(format_sweep(table, sweep.key))
    print(f"\nwrote {out / 'sweep.csv'}, {out / 'sweep_episodes.csv'}, {out / 'sweep.png'}")
    check_cells_measured(table, episodes)
    return 0


def check_cells_measured(summary: pd.DataFrame, episodes: pd.DataFrame) -> None:
    """Refuse to end as a success when a cell has no finished episode: each of them failed on a service (an
    unreachable judge or served model), even with fewer of them than ``--max-failures``. The tables are written
    first (the failed column shows it); this is the one line on stderr and exit status 1 that say so."""
    empty = summary[(summary["episodes"] == 0) & (summary["failed"] > 0)]
    if empty.empty:
        return
    cells = ", ".join(f"{row.env} x {row.strategy}" for row in empty.head(3).itertuples())
    more = f" (+{len(empty) - 3} more)" if len(empty) > 3 else ""
    errors = episodes["error"].dropna() if "error" in episodes else pd.Series([], dtype=object)
    last = f"; last: {errors.iloc[-1]}" if len(errors) else ""
    raise CommandError(f"every episode failed in {len(empty)} of {len(summary)} cells ({cells}{more}){last}; "
                       "rerun the same command to run them again", status=1)


def trace_cells(strategies: Iterable[str], specs: Iterable[EnvSpec], seed: int, out: str | Path) -> Path:
    """The first episode (seed ``seed``) of every (env, strategy) cell run again with its snapshots kept, as episode
    traces (``out/trace.jsonl``) and one self-contained page (``out/trace.html``, :mod:`agents.viewer`). Scripted
    strategies and checkpoints (greedy) replay the bench's episode exactly; a served model is asked again."""
    from agents.viewer import episode_trace, save_traces, traces_view, write_view

    out = Path(out)
    traces = []
    for spec in specs:
        for name in strategies:
            policy = resolve_strategy(name, spec.env_id, spec.kwargs.get("memory_mode"))
            kwargs = bench_env_kwargs(spec, policy)
            if env_accepts(spec.env_id, "keep_snapshots"):
                kwargs["keep_snapshots"] = True
            env = gym.make(spec.env_id, **kwargs)
            try:
                summary, _ = run_episode(env, policy, seed)
            finally:
                env.close()
            traces.append(episode_trace(summary, f"{spec.label} · {name} · seed {seed}"))
    save_traces(out / "trace.jsonl", traces)
    write_view(out / "trace.html", traces_view(traces), title=f"memenv bench: {out.name}")
    return out / "trace.html"


def _run(args: argparse.Namespace) -> int:
    if getattr(args, "sweep", None) and getattr(args, "trace", False):
        raise CommandError("--trace writes the page of a plain bench; run it without --sweep")
    if getattr(args, "sweep", None):
        return _run_sweep(args)
    if args.envs is None:
        args.envs = list(DEFAULT_ENVS)
    with user_input("--envs"):
        specs = [EnvSpec.parse(spec) for spec in args.envs]
    out = _check_out(args, specs)
    check_setup(args.strategies, specs)
    summary, episodes = run_bench(args.strategies, specs, args.episodes, args.seed, progress=not args.quiet,
                                  **_bench_kwargs(args, out))
    write_atomic(out / "results.csv", lambda tmp: summary.to_csv(tmp, index=False))
    write_atomic(out / "episodes.csv", lambda tmp: episodes.to_csv(tmp, index=False))
    plot_tradeoff(summary, out / "f1_vs_peak_context.png")
    print(format_benchmark_tables(summary, format_table))
    print(f"\nwrote {out / 'results.csv'}, {out / 'episodes.csv'}, {out / 'f1_vs_peak_context.png'}")
    if args.trace:
        print(f"wrote {trace_cells(args.strategies, specs, args.seed, out)} (open it in a browser) and "
              f"{out / 'trace.jsonl'}")
    check_cells_measured(summary, episodes)
    return 0


def register_cli(subparsers) -> None:
    """Adds ``memenv bench`` (entry point ``memenv.commands``)."""
    parser = subparsers.add_parser("bench", help="benchmark memory strategies", description=__doc__,
                                   formatter_class=HelpFormatter)
    parser.add_argument("--strategies", nargs="+", default=list(STRATEGIES), type=strategy_name, metavar="NAME",
                        help=f"memory strategies to run: {' '.join(ALL_STRATEGY_NAMES)}, openai:MODEL@URL "
                             "(an OpenAI-compatible completions server), or PATH: a local checkpoint folder "
                             "(config.json; a greedy LLM policy, e.g. a memenv train/experiment checkpoint)")
    parser.add_argument("--envs", nargs="+", default=None, metavar="SPEC",
                        help=f"env specs ID[:key=value,...] (default: {' '.join(DEFAULT_ENVS)}; "
                             f"with --sweep: {' '.join(SWEEP_ENVS)}); MemDialog-BEAM/-LongMemEval take "
                             f"{memenv.scoring.judges.JUDGE_SPEC_HELP}")
    parser.add_argument("-n", "--episodes", type=positive_int, default=DEFAULT_EPISODES,
                        help="seeded episodes per (env, strategy) cell")
    parser.add_argument("--seed", type=non_negative_int, default=0,
                        help="seed of the first episode (episode i uses seed + i)")
    parser.add_argument("--out", default=None,
                        help=f"output folder (default: {DEFAULT_OUT} for the default bench, {DEFAULT_OUT}-HASH named "
                             "by the settings for any other, so that benches of other settings never share one; "
                             "results.csv, episodes.csv, f1_vs_peak_context.png; sweep.* with --sweep; "
                             "bench.json and cells/: the finished cells, so that the same command run again "
                             "continues where it stopped)")
    parser.add_argument("--fresh", action="store_true",
                        help="run every cell again, replacing the cells of an earlier bench in --out "
                             "(default: finished cells of the same settings are kept and skipped)")
    parser.add_argument("--max-failures", dest="max_failures", type=non_negative_int, default=DEFAULT_MAX_FAILURES,
                        metavar="N",
                        help="stop the run (exit status 1, finished cells kept) once more than N episodes failed "
                             "on a served model, retrieval server or judge; 0 stops at the first failure. Failed "
                             "episodes are counted in the failed column and left out of the means")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument("--trace", action="store_true",
                        help="also write OUT/trace.html (one self-contained page: the first episode of every cell, "
                             "invocation by invocation, memory diffs included; memenv view) and OUT/trace.jsonl")
    parser.add_argument("--sweep", metavar="KEY=V1,V2,...", default=None,
                        help="sweep an env kwarg over values on every --envs spec, e.g. objectives=1,2,4,8,16; "
                             "writes sweep.csv and sweep.png (F1 and peak context vs the value) (default: no sweep)")
    parser.set_defaults(func=_run)
