"""Relabelled demonstrations (DAgger-style): a policy plays, an expert labels every state it reached.

An oracle's own episodes show a model only the states the oracle reaches. A teacher for on-policy distillation
must instead be right where the *student* goes (issue 61): a student that lost a fact from its 4-word memory, keeps
searching although its transcript already holds every answer, or writes a memory the oracle never would. Here the
student plays (sampled, at the temperature the arms sample at) and each view's expert labels each state with the
best action given that view's information, while the env goes on with the student's action:

- memory view: one example per invocation, the student's prompt and the memory view's expert action
  (:class:`agents.scripted.strategies.compact_oracle.CompactOracle`);
- persistent view: one example per invocation, the flattened transcript of the student's episode up to that turn
  (the student's own earlier actions, sampled ids, never re-encoded) and the transcript view's expert action, the
  loss on that last action only.

The experts follow the student's actions (:meth:`CompactOracle.follow`), so what each knows is what its view holds
of the student's episode. ``stats`` says per state what each label does (search or answer), whether the student's
action was the label, and whether the two views' labels differ.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import pandas as pd

from agents.llm.records.invocation import memory_mask
from agents.llm.records.transcript import TranscriptFormat
from agents.llm.training.sft import Demonstration, transcript_demonstration
from memenv.protocol import parse_action

__all__ = ["Relabelled", "relabelled_demonstrations"]

VIEWS = ("memory", "persistent")


@dataclass
class Relabelled:
    """The examples (memory-view ones first, then persistent-view ones) and one row per labelled state."""

    data: list[Demonstration]
    stats: pd.DataFrame


def _tool(action: str) -> str:
    parsed = parse_action(action)
    return (parsed.tool or "memory") if parsed.valid else "invalid"


def relabelled_demonstrations(policy, env_fn: Callable[[], Any], seeds: Sequence[int], *,
                              experts: Callable[[str], Any] | None = None, views: Sequence[str] = VIEWS,
                              num_envs: int = 16, progress: bool = False) -> Relabelled:
    """Play ``policy`` (an :class:`agents.llm.generation.policy.LLMPolicy`: its sampling settings and seed) on one
    episode per task seed, ``num_envs`` envs (``env_fn()``) at a time, and label every state it reached in each of
    ``views`` with ``experts(view)``'s action (default: :class:`CompactOracle`, ``reads_transcript`` for the
    persistent view). The experts must have ``reset(env)``, ``act(observation)`` and ``follow(taken)``;
    ``policy.reset(env)`` is called at each episode's start (a no-op for an LLM policy)."""
    from tqdm.auto import tqdm

    views = tuple(views)
    unknown = [v for v in views if v not in VIEWS]
    if not views or unknown or len(set(views)) != len(views):
        raise ValueError(f"views must name each of {VIEWS} at most once, got {views!r}")
    if num_envs < 1:
        raise ValueError(f"num_envs must be >= 1, got {num_envs}")
    if experts is None:
        from agents.scripted.strategies.compact_oracle import CompactOracle

        experts = lambda view: CompactOracle(reads_transcript=view == "persistent")  # noqa: E731
    fmt = TranscriptFormat(policy.tokenizer) if "persistent" in views else None
    envs = [env_fn() for _ in range(min(num_envs, len(seeds)))]
    memory_data, persistent_data, rows = [], [], []
    bar = tqdm(total=len(seeds), desc="relabel", unit="ep", disable=not progress)
    try:
        for start in range(0, len(seeds), len(envs)):
            chunk = list(seeds[start:start + len(envs)])
            live = []
            for env, seed in zip(envs, chunk):
                obs, _ = env.reset(seed=int(seed))
                policy.reset(env.unwrapped)  # an LLM policy keeps no per-episode state; a scripted one (tests) does
                labellers = {view: experts(view) for view in views}
                for expert in labellers.values():
                    expert.reset(env.unwrapped)
                live.append({"env": env, "seed": int(seed), "obs": obs, "experts": labellers,
                             "observations": [], "responses": [], "turn": 0})
            while live:
                generations = policy.generate([ep["obs"] for ep in live])
                still = []
                for ep, gen in zip(live, generations):
                    obs, ep["turn"] = ep["obs"], ep["turn"] + 1
                    labels = {view: expert.act(obs) for view, expert in ep["experts"].items()}
                    for expert in ep["experts"].values():
                        expert.follow(gen.text)
                    ep["observations"].append(obs)
                    ep.setdefault("first_prompt", list(gen.prompt_ids))
                    ids = {view: policy.encode_action(label) for view, label in labels.items()}
                    if "memory" in labels:
                        memory_data.append(Demonstration(list(gen.prompt_ids), ids["memory"],
                                                         memory_mask(ids["memory"], policy.tokenizer)))
                    if "persistent" in labels:
                        turns = ep["responses"] + [ids["persistent"]]
                        persistent_data.append(transcript_demonstration(ep["first_prompt"], turns, ep["observations"],
                                                                        fmt, policy.tokenizer, scored=[len(turns) - 1]))
                    ep["responses"].append(list(gen.response_ids))
                    row = {"seed": ep["seed"], "turn": ep["turn"], "student": _tool(gen.text)}
                    for view, label in labels.items():
                        row[f"{view}_label"] = _tool(label)
                        row[f"{view}_agrees"] = label == gen.text
                    if len(labels) == 2:
                        row["views_differ"] = labels["memory"] != labels["persistent"]
                    rows.append(row)
                    ep["obs"], _, terminated, truncated, _ = ep["env"].step(gen.text)
                    if terminated or truncated:
                        bar.update(1)
                    else:
                        still.append(ep)
                live = still
    finally:
        bar.close()
        for env in envs:
            env.close()
    return Relabelled(memory_data + persistent_data, pd.DataFrame(rows))
