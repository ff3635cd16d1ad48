"""``memenv bench --trace``: the first episode of every (env, strategy) cell run again with its snapshots kept, as
episode traces and one self-contained page (:mod:`agents.llm.records.viewer`)."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

import gymnasium as gym

from agents.scripted.bench.episodes import run_episode
from agents.scripted.bench.specs import EnvSpec, bench_env_kwargs, env_accepts, resolve_strategy


def trace_cells(strategies: Iterable[str], specs: Iterable[EnvSpec], seed: int, out: str | Path) -> Path:
    """The first episode (seed ``seed``) of every (env, strategy) cell run again with its snapshots kept, as episode
    traces (``out/trace.jsonl``) and one self-contained page (``out/trace.html``, :mod:`agents.llm.records.viewer`).
    Scripted strategies and checkpoints (greedy) replay the bench's episode exactly; a served model is asked again."""
    from agents.llm.records.viewer import episode_trace, save_traces, traces_view, write_view

    out = Path(out)
    traces = []
    for spec in specs:
        for name in strategies:
            policy = resolve_strategy(name, spec.env_id, spec.kwargs.get("memory_mode"))
            kwargs = bench_env_kwargs(spec, policy)
            if env_accepts(spec.env_id, "keep_snapshots"):
                kwargs["keep_snapshots"] = True
            env = gym.make(spec.env_id, **kwargs)
            try:
                summary, _ = run_episode(env, policy, seed)
            finally:
                env.close()
            traces.append(episode_trace(summary, f"{spec.label} · {name} · seed {seed}"))
    save_traces(out / "trace.jsonl", traces)
    write_view(out / "trace.html", traces_view(traces), title=f"memenv bench: {out.name}")
    return out / "trace.html"


__all__ = ["trace_cells"]
