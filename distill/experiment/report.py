"""The experiment's report, from the stages' outputs: one row per arm (:func:`results_table`), the arm pairs
(:func:`comparisons_table`), MemOPD's claims as targets (:func:`targets`), ``results.md``
(:func:`format_markdown`) and the learning curves (:func:`plot_curves`). The statistics are
:mod:`distill.stats`'."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from agents.files import write_atomic
from distill.experiment.config import ARMS, ENV_ID, ExperimentConfig
from distill.stats import INFERENCE, arm_summary, compare_arms, standard_error


_GAIN = ["gain_f1", "gain_f1_se", "gain_f1_t", "gain_f1_df", "gain_f1_p", "gain_f1_ci_low", "gain_f1_ci_high",
         "gain_f1_boot_low", "gain_f1_boot_high", "gain_f1_episode_se"]
RESULT_COLUMNS = (["arm", "label", "seeds", "updates", "eval_episodes", "seen_eval_episodes", "inference",
                   "start_f1", "end_f1", "end_f1_seed_sd", *_GAIN,
                   "seen_start_f1", "seen_end_f1", "seen_gain_f1", "seen_gain_f1_se", "seen_gain_f1_t",
                   "start_em", "end_em", "gain_em", "gain_em_se", "gain_em_t",
                   "peak_context_tokens", "peak_scored_tokens", "approx_kl_first", "clipfrac_first",
                   "credit_share", "flat_credited_tokens", "distill_loss", "update_s", "train_cpu_min"])
COMPARISON_COLUMNS = ["a", "b", "seeds", "diff", "se", "t", "df", "p", "ci_low", "ci_high", "boot_low",
                      "boot_high", "ratio", "seen_diff", "seen_se", "seen_t"]
#: (a, b) pairs compared when both arms ran: the matched control first
COMPARISONS = [("memopd", "teacher_persistent"), ("memopd", "rl"), ("memopd", "flattening"),
               ("teacher_persistent", "rl"), ("flattening", "rl"), ("memopd_himpo", "memopd")]


def _peak_scored(timing: pd.DataFrame, reconstructions: set[str]) -> float:
    """The longest scored sequence of the timing records under these reconstructions (nan if not measured)."""
    if not {"reconstruction", "peak_scored_tokens"} <= set(timing.columns):
        return math.nan
    rows = timing[timing.reconstruction.isin(reconstructions)]
    return float(rows.peak_scored_tokens.max()) if len(rows) else math.nan


def _mean_of(runs: list[dict], key: str) -> float:
    values = [r[key] for r in runs if key in r and r[key] is not None and not math.isnan(r[key])]
    return float(np.mean(values)) if values else math.nan


def results_table(cfg: ExperimentConfig, start: pd.DataFrame, ends: dict[str, list[pd.DataFrame]],
                  runs: dict[str, list[dict]], timing: pd.DataFrame, start_seen: pd.DataFrame | None = None,
                  ends_seen: dict[str, list[pd.DataFrame]] | None = None) -> pd.DataFrame:
    """One row per arm (columns :data:`RESULT_COLUMNS`): held-out F1 (the headline) and EM, seen F1."""
    rows = []
    for arm, arm_ends in ends.items():
        fields = ARMS[arm][1] or {}
        layouts = {fields.get("reconstruction", "aligned"), fields.get("teacher_reconstruction") or "aligned"}
        row = {"arm": arm, "label": ARMS[arm][0], "seeds": len(arm_ends), "updates": cfg.updates,
               "eval_episodes": len(start), "inference": "seed-level t",
               **arm_summary(start, arm_ends),
               "peak_context_tokens": float(np.mean([e.peak_context_tokens.max() for e in arm_ends])),
               "peak_scored_tokens": _peak_scored(timing, layouts if fields else {"aligned"}),
               "update_s": _mean_of(runs[arm], "update_s"),
               "train_cpu_min": _mean_of(runs[arm], "train_cpu_seconds") / 60,
               **{k: _mean_of(runs[arm], k) for k in ("approx_kl_first", "clipfrac_first", "credit_share",
                                                      "flat_credited_tokens", "distill_loss")}}
        if start_seen is not None and ends_seen is not None:
            row.update(arm_summary(start_seen, ends_seen[arm], prefix="seen_"))
            row["seen_eval_episodes"] = len(start_seen)
        rows.append(row)
    return pd.DataFrame(rows).reindex(columns=RESULT_COLUMNS)


def comparisons_table(ends: dict[str, list[pd.DataFrame]],
                      ends_seen: dict[str, list[pd.DataFrame]] | None = None) -> pd.DataFrame:
    """Every pair of :data:`COMPARISONS` whose arms both ran: end F1 of ``a`` minus ``b`` on held-out questions,
    paired by training seed and episode (columns :data:`COMPARISON_COLUMNS`)."""
    rows = []
    for a, b in COMPARISONS:
        if a in ends and b in ends:
            c = compare_arms(ends[a], ends[b])
            row = {"a": a, "b": b, "seeds": c["n_seeds"], "diff": c["mean"], "se": c["se"], "t": c["t"],
                   "df": c["df"], "p": c["p"], "ci_low": c["ci_low"], "ci_high": c["ci_high"],
                   "boot_low": c["boot_low"], "boot_high": c["boot_high"], "ratio": c["ratio"]}
            if ends_seen is not None:
                s = compare_arms(ends_seen[a], ends_seen[b])
                row.update(seen_diff=s["mean"], seen_se=s["se"], seen_t=s["t"])
            rows.append(row)
    return pd.DataFrame(rows).reindex(columns=COMPARISON_COLUMNS)


def _seen_detail(row, value: str, se: str, who: str = "") -> str:
    """``; seen questions{who}: +x ± se (t t)``: the same figure on seen questions, beside the headline."""
    v, e = row.get(value, math.nan), row.get(se, math.nan)
    if v is None or e is None or not (math.isfinite(v) and math.isfinite(e)):
        return ""
    t = v / e if e > 0 else math.nan
    return f"; seen questions{who}: {v:+.3f} ± {e:.3f} (t {t:.1f})"


def targets(table: pd.DataFrame, comparisons: pd.DataFrame, teacher: dict | None = None,
            student: dict | None = None) -> list[dict[str, Any]]:
    """The set-up conditions and MemOPD's claims as targets, measured on held-out questions (``met`` a bool, ``value``
    the figure). A gain or a difference counts only beyond 3 seed-level standard errors (|t| > 3); a ratio to a
    gain that is not positive is undefined."""
    by = table.set_index("arm")
    pairs = comparisons.set_index(["a", "b"]) if len(comparisons) else None
    out = []
    if teacher is not None:
        out.append({"target": "teacher held-out F1 >= 0.6", "value": teacher["f1"], "met": teacher["f1"] >= 0.6,
                    "detail": f"± {teacher['f1_se']:.3f} (episodes); seen questions "
                              f"{teacher.get('seen_f1', math.nan):.3f}"})
    if student is not None:
        out.append({"target": "student start held-out F1 <= 0.3", "value": student["f1"],
                    "met": student["f1"] <= 0.3, "detail": f"± {student['f1_se']:.3f} (episodes)"})
    if pairs is not None and ("memopd", "teacher_persistent") in pairs.index:
        c = pairs.loc[("memopd", "teacher_persistent")]
        sign = "aligned above" if c["diff"] > 0 else ("aligned below" if c["diff"] < 0 else "no difference")
        out.append({"target": "MemOPD vs teacher-persistent control separated beyond 3 seed-level SE",
                    "value": c["t"], "met": bool(abs(c["t"]) > 3),
                    "detail": f"{sign}: end F1 difference {c['diff']:+.3f} ± {c['se']:.3f} (t {c['t']:.1f}, "
                              f"df {int(c['df'])}, p {c['p']:.3g})" + _seen_detail(c, "seen_diff", "seen_se")})
        out.append({"target": "aligned end F1 >= 1.07x teacher-persistent, beyond 3 SE", "value": c["ratio"],
                    "met": bool(c["ratio"] >= 1.07 and c["t"] > 3),
                    "detail": (f"ratio {c['ratio']:.3f}" if math.isfinite(c["ratio"]) else
                               "ratio unbounded (the control ends at F1 0)" if c["ratio"] > 0 else "ratio undefined")
                              + f", t {c['t']:.1f}"})
    if {"memopd", "rl"} <= set(by.index):
        g_m, g_r = by.loc["memopd", "gain_f1"], by.loc["rl", "gain_f1"]
        significant = bool(by.loc["memopd", "gain_f1_t"] > 3)
        ratio = g_m / g_r if g_r > 0 else math.nan
        out.append({"target": "MemOPD gain > 3 SE and >= 2x GRPO alone's gain", "value": ratio,
                    "met": significant and (g_r <= 0 or ratio >= 2),
                    "detail": f"gains {g_m:+.3f} ± {by.loc['memopd', 'gain_f1_se']:.3f} vs {g_r:+.3f} ± "
                              f"{by.loc['rl', 'gain_f1_se']:.3f} (seed-level SE)"
                              + ("" if g_r > 0 else "; GRPO alone's gain not positive: ratio undefined")
                              + ("" if significant else "; MemOPD gain not > 3 SE")
                              + _seen_detail(by.loc["memopd"], "seen_gain_f1", "seen_gain_f1_se", " MemOPD")
                              + _seen_detail(by.loc["rl"], "seen_gain_f1", "seen_gain_f1_se", " GRPO alone")})
    for arm, row in by.iterrows():
        if row["gain_f1"] > 0:
            out.append({"target": f"{arm}: gain > 3 SE", "value": row["gain_f1_t"],
                        "met": bool(row["gain_f1_t"] > 3),
                        "detail": f"{row['gain_f1']:+.3f} ± {row['gain_f1_se']:.3f}, t {row['gain_f1_t']:.1f} "
                                  f"(df {int(row['gain_f1_df'])})"})
    return out


def markdown_table(frame: pd.DataFrame, floatfmt: str = ".3f") -> str:
    """A pipe table of ``frame`` (floats formatted with ``floatfmt``); no tabulate dependency."""
    def cell(v: Any) -> str:
        return format(v, floatfmt) if isinstance(v, (float, np.floating)) else str(v)

    head = "| " + " | ".join(map(str, frame.columns)) + " |"
    rule = "| " + " | ".join("---" for _ in frame.columns) + " |"
    body = ["| " + " | ".join(cell(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join([head, rule, *body])


def _f(v: float, fmt: str = ".3f", signed: bool = False) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "—"
    return format(v, ("+" if signed else "") + fmt)


def model_shape(stage: dict) -> str:
    """``d=H x L layers`` of a stage's model: from its checkpoint's ``config.json`` where it is there (a pretrained
    base keeps its own shape, which the stage's :class:`ModelSpec` does not hold: ``layers=0`` there means "all of
    the base's"), else from the spec's ``hidden`` and ``layers``."""
    config = Path(str(stage.get("path", ""))) / "config.json"
    try:
        arch = json.loads(config.read_text())
        hidden, layers = arch["hidden_size"], arch["num_hidden_layers"]
    except (OSError, ValueError, KeyError):
        hidden, layers = stage["hidden"], stage["layers"]
    return f"d={hidden} x {layers} layers"


def format_markdown(cfg: ExperimentConfig, table: pd.DataFrame, comparisons: pd.DataFrame, teacher: dict,
                    student: dict, timing: pd.DataFrame, diagnostics: pd.DataFrame | None, host: str,
                    goals: list[dict]) -> str:
    """results.md: setup, the arm table, the comparisons, timing, diagnostics and the targets."""
    seeds = int(table.seeds.max())
    lines = [f"# MemOPD experiment ({ENV_ID} {cfg.env_kwargs})", "", host, "",
             f"questions: the world's entities split before training, {cfg.heldout_fraction:.0%} held out: "
             "SFT, probes and GRPO episodes draw train-pool questions only; **held-out** = questions about "
             "held-out entities (never trained on), **seen** = train-pool questions on evaluation seeds",
             f"teacher: {model_shape(teacher)} ({teacher['parameters']:,} parameters), "
             f"{teacher['steps']} SFT steps, held-out F1 {teacher['f1']:.3f} ± {teacher['f1_se']:.3f}, "
             f"EM {teacher['em']:.3f}; seen F1 {teacher.get('seen_f1', math.nan):.3f}",
             f"student start: {model_shape(student)} ({student['parameters']:,} "
             f"parameters, teacher's tokenizer), {student['steps']} SFT steps, held-out F1 {student['f1']:.3f} ± "
             f"{student['f1_se']:.3f}, EM {student['em']:.3f}; seen F1 {student.get('seen_f1', math.nan):.3f}",
             f"arms: {cfg.updates} GRPO updates x {cfg.tasks_per_update * cfg.group_size} episodes "
             f"({cfg.tasks_per_update} tasks x {cfg.group_size}), lr {cfg.lr}, KL {cfg.kl_coef}, temperature "
             f"{cfg.temperature}, lambda {cfg.distill_coef}; {seeds} training seeds; evaluation: "
             f"{int(table.eval_episodes.max())} held-out and {cfg.seen_eval_episodes} seen episodes (greedy), the "
             "same episodes at the start and the end", "",
             f"Inference: {INFERENCE} (df = {seeds - 1}); the 95% CI is the t interval, the bootstrap interval a "
             "two-level bootstrap over training seeds and evaluation episodes; 'episode SE' averages the seeds "
             "first and is shown only to compare (it leaves out the training-seed variance).", "",
             "| arm | held-out F1 start | end (± sd over seeds) | gain ± SE (seeds) | t | p | 95% CI (t) | "
             "95% CI (bootstrap) | episode SE | seen F1 end | seen gain ± SE | EM gain ± SE | approx-KL update 1 | "
             "credit share / tokens credited in flat groups | s/update | CPU-min |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in table.itertuples():
        lines.append(
            f"| {r.label} | {r.start_f1:.3f} | {r.end_f1:.3f} ± {_f(r.end_f1_seed_sd)} | "
            f"{_f(r.gain_f1, signed=True)} ± {_f(r.gain_f1_se)} | {_f(r.gain_f1_t, '.1f')} | "
            f"{_f(r.gain_f1_p, '.3g')} | "
            f"[{_f(r.gain_f1_ci_low, '+.3f')}, {_f(r.gain_f1_ci_high, '+.3f')}] | "
            f"[{_f(r.gain_f1_boot_low, '+.3f')}, {_f(r.gain_f1_boot_high, '+.3f')}] | "
            f"{_f(r.gain_f1_episode_se)} | {_f(r.seen_end_f1)} | {_f(r.seen_gain_f1, signed=True)} ± "
            f"{_f(r.seen_gain_f1_se)} | {_f(r.gain_em, signed=True)} ± {_f(r.gain_em_se)} | "
            f"{_f(r.approx_kl_first, '.4f')} | {_f(r.credit_share, '.2f')} / {_f(r.flat_credited_tokens, '.0f')} | "
            f"{_f(r.update_s, '.1f')} | "
            f"{_f(r.train_cpu_min, '.1f')} |")
    if len(comparisons):
        lines += ["", "Comparisons (held-out end F1 of a minus b, paired by training seed and episode; seed-level "
                      "SE, t on df; ratio = end F1 a / b):", "",
                  "| a | b | difference ± SE | t | df | p | 95% CI (t) | 95% CI (bootstrap) | ratio | "
                  "seen difference ± SE |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for c in comparisons.itertuples():
            lines.append(f"| {c.a} | {c.b} | {_f(c.diff, signed=True)} ± {_f(c.se)} | {_f(c.t, '.1f')} | "
                         f"{int(c.df)} | {_f(c.p, '.3g')} | [{_f(c.ci_low, '+.3f')}, {_f(c.ci_high, '+.3f')}] | "
                         f"[{_f(c.boot_low, '+.3f')}, {_f(c.boot_high, '+.3f')}] | {_f(c.ratio)} | "
                         f"{_f(c.seen_diff, signed=True)} ± {_f(c.seen_se)} |")
    lines += ["", "Actor timing on one update's records (start student; see timing.csv):", "",
              markdown_table(timing, ".3f")]
    if diagnostics is not None:
        cols = [c for c in ("method", "max_abs_dlogp", "p99_abs_dlogp", "clip_share", "action_tokens", "tokens")
                if c in diagnostics.columns]
        lines += ["", "Misalignment of the flattened transcript, on records of the flattening arm's final student "
                      "(|d log-prob| vs the sampled log-probs; clip_share: tokens whose ratio against the sampled "
                      "log-probs leaves [0.8, 1.2]; that arm recomputes its old log-probs, so its own ratio starts "
                      "at 1):", "", markdown_table(diagnostics[cols], ".4f")]
    lines += ["", "Targets:", ""] + [f"- {g['target']}: {_f(g['value'], '.2f')} — {'met' if g['met'] else 'MISSED'} "
                                    f"({g['detail']})" for g in goals]
    return "\n".join(lines) + "\n"


def curve_frame(cfg: ExperimentConfig, arm: str, start: pd.DataFrame) -> pd.DataFrame:
    """Held-out F1 per (update, training seed) of one arm on the curve's episodes (update 0: the start)."""
    frames = []
    for s in range(cfg.seeds):
        path = Path(cfg.out) / "arms" / arm / f"seed{s}" / "curve.csv"
        if path.exists():
            c = pd.read_csv(path)
            first = start.head(cfg.curve_episodes)
            frames.append(pd.concat([first.assign(update=0)[["update", "seed", "f1"]], c[["update", "seed", "f1"]]])
                          .groupby("update", as_index=False)["f1"].mean().assign(training_seed=s))
    return pd.concat(frames) if frames else pd.DataFrame(columns=["update", "f1", "training_seed"])


def plot_curves(cfg: ExperimentConfig, path: Path, start: pd.DataFrame | None = None) -> None:
    """Left: held-out F1 per arm over updates (mean over training seeds, band ± 1 SE across seeds). Right: the
    distillation loss per update (each OPD arm against its own teacher layout; mean over seeds)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if start is None:
        start = pd.read_csv(Path(cfg.out) / "student" / "start_eval.csv")
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8), constrained_layout=True)
    for arm in cfg.arms:
        color = f"C{list(ARMS).index(arm)}"  # one colour per arm in both panels
        label = ARMS[arm][0]
        short = label if len(label) <= 40 else label.split(" (")[0]
        c = curve_frame(cfg, arm, start)
        if len(c):
            per = c.pivot(index="update", columns="training_seed", values="f1").sort_index()
            mean = per.mean(axis=1).to_numpy()
            se = np.array([standard_error(row.dropna()) for _, row in per.iterrows()])  # nan (no band): < 2 seeds
            x = per.index.to_numpy()
            axes[0].plot(x, mean, marker="o", label=f"{short} (n={per.shape[1]})", color=color)
            axes[0].fill_between(x, mean - np.nan_to_num(se), mean + np.nan_to_num(se), alpha=0.2, color=color)
        frames = [pd.read_csv(p) for p in sorted((Path(cfg.out) / "arms" / arm).glob("seed*/metrics.csv"))]
        frames = [f[f["update"] > 0] for f in frames if "distill_loss" in f]
        if frames:
            n_up = min(len(f) for f in frames)
            dl = np.stack([f["distill_loss"].to_numpy(float)[:n_up] for f in frames]).mean(0)
            axes[1].plot(frames[0]["update"].to_numpy()[:n_up], dl, label=short, color=color)
    from matplotlib.ticker import MaxNLocator

    axes[0].set_ylim(0, max(0.05, axes[0].get_ylim()[1]))
    for ax in axes:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[0].set(xlabel="GRPO update", ylabel="F1 on held-out questions (greedy)",
                title=f"held-out F1, mean ± SE over {cfg.seeds} training seeds")
    axes[1].set(xlabel="GRPO update", ylabel="reverse KL to the teacher (nats/token)",
                title="distillation loss (each arm's teacher layout)")
    for ax in axes:
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    write_atomic(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110))
    plt.close(fig)


__all__ = ["RESULT_COLUMNS", "COMPARISON_COLUMNS", "COMPARISONS", "results_table", "comparisons_table", "targets",
           "markdown_table", "format_markdown", "curve_frame", "plot_curves"]
