"""SFT: behaviour cloning of the oracle, one invocation per sequence, loss on action tokens only.

Demonstrations are the oracle's trajectories (:class:`agents.scripted.strategies.qa_strategies.OraclePolicy`) on
training seeds ``0..episodes-1``; each invocation becomes ``(prompt_ids, action_ids)`` with the prompt built exactly as the
LLM policy builds it (:meth:`agents.llm.generation.policy.LLMPolicy.encode_prompt`), so SFT and sampling see the same
ids. Held-out evaluation: greedy rollouts on seeds ``10**7 + i``. The loss is the mean negative log-likelihood of
the action tokens; ``prompt_loss_weight > 0`` adds a language-model loss on the observation tokens (a cheap
pretraining signal on task text for models trained from scratch; off by default).

    cfg = SFTConfig(out_dir="runs/sft", steps=2000)
    train_sft(cfg)                          # or: memenv train --algo sft --out runs/sft --steps 2000
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, Sequence

import numpy as np
import torch

from agents.llm.models.local import use_float32_attention
from agents.llm.generation.policy import LLMPolicy
from agents.llm.models.precision import AUTOCAST_CHOICES, host_line, resolve_autocast
from agents.llm.records.invocation import memory_mask
from agents.llm.records.transcript import TranscriptFormat, check_view, flatten_episode
from agents.scripted.strategies.qa_strategies import make_strategy
from agents.llm.training.common import (ActorCritic, MetricsLog, RunConfig, Timer, check_finite_step, collate,
                                        enable_activation_checkpointing, evaluate_off_budget, off_the_bar,
                                        init_distributed, latest_checkpoint, load_or_build_model, load_trainer_state,
                                        make_envs, rng_state, save_checkpoint, seed_everything, set_rng_state)


DEMO_EXPERTS = ("oracle", "compact")  # SFTConfig.demo_expert's choices


@dataclass
class SFTConfig(RunConfig):
    episodes: int = 2000  # oracle demonstrations (task seeds 0..episodes-1)
    demo_worlds: int = 0  # 0: every demonstration in the configured world. N > 0: demonstration i is played in
    # world ``world_seed + 1 + i % N`` of the same synthetic generator (never the configured world itself), so a
    # small model cannot memorise one world's facts and must learn to read its search results; see
    # :func:`demo_env_kwargs`
    demo_env_overrides: dict[str, Any] = field(default_factory=dict)  # env kwargs of the demonstrations only (not
    # of the evaluation episodes), e.g. {"hops": (1, 2)}: two-hop questions whose bridge entity (read in a document,
    # then searched) may be any name of the world, so the model learns to copy names no training question asks about
    # how each demonstration episode is rendered (agents.llm.records.transcript.VIEWS):
    views: tuple[str, ...] = ("memory",)
    # "memory", one example per invocation (the prompt the policy samples in); "persistent", one example per episode,
    # the flattened transcript distill.reconstruct.persistent scores (loss on every action). Both: a teacher at home
    # in the memory state and in the teacher-persistent control's transcript
    demo_forget_rate: float = 0.0  # > 0 (MemQA): this share of the demonstrations loses one fact from memory
    # (agents.scripted.strategies.qa_strategies.ForgetfulOracle): the memory view's expert then searches again, the
    # persistent view's copies it back from the transcript and answers; each view renders its own expert's episode
    demo_expert: str = "oracle"  # MemQA's demonstrator: "oracle" (agents.scripted.strategies.qa_strategies.OraclePolicy:
    # whole document lines in memory) or "compact" (agents.scripted.strategies.compact_oracle.CompactOracle: one short
    # note per question within the env's memory_budget, for a budget that binds); with "compact" each view renders its
    # own expert's episode: the memory view's acts on its notes and the result in front, the persistent view's on the
    # transcript
    demo_seed_base: int = 0  # demonstrations play task seeds demo_seed_base .. + episodes - 1
    steps: int = 2000
    batch_size: int = 16  # sequences (invocations) per step and rank
    gradient_checkpointing: bool = False  # recompute the body's activations in the backward: a 30-layer
    # SmolLM2 at 16 invocations of ~700 tokens kept ~20 GB of activations (OOM on a 24 GiB machine)
    lr: float = 1e-3
    warmup: int = 50
    min_lr_ratio: float = 0.1
    log_every: int = 10
    prompt_loss_weight: float = 0.0  # > 0: add w * LM loss on the observation tokens (pretraining on task
    # text; speeds up a from-scratch tiny model learning to copy). 0 = behaviour cloning on action tokens only.
    prompt_loss_fraction: float = 1.0  # share of observation tokens scored by that LM loss (a random subset
    # each step: the output layer over every prompt position costs more than the model body at vocab 4096)
    bucket: int = 8  # draw batch_size * bucket sequences, sort them by length, cut into `bucket` batches:
    # rows of similar length waste little padding (1 = plain uniform batches)
    autocast: str = "auto"  # "bf16": bfloat16 autocast of the forward pass, weights stay fp32; "none": fp32;
    # "auto": bf16 only where the device computes it natively (agents.llm.models.precision), fp32 elsewhere
    schedule_by: str = "steps"  # "steps": cosine over cfg.steps; "budget": cosine over max_seconds on the
    # budget clock (the LR anneals by the end of a time-limited run instead of staying near its peak)
    pad_multiple: int = 64  # batch widths and target counts rounded up to a multiple of this (1: as they are):
    # CPU bf16 kernels cache a plan per input shape, and a run that saw every width and count grew by GBs (issue 51)

    def __post_init__(self) -> None:
        if isinstance(self.pad_multiple, bool) or not isinstance(self.pad_multiple, int) or self.pad_multiple < 1:
            raise ValueError(f"SFTConfig.pad_multiple must be an integer >= 1, got {self.pad_multiple!r}")
        if self.autocast not in AUTOCAST_CHOICES:
            raise ValueError(f"SFTConfig.autocast must be one of {AUTOCAST_CHOICES}, got {self.autocast!r}")
        if self.schedule_by not in ("steps", "budget"):
            raise ValueError(f"SFTConfig.schedule_by must be 'steps' or 'budget', got {self.schedule_by!r}")
        if isinstance(self.demo_worlds, bool) or not isinstance(self.demo_worlds, int) or self.demo_worlds < 0:
            raise ValueError(f"SFTConfig.demo_worlds must be an integer >= 0, got {self.demo_worlds!r}")
        if not 0.0 < self.prompt_loss_fraction <= 1.0:
            raise ValueError(f"SFTConfig.prompt_loss_fraction must be in (0, 1], got {self.prompt_loss_fraction}")
        if self.bucket < 1:
            raise ValueError(f"SFTConfig.bucket must be >= 1, got {self.bucket}")
        self.views = tuple(self.views)
        if not self.views or len(set(self.views)) != len(self.views):
            raise ValueError(f"SFTConfig.views must name each view once, got {self.views!r}")
        for view in self.views:
            check_view(view)
        if not 0.0 <= self.demo_forget_rate <= 1.0:
            raise ValueError(f"SFTConfig.demo_forget_rate must be in [0, 1], got {self.demo_forget_rate!r}")
        if self.demo_expert not in DEMO_EXPERTS:
            raise ValueError(f"SFTConfig.demo_expert must be one of {', '.join(map(repr, DEMO_EXPERTS))}, "
                             f"got {self.demo_expert!r}")
        if self.demo_expert == "compact" and self.demo_forget_rate:
            raise ValueError("SFTConfig.demo_forget_rate applies to demo_expert='oracle' only (the compact expert's "
                             f"memory loses notes to the env's memory_budget instead), got demo_forget_rate="
                             f"{self.demo_forget_rate!r} with demo_expert='compact'")
        if not isinstance(self.demo_env_overrides, dict):
            raise ValueError(f"SFTConfig.demo_env_overrides must be a dict of env kwargs, got {self.demo_env_overrides!r}")


def demo_env_kwargs(cfg: RunConfig, index: int) -> dict[str, Any]:
    """The env kwargs of demonstration ``index``: the configured ones, or with ``cfg.demo_worlds`` set, those of
    world ``world_seed + 1 + index % demo_worlds`` (the configured world is never among them). The question split
    is kept: each world has its own hash salt, so it only thins that world's questions."""
    worlds = getattr(cfg, "demo_worlds", 0)
    kwargs = {**cfg.env_kwargs, **getattr(cfg, "demo_env_overrides", {})}
    if not worlds:
        return kwargs
    base = int(cfg.env_kwargs.get("world_seed", 0))
    return {**kwargs, "world_seed": base + 1 + index % worlds}


class Demonstration(NamedTuple):
    """One SFT example: ``prompt_ids`` then ``response_ids``; the loss is on the response tokens whose
    ``action_mask`` is 1 (None: all of them). A memory-view example is one invocation (its prompt, the oracle's
    action); a persistent-view example is one episode's transcript (the first prompt, then every action and env
    reply, replies masked out)."""

    prompt_ids: list[int]
    response_ids: list[int]
    memory_mask: list[int]
    action_mask: list[int] | None = None


def transcript_demonstration(first_prompt_ids: Sequence[int], actions: Sequence[Sequence[int]],
                             observations: Sequence[str], fmt: TranscriptFormat, tokenizer,
                             scored: Sequence[int] | None = None) -> Demonstration:
    """One episode in the persistent view (:func:`agents.llm.records.transcript.flatten_episode`) as an SFT example: the
    loss on each action's ids (``scored``: on those turns' actions only, 0-based), none on the env's replies."""
    ids, spans = flatten_episode(first_prompt_ids, actions, observations, fmt)
    start = len(first_prompt_ids)
    action, memory = [0] * (len(ids) - start), [0] * (len(ids) - start)
    turns = range(len(actions)) if scored is None else sorted(set(scored))
    for turn in turns:
        if not 0 <= turn < len(actions):
            raise ValueError(f"scored turn {turn} is outside the episode's {len(actions)} actions")
        (begin, length), act = spans[turn], actions[turn]
        action[begin - start:begin - start + length] = [1] * length
        memory[begin - start:begin - start + length] = memory_mask(list(act), tokenizer)
    return Demonstration(list(first_prompt_ids), ids[start:], memory, action)


def expert_data(policy, cfg: RunConfig, seeds) -> list[Demonstration]:
    """The oracle's demonstrations on ``seeds`` (the i-th seed in the world :func:`demo_env_kwargs` gives it), in
    each of ``cfg.views`` (default: one :class:`Demonstration` per invocation, its memory-view prompt)."""
    import gymnasium as gym

    import memenv  # noqa: F401

    seeds = list(seeds)
    worlds = getattr(cfg, "demo_worlds", 0)
    views = tuple(getattr(cfg, "views", ("memory",)))
    fmt = TranscriptFormat(policy.tokenizer) if "persistent" in views else None
    forget = getattr(cfg, "demo_forget_rate", 0.0)
    if getattr(cfg, "demo_expert", "oracle") == "compact":  # each view's own expert: the episodes may differ
        from agents.scripted.strategies.compact_oracle import CompactOracle
        from agents.scripted.strategies.qa_strategies import OraclePolicy

        if not isinstance(make_strategy("oracle", cfg.env_id), OraclePolicy):
            raise ValueError(f"SFTConfig.demo_expert='compact' needs a MemQA env (its oracle), got {cfg.env_id!r}")
        experts = {view: CompactOracle(reads_transcript=view == "persistent") for view in views}
    elif forget:  # each view's own expert (the same fact lost at the same turn): the episodes differ after it
        from agents.scripted.strategies.qa_strategies import ForgetfulOracle, OraclePolicy

        if not isinstance(make_strategy("oracle", cfg.env_id), OraclePolicy):
            raise ValueError(f"SFTConfig.demo_forget_rate needs a MemQA env (its oracle), got {cfg.env_id!r}")
        experts = {view: ForgetfulOracle(forget, seed=cfg.seed, reads_transcript=view == "persistent")
                   for view in views}
    else:  # one expert episode rendered in every view
        oracle = make_strategy("oracle", cfg.env_id)
        experts = {view: oracle for view in views}
    data = []
    # One world at a time (each holds its corpus and search index); the data's order does not matter to training.
    for world in range(min(worlds, len(seeds)) if worlds else 1):
        indices = range(world, len(seeds), worlds or 1)  # the demonstrations this world plays
        try:
            env = gym.make(cfg.env_id, **demo_env_kwargs(cfg, world))
        except TypeError as exc:
            if worlds and "world_seed" in str(exc):
                raise ValueError(f"SFTConfig.demo_worlds={worlds} needs an env with a synthetic world "
                                 f"(a world_seed argument); {cfg.env_id!r} has none") from exc
            raise
        for i in indices:
            played = {}
            for view in views:
                expert = experts[view]
                if len({id(e) for e in experts.values()}) == 1 and played:  # one expert: play its episode once
                    played[view] = next(iter(played.values()))
                    continue
                obs, _ = env.reset(seed=int(seeds[i]))
                expert.reset(env.unwrapped)
                prompts, actions, observations = [], [], []
                while True:
                    action = expert.act(obs)
                    prompts.append(policy.encode_prompt(obs))
                    actions.append(policy.encode_action(action))
                    observations.append(obs)
                    obs, _, terminated, truncated, _ = env.step(action)
                    if terminated or truncated:
                        break
                played[view] = prompts, actions, observations
            if "memory" in views:
                prompts, actions, _ = played["memory"]
                data += [Demonstration(p, a, memory_mask(a, policy.tokenizer)) for p, a in zip(prompts, actions)]
            if fmt is not None:
                prompts, actions, observations = played["persistent"]
                data.append(transcript_demonstration(prompts[0], actions, observations, fmt, policy.tokenizer))
        env.close()
    return data


def lr_at(step: int, cfg: SFTConfig, spent: float | None = None) -> float:
    """Linear warm-up, then cosine to ``min_lr_ratio * lr``: over the steps, or over the time budget when
    ``cfg.schedule_by == "budget"`` (``spent``: seconds used on the budget clock)."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    if cfg.schedule_by == "budget" and cfg.max_seconds and spent is not None:
        progress = spent / cfg.max_seconds
    else:
        progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def length_buckets(lengths, batch_size: int, bucket: int, rng: np.random.Generator):
    """Endless batches of indices into ``lengths``: each round draws ``batch_size * bucket`` indices uniformly,
    sorts them by length and yields the ``bucket`` consecutive slices in random order. Every sequence is still
    drawn uniformly; only which sequences share a batch (and so the padding) changes."""
    lengths = np.asarray(lengths)
    while True:
        idx = rng.choice(len(lengths), size=batch_size * bucket, replace=len(lengths) < batch_size * bucket)
        idx = idx[np.argsort(lengths[idx], kind="stable")]
        for b in rng.permutation(bucket):
            yield idx[b * batch_size:(b + 1) * batch_size]


def train_sft(cfg: SFTConfig, data: Sequence[Demonstration] | None = None) -> dict[str, Any]:
    """Train; returns the last metrics row (with ``eval_f1`` when evaluated). Runs unchanged under torchrun.

    ``data``: the examples to train on (e.g. a teacher's own episodes: sequence-level distillation); default the
    oracle's demonstrations on seeds ``demo_seed_base .. demo_seed_base + episodes - 1``."""
    from tqdm.auto import tqdm

    run = sft_setup(cfg, data)
    dist, data = run.dist, run.data
    timer, tokens, last = Timer(run.elapsed), 0, {}
    # A run its time budget ends shows that budget filling (seconds on its clock, so the ETA is the budget's), not
    # steps out of a cap it will never reach (a 70-minute teacher showed "5507/100000, 16 hours left").
    budgeted = cfg.max_seconds is not None
    spent = lambda: min(int(timer.budget(cfg.budget_clock)), int(cfg.max_seconds))  # noqa: E731
    bar = tqdm(total=int(cfg.max_seconds) if budgeted else cfg.steps, initial=spent() if budgeted else run.start,
               desc="sft", unit=f"{cfg.budget_clock}-s" if budgeted else "step",
               disable=not (cfg.progress and dist.main))
    sums = [0.0, 0.0, 0.0]  # this rank's action-token NLL, argmax hits and tokens since the last logged row
    batches = length_buckets([len(d.prompt_ids) + len(d.response_ids) for d in data], cfg.batch_size, cfg.bucket,
                             run.rng)
    for step in range(run.start, cfg.steps):
        lr = lr_at(step, cfg, timer.budget(cfg.budget_clock))
        for group in run.optimizer.param_groups:
            group["lr"] = lr
        batch = sft_batch(cfg, run, next(batches))
        logp, grad_norm = sft_step(cfg, run, batch, step)
        tokens += int(batch.attention_mask.sum())
        sums[0] += -float(logp.detach().sum())  # this rank's sum: the logged mean is over every rank's tokens
        sums[1] += float((logp.detach() > math.log(0.5)).float().sum())  # p(target) > 1/2: argmax hit
        sums[2] += len(logp)
        bar.update(spent() - bar.n if budgeted else 1)
        done = step + 1 == cfg.steps or (cfg.max_seconds is not None and timer.budget(cfg.budget_clock) > cfg.max_seconds)
        if dist.enabled and cfg.max_seconds is not None:  # every rank must agree to stop
            done = dist.mean({"d": float(done)})["d"] > 0
        row = None
        if (cfg.log_every > 0 and (step + 1) % cfg.log_every == 0) or done:
            loss_all, acc_all, n_all = dist.sum(sums)  # token means over every rank
            stats = {"loss": loss_all / max(1, n_all), "token_acc": acc_all / max(1, n_all)}
            row = {"step": step + 1, "seconds": round(timer(), 2), "cpu_seconds": round(timer.cpu(), 2), **stats, "lr": lr,
                   "grad_norm": float(grad_norm), "tokens_per_s": tokens * dist.world / max(1e-9, timer())}
            sums = [0.0, 0.0, 0.0]
            bar.set_postfix(step=step + 1, loss=f"{stats['loss']:.3f}")
        if cfg.eval_every > 0 and ((step + 1) % cfg.eval_every == 0 or done):  # 0: never evaluate
            row = row or {"step": step + 1, "seconds": round(timer(), 2), "cpu_seconds": round(timer.cpu(), 2)}
            with off_the_bar(bar):  # the ETA counts training steps only
                row.update(evaluate_off_budget(run.sampler, run.envs, cfg.eval_episodes, dist, timer,
                                               cfg.budget_counts_eval, cfg.progress))
            bar.set_postfix(loss=row.get("loss"), f1=f"{row['eval_f1']:.3f}")
        if row is not None:
            run.log.append(row)
            last = row
            with timer.excluded():  # drawing the curve (matplotlib's first import: ~1-2 CPU-s) is no training
                run.log.plot("step", ["loss", "token_acc", "eval_f1"], f"SFT {cfg.env_id} {cfg.env_kwargs}")
        if (cfg.save_every > 0 and (step + 1) % cfg.save_every == 0) or done:  # 0: only at the end
            with off_the_bar(bar):
                _save(cfg, dist, run.out, step + 1, run.lm, run.tok, run.optimizer, timer)
        if done:
            break
    bar.close()
    if dist.enabled:
        dist.barrier()
    return last


@dataclass
class SFTRun:
    """What the steps of :func:`train_sft` share, as :func:`sft_setup` builds it."""

    dist: Any
    out: Path
    lm: torch.nn.Module
    tok: Any
    model: ActorCritic
    train_model: torch.nn.Module  # model, DDP-wrapped under torchrun
    optimizer: torch.optim.Optimizer
    sampler: LLMPolicy  # greedy: the oracle's demonstrations' prompts and the evaluation
    data: list[Demonstration]
    envs: list
    log: MetricsLog
    rng: np.random.Generator  # the batches and the prompt-loss token subset
    autocast: str
    start: int
    elapsed: tuple[float, float]


def sft_setup(cfg: SFTConfig, data: Sequence[Demonstration] | None) -> SFTRun:
    """Everything before the first step: the process group, the model (resumed from ``cfg.out_dir``'s last
    checkpoint with ``cfg.resume``), the optimizer, the data (default the oracle's demonstrations), the envs and
    the metrics log."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    dist = init_distributed()
    out = Path(cfg.out_dir)
    if dist.main:
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(cfg.to_json())
    seed_everything(cfg.seed)
    resume_from = latest_checkpoint(out) if cfg.resume else None
    lm, tok = load_or_build_model(cfg, dist, resume_from)
    autocast = resolve_autocast(cfg.autocast, dist.device)
    if dist.main and cfg.progress:
        print(host_line(autocast, dist.device), flush=True)
    if autocast == "bf16" and torch.device(dist.device).type == "cpu":
        use_float32_attention(lm)  # CPU flash attention is much faster in fp32 than in bf16
    if cfg.gradient_checkpointing:
        enable_activation_checkpointing(lm)
    model = ActorCritic(lm)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    start, elapsed = 0, (0.0, 0.0)
    if resume_from is not None:
        state = load_trainer_state(resume_from, optimizer=True)
        elapsed = tuple(state.get("elapsed", (0.0, 0.0)))
        optimizer.load_state_dict(state["optimizer"])
        start = int(state["step"])
        set_rng_state(state["rng"][dist.rank] if isinstance(state["rng"], list) else state["rng"])
    seed_everything(cfg.seed * 1000 + dist.rank + start)  # rank-specific batches, reproducible on resume
    train_model = torch.nn.parallel.DistributedDataParallel(model) if dist.enabled else model
    sampler = LLMPolicy(lm, tok, temperature=0.0, max_new_tokens=cfg.max_new_tokens)
    if data is None:
        data = expert_data(sampler, cfg, range(cfg.demo_seed_base, cfg.demo_seed_base + cfg.episodes))
    elif not data:
        raise ValueError("train_sft: data holds no example")
    data = list(data)
    envs = make_envs(cfg)
    log = MetricsLog(out, enabled=dist.main, resume=resume_from is not None)
    log.truncate("step", start)
    rng = np.random.default_rng(cfg.seed * 7919 + dist.rank * 104729 + start)
    return SFTRun(dist, out, lm, tok, model, train_model, optimizer, sampler, data, envs, log, rng, autocast,
                  start, elapsed)


def sft_batch(cfg: SFTConfig, run: SFTRun, idx) -> Any:
    """The examples ``idx`` of ``run.data`` as one right-padded batch (:func:`agents.llm.training.common.collate`),
    the observation tokens' targets thinned to ``prompt_loss_fraction`` when they get a loss."""
    data = run.data
    batch = collate([(data[i].prompt_ids, data[i].response_ids) for i in idx], run.tok.pad_token_id,
                    device=run.dist.device, include_prompt=cfg.prompt_loss_weight > 0, pad_multiple=cfg.pad_multiple,
                    max_width=getattr(run.lm.config, "max_position_embeddings", None), action_masks=[
                        data[i].action_mask if data[i].action_mask is not None else [1] * len(data[i].response_ids)
                        for i in idx])
    if cfg.prompt_loss_weight > 0 and cfg.prompt_loss_fraction < 1.0:
        keep = ~batch.prompt | (torch.from_numpy(run.rng.random(len(batch.prompt))).to(batch.prompt.device)
                                < cfg.prompt_loss_fraction)
        batch = batch.select_targets(keep)
    return batch


def sft_step(cfg: SFTConfig, run: SFTRun, batch, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One optimizer step on ``batch``; returns the action tokens' log-probs and the gradient norm (before
    clipping)."""
    run.model.train()
    with torch.autocast(torch.device(run.dist.device).type, dtype=torch.bfloat16, enabled=run.autocast == "bf16"):
        # The target count is padded too: it changes every step, and oneDNN's bf16 kernels keep a plan (and glibc
        # the heap pages around it) per shape of the LM head's products: ~3-5 MB per new count (issue 51).
        logp_all, _, _ = run.train_model(**batch.inputs(cfg.pad_multiple))
    logp_all = logp_all[:len(batch.targets)]
    logp = logp_all[~batch.prompt]
    total, _ = sft_loss(logp_all, batch.prompt, cfg.prompt_loss_weight, run.dist)
    run.optimizer.zero_grad(set_to_none=True)
    total.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(run.model.parameters(), cfg.grad_clip)
    check_finite_step(grad_norm, f"step {step + 1}")
    run.optimizer.step()
    # The gradients are dead until the next backward: freed now, they are not held beside the next forward's
    # activations, a checkpoint write or an evaluation (SmolLM2: 538 MB; issue 51).
    run.optimizer.zero_grad(set_to_none=True)
    return logp, grad_norm


def sft_loss(logp_all: torch.Tensor, prompt: torch.Tensor, prompt_loss_weight: float, dist) -> tuple:
    """``(total, loss)`` of one SFT step: ``loss`` is the negative mean log-prob of the action tokens
    (``~prompt``), ``total`` adds ``prompt_loss_weight`` x the observation tokens' negative mean.

    The means are over the tokens of **every rank**: each rank divides its sum by the global count / world size,
    so DDP's average of the ranks' gradients is the gradient of the global token mean (a per-rank mean would
    weight a rank's tokens by the inverse of its own count, and length-bucketed batches give ranks very
    different counts). One all-reduce of two counts per step; with one process this is the plain mean. The
    returned ``loss`` is this rank's share (its sum over the global count / world), for backward only: logged
    figures are reduced separately."""
    targets = ~prompt
    counts = [float(targets.sum()), float(prompt.sum()) if prompt_loss_weight > 0 else 0.0]
    if dist.enabled:
        counts = dist.sum(counts)
    denom_action, denom_prompt = (max(c, 1.0) / dist.world for c in counts)
    loss = -logp_all[targets].sum() / denom_action
    total = loss
    if prompt_loss_weight > 0:
        total = loss - prompt_loss_weight * logp_all[prompt].sum() / denom_prompt
    return total, loss


def _save(cfg, dist, out, step, lm, tok, optimizer, timer) -> None:
    rngs = [rng_state()]
    if dist.enabled:
        gathered: list[Any] = [None] * dist.world
        torch.distributed.all_gather_object(gathered, rng_state())
        rngs = gathered
    if dist.main:
        save_checkpoint(out, step, lm, tok, {"step": step, "optimizer": optimizer.state_dict(), "rng": rngs,
                                             "config": cfg.to_json(), "algo": "sft",
                                             "elapsed": (timer(), timer.cpu())}, keep=cfg.keep_checkpoints,
                        keep_every=cfg.keep_every)
    dist.barrier()
