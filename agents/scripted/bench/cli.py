"""``memenv bench``: memory strategies x environments x episodes -> a table, ``results.csv`` and a PNG.

    memenv bench                                   # the default below, < 1 minute on 2 cores (cost: below)
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
import hashlib
import json
from pathlib import Path
from typing import Any

import pandas as pd

import memenv.scoring.judges
from memenv.files import write_atomic
from agents.scripted.bench.run import DEFAULT_MAX_FAILURES, check_setup, format_table, plot_tradeoff, run_bench
from agents.scripted.bench.specs import ALL_STRATEGY_NAMES, DEFAULT_ENVS, DEFAULT_EPISODES, EnvSpec, strategy_name
from agents.scripted.bench.store import BenchStore, bench_settings
from agents.scripted.bench.sweep import Sweep, format_sweep, plot_sweep, run_sweep, sweep_specs
from agents.scripted.bench.tables import format_benchmark_tables
from agents.scripted.strategies.qa_strategies import STRATEGIES
from memenv.cli_common import CommandError, HelpFormatter, non_negative_int, positive_int, user_input
from memenv.costs import cost


SWEEP_ENVS = ("MemQA-v0",)  # the base specs of ``--sweep`` when --envs is not given

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
        from agents.scripted.bench.trace import trace_cells

        print(f"wrote {trace_cells(args.strategies, specs, args.seed, out)} (open it in a browser) and "
              f"{out / 'trace.jsonl'}")
    check_cells_measured(summary, episodes)
    return 0


def register_cli(subparsers) -> None:
    """Adds ``memenv bench`` (entry point ``memenv.commands``)."""
    parser = subparsers.add_parser("bench", help="benchmark memory strategies",
                                   description=f"{__doc__}\nCost at the defaults: {cost('bench')} (memenv.costs).\n",
                                   formatter_class=HelpFormatter)
    parser.add_argument("--strategies", "--strategy", nargs="+", default=list(STRATEGIES), type=strategy_name, metavar="NAME",
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
