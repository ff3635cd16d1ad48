"""TRL adapter: GRPO on memenv episodes with ``trl.GRPOTrainer(rollout_func=...)`` (``pip install 'memenv[trl]'``).

TRL's ``GRPOTrainer`` hands ``rollout_func(prompts, trainer)`` one prompt string per *row slot* of the generation
batch (each dataset prompt repeated ``num_generations`` times, consecutively) and expects back, per slot,
``prompt_ids``, ``completion_ids`` and ``logprobs`` (optional ``env_mask``: 1 = model token, 0 = excluded from the
loss); any other key reaches the reward functions as a keyword argument. Rewards are normalised per run of
``num_generations`` consecutive rows (the GRPO group).

memenv maps episodes onto those rows so that the trainer optimises exactly the token sequences the model sampled:

- **memory mode** (``context="memory"``, ``"window:K"``, ``"none"``): every invocation is its own sequence (its
  prompt is the observation of that turn, never a growing chat), so each invocation is one row. Each episode owns
  ``rows_per_episode`` consecutive slots; an episode with fewer invocations is padded with rows whose
  ``env_mask`` is 0 (no loss). ``num_generations = episodes_per_group * rows_per_episode``: the slots of one
  dataset prompt hold ``episodes_per_group`` episodes of the same task seed. Every row (padding rows included)
  carries its episode's return, so the group mean is the episodes' and every row of an episode gets the same
  advantage; TRL's spread is the unbiased std over the group's E x R rows, which scales every advantage by
  ``sqrt((E R - 1) / (E R))`` against the native trainer's (population std over the E episodes; returns
  [1, 0], R = 3: 0.913, not 1; :class:`distill.trl.MemOPDTrainer` computes them over episodes). The env's turn
  limit is set to ``rows_per_episode`` so no episode overflows.
- **history mode** (``context="history"``): the transcript grows, so one episode is one row: the first prompt,
  then the sampled actions interleaved with the env's new text, ``env_mask`` 0 on the env's tokens. The model
  samples each action after exactly these ids (the ids are concatenated, never re-tokenised).

Sampling uses the trainer's own model (:class:`agents.llm.generation.policy.LLMPolicy`, token-exact, log-probs at
``trainer.temperature``), or ``trainer.vllm_generation`` when ``use_vllm=True`` (the vLLM path is written against
trl 1.16's ``VLLMGeneration.generate`` and has not been run here: no GPU; set the stop strings through
``GRPOConfig(generation_kwargs=vllm_generation_kwargs())``).

    rollout = MemenvRollout("MemQA-v0", {"objectives": 1, "hops": 2})
    args = GRPOConfig(num_generations=4 * rollout.rows_per_episode, temperature=1.0, ...)
    trainer = GRPOTrainer(model, reward_funcs=episode_return_reward, args=args,
                          train_dataset=rollout.dataset(64), processing_class=tokenizer, rollout_func=rollout)

Checked against trl 1.16.0 (``GRPOTrainer._generate`` / ``_generate_and_score_completions``).
"""

from __future__ import annotations

import re
import sys
from typing import Any, Sequence

import gymnasium as gym

import memenv  # noqa: F401 - registers the environments
from agents.llm.generation.policy import DEFAULT_STOP, Generation, LLMPolicy
from agents.llm.records.rollouts import Episode, rollout
from memenv.context import sanitize

MIN_PYTHON = (3, 11)
TRL_TESTED = "1.16.0"
_SEED_IN_PROMPT = re.compile(r"seed=(-?\d+)\s*$")


def require_trl():
    """Import ``trl`` with clear errors for an old Python or a missing install."""
    if sys.version_info < MIN_PYTHON:
        raise RuntimeError(f"the TRL adapter needs Python >= {MIN_PYTHON[0]}.{MIN_PYTHON[1]} (trl {TRL_TESTED} "
                           f"requires it); this is Python {sys.version.split()[0]}")
    try:
        import trl
    except ImportError as err:  # pragma: no cover - depends on the install
        raise ImportError(f"the TRL adapter needs trl: pip install 'memenv[trl]' (tested with trl {TRL_TESTED})") from err
    return trl


def vllm_generation_kwargs(stop: Sequence[str] = DEFAULT_STOP) -> dict[str, Any]:
    """``GRPOConfig(generation_kwargs=...)`` for ``use_vllm=True``: stop at the closing tags, keep them."""
    return {"stop": list(stop), "include_stop_str_in_output": True}


def episode_return_reward(completions: list, episode_return: list[float], **kwargs: Any) -> list[float]:
    """TRL reward function: the return of the episode each row belongs to (MemQA: the final F1)."""
    return [float(r) for r in episode_return]


def task_prompt(env_id: str, seed: int) -> str:
    """The dataset prompt of one task seed (the rollout reads the seed back from it)."""
    return f"{env_id} seed={int(seed)}"


def seed_dataset(env_id: str, num_tasks: int, seed: int = 0):
    """A ``datasets.Dataset`` of ``num_tasks`` task seeds ``seed..``: columns ``prompt`` and ``seed``."""
    if num_tasks < 1:
        raise ValueError(f"num_tasks must be >= 1, got {num_tasks}")
    from datasets import Dataset

    seeds = list(range(seed, seed + num_tasks))
    return Dataset.from_dict({"prompt": [task_prompt(env_id, s) for s in seeds], "seed": seeds})


def seed_of(prompt: Any) -> int:
    """The task seed of a dataset prompt made by :func:`task_prompt` (or a bare integer)."""
    if isinstance(prompt, int):
        return prompt
    text = prompt if isinstance(prompt, str) else str(prompt)
    match = _SEED_IN_PROMPT.search(text)
    if match is None:
        raise ValueError(f"prompt {text[:80]!r} carries no task seed: build the dataset with seed_dataset() / "
                         f"MemenvRollout.dataset() (prompts end with 'seed=N')")
    return int(match.group(1))


class VLLMPolicy(LLMPolicy):
    """An :class:`LLMPolicy` whose sampling goes through ``trainer.vllm_generation`` (trl 1.16, untested here).

    Prompts are encoded by the policy (same templates); vLLM returns the sampled ids and their processed
    log-probs (``log_softmax(logits / T)``, the trainer's convention). Finish reasons are read off the text.
    """

    def __init__(self, vllm_generation, model, tokenizer, **kwargs: Any) -> None:
        super().__init__(model, tokenizer, **kwargs)
        self.vllm_generation = vllm_generation

    def generate_ids(self, prompts: Sequence[Sequence[int]]) -> list[Generation]:
        if not prompts:
            return []
        _, completion_ids, logprobs, _ = self.vllm_generation.generate(
            prompts=[list(p) for p in prompts], images=None, num_generations=1)
        out = []
        for prompt, ids, logps in zip(prompts, completion_ids, logprobs):
            ids = list(ids)
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            reason = ("stop" if any(text.endswith(s) for s in self.stop) else
                      "eos" if ids and ids[-1] in self.eos_ids else "length")
            sampled = [float("nan") if lp is None or lp[0] is None else float(lp[0]) for lp in (logps or [])]
            out.append(Generation(list(prompt), ids, sampled or [float("nan")] * len(ids), text, reason,
                                  self.temperature or 1.0))
        return out


class MemenvRollout:
    """``rollout_func`` for ``trl.GRPOTrainer``: memenv episodes with the trainer's model (see module doc).

    Args:
        env_id: any registered memenv env (``gym.make`` id).
        env_kwargs: its kwargs; ``context`` picks the row layout (``"history"``: one row per episode).
        rows_per_episode: memory mode only: row slots per episode, which is also the env's turn limit
            (default: the env's ``max_turns`` after ``reset(seed=0)``). History mode: always 1.
        temperature: sampling temperature; ``None`` uses ``trainer.temperature`` (anything else must equal it,
            since TRL recomputes log-probs from ``logits / trainer.temperature``).
        max_new_tokens: tokens per invocation (default ``trainer.max_completion_length``).
        stop: strings that end an action.
        template, system_prompt, max_prompt_tokens, batch_size: as in :class:`LLMPolicy`.
        history_rows: force the layout (default: ``True`` iff the env's context mode is ``history``).

    After each call ``last_episodes`` holds the episodes as :class:`agents.llm.records.rollouts.Episode` (memory mode:
    with their invocation records) and ``last_rows`` the row dict that was returned.
    """

    def __init__(self, env_id: str = "MemQA-v0", env_kwargs: dict[str, Any] | None = None, *,
                 rows_per_episode: int | None = None, temperature: float | None = None,
                 max_new_tokens: int | None = None, stop: Sequence[str] = DEFAULT_STOP, template: str = "auto",
                 system_prompt: str | None = "checkpoint", max_prompt_tokens: int | None = None, batch_size: int = 64,
                 history_rows: bool | None = None) -> None:
        if sys.version_info < MIN_PYTHON:
            require_trl()  # raises the Python-version error
        if env_id not in gym.registry:
            raise ValueError(f"unknown environment {env_id!r}; registered memenv envs: "
                             + ", ".join(k for k in gym.registry if k.startswith("Mem")))
        self.env_id = env_id
        self.env_kwargs = dict(env_kwargs or {})
        probe = gym.make(env_id, **self.env_kwargs)
        mode = getattr(probe.unwrapped, "mode", None)
        context = getattr(mode, "name", "memory")
        self.history_rows = context == "history" if history_rows is None else bool(history_rows)
        if self.history_rows:
            if context != "history" or self.env_kwargs.get("context_budget") is not None:
                probe.close()
                raise ValueError("history_rows=True needs context='history' without context_budget: only then does "
                                 "each observation extend the previous one (got context="
                                 f"{self.env_kwargs.get('context', 'memory')!r}, "
                                 f"context_budget={self.env_kwargs.get('context_budget')!r})")
            if rows_per_episode not in (None, 1):
                probe.close()
                raise ValueError(f"rows_per_episode must be 1 (or None) in history mode, got {rows_per_episode}")
            rows_per_episode = 1
        else:
            if rows_per_episode is None:
                rows_per_episode = self.env_kwargs.get("max_turns")
            if rows_per_episode is None:
                probe.reset(seed=0)
                rows_per_episode = getattr(probe.unwrapped, "max_turns", None)
                if rows_per_episode is None:
                    probe.close()
                    raise ValueError(f"{env_id} has no max_turns: pass rows_per_episode=")
            if not isinstance(rows_per_episode, int) or rows_per_episode < 1:
                probe.close()
                raise ValueError(f"rows_per_episode must be a positive int, got {rows_per_episode!r}")
            if self.env_kwargs.get("max_turns", rows_per_episode) > rows_per_episode:
                probe.close()
                raise ValueError(f"env max_turns={self.env_kwargs['max_turns']} exceeds rows_per_episode="
                                 f"{rows_per_episode}: an episode could not fit its rows")
            # The turn limit is the row budget, so the env tells the policy the real number of turns left.
            self.env_kwargs["max_turns"] = rows_per_episode
        probe.close()
        self.rows_per_episode = int(rows_per_episode)
        self.temperature = temperature
        self.max_new_tokens = max_new_tokens
        self.stop = tuple(stop)
        self.template = template
        self.system_prompt = system_prompt
        self.max_prompt_tokens = max_prompt_tokens
        self.batch_size = batch_size
        self._envs: list[gym.Env] = []
        self._policy: LLMPolicy | None = None
        self._calls = 0
        self.last_episodes: list[Episode] = []
        self.last_rows: dict[str, list] = {}

    # ------------------------------------------------------------------ public helpers
    def dataset(self, num_tasks: int, seed: int = 0):
        """The seed dataset: ``num_tasks`` prompts ``"<env_id> seed=N"`` (with a ``seed`` column)."""
        return seed_dataset(self.env_id, num_tasks, seed)

    def check(self, trainer) -> None:
        """Fail clearly on trainer settings this layout cannot train correctly."""
        args = trainer.args
        rows = self.rows_per_episode
        num_generations = trainer.num_generations
        if num_generations % rows != 0 or num_generations // rows < 2:
            raise ValueError(
                f"GRPOConfig.num_generations={num_generations} must be episodes_per_group x rows_per_episode "
                f"with rows_per_episode={rows} and episodes_per_group >= 2 (a group of one episode has no "
                f"baseline): use num_generations={2 * rows}, {4 * rows}, ...")
        if getattr(args, "mask_truncated_completions", False):
            raise ValueError("GRPOConfig.mask_truncated_completions=True would drop every memenv row: actions end at "
                             "the closing tag (</search>, </answer>), not at EOS, so TRL counts them as clipped; "
                             "set mask_truncated_completions=False")
        trainer_t = float(getattr(trainer, "temperature", args.temperature))
        if self.temperature is not None and abs(float(self.temperature) - trainer_t) > 1e-9:
            raise ValueError(f"MemenvRollout(temperature={self.temperature}) differs from GRPOConfig.temperature="
                             f"{trainer_t}: TRL recomputes log-probs from logits / {trainer_t}, so sample at that "
                             f"temperature (leave temperature=None to follow the trainer)")
        if not getattr(trainer, "use_vllm", False):
            unsupported = {"top_k": (getattr(args, "top_k", 0), (0, -1, None)),
                           "min_p": (getattr(args, "min_p", None), (None, 0, 0.0)),
                           "repetition_penalty": (getattr(args, "repetition_penalty", 1.0), (1, 1.0, None))}
            for name, (value, neutral) in unsupported.items():
                if value not in neutral:
                    raise ValueError(f"GRPOConfig.{name}={value!r} is not supported by the memenv sampler "
                                     f"(temperature and top_p are); leave it at its default")
        else:
            mode = getattr(args, "vllm_mode", "colocate")
            processes = getattr(trainer.accelerator, "num_processes", 1)
            if (mode == "server" and processes > 1) or getattr(args, "vllm_tensor_parallel_size", 1) > 1:
                raise NotImplementedError(
                    "memenv episodes call vLLM a different number of times per process, which trl's collective "
                    "vLLM calls cannot match: use vllm_mode='colocate' with vllm_tensor_parallel_size=1, or "
                    "vllm_mode='server' with one training process")
            stops = (getattr(args, "generation_kwargs", None) or {}).get("stop") or []
            if not set(self.stop) <= set(stops):
                raise ValueError(f"use_vllm=True needs GRPOConfig(generation_kwargs=vllm_generation_kwargs()) so vLLM "
                                 f"stops at {list(self.stop)} (got generation_kwargs={args.generation_kwargs!r})")

    # ------------------------------------------------------------------ rollout_func
    def __call__(self, prompts: list, trainer) -> dict[str, list]:
        self.check(trainer)
        rows = self.rows_per_episode
        if len(prompts) % rows != 0:
            raise ValueError(f"rollout_func got {len(prompts)} row slots, not a multiple of rows_per_episode={rows}: "
                             f"make per_device_train_batch_size x steps_per_generation a multiple of {rows}")
        seeds = []
        for start in range(0, len(prompts), rows):
            block = prompts[start:start + rows]
            if any(p != block[0] for p in block):
                raise ValueError(f"row slots {start}..{start + rows - 1} hold different prompts: the slots of one "
                                 f"episode must come from one task (num_generations must be a multiple of {rows})")
            seeds.append(seed_of(block[0]))
        policy = self._policy_for(trainer)
        envs = self._envs_for(len(seeds))
        if self.history_rows:
            self.last_episodes = history_rollout(policy, envs, seeds)
            out = history_rows(self.last_episodes)
        else:
            self.last_episodes = rollout(policy, envs, seeds, groups=seeds)
            out = memory_rows(self.last_episodes, rows, policy.pad_id)
        self._calls += 1
        self.last_rows = out
        return out

    # ------------------------------------------------------------------ internals
    def _policy_for(self, trainer) -> LLMPolicy:
        model = trainer.accelerator.unwrap_model(trainer.model)
        tokenizer = getattr(trainer.processing_class, "tokenizer", trainer.processing_class)
        args = trainer.args
        temperature = float(getattr(trainer, "temperature", args.temperature))
        kwargs = dict(temperature=temperature, top_p=float(getattr(args, "top_p", 1.0) or 1.0),
                      max_new_tokens=int(self.max_new_tokens or args.max_completion_length or 256),
                      stop=self.stop, template=self.template, system_prompt=self.system_prompt,
                      batch_size=self.batch_size, max_prompt_tokens=None if self.history_rows else self.max_prompt_tokens)
        if self._policy is None or self._policy.model is not model:
            seed = int(getattr(args, "seed", 0)) * 1000 + int(getattr(trainer.accelerator, "process_index", 0))
            if getattr(trainer, "use_vllm", False):
                self._policy = VLLMPolicy(trainer.vllm_generation, model, tokenizer, seed=seed, **kwargs)
            else:
                self._policy = LLMPolicy(model, tokenizer, seed=seed, **kwargs)
        return self._policy

    def _envs_for(self, n: int) -> list[gym.Env]:
        while len(self._envs) < n:
            self._envs.append(gym.make(self.env_id, **self.env_kwargs))
        return self._envs[:n]

    def close(self) -> None:
        for env in self._envs:
            env.close()
        self._envs = []


# ---------------------------------------------------------------------- row layouts
def memory_rows(episodes: Sequence[Episode], rows_per_episode: int, pad_id: int) -> dict[str, list]:
    """One row per invocation record, each episode padded to ``rows_per_episode`` rows (``env_mask`` 0)."""
    out: dict[str, list] = {k: [] for k in ("prompt_ids", "completion_ids", "logprobs", "env_mask", "episode_return",
                                            "episode_id", "turn", "padding")}
    for episode in episodes:
        if len(episode.records) > rows_per_episode:
            raise RuntimeError(f"episode {episode.episode_id} made {len(episode.records)} invocations, more than "
                               f"rows_per_episode={rows_per_episode}")
        ret = episode.reward
        for record in episode.records:
            _add_row(out, record.prompt_ids, record.response_ids, record.response_logprobs,
                     [1] * len(record.response_ids), ret, episode.episode_id, record.turn, False)
        for _ in range(rows_per_episode - len(episode.records)):
            # One pad token of prompt and of completion: TRL needs non-empty rows; env_mask 0 keeps it out of
            # the loss, and its reward (the episode's return) keeps the group statistics per episode.
            _add_row(out, [pad_id], [pad_id], [0.0], [0], ret, episode.episode_id, 0, True)
    return out


def history_rows(episodes: Sequence[Episode]) -> dict[str, list]:
    """One row per episode made by :func:`history_rollout`."""
    out: dict[str, list] = {k: [] for k in ("prompt_ids", "completion_ids", "logprobs", "env_mask", "episode_return",
                                            "episode_id", "turn", "padding")}
    for episode in episodes:
        row = episode.info["row"]
        _add_row(out, row["prompt_ids"], row["completion_ids"], row["logprobs"], row["env_mask"],
                 sum(episode.info["rewards"]), episode.episode_id, len(episode.info["rewards"]), False)
    return out


def _add_row(out, prompt_ids, completion_ids, logprobs, env_mask, ret, episode_id, turn, padding) -> None:
    out["prompt_ids"].append(list(prompt_ids))
    out["completion_ids"].append(list(completion_ids))
    out["logprobs"].append([float(v) for v in logprobs])
    out["env_mask"].append(list(env_mask))
    out["episode_return"].append(float(ret))
    out["episode_id"].append(str(episode_id))
    out["turn"].append(int(turn))
    out["padding"].append(bool(padding))


class _HistoryEpisode:
    """One history-mode episode being built as a single row."""

    def __init__(self, policy: LLMPolicy, observation: str, seed: int, info: dict[str, Any]) -> None:
        self.seed = seed
        self.episode_id = str(info.get("episode_id") or f"ep{seed}")
        self.prompt_ids = policy.encode_prompt(observation)
        self.seen = policy.prompt_text(observation)  # the text the model has seen (prompt + actions + env text)
        self.completion_ids: list[int] = []
        self.logprobs: list[float] = []
        self.env_mask: list[int] = []
        self.rewards: list[float] = []
        self.generations: list[Generation] = []
        self.summary: dict[str, Any] = {}

    @property
    def context_ids(self) -> list[int]:
        return self.prompt_ids + self.completion_ids

    def add_action(self, gen: Generation, reward: float) -> None:
        self.generations.append(gen)
        self.completion_ids += gen.response_ids
        self.logprobs += gen.response_logprobs
        self.env_mask += [1] * len(gen.response_ids)
        self.rewards.append(float(reward))
        self.seen += sanitize(gen.text)  # the env stores the action sanitised

    def add_env_text(self, policy: LLMPolicy, observation: str) -> None:
        new = policy.prompt_text(observation)
        if not new.startswith(self.seen):
            raise ValueError(f"history row of episode {self.episode_id}: the observation of turn "
                             f"{len(self.generations) + 1} does not extend the previous prompt and action (a chat "
                             f"template or a context budget rewrites it); use template='plain' or memory-mode rows")
        env_ids = policy.tokenizer.encode(new[len(self.seen):], add_special_tokens=False)
        self.completion_ids += env_ids
        self.logprobs += [0.0] * len(env_ids)
        self.env_mask += [0] * len(env_ids)
        self.seen = new


def history_rollout(policy: LLMPolicy, envs: Sequence[gym.Env], seeds: Sequence[int]) -> list[Episode]:
    """Episodes in history mode, one per seed, each run as one growing sequence of ids: the model samples turn
    t+1 after ``prompt ids + its earlier actions + the env's new text`` (env tokens get ``env_mask`` 0).

    Returns :class:`Episode` objects without records; ``info["row"]`` holds the row
    (``prompt_ids, completion_ids, logprobs, env_mask``) and ``info["generations"]`` the sampled actions."""
    if len(envs) < len(seeds):
        raise ValueError(f"history_rollout needs one env per seed ({len(seeds)}), got {len(envs)}")
    states, active, seen = [], [], {}
    for e, seed in enumerate(seeds):
        obs, info = envs[e].reset(seed=int(seed))
        state = _HistoryEpisode(policy, obs, int(seed), info)
        repeat = seen.get(state.episode_id, 0)  # episodes of one task seed share the env's id
        seen[state.episode_id] = repeat + 1
        state.episode_id += f"-{repeat}" if repeat else ""
        states.append(state)
        active.append(e)
    while active:
        gens = policy.generate_ids([states[e].context_ids for e in active])
        still = []
        for e, gen in zip(active, gens):
            obs, reward, terminated, truncated, info = envs[e].step(gen.text)
            state = states[e]
            state.add_action(gen, reward)
            if terminated or truncated:
                state.summary = {k: v for k, v in (info.get("summary") or {}).items() if k != "snapshots"}
            else:
                state.add_env_text(policy, obs)
                still.append(e)
        active = still
    episodes = []
    for state in states:
        row = {"prompt_ids": state.prompt_ids, "completion_ids": state.completion_ids, "logprobs": state.logprobs,
               "env_mask": state.env_mask}
        info = {**state.summary, "row": row, "generations": state.generations, "rewards": state.rewards}
        episode = Episode(state.episode_id, state.seed, [], info, state.seed)
        episodes.append(episode)
    return episodes
