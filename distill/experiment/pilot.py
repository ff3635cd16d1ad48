"""The powered run's pilot (issue 61, items 5-6): what fixes the headline run's training length and its number of
seeds before any of its arms runs.

``memenv experiment memopd --powered --pilot --out runs/memopd_pilot --stages-from runs/memopd_budget`` runs
:func:`pilot_config`: the powered preset's arms on the same teacher and start (linked, not rebuilt), a few seeds,
twice the headline's provisional length, every arm's train-pool probe F1 every 20 updates (``probe_curve``), each
arm at a fixed provisional rate (no sweep: the sweep belongs to the headline run, at the length the pilot chooses).
Then :func:`pilot_plan` reads it and writes ``OUT/pilot_plan.json``:

- **length**: :func:`distill.experiment.length.flat_length` on the probe curves (never the evaluation episodes);
- **seeds**: :func:`distill.stats.seeds_for_power` for the paper's effect in this regime's units (7% of the
  teacher-persistent control's end held-out F1) at the seed-level SD of MemOPD minus that control (each seed's
  mean paired difference over the same held-out episodes at the pilot's end), at least 16; with the minimum
  detectable effect of 16 seeds and of the number chosen beside it.

The pilot's own arm comparisons are not an outcome (its results.md says what it is): only the SD and the curves'
shape are read from it, the pre-registered rule's inputs.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from distill.experiment.config import ExperimentConfig, powered_config
from distill.experiment.length import flat_length, probe_curves

#: The pilot's design: 4 seeds (a seed-level SD on 3 degrees of freedom; the power analysis is only as good as
#: it), 240 updates (twice the fair run's, so that a flattening can be seen), curve points every 20 updates, the
#: held-out curve cut to 50 episodes (the pilot reads the probe curve), provisional rates: GRPO alone at the fair
#: run's chosen 1e-4, the distillation arms at the preset's 3e-4.
PILOT = dict(seeds=4, updates=240, curve_every=20, curve_episodes=50, probe_curve=True, rl_lr=1e-4,
             rl_lr_sweep=(), swept_arms=())
#: How far ahead the length rule looks for a gain beyond noise (updates).
PILOT_WINDOW = 40
PRIMARY = ("memopd", "teacher_persistent")


def pilot_config(out: str, **overrides: Any) -> ExperimentConfig:
    """``--powered --pilot``: :func:`~distill.experiment.config.powered_config` with :data:`PILOT`."""
    return replace(powered_config(out), **{**PILOT, **overrides})


def _end_f1(out: Path, arm: str, seeds: int, episodes: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per training seed, the arm's end held-out F1 per evaluation episode (``end_eval.csv``), episodes in seed
    order, and those episodes' seeds; a file missing, or on other episodes than ``episodes``, is named."""
    import pandas as pd

    rows = []
    for s in range(seeds):
        path = out / "arms" / arm / f"seed{s}" / "end_eval.csv"
        if not path.is_file():
            raise ValueError(f"{path} is missing: the pilot's arms have not all finished")
        frame = pd.read_csv(path).sort_values("seed")
        episodes = frame["seed"].to_numpy() if episodes is None else episodes
        if not np.array_equal(frame["seed"].to_numpy(), episodes):
            raise ValueError(f"{path}: evaluated on other episodes than the other arms' (not paired)")
        rows.append(frame["f1"].to_numpy(dtype=float))
    return np.stack(rows), episodes


def pilot_plan(out: str | Path, window: int = PILOT_WINDOW) -> dict[str, Any]:
    """The headline run's length and seeds from a finished pilot in ``out`` (module doc); written atomically to
    ``out/pilot_plan.json`` and returned. A pilot that is not finished raises a ``ValueError`` naming the file."""
    from distill.experiment.report import PAPER_RELATIVE_EFFECT
    from distill.stats import minimum_detectable_effect, seeds_for_power
    from memenv.files import write_text_atomic

    out = Path(out)
    settings = json.loads((out / "experiment.json").read_text(encoding="utf-8"))
    arms, seeds = list(settings["arms"]), int(settings["seeds"])
    if not set(PRIMARY) <= set(arms):
        raise ValueError(f"{out}: the pilot needs the arms {', '.join(PRIMARY)} (it has {', '.join(arms)})")
    length = flat_length(probe_curves(out, arms, seeds), window)
    aligned, episodes = _end_f1(out, PRIMARY[0], seeds)
    control, _ = _end_f1(out, PRIMARY[1], seeds, episodes)
    per_seed = (aligned - control).mean(axis=1)  # paired by episode within each seed
    seed_sd = float(per_seed.std(ddof=1)) if seeds > 1 else math.nan
    control_end = float(control.mean())
    effect = PAPER_RELATIVE_EFFECT * control_end
    needed = seeds_for_power(effect, seed_sd) if effect > 0 and seed_sd > 0 else None
    plan = {"pilot": str(out), "pilot_seeds": seeds, "pilot_updates": int(settings["updates"]),
            "updates": length["updates"], "flat": length["flat"], "window": window,
            "control_end_f1": control_end, "paper_effect": effect, "seed_sd": seed_sd,
            "pilot_difference_per_seed": [float(d) for d in per_seed],
            "seeds": needed, "mde_16": minimum_detectable_effect(seed_sd, 16) if seed_sd > 0 else math.nan,
            "mde_at_seeds": minimum_detectable_effect(seed_sd, needed) if needed else math.nan,
            "length_table": length["table"]}
    write_text_atomic(out / "pilot_plan.json", json.dumps(plan, indent=1))
    return plan


def format_plan(plan: dict[str, Any]) -> str:
    """The plan in three lines, for the command's output."""
    flat = "flat" if plan["flat"] else "still rising at the pilot's end: longer pilot needed"
    seeds = plan["seeds"] if plan["seeds"] is not None else "n/a (no spread or no effect to size)"
    return (f"pilot plan: train {plan['updates']} updates ({flat}; window {plan['window']})\n"
            f"  paper's effect here {plan['paper_effect']:+.4f} (7% of the control's end F1 "
            f"{plan['control_end_f1']:.3f}); seed-level SD of MemOPD - control {plan['seed_sd']:.4f} "
            f"({plan['pilot_seeds']} pilot seeds)\n"
            f"  seeds for 80% power: {seeds}; 16 seeds detect {plan['mde_16']:.4f}, the chosen number "
            f"{plan['mde_at_seeds']:.4f}")


__all__ = ["PILOT", "PILOT_WINDOW", "pilot_config", "pilot_plan", "format_plan"]
