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
"""

from __future__ import annotations

import argparse
import ast
import functools
import inspect
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import gymnasium as gym
import pandas as pd
from tqdm.auto import tqdm

import memenv  # noqa: F401 - registers the environments
from agents.files import write_atomic
from agents.scripted.qa_strategies import STRATEGIES, STRATEGY_FAMILIES, make_strategy
from agents.served import ServedPolicy, ServedSpec, ServerError, is_served
from memenv.cli import CommandError, HelpFormatter, non_negative_int, positive_int, user_input

DEFAULT_ENVS = ("MemQA-v0", "MemQA-v0:objectives=8,hops=3", "MemQA-v0:objectives=16,context_budget=800")
DEFAULT_EPISODES = 30
# every scripted strategy name of any env family (MemQA's first; MemDialog-BEAM adds tool strategies such as rag)
ALL_STRATEGY_NAMES = tuple(dict.fromkeys(name for family in STRATEGY_FAMILIES.values() for name in family))
SWEEP_ENVS = ("MemQA-v0",)  # the base specs of ``--sweep`` when --envs is not given
SUMMARY_COLUMNS = ["env", "strategy", "episodes", "f1", "em", "peak_context_tokens", "total_context_tokens",
                   "invocations", "invalid_rate", "steps_per_s"]


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


def run_episode(env: gym.Env, policy, seed: int) -> tuple[dict[str, Any], int]:
    """One episode of ``policy`` on ``env``; returns ``info["summary"]`` and the number of steps."""
    obs, _ = env.reset(seed=seed)
    policy.reset(env.unwrapped)
    steps = 0
    while True:
        obs, _, terminated, truncated, info = env.step(policy.act(obs))
        steps += 1
        if terminated or truncated:
            return info["summary"], steps


def is_model_path(name: str) -> bool:
    """A local checkpoint folder (``config.json`` inside): run as a greedy LLM policy."""
    return (Path(name) / "config.json").is_file()


def resolve_strategy(name: str, env_id: str, memory_mode: str | None = None):
    """A strategy by name: a scripted one (:func:`make_strategy`, for ``env_id`` in ``memory_mode``), a served
    model ``openai:MODEL@URL`` (:class:`agents.served.ServedPolicy`) or a local checkpoint folder
    (:class:`agents.llm.strategy.CheckpointStrategy`; needs the ``llm`` extra)."""
    if is_model_path(name):
        return _checkpoint_strategy(str(Path(name).resolve()))
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
    elif name not in ALL_STRATEGY_NAMES and not is_model_path(name):
        raise argparse.ArgumentTypeError(f"unknown strategy {name!r}: choose from {', '.join(ALL_STRATEGY_NAMES)}, "
                                         f"openai:MODEL@URL or a local checkpoint folder (with config.json)")
    return name


def run_bench(strategies: Iterable[str], envs: Iterable[str | EnvSpec], episodes: int = DEFAULT_EPISODES,
              seed: int = 0, progress: bool = True) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Run every strategy on every env for ``episodes`` seeded episodes (seeds ``seed..seed+episodes-1``,
    the same for every strategy, so strategies face the same questions).

    Returns (summary table, one row per episode).
    """
    specs = [e if isinstance(e, EnvSpec) else EnvSpec.parse(e) for e in envs]
    strategies = list(strategies)
    for spec in specs:  # fail before any work on a strategy an env family does not have
        for name in strategies:
            policy = resolve_strategy(name, spec.env_id, spec.kwargs.get("memory_mode"))
            if is_served(name):
                policy.client.check()  # a server that is down fails here, naming its URL
    rows, summary = [], []
    bar = tqdm(total=len(specs) * len(strategies) * episodes, desc="bench", unit="ep", disable=not progress)
    for spec in specs:
        for name in strategies:
            policy = resolve_strategy(name, spec.env_id, spec.kwargs.get("memory_mode"))
            kwargs = bench_env_kwargs(spec, policy)
            env = gym.make(spec.env_id, **kwargs)
            steps, start = 0, time.perf_counter()
            cell = []
            seeds = [seed + i for i in range(episodes)]
            concurrent = hasattr(policy, "run_episodes")  # served models: episodes run on a thread pool
            if concurrent:
                results = policy.run_episodes(lambda: gym.make(spec.env_id, **kwargs), seeds, run_episode,
                                              on_done=lambda: bar.update(1))
            else:
                results = (run_episode(env, policy, s) + ({},) for s in seeds)
            for i, (episode, n, extra) in enumerate(results):
                steps += n
                cell.append({
                    "env": spec.label, "strategy": name, "seed": seed + i, "f1": episode["f1"], "em": episode["em"],
                    "peak_context_tokens": episode["peak_context_tokens"],
                    "total_context_tokens": episode["total_context_tokens"], "invocations": episode["turns"],
                    "invalid_actions": episode["invalid_actions"], "answered": episode["answered"], **extra,
                    **_ability_scores(episode),
                })
                if not concurrent:
                    bar.update(1)
            elapsed = time.perf_counter() - start
            env.close()
            frame = pd.DataFrame(cell)
            summary.append({
                "env": spec.label, "strategy": name, "episodes": episodes, "f1": frame.f1.mean(), "em": frame.em.mean(),
                "peak_context_tokens": frame.peak_context_tokens.mean(),
                "total_context_tokens": frame.total_context_tokens.mean(), "invocations": frame.invocations.mean(),
                "invalid_rate": frame.invalid_actions.sum() / max(1, frame.invocations.sum()),
                "steps_per_s": steps / elapsed if elapsed > 0 else float("nan"),
                **{k: frame[k].mean() for k in frame.columns if k.startswith("server_")},  # tokens per episode
                **{c: frame[c].mean() for c in frame.columns if c.startswith("score")},
            })
            rows.extend(cell)
    bar.close()
    scores = sorted({c for row in summary for c in row if c.startswith("score")}, key=lambda c: (c != "score", c))
    extra_columns = [k for k in dict.fromkeys(k for row in summary for k in row)
                     if k not in SUMMARY_COLUMNS and k not in scores] + scores
    return pd.DataFrame(summary, columns=SUMMARY_COLUMNS + extra_columns), pd.DataFrame(rows)


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


def run_sweep(strategies: Iterable[str], envs: Iterable[str | EnvSpec], sweep: str | Sweep,
              episodes: int = DEFAULT_EPISODES, seed: int = 0,
              progress: bool = True) -> tuple[pd.DataFrame, pd.DataFrame]:
    """:func:`run_bench` with ``sweep.key = v`` for every value ``v``, on every env spec.

    Returns (sweep table, one row per episode). The sweep table has one row per (env, strategy, value) and
    the columns ``env`` (the base spec's label), ``strategy``, the swept key (e.g. ``objectives``), then the
    summary metrics of :data:`SUMMARY_COLUMNS` (``episodes``, ``f1``, ``em``, ``peak_context_tokens``, ...).
    """
    sweep = sweep if isinstance(sweep, Sweep) else Sweep.parse(sweep)
    runs = sweep_specs(envs, sweep)
    summary, rows = run_bench(strategies, [spec for spec, _, _ in runs], episodes, seed, progress)
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


def plot_sweep(table: pd.DataFrame, key: str, path: Path) -> None:
    """Two panels per env: F1 vs the swept value and peak context tokens vs it, one line per strategy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    envs = list(dict.fromkeys(table.env))
    strategies = list(dict.fromkeys(table.strategy))
    colors = {name: plt.cm.tab10(i % 10) for i, name in enumerate(strategies)}
    markers = "osD^vP*X"
    values = list(dict.fromkeys(table[key]))
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
    positions = {v: (v if numeric else i) for i, v in enumerate(values)}
    fig, axes = plt.subplots(len(envs), 2, figsize=(11, 4.0 * len(envs)), squeeze=False)
    for row, env in zip(axes, envs):
        part = table[table.env == env]
        for i, name in enumerate(strategies):
            line = part[part.strategy == name]
            xs = [positions[v] for v in line[key]]
            style = dict(color=colors[name], marker=markers[i % len(markers)], label=name, alpha=0.9)
            row[0].plot(xs, line[_main_metric(part)], **style)
            row[1].plot(xs, line.peak_context_tokens, **style)
        row[0].set_ylabel(_main_metric(part))
        row[0].set_ylim(-0.05, 1.08)
        row[1].set_ylabel("peak context tokens (mean per episode)")
        for ax in row:
            ax.set_xlabel(key)
            ax.set_title(env, fontsize=9)
            ax.grid(alpha=0.3)
            if numeric and min(values) > 0 and max(values) / min(values) >= 8:
                ax.set_xscale("log", base=2)
            ax.set_xticks([positions[v] for v in values])
            ax.set_xticklabels([str(v) for v in values])
            ax.minorticks_off()
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(strategies), frameon=False)
    fig.suptitle(f"memenv bench: {_main_metric(table)} and peak context vs {key}")
    fig.tight_layout(rect=(0, 0.06 if len(envs) > 1 else 0.09, 1, 1))
    write_atomic(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
    plt.close(fig)


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
    first episode, as a :class:`memenv.cli.CommandError` naming the env spec."""
    strategies = list(strategies)
    for spec in specs:
        with user_input(f"env {spec.label!r}"):
            policies = [resolve_strategy(name, spec.env_id, spec.kwargs.get("memory_mode")) for name in strategies]
            for policy in policies:
                if isinstance(policy, ServedPolicy):
                    try:
                        policy.client.check()  # a server that is down fails here, naming its URL
                    except ServerError as err:
                        raise CommandError(f"--strategies {policy.name}: {err}") from err
            env = gym.make(spec.env_id, **{"context": policies[0].context, **spec.kwargs})
            env.reset(seed=0)
            env.close()


def _run_sweep(args: argparse.Namespace) -> int:
    envs = args.envs if args.envs is not None else list(SWEEP_ENVS)
    with user_input("--sweep"):
        sweep = Sweep.parse(args.sweep)
    with user_input("--envs"):
        runs = sweep_specs(envs, sweep)
    check_setup(args.strategies, [spec for spec, _, _ in runs])
    table, episodes = run_sweep(args.strategies, envs, sweep, args.episodes, args.seed, progress=not args.quiet)
    out = Path(args.out)
    write_atomic(out / "sweep.csv", lambda tmp: table.to_csv(tmp, index=False))
    write_atomic(out / "sweep_episodes.csv", lambda tmp: episodes.to_csv(tmp, index=False))
    plot_sweep(table, sweep.key, out / "sweep.png")
    print(format_sweep(table, sweep.key))
    print(f"\nwrote {out / 'sweep.csv'}, {out / 'sweep_episodes.csv'}, {out / 'sweep.png'}")
    return 0


def _run(args: argparse.Namespace) -> int:
    if getattr(args, "sweep", None):
        return _run_sweep(args)
    if args.envs is None:
        args.envs = list(DEFAULT_ENVS)
    with user_input("--envs"):
        specs = [EnvSpec.parse(spec) for spec in args.envs]
    check_setup(args.strategies, specs)
    summary, episodes = run_bench(args.strategies, specs, args.episodes, args.seed, progress=not args.quiet)
    out = Path(args.out)
    write_atomic(out / "results.csv", lambda tmp: summary.to_csv(tmp, index=False))
    write_atomic(out / "episodes.csv", lambda tmp: episodes.to_csv(tmp, index=False))
    plot_tradeoff(summary, out / "f1_vs_peak_context.png")
    print(format_table(summary))
    print(f"\nwrote {out / 'results.csv'}, {out / 'episodes.csv'}, {out / 'f1_vs_peak_context.png'}")
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
                             f"with --sweep: {' '.join(SWEEP_ENVS)})")
    parser.add_argument("-n", "--episodes", type=positive_int, default=DEFAULT_EPISODES,
                        help="seeded episodes per (env, strategy) cell")
    parser.add_argument("--seed", type=non_negative_int, default=0,
                        help="seed of the first episode (episode i uses seed + i)")
    parser.add_argument("--out", default="bench_out",
                        help="output folder (results.csv, episodes.csv, f1_vs_peak_context.png; sweep.* with --sweep)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument("--sweep", metavar="KEY=V1,V2,...", default=None,
                        help="sweep an env kwarg over values on every --envs spec, e.g. objectives=1,2,4,8,16; "
                             "writes sweep.csv and sweep.png (F1 and peak context vs the value) (default: no sweep)")
    parser.set_defaults(func=_run)
