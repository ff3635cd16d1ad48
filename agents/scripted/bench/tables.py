"""``memenv bench`` on cited benchmarks: one table per benchmark, headed by its official metric's name.

An env whose episode summary names an ``official_metric`` (MemDialog-LoCoMo: ``locomo_f1``, LoCoMo's
Porter-stemmed F1 with its category rules; MemDialog-BEAM: ``beam_score``, BEAM's rubric score;
MemDialog-LongMemEval: ``accuracy``, LongMemEval's judged accuracy) gets an ``official:<metric>`` column per
episode (:func:`official_columns`), and :func:`format_benchmark_tables` prints the cells of each benchmark in
their own table, that column first under the metric's own name (marked ``judge-free`` where no judge scored
it: then it is the approximation, not the official figure), then the metric's :data:`COMPANIONS` (BEAM's
``beam_score_float``: the same judge grades without the official ``int()`` truncation). Cells of other envs
(MemQA, MemRead, synthetic MemDialog) keep the general table.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import pandas as pd

__all__ = ["BENCHMARKS", "COMPANIONS", "format_benchmark_tables", "official_columns"]

#: metric -> (benchmark, what the metric is)
BENCHMARKS = {
    "locomo_f1": ("LoCoMo", "LoCoMo's official QA score: Porter-stemmed token F1 with its per-category rules"),
    "beam_score": ("BEAM", "BEAM's official rubric score (each judge grade through int(), as BEAM's scorer sums "
                           "them: 0.5 counts 0 except in event ordering; event ordering by Kendall tau-b); "
                           "beam_score_float: the grades as given"),
    "accuracy": ("LongMemEval", "LongMemEval's accuracy: share of answers its per-type judge accepts"),
}
#: metric -> the other ways the episode summary scores the same answers, shown right after the metric
COMPANIONS = {"beam_score": ("beam_score_float",)}
_SHOWN = ["env", "strategy", "episodes", "failed", "f1", "peak_context_tokens", "invocations", "invalid_rate",
          "steps_per_s"]


def official_columns(episode: dict[str, Any]) -> dict[str, float]:
    """The episode's official metric as ``official:<metric>``, its :data:`COMPANIONS` as ``official:<name>``, and
    ``official:judged`` (1.0 when a judge scored it, 0.0 for the judge-free approximation; NaN where the metric
    needs no judge)."""
    metric = episode.get("official_metric")
    if not metric or metric not in episode:
        return {}
    scoring = episode.get("scoring")
    judged = float("nan") if scoring is None else float(scoring == "judge")
    by_type = episode.get(f"{metric}_by_type") or {}  # LoCoMo: the official F1 per category
    return {f"official:{metric}": float(episode[metric]), "official:judged": judged,
            **{f"official:{name}": float(episode[name]) for name in COMPANIONS.get(metric, ()) if name in episode},
            **{f"official:{metric}:{kind}": float(v) for kind, v in by_type.items()}}


def _label(metric: str, judged: pd.Series) -> str:
    values = [v for v in judged if isinstance(v, float) and not math.isnan(v)]
    if values and max(values) == 0.0:
        return f"{metric} (judge-free)"
    if values and min(values) < 1.0:
        return f"{metric} (partly judge-free)"
    return metric


def format_benchmark_tables(summary: pd.DataFrame, format_table: Callable[[pd.DataFrame], str]) -> str:
    """The summary as text: the general table for cells without an official metric, then one table per
    benchmark (see the module docstring). ``format_table`` formats a frame (the bench's own)."""
    companions = {f"official:{name}" for names in COMPANIONS.values() for name in names}
    metrics = [c for c in summary.columns if c.startswith("official:") and c != "official:judged" and c.count(":") == 1
               and c not in companions]
    if not metrics:
        return format_table(summary)
    parts = []
    has_official = summary[metrics].notna().any(axis=1)
    plain = summary[~has_official].drop(columns=[c for c in summary.columns if c.startswith("official:")])
    if len(plain):
        parts.append(format_table(plain.dropna(axis=1, how="all")))
    for column in metrics:
        metric = column.split(":", 1)[1]
        rows = summary[summary[column].notna()]
        if not len(rows):
            continue
        benchmark, what = BENCHMARKS.get(metric, (metric, metric))
        label = _label(metric, rows["official:judged"]) if "official:judged" in rows else metric
        table = rows[[c for c in _SHOWN if c in rows.columns]].copy()
        table.insert(2, label, rows[column].map(lambda v: f"{v:.3f}"))
        for at, name in enumerate(COMPANIONS.get(metric, ()), start=3):
            if f"official:{name}" in rows.columns:
                table.insert(at, name, rows[f"official:{name}"].map(lambda v: f"{v:.3f}"))
        per = [c for c in rows.columns if c.startswith(f"{column}:")]  # per category (means over episodes)
        for c in per:
            if rows[c].notna().any():
                table[f"{metric}:{c.rsplit(':', 1)[1]}"] = rows[c].map(lambda v: f"{v:.3f}")
        per = [c for c in rows.columns if c.startswith("score:")]
        for c in per:
            if rows[c].notna().any():
                table[c] = rows[c]
        parts.append(f"== {benchmark}: {label} = {what} ==\n{format_table(table)}")
    return "\n\n".join(parts)
