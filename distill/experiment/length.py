"""How long the arms train, read from a pilot's probe curves (issue 61's pre-registered rule): train until the
probe curves flatten, judged on train-pool probe episodes (``ExperimentConfig.probe_curve``), never the evaluation
episodes.

The rule (:func:`flat_length`): for each arm, the mean probe F1 over the pilot's seeds at every curve point and its
standard error across seeds; the chosen length is the first curve point ``u`` after which **no** arm gains beyond
noise within the next ``window`` updates: every later point ``v`` in the window is at most two standard errors of
the difference (``2 sqrt(se_u^2 + se_v^2)``) above ``u``. Every arm then trains for that same length (a paired comparison
of arms trained for different lengths would compare lengths). Where no point qualifies, the last one is returned
with ``flat`` False: the curves still rise at the end of the pilot, and that is said.

    from distill.experiment.length import flat_length, probe_curves
    choice = flat_length(probe_curves("runs/pilot", ["memopd", "teacher_persistent"], seeds=4), window=40)
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

import pandas as pd


def probe_curves(out: str | Path, arms: Sequence[str], seeds: int) -> dict[str, pd.DataFrame]:
    """Each arm's ``probe_curve.csv`` of every seed (``OUT/arms/ARM/seedS``) as one frame: ``update, seed,
    probe_f1``. A missing file raises a ``ValueError`` naming it (the pilot ran without ``probe_curve``?)."""
    curves = {}
    for arm in arms:
        frames = []
        for s in range(seeds):
            path = Path(out) / "arms" / arm / f"seed{s}" / "probe_curve.csv"
            if not path.is_file():
                raise ValueError(f"{path} is missing: the pilot's arms need probe_curve=True (and to have finished)")
            frames.append(pd.read_csv(path).assign(seed=s))
        curves[arm] = pd.concat(frames, ignore_index=True)
    return curves


def flat_length(curves: dict[str, pd.DataFrame], window: int) -> dict:
    """The training length by the rule of the module doc. ``curves``: arm -> frame of ``update, seed, probe_f1``
    (every arm on the same curve points). Returns ``updates`` (the chosen length), ``flat`` (whether the rule was
    met before the last point) and ``table`` (per arm and point: mean, SE across seeds, the largest gain within
    the window)."""
    if window < 1 or not curves:
        raise ValueError(f"flat_length needs curves and a window >= 1 update, got {len(curves)} and {window}")
    points = None
    table = []
    gains: dict[int, list[tuple[float, float]]] = {}
    for arm, frame in curves.items():
        per = frame.pivot_table(index="update", columns="seed", values="probe_f1").sort_index()
        if points is None:
            points = list(per.index)
        elif list(per.index) != points:
            raise ValueError(f"arm {arm}'s curve points {list(per.index)} differ from {points}")
        mean = per.mean(axis=1)
        se = per.std(axis=1, ddof=1) / math.sqrt(per.shape[1]) if per.shape[1] > 1 else pd.Series(0.0, per.index)
        for u in points:
            later = [v for v in points if u < v <= u + window]
            # the largest gain in the window beyond two standard errors of that gain (<= 0: within noise)
            excess = float(max((mean[v] - mean[u] - 2 * math.sqrt(se[u] ** 2 + se[v] ** 2) for v in later),
                               default=math.nan))
            gain = float(max((mean[v] - mean[u] for v in later), default=math.nan))
            table.append({"arm": arm, "update": int(u), "probe_f1": float(mean[u]), "se": float(se[u]),
                          "gain_within_window": gain, "gain_beyond_noise": excess})
            gains.setdefault(int(u), []).append((excess, float(se[u])))
    for u in points:
        checks = gains[int(u)]
        if all(not math.isnan(g) and g <= 0 for g, _ in checks):
            return {"updates": int(u), "flat": True, "window": window, "table": table}
    return {"updates": int(points[-1]), "flat": False, "window": window, "table": table}


__all__ = ["probe_curves", "flat_length"]
