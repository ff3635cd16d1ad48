"""The horizon sweep (``--sweep KEY=V1,V2,...``): a bench with an env kwarg set to each value, its table and its
figure (F1 and peak context against the value)."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import pandas as pd

from memenv.files import write_atomic
from agents.scripted.bench.run import SUMMARY_COLUMNS, run_bench
from agents.scripted.bench.specs import DEFAULT_EPISODES, EnvSpec, split_top_level


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
        for item in filter(None, (part.strip() for part in split_top_level(rest))):
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
