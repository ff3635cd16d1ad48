"""Rollouts of an LLM policy over several envs at once, joined into invocation records.

At each step the observations of every active env go through one batched ``policy.generate`` call; the
generation of env i is the invocation ``(episode_id, turn)`` of that env, and is joined with the snapshot that
``env.step`` returns in ``info["invocation"]`` (the keys must agree, else the rollout fails loudly) into an
:class:`InvocationRecord`. Envs without snapshots (toy envs) get a minimal one. Record episode ids are unique
within one rollout call: episodes of one task seed (GRPO groups; the env derives its id from the seed) get the
env's id with a suffix ``-1``, ``-2``, ... (``snapshot["episode_id"]`` keeps the env's own id).

``envs`` is a list of envs (each takes the next task seed as soon as it is free) or a Gymnasium vector env
(``SyncVectorEnv``/``AsyncVectorEnv``; autoreset modes NEXT_STEP and SAME_STEP): it is reset with ``num_envs`` seeds per round and
each sub-env contributes its first episode of the round; after a sub-env's episode ends, its later steps
(autoreset, filler actions) are ignored.
"""

from __future__ import annotations

import contextlib
import itertools
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from agents.llm.records.invocation import InvocationRecord, memory_mask, tokenizer_fingerprint
from memenv.vector import sub_env_info


@dataclass
class Episode:
    episode_id: str
    seed: int | None
    records: list[InvocationRecord]
    info: dict[str, Any] = field(default_factory=dict)  # info["summary"] without the snapshots
    group: int | None = None

    @property
    def reward(self) -> float:
        """Undiscounted return (MemQA: the final F1; minus invalid-action penalties if any)."""
        return float(sum(r.reward for r in self.records))

    @property
    def f1(self) -> float:
        return float(self.info.get("f1", self.reward))

    @property
    def turns(self) -> int:
        return len(self.records)


def _finish(records: list[InvocationRecord], gamma: float, terminated: bool, summary: dict | None = None) -> None:
    total = float(sum(r.reward for r in records))
    gold = (summary or {}).get("gold")
    if gold is not None:  # per objective, its accepted answers (a bare string counts as one answer)
        gold = [[str(g)] if isinstance(g, str) else [str(a) for a in g] for g in gold]
        for r in records:
            r.gold = gold
    running = 0.0
    for r in reversed(records):
        running = r.reward + gamma * running
        r.return_to_go = running
        r.episode_return = total
    if records:
        records[-1].done = True
        records[-1].terminated = terminated


class _Slot:
    """Bookkeeping of one env's current episode.

    ``env_episode_id`` is the env's id (the join key with its snapshots); ``episode_id`` is unique within the
    rollout: episodes of the same task seed (GRPO groups) get the env's id with a suffix ``-1``, ``-2``, ..."""

    def __init__(self, seed: int | None, group: int | None, env_episode_id: str, seen: dict[str, int],
                 rollout_id: str = "") -> None:
        self.seed, self.group, self.env_episode_id, self.rollout_id = seed, group, env_episode_id, rollout_id
        repeat = seen.get(env_episode_id, 0)
        seen[env_episode_id] = repeat + 1
        self.episode_id = env_episode_id if repeat == 0 else f"{env_episode_id}-{repeat}"
        self.turn = 0
        self.records: list[InvocationRecord] = []
        self.context: list[int] | None = None  # the persistent view: the transcript the next turn is shown
        self.chat: bool | None = None


def _make_record(gen, snapshot: dict[str, Any], reward: float, tokenizer, slot: _Slot):
    key = (slot.env_episode_id, slot.turn)
    if snapshot.get("episode_id", key[0]) != key[0] or snapshot.get("turn", key[1]) != key[1]:
        raise RuntimeError(f"snapshot {(snapshot.get('episode_id'), snapshot.get('turn'))} does not match the "
                           f"invocation {key}: the env and the rollout disagree on the episode")
    return InvocationRecord(
        episode_id=slot.episode_id, turn=slot.turn, prompt_ids=list(gen.prompt_ids), response_ids=list(gen.response_ids),
        response_logprobs=list(gen.response_logprobs), action_mask=[1] * len(gen.response_ids),
        memory_mask=memory_mask(gen.response_ids, tokenizer), reward=float(reward),
        temperature=gen.temperature, finish_reason=gen.finish_reason, seed=slot.seed, group=slot.group,
        snapshot=snapshot, rollout_id=slot.rollout_id, tokenizer_fingerprint=tokenizer_fingerprint(tokenizer),
    )


def _minimal_snapshot(key, observation, action, reward) -> dict[str, Any]:
    return {"episode_id": key[0], "turn": key[1], "observation": observation, "action": action,
            "reward": float(reward)}


def rollout(policy, envs, seeds: Sequence[int | None], *, groups: Sequence[int | None] | None = None,
            gamma: float = 1.0, progress: bool = False, rollout_id: str | None = None, desc: str = "rollout",
            on_episode: Callable[[Episode], None] | None = None,
            on_invocations: Callable[[int], None] | None = None, view: str = "memory",
            on_tokens: Callable[[int], None] | None = None) -> list[Episode]:
    """Run one episode per entry of ``seeds`` with ``policy`` (an :class:`agents.llm.generation.policy.LLMPolicy`) and
    return them as :class:`Episode` objects (in the order of ``seeds``), each with its invocation records.

    ``groups[i]`` tags episode i (GRPO groups); ``gamma`` discounts ``return_to_go`` over invocations.
    Every record gets ``rollout_id`` (default: a fresh uuid4 hex, so records pooled across calls stay unique by
    ``(rollout_id, episode_id, turn)``), the episode's gold answers (from ``info["summary"]["gold"]`` where the
    env reports them) and the policy tokenizer's fingerprint.

    A policy with ``reuse_prefixes`` (:class:`agents.llm.generation.policy.LLMPolicy`) keeps shared prompt prefixes
    across the rollout's turns inside it (the weights must not change during the rollout, e.g. in ``on_episode``).

    ``view`` (:data:`agents.llm.records.transcript.VIEWS`): what the policy is shown. ``"memory"`` (default): each
    observation, as the env renders it. ``"persistent"``: the episode's flattened transcript, built turn by turn
    exactly as :func:`distill.reconstruct.persistent` builds it for scoring (the first prompt, then each action
    and the env's reply, :class:`agents.llm.records.transcript.TranscriptFormat`), so a model can be measured *acting*
    in the view a teacher-persistent control scores in; each record's ``prompt_ids`` is then that transcript, and the
    env (and its snapshots) run as ever. Needs a policy with ``generate_ids`` and a list of envs.

    Progress (``progress``: a bar named ``desc``, in episodes, with the invocations so far and their rate beside
    it, so that a slow model's first episodes are not a silent 0/N): ``on_episode(episode)`` is called as each
    episode ends, ``on_invocations(total)`` after each batch of invocations, ``on_tokens(total)`` as tokens are
    generated inside an invocation (at most every half second; a policy with ``on_tokens``, as LLMPolicy).
    """
    groups = list(groups) if groups is not None else [None] * len(seeds)
    if len(groups) != len(seeds):
        raise ValueError("groups must have one entry per seed")
    rollout_id = uuid.uuid4().hex if rollout_id is None else str(rollout_id)
    import gymnasium as gym

    from agents.llm.records.transcript import TranscriptFormat, check_view

    transcript = None
    if check_view(view) == "persistent":
        if isinstance(envs, gym.vector.VectorEnv) or not hasattr(policy, "generate_ids"):
            raise ValueError("view='persistent' needs a list of envs and a policy with generate_ids (LLMPolicy)")
        transcript = TranscriptFormat(policy.tokenizer)

    tracker = _Progress(len(seeds), progress, desc, on_episode, on_invocations, on_tokens)
    # A policy that generates token by token (LLMPolicy) reports each decoding step, so that a slow model's bar
    # moves inside an invocation too (tokens so far and their rate).
    watched = (progress or on_tokens is not None) and hasattr(policy, "on_tokens")
    if watched:
        previous, policy.on_tokens = policy.on_tokens, tracker.tokens
    # The weights do not change during a rollout: a policy that can keeps the KV of shared prompt prefixes (the
    # system prompt, a group's question) from one turn to the next.
    reuse = getattr(policy, "reuse_prefixes", None)
    try:
        with reuse() if reuse is not None else contextlib.nullcontext():
            if isinstance(envs, gym.vector.VectorEnv):
                return _rollout_vector(policy, envs, list(seeds), groups, gamma, tracker, rollout_id)
            return _rollout_list(policy, list(envs), list(seeds), groups, gamma, tracker, rollout_id, transcript)
    finally:
        if watched:
            policy.on_tokens = previous
        tracker.close()


class _Progress:
    """A rollout's progress: episodes on a bar; invocations, generated tokens and their rates beside it; the
    callbacks."""

    REDRAW_S = 0.5  # token steps redraw the bar at most this often (a decoding step is milliseconds)

    def __init__(self, total: int, enabled: bool, desc: str, on_episode, on_invocations, on_tokens=None) -> None:
        from tqdm.auto import tqdm

        self.bar = tqdm(total=total, desc=desc, unit="ep", disable=not enabled, leave=False)
        self.on_episode, self.on_invocations, self.on_tokens = on_episode, on_invocations, on_tokens
        self.invocations, self.generated, self.start = 0, 0, time.perf_counter()
        self.drawn = self.start

    def _postfix(self, now: float) -> None:
        elapsed = max(1e-9, now - self.start)
        text = f"{self.invocations} invocations, {self.invocations / elapsed:.2f}/s"
        if self.generated:
            text += f", {self.generated} tokens, {self.generated / elapsed:.1f} tok/s"
        self.bar.set_postfix_str(text)
        self.drawn = now

    def invoked(self, n: int) -> None:
        self.invocations += n
        if not self.bar.disable:
            self._postfix(time.perf_counter())
        if self.on_invocations is not None:
            self.on_invocations(self.invocations)

    def tokens(self, n: int) -> None:
        """``n`` tokens were just generated (one decoding step of the rows still running)."""
        self.generated += n
        now = time.perf_counter()
        if now - self.drawn >= self.REDRAW_S:
            if not self.bar.disable:
                self._postfix(now)
            self.drawn = now
            if self.on_tokens is not None:
                self.on_tokens(self.generated)

    def episode(self, episode: "Episode") -> None:
        self.bar.update(1)
        if self.on_episode is not None:
            self.on_episode(episode)

    def close(self) -> None:
        self.bar.close()


def _rollout_list(policy, envs: list, seeds: list, groups: list, gamma: float, progress: _Progress,
                  rollout_id: str, transcript=None) -> list[Episode]:
    if not envs:
        raise ValueError("rollout needs at least one env")
    queue = iter(enumerate(zip(seeds, groups)))
    slots: list[_Slot | None] = [None] * len(envs)
    observations: list[str | None] = [None] * len(envs)
    order: dict[int, int] = {}  # env index -> episode index in seeds
    results: list[Episode | None] = [None] * len(seeds)
    counter = itertools.count()
    seen: dict[str, int] = {}

    def start(e: int) -> bool:
        nxt = next(queue, None)
        if nxt is None:
            slots[e] = None
            return False
        index, (seed, group) = nxt
        obs, info = envs[e].reset(seed=seed)
        episode_id = str(info.get("episode_id") or f"ep{seed}-{next(counter)}")
        slots[e], observations[e], order[e] = _Slot(seed, group, episode_id, seen, rollout_id), obs, index
        return True

    for e in range(len(envs)):
        start(e)
    while any(s is not None for s in slots):
        active = [e for e, s in enumerate(slots) if s is not None]
        if transcript is None:
            gens = policy.generate([observations[e] for e in active])
        else:  # the persistent view: each env's transcript so far (its first turn: the observation's prompt)
            gens = policy.generate_ids([slots[e].context or policy.encode_prompt(observations[e]) for e in active])
        progress.invoked(len(active))
        for e, gen in zip(active, gens):
            slot = slots[e]
            slot.turn += 1  # the generation is the invocation (env_episode_id, turn) of this env
            obs, reward, terminated, truncated, info = envs[e].step(gen.text)
            snapshot = info.get("invocation")
            if snapshot is None:
                snapshot = _minimal_snapshot((slot.env_episode_id, slot.turn), observations[e], gen.text, reward)
            slot.records.append(_make_record(gen, snapshot, reward, policy.tokenizer, slot))
            if transcript is not None and not (terminated or truncated):
                if slot.chat is None:
                    slot.chat = transcript.uses_chat(gen.prompt_ids)
                slot.context = list(gen.prompt_ids) + list(gen.response_ids) + transcript.continuation(
                    gen.response_ids, observations[e], obs, slot.chat)
            observations[e] = obs
            if terminated or truncated:
                episode_info = {k: v for k, v in (info.get("summary") or {}).items() if k != "snapshots"}
                _finish(slot.records, gamma, bool(terminated), episode_info)
                results[order[e]] = Episode(slot.episode_id, slot.seed, slot.records, episode_info, slot.group)
                progress.episode(results[order[e]])
                start(e)
    return [r for r in results if r is not None]


def _rollout_vector(policy, venv, seeds: list, groups: list, gamma: float, progress: _Progress,
                    rollout_id: str) -> list[Episode]:
    n = venv.num_envs
    results: dict[int, Episode] = {}
    counter = itertools.count()
    seen: dict[str, int] = {}
    for start in range(0, len(seeds), n):
        chunk = list(range(start, min(start + n, len(seeds))))
        # Sub-envs beyond the chunk run a throw-away episode (seeded after the chunk's last seed).
        round_seeds = [seeds[i] for i in chunk]
        filler = [None if round_seeds[-1] is None else int(round_seeds[-1]) + 1 + k for k in range(n - len(chunk))]
        obs, info = venv.reset(seed=round_seeds + filler)
        slots: list[_Slot | None] = []
        for k in range(n):
            if k < len(chunk):
                eid = sub_env_info(info, k).get("episode_id") or f"ep{seeds[chunk[k]]}-{next(counter)}"
                slots.append(_Slot(seeds[chunk[k]], groups[chunk[k]], str(eid), seen, rollout_id))
            else:
                slots.append(None)
        observations = list(obs)
        while any(s is not None for s in slots):
            active = [k for k, s in enumerate(slots) if s is not None]
            gens = dict(zip(active, policy.generate([observations[k] for k in active])))
            progress.invoked(len(active))
            actions = []
            for k in range(n):
                if k in gens:
                    slots[k].turn += 1
                    actions.append(gens[k].text)
                else:
                    actions.append("")  # finished or filler sub-env: its steps are ignored
            obs, rewards, terms, truncs, info = venv.step(actions)
            for k in active:
                slot, gen = slots[k], gens[k]
                env_info = sub_env_info(info, k)
                snapshot = env_info.get("invocation") or _minimal_snapshot(
                    (slot.env_episode_id, slot.turn), observations[k], gen.text, rewards[k])
                slot.records.append(_make_record(gen, snapshot, float(rewards[k]), policy.tokenizer, slot))
                if terms[k] or truncs[k]:
                    episode_info = env_info.get("summary")
                    if episode_info is None and "final_info" in info:  # SAME_STEP autoreset
                        episode_info = sub_env_info(info["final_info"], k).get("summary")
                    episode_info = {k2: v for k2, v in (episode_info or {}).items() if k2 != "snapshots"}
                    _finish(slot.records, gamma, bool(terms[k]), episode_info)
                    results[chunk[k]] = Episode(slot.episode_id, slot.seed, slot.records, episode_info, slot.group)
                    progress.episode(results[chunk[k]])
                    slots[k] = None
            observations = list(obs)
    return [results[i] for i in sorted(results)]


def records_of(episodes: Iterable[Episode]) -> list[InvocationRecord]:
    return [r for ep in episodes for r in ep.records]


def evaluate(policy, envs, seeds: Sequence[int], progress: bool = False) -> dict[str, float]:
    """Mean F1 / EM / reward / turns / invalid rate over one episode per seed."""
    episodes = rollout(policy, envs, seeds, progress=progress)
    f1 = [ep.f1 for ep in episodes]
    em = [float(ep.info.get("em", ep.reward >= 1.0)) for ep in episodes]
    invalid = sum(int(ep.info.get("invalid_actions", 0)) for ep in episodes)
    turns = sum(ep.turns for ep in episodes)
    return {"f1": float(np.mean(f1)), "em": float(np.mean(em)), "reward": float(np.mean([e.reward for e in episodes])),
            "turns": turns / max(1, len(episodes)), "invalid_rate": invalid / max(1, turns),
            "answered": float(np.mean([bool(ep.info.get("answered", True)) for ep in episodes]))}
