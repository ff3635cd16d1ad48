"""The greedy evaluation the experiment's stages share (:func:`evaluate_per_seed`), cached by what its rows depend
on (:func:`evaluation_key`), and the environments it plays (:func:`make_env_fn`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import pandas as pd

from memenv.files import write_atomic, write_text_atomic
from distill.experiment.config import ENV_ID, ExperimentConfig, pool_env_kwargs


def make_env_fn(cfg: ExperimentConfig, pool: str = "train"):
    import gymnasium as gym

    import memenv  # noqa: F401 - registers the environments

    kwargs = pool_env_kwargs(cfg, pool)
    return lambda: gym.make(ENV_ID, **kwargs)


#: Seeds of the student's weak-start probe: neither SFT seeds (0..episodes-1) nor evaluation seeds (10**7 + i).
PROBE_SEED_BASE = 2 * 10**7


def evaluation_key(lm, tokenizer, cfg: ExperimentConfig, seeds: Sequence[int], pool: str, view: str) -> dict:
    """What a greedy evaluation's rows depend on: the weights (a digest of every tensor of the state dict, its
    name, dtype and shape), the tokenizer (its vocabulary's fingerprint) and prompt settings, the episodes (pool,
    its env settings, seeds), the view and the token cap. Equal keys give the same rows (greedy decoding of the
    same episodes)."""
    import hashlib

    import torch

    from agents.llm.records.invocation import tokenizer_fingerprint

    digest = hashlib.blake2b(digest_size=16)
    for name, tensor in sorted(lm.state_dict().items()):
        flat = tensor.detach().cpu().contiguous().reshape(-1)
        digest.update(f"{name}|{flat.dtype}|{tuple(tensor.shape)}".encode())
        digest.update(flat.view(torch.uint8).numpy().data)
    return json.loads(json.dumps({
        "weights": digest.hexdigest(), "vocab": tokenizer_fingerprint(tokenizer),
        "prompt": getattr(tokenizer, "memenv_prompt", None),
        "chat_template": getattr(tokenizer, "chat_template", None),
        "pool": pool, "env": pool_env_kwargs(cfg, pool), "seeds": [int(s) for s in seeds], "view": view,
        "max_new_tokens": cfg.max_new_tokens}, default=str))


#: The columns every cached evaluation holds (:func:`evaluate_per_seed`'s rows).
EVALUATION_COLUMNS = ("seed", "f1", "em", "peak_context_tokens", "turns", "questions")


def _warn(message: str) -> None:
    import sys

    print(f"warning: {message}", file=sys.stderr, flush=True)


def _cached_rows(cache: Path, seeds: Sequence[int]) -> tuple[pd.DataFrame | None, str]:
    """The cached rows when they are exactly the ones asked for (one per seed, in order, every column, finite
    scores), else ``(None, why not)``: a file cut short, empty or damaged is evaluated again, never returned."""
    import numpy as np

    try:
        rows = pd.read_csv(cache, keep_default_na=False, dtype={"questions": str})
    except (pd.errors.EmptyDataError, pd.errors.ParserError, UnicodeDecodeError, ValueError, OSError) as exc:
        return None, f"not a readable evaluation ({type(exc).__name__})"
    missing = [c for c in EVALUATION_COLUMNS if c not in rows.columns]
    if missing:
        return None, f"no {', '.join(missing)} column"
    try:
        cached_seeds = [int(s) for s in rows.seed]
        scores = rows[["f1", "em"]].to_numpy(dtype=float)
    except (TypeError, ValueError):
        return None, "a seed or score that is not a number"
    if cached_seeds != [int(s) for s in seeds]:
        return None, f"holds {len(cached_seeds)} rows of other seeds than the {len(seeds)} asked for"
    if not np.isfinite(scores).all() or (scores < 0).any() or (scores > 1).any():
        return None, "a score outside [0, 1]"
    return rows, ""


def evaluate_per_seed(lm, tokenizer, cfg: ExperimentConfig, seeds: Sequence[int] | None = None,
                      pool: str = "heldout", episodes: int | None = None, view: str = "memory",
                      cache: Path | None = None) -> pd.DataFrame:
    """Greedy episodes of ``pool``'s questions on ``seeds`` (default: the first ``episodes`` (default
    ``cfg.eval_episodes``) evaluation seeds :func:`agents.llm.training.common.eval_seeds`, never trained on): one row
    per seed with ``seed, f1, em, peak_context_tokens, turns, questions`` (the episode's question texts).
    ``view``: what the model is shown (:func:`agents.llm.records.rollouts.rollout`): the memory state (default) or the
    flattened transcript the teacher-persistent control scores in.

    ``cache``: the CSV the rows are written to (atomically), with their :func:`evaluation_key` beside it
    (``NAME.key.json``); where both are there and the key is this call's, the rows are read back instead of played
    again, so a stage interrupted after one of its evaluations resumes after it."""
    from agents.llm.generation.policy import LLMPolicy
    from agents.llm.records.rollouts import rollout
    from agents.llm.training.common import eval_seeds

    seeds = eval_seeds(episodes or cfg.eval_episodes) if seeds is None else list(seeds)
    if cache is not None:
        key_file = cache.with_suffix(".key.json")
        key = evaluation_key(lm, tokenizer, cfg, seeds, pool, view)
        if cache.exists() and key_file.exists():
            try:
                cached = json.loads(key_file.read_text())
            except ValueError:  # a damaged key: evaluate again
                cached = None
            if cached == key:
                rows, why = _cached_rows(cache, seeds)
                if rows is not None:
                    return rows
                _warn(f"{cache}: {why}; evaluated again")
        rows = evaluate_per_seed(lm, tokenizer, cfg, seeds, pool, view=view)
        key_file.unlink(missing_ok=True)  # the key is written last: a CSV without its key is never reused
        write_atomic(cache, lambda tmp: rows.to_csv(tmp, index=False))
        write_text_atomic(key_file, json.dumps(key, indent=1))
        return rows
    env_fn = make_env_fn(cfg, pool)
    envs = [env_fn() for _ in range(cfg.num_envs)]
    eps = rollout(LLMPolicy(lm, tokenizer, temperature=0.0, max_new_tokens=cfg.max_new_tokens), envs, seeds,
                  progress=cfg.progress, view=view)
    for env in envs:
        env.close()
    return pd.DataFrame({"seed": seeds, "f1": [ep.f1 for ep in eps],
                         "em": [float(ep.info.get("em", 0.0)) for ep in eps],
                         "peak_context_tokens": [ep.info.get("peak_context_tokens", 0) for ep in eps],
                         "turns": [ep.turns for ep in eps],
                         "questions": [" | ".join(ep.info.get("questions", []) or []) for ep in eps]})


__all__ = ["make_env_fn", "PROBE_SEED_BASE", "EVALUATION_COLUMNS", "evaluation_key", "evaluate_per_seed"]
