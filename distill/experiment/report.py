"""The experiment's report, from the stages' outputs: one row per arm (:func:`results_table`), the arm pairs
(:func:`comparisons_table`: MemOPD against every other arm that ran, then :data:`COMPARISONS`), MemOPD's claims as
targets (:func:`targets`, each judged on a paired difference and its two-level bootstrap interval), ``results.md``
(:func:`format_markdown`) and the learning curves (:func:`plot_curves`). The statistics are
:mod:`distill.stats`'."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from memenv.files import write_atomic
from distill.experiment.config import ARMS, ENV_ID, SFT_ARMS, ExperimentConfig
from distill.stats import (ALPHA, INFERENCE, POWER, arm_summary, compare_arms, is_finite_number,
                           minimum_detectable_effect, sign_flip_test, standard_error, verdict)


_GAIN = ["gain_f1", "gain_f1_se", "gain_f1_t", "gain_f1_df", "gain_f1_p", "gain_f1_ci_low", "gain_f1_ci_high",
         "gain_f1_zero_variance", "gain_f1_p_exact", "gain_f1_p_exact_min", "gain_f1_boot_low", "gain_f1_boot_high",
         "gain_f1_boot_se", "gain_f1_episode_se"]
RESULT_COLUMNS = (["arm", "label", "seeds", "updates", "eval_episodes", "seen_eval_episodes", "inference",
                   "start_f1", "end_f1", "end_f1_seed_sd", *_GAIN,
                   "seen_start_f1", "seen_end_f1", "seen_gain_f1", "seen_gain_f1_se", "seen_gain_f1_t",
                   "seen_gain_f1_zero_variance", "seen_gain_f1_p_exact", "seen_gain_f1_boot_low",
                   "seen_gain_f1_boot_high",
                   "start_em", "end_em", "gain_em", "gain_em_se", "gain_em_t",
                   "peak_context_tokens", "peak_scored_tokens", "approx_kl_first", "clipfrac_first",
                   "credit_share", "flat_credited_tokens", "distill_loss", "update_s", "train_cpu_min",
                   "start_turns", "end_turns"])
COMPARISON_COLUMNS = ["a", "b", "seeds", "diff", "se", "t", "df", "p", "ci_low", "ci_high", "zero_variance",
                      "p_exact", "p_exact_min", "p_exact_draws", "boot_low", "boot_high", "boot_se", "ratio",
                      "seed_sd", "mde",
                      "seen_diff", "seen_se", "seen_t", "seen_zero_variance", "seen_p_exact", "seen_boot_low",
                      "seen_boot_high"]
#: the arm whose claims the targets are: it is compared with every other arm that ran
HEADLINE_ARM = "memopd"
#: further (a, b) pairs compared when both arms ran, after MemOPD against every other arm
COMPARISONS = [("teacher_persistent", "rl"), ("constant", "rl"), ("flattening", "rl"), ("memopd_himpo", "memopd")]
#: the arm MemOPD is compared with first: the matched control (one thing changed: the teacher's view)
MATCHED_CONTROL = "teacher_persistent"
INFERENCE_COLUMN = "seed-level t, exact sign-flip p, two-level bootstrap (seeds x episodes)"


def comparison_pairs(arms) -> list[tuple[str, str]]:
    """The (a, b) pairs :func:`comparisons_table` compares among ``arms`` (those that ran): :data:`HEADLINE_ARM`
    minus every other arm (the matched control first, then in :data:`ARMS` order; an arm that a pair of
    :data:`COMPARISONS` already sets against MemOPD is left to that pair), then :data:`COMPARISONS` whose arms
    both ran."""
    present = list(arms)
    order = {arm: i for i, arm in enumerate(ARMS)}
    pairs = []
    if HEADLINE_ARM in present:
        others = [b for b in present if b != HEADLINE_ARM and (b, HEADLINE_ARM) not in COMPARISONS]
        others.sort(key=lambda b: (b != MATCHED_CONTROL, order.get(b, len(order)), b))
        pairs = [(HEADLINE_ARM, b) for b in others]
    return pairs + [(a, b) for a, b in COMPARISONS if a in present and b in present and (a, b) not in pairs]


def _peak_scored(timing: pd.DataFrame, reconstructions: set[str]) -> float:
    """The longest scored sequence of the timing records under these reconstructions (nan if not measured)."""
    if not {"reconstruction", "peak_scored_tokens"} <= set(timing.columns):
        return math.nan
    rows = timing[timing.reconstruction.isin(reconstructions)]
    return float(rows.peak_scored_tokens.max()) if len(rows) else math.nan


def _mean_of(runs: list[dict], key: str) -> float:
    values = [r[key] for r in runs if key in r and r[key] is not None and not math.isnan(r[key])]
    return float(np.mean(values)) if values else math.nan


def _mean_turns(frames: list[pd.DataFrame]) -> float:
    """Mean turns per held-out evaluation episode over ``frames`` (nan where they do not record turns): how an arm
    ends its episodes (a policy that stops answering runs every episode to the turn limit)."""
    if not frames or any("turns" not in f for f in frames):
        return math.nan
    return float(np.mean([f.turns.mean() for f in frames]))


def results_table(cfg: ExperimentConfig, start: pd.DataFrame, ends: dict[str, list[pd.DataFrame]],
                  runs: dict[str, list[dict]], timing: pd.DataFrame, start_seen: pd.DataFrame | None = None,
                  ends_seen: dict[str, list[pd.DataFrame]] | None = None) -> pd.DataFrame:
    """One row per arm (columns :data:`RESULT_COLUMNS`): held-out F1 (the headline) and EM, seen F1."""
    rows = []
    for arm, arm_ends in ends.items():
        fields = ARMS[arm][1] or {}
        layouts = {fields.get("reconstruction", "aligned"), fields.get("teacher_reconstruction") or "aligned"}
        row = {"arm": arm, "label": ARMS[arm][0], "seeds": len(arm_ends), "updates": cfg.updates,
               "eval_episodes": len(start), "inference": INFERENCE_COLUMN,
               **arm_summary(start, arm_ends),
               "peak_context_tokens": float(np.mean([e.peak_context_tokens.max() for e in arm_ends])),
               "peak_scored_tokens": _peak_scored(timing, layouts if fields else {"aligned"}),
               "update_s": _mean_of(runs[arm], "update_s"),
               "train_cpu_min": _mean_of(runs[arm], "train_cpu_seconds") / 60,
               "start_turns": _mean_turns([start]), "end_turns": _mean_turns(arm_ends),
               **{k: _mean_of(runs[arm], k) for k in ("approx_kl_first", "clipfrac_first", "credit_share",
                                                      "flat_credited_tokens", "distill_loss")}}
        if start_seen is not None and ends_seen is not None:
            row.update(arm_summary(start_seen, ends_seen[arm], prefix="seen_"))
            row["seen_eval_episodes"] = len(start_seen)
        rows.append(row)
    return pd.DataFrame(rows).reindex(columns=RESULT_COLUMNS)


def comparisons_table(ends: dict[str, list[pd.DataFrame]],
                      ends_seen: dict[str, list[pd.DataFrame]] | None = None) -> pd.DataFrame:
    """Every pair of :func:`comparison_pairs` among the arms that ran: end F1 of ``a`` minus ``b`` on held-out
    questions, paired by training seed and episode (columns :data:`COMPARISON_COLUMNS`): the difference, its
    seed-level SE, t (nan where the seeds do not differ: ``zero_variance``), df, the exact sign-flip p, the
    two-level bootstrap interval, and the end-F1 ratio (information only)."""
    rows = []
    for a, b in comparison_pairs(ends):
        c = compare_arms(ends[a], ends[b])
        row = {"a": a, "b": b, "seeds": c["n_seeds"], "diff": c["mean"],
               **{k: c[k] for k in ("se", "t", "df", "p", "ci_low", "ci_high", "zero_variance", "p_exact",
                                    "p_exact_min", "p_exact_draws", "boot_low", "boot_high", "boot_se", "ratio",
                                    "seed_sd", "mde")}}
        if ends_seen is not None:
            s = compare_arms(ends_seen[a], ends_seen[b])
            row.update(seen_diff=s["mean"], seen_se=s["se"], seen_t=s["t"], seen_zero_variance=s["zero_variance"],
                       seen_p_exact=s["p_exact"], seen_boot_low=s["boot_low"], seen_boot_high=s["boot_high"])
        rows.append(row)
    return pd.DataFrame(rows).reindex(columns=COMPARISON_COLUMNS)


def _get(row, key: str, default: Any = math.nan) -> Any:
    """``row[key]``, or ``default`` where the row has no such field or it is empty (a table of fewer columns)."""
    v = row.get(key, default)
    return default if v is None or (isinstance(v, float) and math.isnan(v)) else v


_finite = is_finite_number


def _flag(v: Any) -> bool:
    """A boolean column's value: True only for a true boolean (an empty cell, nan, is not)."""
    return isinstance(v, (bool, np.bool_)) and bool(v)


def t_text(t: float, df: Any, zero_variance: Any = False) -> str:
    """``t 3.10 (df 9)``; for per-seed values that do not differ, ``no spread across seeds: no t`` (their t would
    be a division by zero, not a measurement); ``no t`` without one (a single seed)."""
    if _flag(zero_variance):
        return "no spread across seeds: no t"
    if not _finite(t):
        return "no t: one seed" if _finite(df) and df < 1 else "no t"
    return f"t {t:.2f} (df {int(df)})" if _finite(df) else f"t {t:.2f}"


def _exact_p_text(p: float, p_min: float, seeds: Any) -> str:
    """``exact sign-flip p 0.03``, saying so where it is the least p these seeds can give."""
    if not _finite(p):
        return ""
    at_floor = _finite(p_min) and p <= p_min * (1 + 1e-9)
    n = int(seeds) if _finite(seeds) else None
    floor = "" if not at_floor else " (the least these seeds can give)" if n is None else \
        f" (the least {n} seed{'s' if n != 1 else ''} can give)"
    return f"exact sign-flip p {p:.3g}{floor}"


def _interval(low: float, high: float) -> str:
    return f"[{_f(low, '+.3f')}, {_f(high, '+.3f')}]"


#: MemOPD's paper: aligned scoring beats the teacher-persistent control by 7% of the control's F1 (1.07x). In a
#: regime's own units the expected difference is this share of the control's end F1 (:func:`targets`).
PAPER_RELATIVE_EFFECT = 0.07
#: How results.md writes each verdict of :func:`distill.stats.verdict`.
VERDICT_TEXT = {"met": "met", "reversed": "REVERSED", "inconclusive": "INCONCLUSIVE", "not met": "MISSED"}
#: The decision rule, as the targets name it.
RULE = f"paired difference > 0 with exact p <= {ALPHA:g} and bootstrap 95% CI above 0"


def _claim_detail(diff: float, se: float, t: float, df: Any, zero_variance: Any, boot_low: float,
                  boot_high: float, p_exact: float, p_exact_min: float, seeds: Any, mde: float = math.nan) -> str:
    """``+0.030 ± 0.008 (seed SE), t 3.75 (df 9), bootstrap 95% CI [+0.012, +0.047], exact sign-flip p 0.002,
    minimum detectable effect 0.021 (80% power)``..."""
    parts = [f"{_f(diff, signed=True)} ± {_f(se)} (seed SE)", t_text(t, df, zero_variance),
             f"bootstrap 95% CI {_interval(boot_low, boot_high)}", _exact_p_text(p_exact, p_exact_min, seeds),
             f"minimum detectable effect {mde:.3f} ({POWER:.0%} power)" if _finite(mde) else ""]
    return ", ".join(p for p in parts if p)


def _mde_of(se: Any, seeds: Any) -> float:
    """The minimum detectable effect of a seed-level SE over ``seeds`` seeds (nan where either is missing)."""
    if not (_finite(se) and _finite(seeds)) or seeds < 2:
        return math.nan
    return minimum_detectable_effect(float(se) * math.sqrt(seeds), int(seeds))


def _seen_detail(row, value: str, se: str, zero_variance: str) -> str:
    """``; seen questions: +x ± se (t t)``: the same figure on seen questions, beside the headline."""
    v, e = _get(row, value), _get(row, se)
    if not (_finite(v) and _finite(e)):
        return ""
    t = "no spread across seeds: no t" if e == 0 or _flag(_get(row, zero_variance, False)) else f"t {v / e:.1f}"
    return f"; seen questions: {v:+.3f} ± {e:.3f} ({t})"


def _short_label(arm: str) -> str:
    label = ARMS[arm][0] if arm in ARMS else arm
    return label.split(" (")[0].split(":")[0]


#: The teacher's held-out F1 acting in the two views may differ by at most this much for the matched control to
#: change one thing only (the state the teacher scores in, not its familiarity with that state).
TEACHER_VIEW_TOLERANCE = 0.05


def view_gap_caveat(teacher: dict) -> str:
    """What the teacher's own difference between the two views does to the matched control's comparison, beside it
    (empty when the teacher was measured in one view only, or its views are within :data:`TEACHER_VIEW_TOLERANCE`):
    the control then changes two things, the state the teacher scores in and how well the teacher acts there, and
    only the outcome the gap works against can be read."""
    gap = teacher.get("view_gap")
    if gap is None or not _finite(gap) or abs(gap) <= TEACHER_VIEW_TOLERANCE:
        return ""
    views = (f"; the teacher's own held-out F1 differs between the views (memory minus persistent {gap:+.3f} ± "
             f"{teacher.get('view_gap_se', math.nan):.3f}, beyond {TEACHER_VIEW_TOLERANCE:g}): ")
    if gap < 0:
        return views + ("it acts better in the control's view, so a MemOPD win holds despite it, while a null or a "
                        "loss cannot be told apart from that gap")
    return views + ("it acts better in MemOPD's view, so a MemOPD loss holds despite it, while a win cannot be told "
                    "apart from that gap (the teacher's familiarity, not alignment)")


def targets(table: pd.DataFrame, comparisons: pd.DataFrame, teacher: dict | None = None,
            student: dict | None = None) -> list[dict[str, Any]]:
    """The set-up conditions and MemOPD's claims as targets, measured on held-out questions (``met`` a bool,
    ``value`` the figure, ``detail`` the inference; claims also carry ``verdict``). Every claim is a paired
    difference judged by :func:`distill.stats.verdict` (:data:`RULE`): met only where it is positive, its exact
    sign-flip p is at most 0.05 **and** its two-level bootstrap 95% interval (training seeds x evaluation episodes)
    lies above 0; "inconclusive" where the interval holds the paper's effect (the matched control:
    :data:`PAPER_RELATIVE_EFFECT` of the control's end F1) or excludes 0 without the exact test. The seed-level SE,
    t (or "no spread across seeds: no t"), the exact p and the minimum detectable effect stand beside it.
    The claims: MemOPD's end F1 above every other arm's that ran (paired by training seed: with a common start,
    the difference of the two gains), the matched control first, and MemOPD's gain above 0. A ratio of gains is
    printed as information only, and only when the denominator gain is positive."""
    by = table.set_index("arm") if len(table) else pd.DataFrame()
    out = []
    if teacher is not None:
        out.append({"target": "teacher held-out F1 >= 0.8", "value": teacher["f1"], "met": teacher["f1"] >= 0.8,
                    "detail": f"± {teacher['f1_se']:.3f} (episodes); seen questions "
                              f"{teacher.get('seen_f1', math.nan):.3f}"})
        if "persistent_f1" in teacher:  # the matched control is fair only with a teacher at home in both views
            out.append({"target": "teacher at home in both views: held-out F1 acting in the memory state and in the "
                                  "flattened transcript within 0.05", "value": teacher["view_gap"],
                        "met": abs(teacher["view_gap"]) <= TEACHER_VIEW_TOLERANCE,
                        "detail": f"memory {teacher['f1']:.3f} ± {teacher['f1_se']:.3f}, persistent "
                                  f"{teacher['persistent_f1']:.3f} ± {teacher['persistent_f1_se']:.3f}, difference "
                                  f"{teacher['view_gap']:+.3f} ± {teacher.get('view_gap_se', math.nan):.3f} (paired "
                                  f"episodes); seen {teacher.get('seen_f1', math.nan):.3f} vs "
                                  f"{teacher.get('persistent_seen_f1', math.nan):.3f}"})
    if student is not None:
        out.append({"target": "student start held-out F1 <= 0.3", "value": student["f1"],
                    "met": student["f1"] <= 0.3, "detail": f"± {student['f1_se']:.3f} (episodes)"})
        window = student.get("start_window")
        if window and teacher is not None:  # the window rule of issue 47, judged on the held-out start
            ratio = student["f1"] / teacher["f1"] if teacher["f1"] > 0 else math.nan
            out.append({"target": f"student start held-out F1 > {window['floor']:g} and <= the weak-start share of "
                                  "the teacher's", "value": student["f1"],
                        "met": window["floor"] < student["f1"] <= window["ceiling"],
                        "detail": f"± {student['f1_se']:.3f} (episodes); {ratio:.2f}x the teacher's "
                                  f"{teacher['f1']:.3f}; window ({window['floor']:g}, {window['ceiling']:.3f}]; "
                                  f"the probes stopped it: {window['verdict']}"})
    rows = comparisons[comparisons["a"] == HEADLINE_ARM] if len(comparisons) else comparisons
    for _, c in rows.iterrows():
        b = c["b"]
        name = ("MemOPD (aligned) above the teacher-persistent control" if b == MATCHED_CONTROL
                else f"MemOPD above {_short_label(b)}")
        detail = "end F1 difference " + _claim_detail(
            c["diff"], _get(c, "se"), _get(c, "t"), _get(c, "df"), _get(c, "zero_variance", False),
            _get(c, "boot_low"), _get(c, "boot_high"), _get(c, "p_exact"), _get(c, "p_exact_min"),
            _get(c, "seeds"), _get(c, "mde", _mde_of(_get(c, "se"), _get(c, "seeds"))))
        expected = math.nan
        if b == MATCHED_CONTROL and b in by.index and _finite(_get(by.loc[b], "end_f1")):
            expected = PAPER_RELATIVE_EFFECT * float(by.loc[b, "end_f1"])
            detail += (f"; the paper's effect here: {expected:+.4f} ({PAPER_RELATIVE_EFFECT:.0%} of the control's "
                       f"end F1)")
        if {HEADLINE_ARM, b} <= set(by.index):
            g_a, g_b = by.loc[HEADLINE_ARM, "gain_f1"], by.loc[b, "gain_f1"]
            detail += f"; gains {g_a:+.3f} vs {g_b:+.3f}"
            if _finite(g_b) and g_b > 0:
                detail += f" (ratio {g_a / g_b:.2f}, information only)"
            if _get(by.loc[HEADLINE_ARM], "end_f1") == 0 and _get(by.loc[b], "end_f1") == 0:
                # F1 >= 0, so a mean of 0 is 0 on every seed and episode: a floor, not a null
                detail += ("; both arms end at F1 0 on every seed (collapsed to the floor): the comparison cannot "
                           "tell them apart, and says nothing of which scoring is better")
        detail += _seen_detail(c, "seen_diff", "seen_se", "seen_zero_variance")
        if b == MATCHED_CONTROL and teacher is not None:
            detail += view_gap_caveat(teacher)
        v = verdict(c["diff"], _get(c, "boot_low"), _get(c, "boot_high"), _get(c, "p_exact"), expected)
        out.append({"target": f"{name}: {RULE}", "value": c["diff"], "met": v == "met", "verdict": v,
                    "detail": detail})
    if HEADLINE_ARM in by.index:
        r = by.loc[HEADLINE_ARM]
        detail = "gain " + _claim_detail(
            r["gain_f1"], _get(r, "gain_f1_se"), _get(r, "gain_f1_t"), _get(r, "gain_f1_df"),
            _get(r, "gain_f1_zero_variance", False), _get(r, "gain_f1_boot_low"), _get(r, "gain_f1_boot_high"),
            _get(r, "gain_f1_p_exact"), _get(r, "gain_f1_p_exact_min"), _get(r, "seeds"),
            _mde_of(_get(r, "gain_f1_se"), _get(r, "seeds")))
        detail += _seen_detail(r, "seen_gain_f1", "seen_gain_f1_se", "seen_gain_f1_zero_variance")
        v = verdict(r["gain_f1"], _get(r, "gain_f1_boot_low"), _get(r, "gain_f1_boot_high"),
                    _get(r, "gain_f1_p_exact"))
        out.append({"target": f"MemOPD gain (end - start, paired): {RULE.replace('paired difference', 'gain')}",
                    "value": r["gain_f1"], "met": v == "met", "verdict": v, "detail": detail})
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


def _sign_flip_note(seeds: int) -> str:
    """What the exact p can say with ``seeds`` training seeds: its floor, and whether every flip was counted."""
    flips = sign_flip_test(np.ones(max(1, seeds)))  # all flips agree: the smallest p these seeds allow
    how = "every one of the 2^n sign flips counted" if flips["draws"] == 0 else \
        f"{flips['draws']:,} sign flips drawn at random (seed 0)"
    return f"{how}; with {seeds} seeds no p below {flips['p_min']:.3g}"


#: What a ``--quick`` run is (its first line, and the head of its results.md).
SMOKE_NOTE = ("Smoke run (--quick): it checks that every stage of the pipeline runs, with tiny models and budgets; "
              "F1 near 0 everywhere (the teacher's too) and t 'nan' are expected, and the targets are not expected "
              "to be met (reported as 'not judged: smoke run'). The claims need the full run (without --quick).")


def format_markdown(cfg: ExperimentConfig, table: pd.DataFrame, comparisons: pd.DataFrame, teacher: dict,
                    student: dict, timing: pd.DataFrame, diagnostics: pd.DataFrame | None, host: str,
                    goals: list[dict]) -> str:
    """results.md: setup, the arm table, the comparisons, timing, diagnostics and the targets."""
    seeds = int(table.seeds.max())
    lines = [f"# MemOPD experiment ({ENV_ID} {cfg.env_kwargs})", "",
             *([f"**{SMOKE_NOTE}**", ""] if cfg.smoke else []), host, "",
             f"questions: the world's entities split before training, {cfg.heldout_fraction:.0%} held out: "
             "SFT, probes and GRPO episodes draw train-pool questions only; **held-out** = questions about "
             "held-out entities (never trained on), **seen** = train-pool questions on evaluation seeds",
             f"teacher: {model_shape(teacher)} ({teacher['parameters']:,} parameters), "
             f"{teacher['steps']} SFT steps, held-out F1 {teacher['f1']:.3f} ± {teacher['f1_se']:.3f}, "
             f"EM {teacher['em']:.3f}; seen F1 {teacher.get('seen_f1', math.nan):.3f}",
             *([f"teacher acting in the flattened transcript (the teacher-persistent control's view; trained on "
                f"{' and '.join(teacher.get('sft_views', ['memory']))} views): held-out F1 "
                f"{teacher['persistent_f1']:.3f} ± {teacher['persistent_f1_se']:.3f}, seen "
                f"{teacher.get('persistent_seen_f1', math.nan):.3f}; memory minus persistent {teacher['view_gap']:+.3f}"]
               if "persistent_f1" in teacher else []),
             f"student start: {model_shape(student)} ({student['parameters']:,} "
             f"parameters, teacher's tokenizer), {student['steps']} SFT steps, held-out F1 {student['f1']:.3f} ± "
             f"{student['f1_se']:.3f}, EM {student['em']:.3f}; seen F1 {student.get('seen_f1', math.nan):.3f}",
             f"arms: {cfg.updates} GRPO updates x {cfg.tasks_per_update * cfg.group_size} episodes "
             f"({cfg.tasks_per_update} tasks x {cfg.group_size}), lr {cfg.lr}, KL {cfg.kl_coef}, temperature "
             f"{cfg.temperature}, lambda {cfg.distill_coef}"
             + (f", lr warm-up over {cfg.warmup_updates} updates" if cfg.warmup_updates else "")
             + (f", GRPO alone at lr {cfg.rl_lr:g}" if cfg.rl_lr is not None else "")
             + f"; {seeds} training seeds; evaluation: "
             f"{int(table.eval_episodes.max())} held-out and {cfg.seen_eval_episodes} seen episodes (greedy), the "
             "same episodes at the start and the end", "",
             f"Inference ({seeds} training seeds, df = {seeds - 1}): {INFERENCE}. A claim is met when its paired difference is above 0, "
             f"its exact sign-flip p is at most {ALPHA:g} **and** its 95% bootstrap interval (training seeds, and inside "
             "them the same resampled evaluation episodes for every seed) lies above 0; INCONCLUSIVE where the "
             "interval holds the effect the claim predicts (the paper's 7% for the matched control), with the "
             f"minimum detectable effect at {POWER:.0%} power beside it; the exact p flips the signs of the per-seed differences "
             f"({_sign_flip_note(seeds)}); seeds whose differences are all equal get no t. 'episode SE' averages "
             "the seeds first and is shown only to compare (it leaves out the training-seed variance).", "",
             "| arm | held-out F1 start | end (± sd over seeds) | gain ± SE (seeds) | t | exact p | "
             "95% CI (bootstrap) | episode SE | seen F1 end | seen gain ± SE | EM gain ± SE | approx-KL update 1 | "
             "credit share / tokens credited in flat groups | turns start / end | s/update | CPU-min |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for _, r in table.iterrows():
        lines.append(
            f"| {r.label} | {r.start_f1:.3f} | {r.end_f1:.3f} ± {_f(r.end_f1_seed_sd)} | "
            f"{_f(r.gain_f1, signed=True)} ± {_f(r.gain_f1_se)} | "
            f"{t_text(r.gain_f1_t, r.gain_f1_df, _get(r, 'gain_f1_zero_variance', False))} | "
            f"{_f(r.gain_f1_p_exact, '.3g')} | {_interval(r.gain_f1_boot_low, r.gain_f1_boot_high)} | "
            f"{_f(r.gain_f1_episode_se)} | {_f(r.seen_end_f1)} | {_f(r.seen_gain_f1, signed=True)} ± "
            f"{_f(r.seen_gain_f1_se)} | {_f(r.gain_em, signed=True)} ± {_f(r.gain_em_se)} | "
            f"{_f(r.approx_kl_first, '.4f')} | {_f(r.credit_share, '.2f')} / {_f(r.flat_credited_tokens, '.0f')} | "
            f"{_f(_get(r, 'start_turns'), '.2f')} / {_f(_get(r, 'end_turns'), '.2f')} | {_f(r.update_s, '.1f')} | "
            f"{_f(r.train_cpu_min, '.1f')} |")
    if len(comparisons):
        lines += ["", "Comparisons (held-out end F1 of a minus b, paired by training seed and episode; with a common "
                      "start, the difference of the two gains): the difference with its SE across seeds, t on df "
                      "(or none: no spread across seeds), the two-level bootstrap 95% CI, the exact sign-flip p; "
                      "the end-F1 ratio a / b is information, never a verdict:", "",
                  "| a | b | seeds | difference ± SE (seeds) | t | 95% CI (bootstrap) | exact p | ratio a / b | "
                  "seen difference ± SE |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for _, c in comparisons.iterrows():
            ratio = c["ratio"] if _finite(c["ratio"]) else math.nan  # b ends at F1 0: no ratio to print
            lines.append(f"| {c.a} | {c.b} | {int(c.seeds)} | {_f(c['diff'], signed=True)} ± {_f(c.se)} | "
                         f"{t_text(c.t, c.df, _get(c, 'zero_variance', False))} | "
                         f"{_interval(c.boot_low, c.boot_high)} | {_f(c.p_exact, '.3g')} | {_f(ratio)} | "
                         f"{_f(c.seen_diff, signed=True)} ± {_f(c.seen_se)} |")
    sweeps = [Path(cfg.out) / "sweep" / "result.json"] + sorted((Path(cfg.out) / "sweep").glob("*/result.json"))
    for sweep in (p for p in sweeps if p.exists()):
        res = json.loads(sweep.read_text())
        arm = res.get("arm", "rl")
        who = "GRPO alone's" if arm == "rl" else f"{_short_label(arm)}'s"
        edge = " (on the grid's edge after its extensions: the best rate may lie beyond)" if res.get("on_edge") else ""
        lines += ["", f"{who} learning rate (sweep: a full-length run per rate and seed, {res['seeds']} seed(s) "
                      f"each, greedy F1 on {res['probe_episodes']} train-pool probe episodes, never the evaluation "
                      f"episodes; {res['train_cpu_seconds'] / 60:.1f} CPU-min of training): "
                  + ", ".join(f"{r['lr']:g}: {r['probe_f1']:.3f} (" + "/".join(f"{v:.3f}" for v in r["per_seed"]) + ")"
                              for r in res["table"]) + f"; chosen **{res['chosen_lr']:g}**{edge}."]
    if any(a in SFT_ARMS for a in table.arm):
        lines += ["", f"The SFT arms train for the training CPU seconds of the same seed's {cfg.equal_cpu_arm} run "
                      "(data making included: the oracle's demonstrations, or the teacher's greedy episodes sampled "
                      f"with up to {cfg.seqkd_sample_share:.0%} of it); their CPU-min column is that spend."]
    lines += ["", "Actor timing on one update's records (start student; see timing.csv):", "",
              markdown_table(timing, ".3f")]
    if diagnostics is not None:
        cols = [c for c in ("method", "max_abs_dlogp", "p99_abs_dlogp", "clip_share", "action_tokens", "tokens")
                if c in diagnostics.columns]
        lines += ["", "Misalignment of the flattened transcript, on records of the flattening arm's final student "
                      "(|d log-prob| vs the sampled log-probs; clip_share: tokens whose ratio against the sampled "
                      "log-probs leaves [0.8, 1.2]; that arm recomputes its old log-probs, so its own ratio starts "
                      "at 1):", "", markdown_table(diagnostics[cols], ".4f")]
    judged = (lambda g: "not judged: smoke run") if cfg.smoke else \
        (lambda g: VERDICT_TEXT[g.get("verdict", "met" if g["met"] else "not met")])
    lines += ["", "Targets" + (" (a smoke run of the pipeline: tiny budgets, figures near 0 expected, targets not "
                               "expected to be met, so none is judged)" if cfg.smoke else "") + ":", ""]
    lines += [f"- {g['target']}: {_f(g['value'], '.3f')} — {judged(g)} ({g['detail']})" for g in goals]
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
        # and one marker and dash per arm, smaller for later arms: arms on the same points (two collapsed to 0)
        # stay visible one inside the other instead of the last one drawn hiding the others
        i = list(ARMS).index(arm)
        style = dict(marker="osD^vP*X"[i % 8], markersize=9 - 1.2 * (i % 5), linestyle=("-", "--", ":", "-.")[i % 4],
                     markerfacecolor="none" if i % 2 else color)
        label = ARMS[arm][0]
        short = label if len(label) <= 40 else label.split(" (")[0]
        c = curve_frame(cfg, arm, start)
        if len(c):
            per = c.pivot(index="update", columns="training_seed", values="f1").sort_index()
            mean = per.mean(axis=1).to_numpy()
            se = np.array([standard_error(row.dropna()) for _, row in per.iterrows()])  # nan (no band): < 2 seeds
            x = per.index.to_numpy()
            axes[0].plot(x, mean, label=f"{short} (n={per.shape[1]})", color=color, **style)
            axes[0].fill_between(x, mean - np.nan_to_num(se), mean + np.nan_to_num(se), alpha=0.2, color=color)
        frames = [pd.read_csv(p) for p in sorted((Path(cfg.out) / "arms" / arm).glob("seed*/metrics.csv"))]
        frames = [f[f["update"] > 0] for f in frames if "distill_loss" in f]
        if frames:
            n_up = min(len(f) for f in frames)
            dl = np.stack([f["distill_loss"].to_numpy(float)[:n_up] for f in frames]).mean(0)
            axes[1].plot(frames[0]["update"].to_numpy()[:n_up], dl, label=short, color=color,
                         linestyle=style["linestyle"])
    from matplotlib.ticker import MaxNLocator

    top = max(0.05, axes[0].get_ylim()[1])
    axes[0].set_ylim(-0.03 * top, top)  # a little below 0: points at F1 0 are drawn whole
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


__all__ = ["RESULT_COLUMNS", "COMPARISON_COLUMNS", "HEADLINE_ARM", "MATCHED_CONTROL", "COMPARISONS",
           "INFERENCE_COLUMN", "PAPER_RELATIVE_EFFECT", "VERDICT_TEXT", "RULE", "comparison_pairs", "results_table",
           "comparisons_table", "t_text",
           "targets", "markdown_table", "format_markdown", "curve_frame", "plot_curves"]
