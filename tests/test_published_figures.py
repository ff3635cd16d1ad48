"""Every published figure has a record (issue 60 item 3).

Each figure of the README's "What is measured" table, its real-model table and docs/results.md's summary is found
as printed in its row (the row found by a stable anchor: its label), and recomputed from the committed file under
``results/`` that holds it, to the printed precision; the row names that file. A figure whose record is gone is
listed apart and its row must say "no committed record" beside it. Every number of those cells is either a figure
checked here or a setting named in ``SETTINGS`` (so a new figure without a record fails). Reads only; writes
nothing.
"""

from __future__ import annotations

import csv
import json
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable

import pytest

ROOT = Path(__file__).resolve().parents[1]
README, RESULTS, REAL = "README.md", "docs/results.md", "docs/real_models.md"

FAIR = "results/memopd_fair"
REAL_FAIR = "results/memopd_real_fair"
RECORDS = "results/records"


# ------------------------------------------------------------------------------------------ reading records
@lru_cache(maxsize=None)
def _csv(path: str) -> tuple[dict, ...]:
    with open(ROOT / path, newline="") as f:
        return tuple(csv.DictReader(f))


@lru_cache(maxsize=None)
def _json(path: str):
    return json.loads((ROOT / path).read_text())


def row(path: str, **match) -> dict:
    """The one CSV row of ``path`` whose columns equal ``match``."""
    found = [r for r in _csv(path) if all(r[k] == str(v) for k, v in match.items())]
    assert len(found) == 1, f"{path}: {len(found)} rows match {match}"
    return found[0]


def num(path: str, column: str, **match) -> float:
    return float(row(path, **match)[column])


def comparison(b: str, column: str, a: str = "memopd", run: str = FAIR) -> float:
    return num(f"{run}/comparisons.csv", column, a=a, b=b)


def arm(name: str, column: str, run: str = FAIR) -> float:
    return num(f"{run}/results.csv", column, arm=name)


def js(path: str, *keys):
    value = _json(path)
    for k in keys:
        value = value[k]
    return value


def js_row(path: str, rows_key: str, **match) -> dict:
    found = [r for r in js(path, rows_key) if all(r[k] == v for k, v in match.items())]
    assert len(found) == 1, f"{path}: {len(found)} {rows_key} match {match}"
    return found[0]


# --------------------------------------------------------------------------------------------- formatting
def fixed(decimals: int, sign: bool = False, suffix: str = "") -> Callable[[float], str]:
    spec = f"{'+' if sign else ''}.{decimals}f"

    def show(v: float) -> str:
        text = format(v, spec)
        if sign and float(text) == 0:  # -0.000 prints as +0.000
            text = "+" + text.lstrip("+-")
        return text + suffix

    return show


def thousands(decimals: int = 0, sign: bool = False, suffix: str = "") -> Callable[[float], str]:
    return lambda v: format(v, f"{'+' if sign else ''},.{decimals}f") + suffix


def percent(decimals: int) -> Callable[[float], str]:
    return lambda v: format(100 * v, f".{decimals}f") + "%"


def span(low: Callable, high: Callable, sep: str = " to ") -> Callable[[tuple], str]:
    return lambda v: low(v[0]) + sep + high(v[1])


# ------------------------------------------------------------------------------------------------ figures
@dataclass(frozen=True)
class Figure:
    doc: str       # the page
    anchor: str    # text only the figure's row holds (its label)
    printed: str   # the figure as printed in that row
    record: str    # the committed file holding it, named in the row
    value: Callable[[], object]
    show: Callable[[object], str]

    def __str__(self) -> str:
        return f"{self.doc} [{self.anchor[:40]}] {self.printed}"


def _bench_peak_ratio() -> tuple[float, float]:
    """History's peak context over each compact memory's (oracle, keep-all, relevance), bench configurations
    without a budget: the range."""
    path = f"{RECORDS}/bench_default.csv"
    ratios = []
    for env in ("MemQA-v0", "MemQA-v0:objectives=8,hops=3"):
        history = num(path, "peak_context_tokens", env=env, strategy="history")
        ratios += [history / num(path, "peak_context_tokens", env=env, strategy=s)
                   for s in ("oracle", "keep-all", "relevance")]
    return min(ratios), max(ratios)


def _bench_f1_equal() -> bool:
    """Without a budget the transcript (history) answers exactly as well as every compact memory."""
    rows = [r for r in _csv(f"{RECORDS}/bench_default.csv") if "context_budget" not in r["env"]]
    return all(r["f1"] == next(h["f1"] for h in rows if h["env"] == r["env"] and h["strategy"] == "history")
               for r in rows if r["strategy"] in ("oracle", "keep-all", "relevance"))


def _budget_lowest_answering() -> str:
    """The strategy with the lowest peak context among those that answer (F1 1.0) under the 800-token budget."""
    rows = [r for r in _csv(f"{RECORDS}/bench_default.csv") if r["env"] == "MemQA-v0:objectives=16,context_budget=800"]
    return min((r for r in rows if float(r["f1"]) == 1.0), key=lambda r: float(r["peak_context_tokens"]))["strategy"]


def _rss_delta(path: str, size_key: str, last: int, first: int) -> float:
    rows = {r[size_key]: r["peak_rss_mb"] for r in js(path, "rows")}
    return rows[last] - rows[first]


def _real_views(kind: str) -> tuple[int, int]:
    """The real pair's teacher in the start student's states after the first turn: (``kind`` count, states)."""
    rows = [r for r in _csv(f"{REAL_FAIR}/teacher_views_start.csv") if r["view"] == "aligned" and int(r["turn"]) >= 1]
    return sum(r["kind"] == kind for r in rows), len(rows)


def _fair_views(view: str, kind: str) -> int:
    return sum(r["view"] == view and r["kind"] == kind
               for r in _csv("results/view_divergence/fair_teacher_views.csv"))


def _gain_ratios() -> tuple[float, float]:
    gain = arm("memopd", "gain_f1")
    return arm("seqkd", "gain_f1") / gain, arm("sft_continued", "gain_f1") / gain


def _fvm(chunk: int) -> float:
    return js_row(f"{RECORDS}/full_vocab_memory.json", "rows", chunk=chunk)["peak_mb_above_start"]


def _packing(source: str, pass_: str, versus: str = "best") -> float:
    return js(f"{RECORDS}/teacher_packing_{source}.json", "layouts", "prefix_tree sdpa_blocks", f"{pass_}_x_{versus}")


def _teacher(key: str) -> float:
    return js(f"{FAIR}/teacher/result.json", key)


_M_BENCH = "| Without a context budget, the whole transcript"
_M_BUDGET = "| Under an 800-token budget"
_M_RSS = "| Memory stays flat over long inputs"
_M_CITED = "| Cited benchmarks, scored their official way"
_M_SEARCH = "| In-memory BM25 is fast and exact"
_M_TEACHER = "| A tiny teacher learns to read"
_M_FAIR = "| Fair run (fresh world, 10 seeds, held-out subjects)"
_M_FAIR_SFT = "| Fair run: MemOPD vs GRPO alone"
_T_BENCH = "| `relevance` (scripted) / SmolLM2 zero-shot"
_T_PAIR = "| MemOPD on the real pair, fair control"
_T_ROLLOUT = "| rollouts, one GRPO update's calls"
_T_VOCAB = "| full-vocabulary distillation, 2,048 positions"
_S_ALIGNED = "| Aligned scoring beats the teacher-persistent matched control"
_S_RL = "| MemOPD beats RL alone"
_S_CHEAP = "| MemOPD beats the cheapest alternative at equal CPU"
_S_FLAT = "| MemOPD beats the flattening trainer"
_S_DIST = "| Flattening an episode distorts"
_S_PACK = "| Packing speeds up scoring"
_S_REAL = "| The same claims on a real pair"
_S_TEACHER = "| A teacher that reads (our precondition)"
_VIEWS = "`results/view_divergence/fair_teacher_views.csv`): aligned"

COMP = f"{FAIR}/comparisons.csv"
RES = f"{FAIR}/results.csv"
DIAG = f"{FAIR}/diagnostics.csv"
TEACHER = f"{FAIR}/teacher/result.json"
VIEWS = "results/view_divergence/fair_teacher.json"
VIEWS_REGIME = "docs/views_regime.md"
RCOMP = f"{REAL_FAIR}/comparisons.csv"
RRES = f"{REAL_FAIR}/results.csv"
SEARCH = f"{RECORDS}/search_speed_1m.json"
F3, F3s = fixed(3), fixed(3, sign=True)


def _fair_run_figures(doc: str, aligned: str, rl: str, sft: str) -> list[Figure]:
    """The fair run's headline figures, printed alike in the README's rows and results.md's summary."""
    return [
        Figure(doc, aligned, "+0.005", COMP, lambda: comparison("teacher_persistent", "diff"), F3s),
        Figure(doc, aligned, "-0.006 to +0.016", COMP,
               lambda: (comparison("teacher_persistent", "boot_low"), comparison("teacher_persistent", "boot_high")),
               span(F3s, F3s)),
        Figure(doc, aligned, "p 0.22", COMP, lambda: comparison("teacher_persistent", "p_exact"),
               lambda v: f"p {v:.2f}"),
        Figure(doc, aligned, "0.013 at 80% power", COMP, lambda: comparison("teacher_persistent", "mde"),
               lambda v: f"{v:.3f} at 80% power"),
        Figure(doc, aligned, "cosine 0.993", VIEWS,
               lambda: js_row(VIEWS, "rows", setting="base")["between_view_cosine"],
               lambda v: f"cosine {v:.3f}"),
        Figure(doc, rl, "+0.034", COMP, lambda: comparison("rl", "diff"), F3s),
        Figure(doc, rl, "+0.018 to +0.052", COMP,
               lambda: (comparison("rl", "boot_low"), comparison("rl", "boot_high")), span(F3s, F3s)),
        Figure(doc, sft, "+0.150 above MemOPD", COMP, lambda: -comparison("sft_continued", "diff"),
               lambda v: f"{v:+.3f} above MemOPD"),
        Figure(doc, sft, "+0.126 to +0.174", COMP,
               lambda: (-comparison("sft_continued", "boot_high"), -comparison("sft_continued", "boot_low")),
               span(F3s, F3s)),
        Figure(doc, sft, "+0.103 above", COMP, lambda: -comparison("seqkd", "diff"), lambda v: f"{v:+.3f} above"),
    ]


FIGURES: list[Figure] = [
    # README, "What is measured"
    Figure(README, _M_BENCH, "peak context 2.6–10x", f"{RECORDS}/bench_default.csv", _bench_peak_ratio,
           lambda v: f"peak context {v[0]:.1f}–{v[1]:.0f}x"),
    Figure(README, _M_BENCH, "F1 equal", f"{RECORDS}/bench_default.csv", _bench_f1_equal,
           lambda v: "F1 equal" if v else "F1 differs"),
    Figure(README, _M_BUDGET, "F1 0.06 vs 1.0", f"{RECORDS}/bench_default.csv",
           lambda: (num(f"{RECORDS}/bench_default.csv", "f1", env="MemQA-v0:objectives=16,context_budget=800",
                        strategy="history"),
                    num(f"{RECORDS}/bench_default.csv", "f1", env="MemQA-v0:objectives=16,context_budget=800",
                        strategy="relevance")),
           lambda v: f"F1 {v[0]:.2f} vs {v[1]:.1f}"),
    Figure(README, _M_BUDGET, "at the lowest peak context", f"{RECORDS}/bench_default.csv",
           _budget_lowest_answering, lambda v: "at the lowest peak context" if v == "relevance" else v),
    Figure(README, _M_RSS, "+0.5 MB from 10K to 1M document tokens", f"{RECORDS}/memread_rss.json",
           lambda: _rss_delta(f"{RECORDS}/memread_rss.json", "doc_tokens", 1_000_037, 10_035),
           lambda v: f"{fixed(1, sign=True)(v)} MB from 10K to 1M document tokens"),
    Figure(README, _M_RSS, "+6.9 MB from 128K to 10M chat tokens", f"{RECORDS}/beam_rss.json",
           lambda: _rss_delta(f"{RECORDS}/beam_rss.json", "chat_tokens", 10_000_000, 128_000),
           lambda v: f"{fixed(1, sign=True)(v)} MB from 128K to 10M chat tokens"),
    Figure(README, _M_RSS, "+9.4 MB, 197 to 207 MB peak", f"{RECORDS}/beam_rss_snapshots_default.json",
           lambda: (_rss_delta(f"{RECORDS}/beam_rss_snapshots_default.json", "chat_tokens", 10_000_000, 128_000),
                    js(f"{RECORDS}/beam_rss_snapshots_default.json", "rows", 0, "peak_rss_mb"),
                    js(f"{RECORDS}/beam_rss_snapshots_default.json", "rows", -1, "peak_rss_mb")),
           lambda v: f"{v[0]:+.1f} MB, {v[1]:.0f} to {v[2]:.0f} MB peak"),
    Figure(README, _M_RSS, "+0.0 MB to a 1.5M-token LongMemEval item", f"{RECORDS}/longmemeval_rss.json",
           lambda: js(f"{RECORDS}/longmemeval_rss.json", "peak_rss_delta_mb"),
           lambda v: f"{fixed(1, sign=True)(v)} MB to a 1.5M-token LongMemEval item"),
    Figure(README, _M_CITED, "LoCoMo `locomo_f1` 0.175 (BM25 reader)", f"{RECORDS}/locomo_bm25.csv",
           lambda: float(_csv(f"{RECORDS}/locomo_bm25.csv")[0]["official:locomo_f1"]),
           lambda v: f"LoCoMo `locomo_f1` {v:.3f} (BM25 reader)"),
    Figure(README, _M_CITED, "LongMemEval dev accuracy 0.250", f"{RECORDS}/longmemeval_bm25.csv",
           lambda: float(_csv(f"{RECORDS}/longmemeval_bm25.csv")[0]["official:accuracy"]),
           lambda v: f"LongMemEval dev accuracy {v:.3f}"),
    Figure(README, _M_SEARCH, "242x the queries/s of `rank-bm25`, identical rankings", SEARCH,
           lambda: (js(SEARCH, "ratio_bm25_reference"), js(SEARCH, "ranking_mismatches"), js(SEARCH, "max_score_diff")),
           lambda v: f"{v[0]:.0f}x the queries/s of `rank-bm25`, "
                     + ("identical rankings" if v[1] == 0 and v[2] == 0 else "rankings differ")),
    Figure(README, _M_SEARCH, "38 ms mean per query over 1M passages", SEARCH,
           lambda: (js(SEARCH, "index_query", "dist", "mean"), js(SEARCH, "docs")),
           lambda v: f"{v[0]:.0f} ms mean per query over {v[1] / 1e6:.0f}M passages"),
    *_fair_run_figures(README, _M_FAIR, _M_FAIR_SFT, _M_FAIR_SFT),
    Figure(README, _M_FAIR, "(+0.004 here)", RES, lambda: 0.07 * arm("teacher_persistent", "end_f1"),
           lambda v: f"({v:+.3f} here)"),
    Figure(README, _M_TEACHER, "0.886 new draws", TEACHER, lambda: _teacher("seen_f1"), lambda v: f"{v:.3f} new draws"),
    Figure(README, _M_TEACHER, "0.676 held-out subjects", TEACHER, lambda: _teacher("f1"),
           lambda v: f"{v:.3f} held-out subjects"),
    Figure(README, _M_TEACHER, "100 CPU-min", TEACHER, lambda: _teacher("sft_minutes"), lambda v: f"{v:.0f} CPU-min"),
    # README, the real-model table
    Figure(README, _T_ROLLOUT, "0.89 ± 0.08x (3 rounds; decode 0.76x)", "results/limits/rollout_vllm_compiled.json",
           lambda: (_json("results/limits/rollout_vllm_compiled.json")["ratios"]["b/g"], ),
           lambda v: f"{v[0]['tokens_per_cpu_s']['mean']:.2f} ± {v[0]['tokens_per_cpu_s']['sd']:.2f}x "
                     f"({len(v[0]['tokens_per_cpu_s']['rounds'])} rounds; decode {v[0]['decode_tokens_per_cpu_s']['mean']:.2f}x)"),
    Figure(README, _T_VOCAB, "+342 MB / +2,408 MB, same loss", f"{RECORDS}/full_vocab_memory.json",
           lambda: (_fvm(128), _fvm(2048), js(f"{RECORDS}/full_vocab_memory.json", "loss_spread")),
           lambda v: f"{v[0]:+,.0f} MB / {v[1]:+,.0f} MB, "
                     + ("same loss" if v[2] == 0 else f"loss within {v[2]:.1e}")),
    Figure(README, _T_PAIR, "0.100 / 0.052 / 0.000 / 0.000 / 0.089", RRES,
           lambda: [arm("rl", "start_f1", REAL_FAIR)]
                   + [arm(a, "end_f1", REAL_FAIR) for a in ("rl", "memopd", "teacher_persistent", "sft_continued")],
           lambda v: " / ".join(f"{x:.3f}" for x in v)),
    Figure(README, _T_PAIR, "63 of the student's 65 states", f"{REAL_FAIR}/teacher_views_start.csv",
           lambda: _real_views("search"), lambda v: f"{v[0]} of the student's {v[1]} states"),
    # docs/results.md, the summary
    *_fair_run_figures(RESULTS, _S_ALIGNED, _S_RL, _S_CHEAP),
    Figure(RESULTS, _S_ALIGNED, "seen subjects -0.001 ± 0.007", COMP,
           lambda: (comparison("teacher_persistent", "seen_diff"), comparison("teacher_persistent", "seen_se")),
           lambda v: f"seen subjects {v[0]:+.3f} ± {v[1]:.3f}"),
    Figure(RESULTS, _S_ALIGNED, "end F1 0.065 vs 0.060", RES,
           lambda: (arm("memopd", "end_f1"), arm("teacher_persistent", "end_f1")),
           lambda v: f"end F1 {v[0]:.3f} vs {v[1]:.3f}"),
    Figure(RESULTS, _S_ALIGNED, "(+0.0042)", RES, lambda: 0.07 * arm("teacher_persistent", "end_f1"),
           lambda v: f"({v:+.4f})"),
    Figure(RESULTS, _S_RL, "+0.034 (95% CI +0.018 to +0.052, p 0.00195)", COMP,
           lambda: (comparison("rl", "diff"), comparison("rl", "boot_low"), comparison("rl", "boot_high"),
                    comparison("rl", "p_exact")),
           lambda v: f"{v[0]:+.3f} (95% CI {v[1]:+.3f} to {v[2]:+.3f}, p {v[3]:.5f})"),
    Figure(RESULTS, _S_RL, "gains +0.042 vs +0.008", RES, lambda: (arm("memopd", "gain_f1"), arm("rl", "gain_f1")),
           lambda v: f"gains {v[0]:+.3f} vs {v[1]:+.3f}"),
    Figure(RESULTS, _S_RL, "seen +0.011 ± 0.007", COMP, lambda: (comparison("rl", "seen_diff"),
                                                                comparison("rl", "seen_se")),
           lambda v: f"seen {v[0]:+.3f} ± {v[1]:.3f}"),
    Figure(RESULTS, _S_CHEAP, "p 0.00195", COMP, lambda: comparison("sft_continued", "p_exact"),
           lambda v: f"p {v:.5f}"),
    Figure(RESULTS, _S_CHEAP, "(+0.078 to +0.127)", COMP,
           lambda: (-comparison("seqkd", "boot_high"), -comparison("seqkd", "boot_low")),
           lambda v: f"({v[0]:+.3f} to {v[1]:+.3f})"),
    Figure(RESULTS, _S_CHEAP, "learns 3.4-4.5x more", RES, _gain_ratios,
           lambda v: f"learns {v[0]:.1f}-{v[1]:.1f}x more"),
    Figure(RESULTS, _S_CHEAP, "(gains 0.145 and 0.192 against 0.042)", RES,
           lambda: (arm("seqkd", "gain_f1"), arm("sft_continued", "gain_f1"), arm("memopd", "gain_f1")),
           lambda v: f"(gains {v[0]:.3f} and {v[1]:.3f} against {v[2]:.3f})"),
    Figure(RESULTS, _S_FLAT, "+0.030 (95% CI +0.018 to +0.043, p 0.00195)", COMP,
           lambda: (comparison("flattening", "diff"), comparison("flattening", "boot_low"),
                    comparison("flattening", "boot_high"), comparison("flattening", "p_exact")),
           lambda v: f"{v[0]:+.3f} (95% CI {v[1]:+.3f} to {v[2]:+.3f}, p {v[3]:.5f})"),
    Figure(RESULTS, _S_DIST, "p99 \\|Δ\\| 2.18, 8.2% outside the clip", DIAG,
           lambda: (num(DIAG, "p99_abs_dlogp", method="persistent"), num(DIAG, "clip_share", method="persistent")),
           lambda v: f"p99 \\|Δ\\| {v[0]:.2f}, {100 * v[1]:.1f}% outside the clip"),
    Figure(RESULTS, _S_DIST, "aligned 0 and 0%", DIAG,
           lambda: (num(DIAG, "p99_abs_dlogp", method="aligned"), num(DIAG, "clip_share", method="aligned")),
           lambda v: f"aligned {v[0]:.0f} and {100 * v[1]:.0f}%"),
    Figure(RESULTS, _S_PACK, "prefix tree 2.35x the best padded baseline on GRPO groups (actor 2.26x",
           f"{RECORDS}/teacher_packing_random.json", lambda: (_packing("random", "teacher"), _packing("random", "actor")),
           lambda v: f"prefix tree {v[0]:.2f}x the best padded baseline on GRPO groups (actor {v[1]:.2f}x"),
    Figure(RESULTS, _S_PACK, "1.55x on oracle-length records (actor 1.46x", f"{RECORDS}/teacher_packing_oracle.json",
           lambda: (_packing("oracle", "teacher"), _packing("oracle", "actor")),
           lambda v: f"{v[0]:.2f}x on oracle-length records (actor {v[1]:.2f}x"),
    Figure(RESULTS, _S_PACK, "the fair run's own actor pass on its aligned records: 1.72x", f"{FAIR}/timing.csv",
           lambda: num(f"{FAIR}/timing.csv", "x_vs_best_padded", reconstruction="aligned", packing="prefix_tree"),
           lambda v: f"the fair run's own actor pass on its aligned records: {v:.2f}x"),
    Figure(RESULTS, _S_REAL, "MemOPD - control +0.000 (both 0 on every seed)", RCOMP,
           lambda: (comparison("teacher_persistent", "diff", run=REAL_FAIR),
                    comparison("teacher_persistent", "boot_high", run=REAL_FAIR)),
           lambda v: f"MemOPD - control {v[0]:+.3f}" + (" (both 0 on every seed)" if v[1] == 0 else "")),
    Figure(RESULTS, _S_REAL, "MemOPD - GRPO alone -0.052 (CI -0.103 to -0.014)", RCOMP,
           lambda: tuple(comparison("rl", c, run=REAL_FAIR) for c in ("diff", "boot_low", "boot_high")),
           lambda v: f"MemOPD - GRPO alone {v[0]:+.3f} (CI {v[1]:+.3f} to {v[2]:+.3f})"),
    Figure(RESULTS, _S_REAL, "MemOPD - continued SFT -0.089 (CI -0.156 to -0.030)", RCOMP,
           lambda: tuple(comparison("sft_continued", c, run=REAL_FAIR) for c in ("diff", "boot_low", "boot_high")),
           lambda v: f"MemOPD - continued SFT {v[0]:+.3f} (CI {v[1]:+.3f} to {v[2]:+.3f})"),
    Figure(RESULTS, _S_TEACHER, "held-out subjects 0.676 (persistent view 0.647, gap +0.029)", TEACHER,
           lambda: (_teacher("f1"), _teacher("persistent_f1"), _teacher("view_gap")),
           lambda v: f"held-out subjects {v[0]:.3f} (persistent view {v[1]:.3f}, gap {v[2]:+.3f})"),
    Figure(RESULTS, _S_TEACHER, "new draws 0.886 (0.800)", TEACHER,
           lambda: (_teacher("seen_f1"), _teacher("persistent_seen_f1")),
           lambda v: f"new draws {v[0]:.3f} ({v[1]:.3f})"),
    Figure(RESULTS, _S_TEACHER, "not on seen (+0.086)", TEACHER,
           lambda: _teacher("seen_f1") - _teacher("persistent_seen_f1"), lambda v: f"not on seen ({v:+.3f})"),
    Figure(RESULTS, _S_TEACHER, "held-out >= 0.8 missed", TEACHER, lambda: _teacher("f1"),
           lambda v: "held-out >= 0.8 " + ("met" if v >= 0.8 else "missed")),
    # docs/results.md, issue 61's count of the fair teacher's next actions (the issue names it)
    Figure(RESULTS, _VIEWS, "aligned 43 answer / 33 search, persistent 44 answer / 32 search",
           "results/view_divergence/fair_teacher_views.csv",
           lambda: [_fair_views(v, k) for v in ("aligned", "persistent") for k in ("answer", "search")],
           lambda v: f"aligned {v[0]} answer / {v[1]} search, persistent {v[2]} answer / {v[3]} search"),
]

# docs/views_regime.md, issue 61: the relabelled teacher's row (its F1s, its answering count, the instrument)
_RELABEL = "| **+ 55 CPU-min relabelled**"
_RT = "results/memopd_relabel_teacher/result.json"
_RV = "results/view_divergence/relabel_teacher.json"
_RVIEWS = "results/view_divergence/relabel_teacher_views.csv"


def _answered_where_answerable(path: str) -> tuple[int, int]:
    """Transcript-view states holding every answer, and those of them the teacher answers in."""
    rows = [r for r in _csv(path) if r["view"] == "persistent" and r["answerable"] == "True"]
    return sum(r["kind"] == "answer" for r in rows), len(rows)


FIGURES += [
    Figure(VIEWS_REGIME, _RELABEL, "0.110 / 0.124", _RT, lambda: (js(_RT, "f1"), js(_RT, "persistent_f1")),
           lambda v: f"{v[0]:.3f} / {v[1]:.3f}"),
    Figure(VIEWS_REGIME, _RELABEL, "0.422 / 0.401", _RT, lambda: (js(_RT, "seen_f1"), js(_RT, "persistent_seen_f1")),
           lambda v: f"{v[0]:.3f} / {v[1]:.3f}"),
    Figure(VIEWS_REGIME, _RELABEL, "166 of 181 (92%)", _RVIEWS, lambda: _answered_where_answerable(_RVIEWS),
           lambda v: f"{v[0]} of {v[1]} ({100 * v[0] / v[1]:.0f}%)"),
    Figure(VIEWS_REGIME, _RELABEL, "0.921", _RV, lambda: js(_RV, "rows", 0, "between_view_cosine"),
           lambda v: f"{v:.3f}"),
    Figure(VIEWS_REGIME, _RELABEL, "0.940 ± 0.012", _RV,
           lambda: (js(_RV, "rows", 0, "expected_between_view_cosine"),
                    js(_RV, "rows", 0, "expected_between_view_cosine_se")),
           lambda v: f"{v[0]:.3f} ± {v[1]:.3f}"),
    Figure(VIEWS_REGIME, _RELABEL, "| 0.798 | 0.879 |", _RV,
           lambda: (js(_RV, "rows", 0, "between_view_cosine_tool"), js(_RV, "rows", 0, "between_view_cosine_gap")),
           lambda v: f"| {v[0]:.3f} | {v[1]:.3f} |"),
]

#: Figures whose record is gone and cannot be made on this host: the row says "no committed record" beside them.
UNRECORDED: list[tuple[str, str, str]] = [
    (README, _M_CITED, "0.082 (served SmolLM2)"),
    (README, _M_CITED, "0.250, 0.167"),
    (README, _M_SEARCH, "1.9 ms on an idle machine"),
    (README, _T_BENCH, "1.000 / 0.000 / 0.600 (0.550 ± 0.077 on 40 more)"),
    (README, _T_ROLLOUT, "1.05x / 1.47x at `-O0`"),
]

#: The cells whose every number is a figure checked here (or a setting below): the measured column of each row.
CELLS: dict[str, tuple[list[str], list[int]]] = {
    README: ([_M_BENCH, _M_BUDGET, _M_RSS, _M_CITED, _M_SEARCH, _M_TEACHER, _M_FAIR, _M_FAIR_SFT,
              "| Aligned scoring vs the teacher-persistent control, earlier runs"], [2]),
    "README.md#real": ([_T_BENCH, _T_PAIR, _T_ROLLOUT, _T_VOCAB], [2]),
    RESULTS: ([_S_ALIGNED, _S_RL, _S_CHEAP, _S_FLAT, _S_DIST, _S_PACK, _S_REAL, _S_TEACHER], [3, 4]),
}

#: Numbers in those cells that are settings, not measured figures.
SETTINGS: dict[str, list[str]] = {
    _M_RSS: ["256"],  # the snapshots kept
    _M_SEARCH: ["8", "10", "2"],  # the load on the 2 cores
    _M_FAIR: ["95", "10", "61"],  # 95% CI, 10 seeds, issue 61
    "| Aligned scoring vs the teacher-persistent control, earlier runs": ["47"],  # issue 47
    _S_ALIGNED: ["95", "10", "61"],  # 95% CI, 10 seeds, issue 61
    _S_TEACHER: ["0.05"],  # the target: views within 0.05
    _S_PACK: ["52"],  # the fair run's records
}


# ------------------------------------------------------------------------------------------------- reading docs
@lru_cache(maxsize=None)
def _lines(doc: str) -> tuple[str, ...]:
    return tuple((ROOT / doc).read_text().splitlines())


def row_of(doc: str, anchor: str) -> str:
    found = [line for line in _lines(doc) if anchor in line]
    assert len(found) == 1, f"{doc}: {len(found)} lines hold {anchor!r} (the anchor must find one row)"
    return found[0]


@pytest.mark.parametrize("figure", FIGURES, ids=str)
def test_the_figure_as_printed_is_the_records(figure):
    text = row_of(figure.doc, figure.anchor)
    assert figure.printed in text, f"{figure.doc}: the row no longer prints {figure.printed!r}:\n{text}"
    assert (ROOT / figure.record).is_file(), f"{figure.record} is not in the checkout"
    assert figure.show(figure.value()) == figure.printed, (
        f"{figure.record} gives {figure.show(figure.value())!r}, {figure.doc} prints {figure.printed!r}")
    assert figure.record in text, (
        f"{figure.doc}: the row of {figure.printed!r} does not name its record {figure.record}")


@pytest.mark.parametrize("doc, anchor, printed", UNRECORDED, ids=lambda x: str(x)[:40])
def test_a_figure_without_a_record_says_so(doc, anchor, printed):
    text = row_of(doc, anchor)
    assert printed in text
    assert "no committed record" in text


_NUMBER = re.compile(r"(?<![\w.])[+-]?\d[\d,]*(?:\.\d+)?")  # not inside a word (SmolLM2)


def numbers(cell: str) -> list[str]:
    """The numbers of a table cell, less those in code spans (paths, commands) and link targets."""
    cell = re.sub(r"`[^`]*`", " ", re.sub(r"\]\([^)]*\)", "]", cell))
    return [m.group().rstrip(",") for m in _NUMBER.finditer(cell)]


@pytest.mark.parametrize("doc", list(CELLS))
def test_every_number_of_the_tables_is_a_checked_figure_or_a_setting(doc):
    anchors, columns = CELLS[doc]
    page = doc.split("#")[0]
    unchecked = []
    for anchor in anchors:
        printed = [f.printed for f in FIGURES if f.doc == page and f.anchor == anchor]
        printed += [p for d, a, p in UNRECORDED if d == page and a == anchor]
        cells = re.split(r"(?<!\\)\|", row_of(page, anchor))  # "\|" is a pipe inside a cell
        for column in columns:
            for n in numbers(cells[column]):
                if not any(n in p for p in printed) and n not in SETTINGS.get(anchor, []):
                    unchecked.append((anchor, n))
    assert not unchecked, f"{doc}: numbers with no record checked here: {unchecked}"


def test_the_checker_fails_on_a_changed_figure_or_record():
    """A figure printed otherwise, or a record that says otherwise, is caught."""
    fig = next(f for f in FIGURES if f.printed == "+0.034")
    assert fig.show(fig.value() + 0.001) != fig.printed
    assert fig.show(fig.value()) == fig.printed
    printed_otherwise = Figure(fig.doc, fig.anchor, "+0.035", fig.record, fig.value, fig.show)
    record_otherwise = Figure(fig.doc, fig.anchor, fig.printed, fig.record, lambda: fig.value() + 0.001, fig.show)
    unnamed_record = Figure(fig.doc, fig.anchor, fig.printed, RES, fig.value, fig.show)
    for broken in (printed_otherwise, record_otherwise, unnamed_record):
        with pytest.raises(AssertionError):
            test_the_figure_as_printed_is_the_records(broken)
    test_the_figure_as_printed_is_the_records(fig)
