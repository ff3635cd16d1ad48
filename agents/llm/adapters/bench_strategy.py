"""A saved LLM checkpoint as a ``memenv bench`` strategy, beside the scripted ones.

``memenv bench --strategies relevance history runs/memopd/student`` puts learned and hand-written memory in one
table: a strategy name that is a local folder holding ``config.json`` (a ``save_pretrained`` checkpoint) becomes
a :class:`CheckpointStrategy`, a greedy :class:`agents.llm.generation.policy.LLMPolicy` (temperature 0: the bench
compares policies, not samples). Episodes of one cell run batched through :func:`agents.llm.records.rollouts.rollout`
(all episodes' invocations of a turn in one forward), so a cell of 20 episodes costs about one episode's forwards.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Sequence

from agents.llm.models.local import load_pretrained
from agents.llm.generation.policy import LLMPolicy
from agents.llm.records.rollouts import rollout


class CheckpointStrategy:
    """Greedy decoding of a local checkpoint, with the scripted strategies' ``reset/act`` interface and a
    batched ``run_episodes`` (what ``memenv bench`` calls when a strategy has one)."""

    context = "memory"  # the LLM agents are trained on compact-memory observations

    def __init__(self, path: str | os.PathLike, *, max_new_tokens: int = 96, num_envs: int = 16) -> None:
        from agents.llm.models.pretrained import resolve

        self.name = str(path)  # as given: a folder or a registered model name
        path = resolve(path)  # a registered model name -> its prepared folder
        if not (Path(path) / "config.json").is_file():
            raise ValueError(f"model strategy {str(path)!r}: no config.json in that folder (need a checkpoint saved "
                             "with save_pretrained)")
        lm, tok = load_pretrained(path)
        self.policy = LLMPolicy(lm, tok, temperature=0.0, max_new_tokens=max_new_tokens)
        self.num_envs = num_envs

    def reset(self, env: Any = None) -> None:
        self.policy.reset(env)

    def act(self, observation: str) -> str:
        return self.policy.act(observation)

    def run_episodes(self, make_env: Callable[[], Any], seeds: Sequence[int], run_episode=None,
                     on_done: Callable[[], None] | None = None,
                     on_invocations: Callable[[int], None] | None = None,
                     on_tokens: Callable[[int], None] | None = None) -> list[tuple[dict[str, Any], int, dict]]:
        """One greedy episode per seed, batched over ``num_envs`` envs; ``(summary, steps, {})`` in seed order.
        ``on_done()`` is called as each episode ends (not all at the end: a real model's episodes take minutes),
        ``on_invocations(total)`` after each batch of invocations, ``on_tokens(total)`` as tokens are generated
        (at most every half second: a real model's batch of invocations takes minutes)."""
        envs = [make_env() for _ in range(min(self.num_envs, max(1, len(seeds))))]
        try:
            episodes = rollout(self.policy, envs, list(seeds),
                               on_episode=None if on_done is None else (lambda episode: on_done()),
                               on_invocations=on_invocations, on_tokens=on_tokens)
        finally:
            for env in envs:
                env.close()
        return [(ep.info, ep.turns, {}) for ep in episodes]


__all__ = ["CheckpointStrategy"]
