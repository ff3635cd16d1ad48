"""A bench run: every strategy on every env (:func:`run_bench`, one cell at a time, resumable), the check of the
set-up before any episode, and the summary as a table and a figure."""

from __future__ import annotations

import inspect
import time
from pathlib import Path
from typing import Any, Iterable

import gymnasium as gym
import pandas as pd
from tqdm.auto import tqdm

from memenv.files import write_atomic
from agents.scripted.bench.episodes import (EPISODE_FAILED, EPISODE_STOPPED, EpisodeRunner, TooManyFailures,
                                            interrupt_sets)
from agents.scripted.bench.specs import DEFAULT_EPISODES, EnvSpec, bench_env_kwargs, resolve_strategy
from agents.scripted.bench.store import BenchStore, bench_settings
from agents.scripted.bench.tables import official_columns
from agents.llm.adapters.served import ServedPolicy, ServerError, ServerUnreachableError, is_served
from memenv.cli_common import CommandError, CommandInterrupted, user_input
from tasks.types import DataFormatError


SUMMARY_COLUMNS = ["env", "strategy", "episodes", "failed", "f1", "em", "peak_context_tokens",
                   "total_context_tokens", "invocations", "invalid_rate", "steps_per_s"]
#: Failed episodes a run tolerates before it stops (``--max-failures``): a few flaky requests do not cost the
#: run, a server that went away stops it within a few episodes.
DEFAULT_MAX_FAILURES = 5

def run_bench(strategies: Iterable[str], envs: Iterable[str | EnvSpec], episodes: int = DEFAULT_EPISODES,
              seed: int = 0, progress: bool = True, *, out: str | Path | None = None,
              max_failures: int = DEFAULT_MAX_FAILURES, fresh: bool = False,
              sweep: str | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Run every strategy on every env for ``episodes`` seeded episodes (seeds ``seed..seed+episodes-1``,
    the same for every strategy, so strategies face the same questions).

    With ``out``, each finished cell is written to ``out/cells/`` as it ends and the finished cells of an
    earlier call with the same settings are not run again (``fresh``: they are). An episode that fails on a
    service (:data:`SERVICE_ERRORS`) counts in the ``failed`` column; past ``max_failures`` of them the run
    raises :class:`TooManyFailures`. Ctrl-C raises :class:`memenv.cli_common.CommandInterrupted` saying how many cells
    were kept (with ``out``; a plain KeyboardInterrupt without).

    Returns (summary table, one row per episode).
    """
    specs = [e if isinstance(e, EnvSpec) else EnvSpec.parse(e) for e in envs]
    strategies = list(strategies)
    if max_failures < 0:
        raise ValueError(f"max_failures must be >= 0, got {max_failures}")
    store = None if out is None else BenchStore(out, bench_settings(strategies, specs, episodes, seed, sweep), fresh)
    if store is not None:
        store.check()
    for spec in specs:  # fail before any work on a strategy an env family does not have
        for name in strategies:
            policy = resolve_strategy(name, spec.env_id, spec.kwargs.get("memory_mode"))
            if is_served(name):
                policy.client.check()  # a server that is down fails here, naming its URL
    plan = [(spec, name) for spec in specs for name in strategies]
    done = store.start() if store is not None else {}
    done = {key: cell for key, cell in done.items() if not cell["summary"].get("failed")}  # failed: run again
    resumed = sum((spec.label, name) in done for spec, name in plan)
    if resumed:
        print(f"resuming: {resumed} of {len(plan)} cells already in {store.out} (--fresh runs them again)")
    runner = EpisodeRunner(max_failures)
    cells: list[dict[str, Any]] = []
    kept = resumed

    def note() -> str:
        return f"{kept} of {len(plan)} cells kept in {store.out} (rerun the same command to continue)"

    bar = tqdm(total=(len(plan) - resumed) * episodes, desc="bench", unit="ep", disable=not progress)
    try:
        with interrupt_sets(runner.stop):
            for spec, name in plan:
                if (spec.label, name) in done:
                    cells.append(done[(spec.label, name)])
                    continue
                cell = _run_cell(spec, name, episodes, seed, runner, bar)
                if runner.too_many:
                    where = f"; {note()}" if store is not None else ""
                    raise TooManyFailures(f"stopped after {len(runner.failures)} failed episodes (more than "
                                          f"--max-failures {max_failures}); last: {runner.failures[-1]}{where}",
                                          runner.failures)
                if store is not None:
                    store.save(cell)
                    kept += 1
                cells.append(cell)
    except KeyboardInterrupt:
        runner.stop.set()
        if store is None:
            raise
        raise CommandInterrupted(note()) from None
    except DataFormatError as exc:  # a data file of the user's, damaged past what the set-up check reads
        if store is None:
            raise
        raise CommandError(f"{exc}; {note()}") from exc
    finally:
        bar.close()
    summary = [cell["summary"] for cell in cells]
    rows = [row for cell in cells for row in cell["episodes"]]
    scores = sorted({c for row in summary for c in row if c.startswith("score")}, key=lambda c: (c != "score", c))
    extra_columns = [k for k in dict.fromkeys(k for row in summary for k in row)
                     if k not in SUMMARY_COLUMNS and k not in scores] + scores
    return pd.DataFrame(summary, columns=SUMMARY_COLUMNS + extra_columns), pd.DataFrame(rows)


def _live_postfix(bar, name: str, start: float, tokens: bool) -> dict[str, Any]:
    """``on_invocations`` (and with ``tokens`` ``on_tokens``) callbacks that keep ``bar``'s postfix current: the
    invocations and generated tokens so far and their rates."""
    seen = {"invocations": 0, "tokens": 0}

    def show(**counts: int) -> None:
        seen.update(counts)
        elapsed = max(1e-9, time.perf_counter() - start)
        text = f"{name}: {seen['invocations']} invocations, {seen['invocations'] / elapsed:.2f}/s"
        if seen["tokens"]:
            text += f", {seen['tokens']} tokens, {seen['tokens'] / elapsed:.1f} tok/s"
        bar.set_postfix_str(text)

    callbacks = {"on_invocations": lambda n: show(invocations=n)}
    if tokens:
        callbacks["on_tokens"] = lambda n: show(tokens=n)
    return callbacks


def _run_cell(spec: EnvSpec, name: str, episodes: int, seed: int, runner: EpisodeRunner, bar) -> dict[str, Any]:
    """One (env, strategy) cell: ``{"env", "strategy", "summary": row, "episodes": rows}``."""
    policy = resolve_strategy(name, spec.env_id, spec.kwargs.get("memory_mode"))
    kwargs = bench_env_kwargs(spec, policy)
    env = gym.make(spec.env_id, **kwargs)
    steps, start = 0, time.perf_counter()
    cell = []
    seeds = [seed + i for i in range(episodes)]
    concurrent = hasattr(policy, "run_episodes")  # served models: episodes run on a thread pool
    try:
        if concurrent:
            progress = {"on_done": lambda: bar.update(1)}
            accepted = inspect.signature(policy.run_episodes).parameters
            if "on_invocations" in accepted:  # a model in this process: its episodes end together after minutes,
                # so the bar shows the invocations and the tokens generated inside them as they happen
                progress.update(_live_postfix(bar, name, start, tokens="on_tokens" in accepted))
            results = policy.run_episodes(lambda: gym.make(spec.env_id, **kwargs), seeds, runner, **progress)
        else:
            results = (runner(env, policy, s) + ({},) for s in seeds)
        for i, (episode, n, extra) in enumerate(results):
            if not concurrent:
                bar.update(1)
            if EPISODE_STOPPED in episode:
                continue
            steps += n
            row = {"env": spec.label, "strategy": name, "seed": seed + i}
            if EPISODE_FAILED in episode:
                cell.append({**row, "error": episode[EPISODE_FAILED]})
                continue
            cell.append({
                **row, "f1": episode["f1"], "em": episode["em"],
                "peak_context_tokens": episode["peak_context_tokens"],
                "total_context_tokens": episode["total_context_tokens"], "invocations": episode["turns"],
                "invalid_actions": episode["invalid_actions"], "answered": episode["answered"], **extra,
                **_ability_scores(episode), **official_columns(episode),
            })
    finally:
        env.close()
    elapsed = time.perf_counter() - start
    frame = pd.DataFrame(cell)
    failed = int(frame["error"].notna().sum()) if "error" in frame else 0
    ok = frame[frame["error"].isna()] if "error" in frame else frame
    ok = ok.reindex(columns=list(dict.fromkeys([*frame.columns, "f1", "em", "peak_context_tokens",
                                                "total_context_tokens", "invocations", "invalid_actions"])))
    summary = {
        "env": spec.label, "strategy": name, "episodes": len(ok), "failed": failed, "f1": ok.f1.mean(),
        "em": ok.em.mean(), "peak_context_tokens": ok.peak_context_tokens.mean(),
        "total_context_tokens": ok.total_context_tokens.mean(), "invocations": ok.invocations.mean(),
        "invalid_rate": ok.invalid_actions.sum() / max(1, ok.invocations.sum()) if len(ok) else float("nan"),
        "steps_per_s": steps / elapsed if elapsed > 0 else float("nan"),
        **{k: ok[k].mean() for k in frame.columns if k.startswith("server_")},  # tokens per episode
        **{c: ok[c].mean() for c in frame.columns if c.startswith(("score", "official:"))},
    }
    return {"env": spec.label, "strategy": name, "summary": summary, "episodes": cell}


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
        ax.set_xlim(left=0, right=max(1.0, float(part.peak_context_tokens.max())) * 1.08)  # distances from zero
        ax.set_title(env, fontsize=9)
        ax.grid(alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(strategies), frameon=False)
    fig.suptitle("memenv bench: F1 vs peak context")
    fig.tight_layout(rect=(0, 0.08, 1, 1))
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
    first episode, as a :class:`memenv.cli_common.CommandError` naming the env spec."""
    strategies = list(strategies)
    for spec in specs:
        with user_input(f"env {spec.label!r}"):
            policies = [resolve_strategy(name, spec.env_id, spec.kwargs.get("memory_mode")) for name in strategies]
            for policy in policies:
                if isinstance(policy, ServedPolicy) or hasattr(policy, "check_server"):
                    try:  # a server that is down fails here, naming its URL
                        policy.client.check() if isinstance(policy, ServedPolicy) else policy.check_server()
                    except ServerError as err:  # down: a service failure (1); not the API: a wrong URL (2)
                        raise CommandError(f"--strategies {policy.name}: {err}",
                                           status=1 if isinstance(err, ServerUnreachableError) else 2) from err
            env = gym.make(spec.env_id, **bench_env_kwargs(spec, policies[0]))  # the kwargs its cells will use
            env.reset(seed=0)
            env.close()
