"""``memenv bench``: memory strategies x environments x episodes -> a table, ``results.csv`` and a PNG.

One concern per module, every public name re-exported here: ``specs`` (env specs, strategies by name),
``episodes`` (one episode, failures and stops), ``store`` (the finished cells on disk, resuming), ``run``
(:func:`run_bench`, the set-up check, the table and figure), ``sweep`` (``--sweep``), ``tables`` (the cited
benchmarks' official columns), ``cli`` (the command; its docstring is the command's help).
"""

from agents.scripted.bench.cli import DEFAULT_OUT, SWEEP_ENVS, check_cells_measured, default_out, register_cli
from agents.scripted.bench.episodes import SERVICE_ERRORS, EpisodeRunner, Stopped, TooManyFailures, run_episode
from agents.scripted.bench.run import (DEFAULT_MAX_FAILURES, SUMMARY_COLUMNS, check_setup, format_table,
                                       plot_tradeoff, run_bench)
from agents.scripted.bench.specs import (ALL_STRATEGY_NAMES, DEFAULT_ENVS, DEFAULT_EPISODES, EnvSpec,
                                         bench_env_kwargs, env_accepts, is_model_path, resolve_strategy,
                                         strategy_name)
from agents.scripted.bench.store import BENCH_FORMAT, CELLS, MANIFEST, RESULT_FILES, BenchStore, bench_settings
from agents.scripted.bench.sweep import (Sweep, coinciding, format_sweep, plot_sweep, run_sweep, sweep_figure,
                                         sweep_specs, tick_label)
from agents.scripted.bench.tables import format_benchmark_tables, official_columns
from agents.scripted.bench.trace import trace_cells
from agents.scripted.strategies.qa_strategies import STRATEGIES  # the strategies a bench runs unless told

__all__ = ["ALL_STRATEGY_NAMES", "BENCH_FORMAT", "CELLS", "DEFAULT_ENVS", "DEFAULT_EPISODES", "DEFAULT_MAX_FAILURES",
           "DEFAULT_OUT", "MANIFEST", "RESULT_FILES", "SERVICE_ERRORS", "STRATEGIES", "SUMMARY_COLUMNS", "SWEEP_ENVS",
           "BenchStore", "EnvSpec", "EpisodeRunner", "Stopped", "Sweep", "TooManyFailures", "bench_env_kwargs",
           "bench_settings", "check_cells_measured", "check_setup", "coinciding", "default_out", "env_accepts",
           "format_benchmark_tables", "format_sweep", "format_table", "is_model_path", "official_columns",
           "plot_sweep", "plot_tradeoff", "register_cli", "resolve_strategy", "run_bench", "run_episode",
           "run_sweep", "strategy_name", "sweep_figure", "sweep_specs", "tick_label", "trace_cells"]
