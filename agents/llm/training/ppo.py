"""PPO and GRPO on invocation records, CleanRL style: one config dataclass, one loop of named steps.

:func:`train_rl` reads as the loop: per update, **rollout** (:func:`rollout_step`), **advantages**
(:func:`advantages_step`; the math in :mod:`agents.llm.training.advantages`), **update**
(:func:`agents.llm.training.ppo_update.ppo_update`, the loss :func:`agents.llm.training.ppo_update.ppo_loss`), **log**
(:func:`log_row`) and **checkpoint** (``_save``). The set-up before it is :func:`setup`; the actor forward and the loss
hook's interface are in :mod:`agents.llm.training.actor`. Every public name of those modules is importable from here as
before.

Each update: every rank rolls out its own episodes with the current policy (sampling at ``temperature``),
computes advantages, then runs ``epochs`` x ``num_minibatches`` clipped-surrogate steps on its records. Under
``torchrun`` the actor(-critic) is wrapped in DDP, so gradients are all-reduced and parameters stay identical.
Training is one invocation per sequence (memory-aligned: the exact prompt ids of the invocation, positions from
0); observation (prompt) tokens never get loss.

Credit assignment (how the terminal reward reaches earlier invocations of the same episode):

- **PPO** (value head on the LM's last hidden state): token-level GAE over the *concatenated action tokens of
  the episode*, in turn order. The env reward of a step is placed on the last token of that invocation; the
  value after the last action token of invocation k is the value of the first action token of invocation k+1,
  so the bootstrap crosses invocation boundaries and the final F1 flows back to earlier memory writes and
  searches. The episode end (answer or turn limit) is terminal: value 0 after it (the remaining turns are part
  of the observation, so the turn limit is part of the state, not a time-out). ``gamma``/``lam`` are per token.
- **GRPO** (no value head): each task seed is played ``group_size`` times; a trajectory's advantage is its
  return minus the group mean, divided by the group std (population std, floored at ``adv_std_floor`` so a group
  whose rewards barely differ does not get huge advantages; ``grpo_std_norm=False`` skips the division),
  broadcast to every action token of every invocation of that trajectory. A group whose rewards are all equal
  carries no learning signal: its trajectory advantage is exactly 0, and with ``grpo_drop_zero_variance``
  (default) its tokens get no policy-gradient, entropy or KL loss and are left out of the token-mean normaliser
  (otherwise they dilute every other group's gradient); the count is logged as ``zero_variance_groups``. Only
  the trajectory part is dropped: an advantage a loss hook's ``on_update`` adds to such a group's tokens (memory
  credit) still trains them (those tokens count in the policy-gradient term and its normaliser; logged as
  ``flat_credited_tokens``), and the hook's own term (distillation) still covers every action token.
  Every minibatch takes its optimizer step, also one whose tokens are all dropped (a zero loss that is still a
  function of the parameters): under ``torchrun`` every rank must run the same backward passes.

Under ``torchrun`` (DDP) the update is the one process would make on the *global* batch (every rank's records):
each token-mean divides by the minibatch's action-token count summed over ranks (one small all-reduce per
minibatch), PPO's advantage whitening uses the global mean and std, and DDP averages the gradients; a rank whose
minibatch has no loss token (GRPO, every group flat) still runs its forward and backward (a zero loss through
the graph), so every rank reaches the same collectives. GRPO groups never straddle ranks (each rank rolls out
whole groups, :func:`task_seeds`).

Memory per update (``grad_accumulation``): the minibatch is split into micro-batches (the actor forward's
``split(records)`` when it has one, e.g. one packed batch each in :mod:`distill.trainer`; else
``micro_batch_size`` records), each forward is followed by its backward (gradients accumulate; under DDP only the
last one all-reduces), and one optimizer step follows; every loss term divides by the whole minibatch's
token count, so the gradient equals one backward over the minibatch. ``gradient_checkpointing`` recomputes the
body's activations in the backward (transformers' ``activation_checkpointing_enable``, non-reentrant).

Loss per action token, averaged over all action tokens of the minibatch (token-mean):
``max(-A r, -A clip(r, 1-eps, 1+eps)) + vf_coef * 0.5 * max((V-R)^2, (V_clip-R)^2) - ent_coef * H
+ kl_coef * KL_k3(pi || pi_ref)``, with ``r = exp(logp - logp_behaviour)``; ``logp_behaviour`` are the records'
``response_logprobs`` (same temperature; token-exact, so ``r == 1`` at the first minibatch) and
``KL_k3 = exp(ref - logp) - (ref - logp) - 1`` against a frozen copy of the starting model.
With ``recompute_old_logprobs=True`` the old log-probs are instead recomputed with the training forward before
the first minibatch (needed wherever the training forward differs from sampling: another precision, a packing,
a reconstruction of the context). GRPO's first minibatch of an update takes them from its own training forward instead
(``old_logprobs_from_first_forward``: it runs before any optimizer step, so they are exactly what a scoring pass
would give, and its ratio is exactly 1); while the actor's weights equal the reference's (a fresh run's first
update) the reference's log-probs are the actor's, with no pass of their own (``ref_logprobs_from_actor``).

With ``lora_rank > 0`` the actor trains low-rank adapters on its linear layers instead of its weights
(:mod:`agents.llm.training.lora`): the reference is then the base (the same LM with its adapters off, no second copy),
equal to the actor while every adapter's ``B`` is zero; a checkpoint holds the merged model and the adapters.

Extension points (what ``distill.trainer`` plugs in instead of copying this loop):

- ``actor_forward(module, records, temperature=, entropy=) -> ActorOutput``: how a list of records goes through
  the actor(-critic); default :func:`collate_forward` (one invocation per right-padded row).
- ``extra_loss``: a :class:`LossHook`, called on every minibatch with its records and the
  :class:`ActorOutput` of the same forward; its term is added to the PPO/GRPO loss before ``backward``. An
  ``on_update(episodes, records, module)`` method, when the hook has one, runs once per update after the
  advantages are set and before the epochs (it may add to ``token_advantages``: memory credit).
"""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agents.llm.training.actor import (ActorForward, ActorOutput, LossHook, collate_forward, flat_tokens, micro_batches,
                                       minibatch_units, score_records)
from agents.llm.training.advantages import (advantage_moments, assign_advantages, episode_gae, gae, group_advantages,
                                            grpo_assign, zero_variance_groups)
from agents.llm.training.lora import (DEFAULT_TARGETS, BaseReference, adapter_files, adapters_are_zero, add_adapters,
                                      check_lora_settings, merged_copy, resume_adapters)
from agents.llm.models.local import use_float32_attention
from agents.llm.generation.policy import LLMPolicy
from agents.llm.training.ppo_update import Learner, UpdateBatch, clip_gradients, ppo_loss, ppo_update
from agents.llm.models.precision import host_line, resolve_autocast
from agents.llm.records.rollouts import records_of, rollout
from agents.llm.training.common import (ActorCritic, MetricsLog, RunConfig, Timer, enable_activation_checkpointing,
                                        evaluate_off_budget, off_the_bar, init_distributed, latest_checkpoint,
                                        load_or_build_model, load_trainer_state, make_envs, rng_state, save_checkpoint,
                                        seed_everything, set_rng_state)


@dataclass
class PPOConfig(RunConfig):
    algo: str = "ppo"  # "ppo" | "grpo"
    updates: int = 100
    episodes_per_update: int = 32  # per rank; GRPO: tasks_per_update * group_size
    group_size: int = 8  # GRPO: episodes per task seed
    temperature: float = 1.0
    top_p: float = 1.0
    epochs: int = 2
    num_minibatches: int = 4  # per epoch, per rank (the same on every rank: DDP needs equal step counts)
    lr: float = 1e-4
    warmup_updates: int = 0  # the lr rises linearly over the first this many updates: update u (0-based) trains at
    # lr * (u + 1) / warmup_updates (0: no warm-up). Without one, Adam's first steps move every weight by ~lr
    # whatever its gradient (a first-update KL to the start policy of 10-74 nats on SmolLM2)
    value_lr_mult: float = 10.0  # lr of the value head = lr * value_lr_mult
    clip: float = 0.2
    clip_vf: float | None = 0.2
    vf_coef: float = 0.5
    ent_coef: float = 0.0
    kl_coef: float = 0.0
    gamma: float = 1.0
    lam: float = 1.0  # per token; 1.0 = Monte Carlo returns with the value baseline (as verl's default)
    value_detach: bool = False  # value head on detached hidden states (the critic does not move the LM)
    norm_adv: bool = True  # PPO: whiten token advantages over the rank's batch
    grpo_std_norm: bool = True
    adv_std_floor: float = 0.0  # GRPO: divide by max(group std, floor) (0: the plain std)
    grpo_drop_zero_variance: bool = True  # GRPO: groups with equal rewards contribute no loss and no tokens
    target_kl: float | None = None  # stop the epochs of an update early when approx KL exceeds it
    recompute_old_logprobs: bool = False  # old log-probs from the training forward, not the records' behaviour ones
    # Scoring passes saved, exactly (docs/distill_speed.md, "Cost of one arm update"): the first minibatch of an update
    # (GRPO) takes its recomputed old log-probs, and its reference log-probs while the actor equals the reference,
    # from its own training forward, which runs before any optimizer step, at the policy a scoring pass would see;
    # only the other records are scored. Off where the actor has an active dropout (train and eval forwards differ)
    old_logprobs_from_first_forward: bool = True
    # the reference's log-probs are the actor's (no separate reference pass) while the actor's weights equal the
    # reference's bit for bit (a fresh run's first update; lr 0): the same weights through the same forward
    ref_logprobs_from_actor: bool = True
    minibatch_unit: str = "invocation"  # "invocation" | "episode" (whole episodes: a persistent reconstruction)
    grad_accumulation: bool = False  # backward per micro-batch of a minibatch (bounded memory; same gradient)
    micro_batch_size: int = 8  # records per micro-batch of the default (collate) forward, with grad_accumulation
    gradient_checkpointing: bool = False  # recompute the LM body's activations in the backward
    eval_every: int = 10
    save_every: int = 20
    generation: str = "tree"  # the rollout sampler's prefill: agents.llm.generation.policy.GENERATIONS (tree | padded)
    # The training passes' precision (agents.llm.models.precision.AUTOCAST_CHOICES): "none" fp32; "bf16" the actor's and
    # the reference's forwards under bf16 autocast (the body's and the LM head's matmuls bf16; weights, softmaxes,
    # log-probs and losses fp32; attention fp32 on CPU); "auto" bf16 where the device computes it natively.
    # Sampling stays fp32, so the records' log-probs stay exact; under bf16 the
    # old log-probs are recomputed by the training forward (recompute_old_logprobs), so the first minibatch's
    # ratio is exactly 1 and the clip acts on the policy's movement, not on bf16 rounding.
    train_autocast: str = "none"
    # Low-rank adapters (agents.llm.training.lora; off at 0): the actor trains rank-r adapters (scaled by alpha / r; alpha
    # None: 2 r) on its linear layers named lora_targets instead of its weights, which stay frozen. The reference is
    # the base (the adapters off, no second copy); checkpoints hold the merged model plus the adapters' weights
    lora_rank: int = 0
    lora_alpha: float | None = None
    lora_targets: tuple[str, ...] = DEFAULT_TARGETS  # the attention and MLP projections; add "lm_head" for a model
    # trained from scratch (its small frozen head caps what body adapters can change: docs/distill_speed.md)

    def __post_init__(self) -> None:
        from agents.llm.generation.policy import GENERATIONS
        from agents.llm.models.precision import AUTOCAST_CHOICES

        check_lora_settings(self.lora_rank, self.lora_alpha, self.lora_targets)
        if self.train_autocast not in AUTOCAST_CHOICES:
            raise ValueError(f"train_autocast must be one of {', '.join(AUTOCAST_CHOICES)}, "
                             f"got {self.train_autocast!r}")
        if self.generation not in GENERATIONS:
            raise ValueError(f"generation must be one of {', '.join(GENERATIONS)}, got {self.generation!r}")
        if self.algo not in ("ppo", "grpo"):
            raise ValueError(f"algo must be 'ppo' or 'grpo', got {self.algo!r}")
        if self.minibatch_unit not in ("invocation", "episode"):
            raise ValueError(f"minibatch_unit must be 'invocation' or 'episode', got {self.minibatch_unit!r}")
        if self.algo == "grpo" and (self.group_size < 2 or self.episodes_per_update % self.group_size):
            raise ValueError("GRPO needs group_size >= 2 dividing episodes_per_update")
        if self.adv_std_floor < 0:
            raise ValueError(f"adv_std_floor must be >= 0, got {self.adv_std_floor}")
        if self.num_minibatches > self.episodes_per_update:
            raise ValueError("num_minibatches must not exceed episodes_per_update")
        if self.micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be >= 1 record, got {self.micro_batch_size}")
        if isinstance(self.warmup_updates, bool) or not isinstance(self.warmup_updates, int) or self.warmup_updates < 0:
            raise ValueError(f"warmup_updates must be an integer >= 0, got {self.warmup_updates!r}")

    def lr_scale(self, update: int) -> float:
        """The learning-rate factor of update ``update`` (0-based): the linear warm-up, then 1."""
        return min(1.0, (update + 1) / self.warmup_updates) if self.warmup_updates else 1.0

    @property
    def uses_value(self) -> bool:
        return self.algo == "ppo"


def task_seeds(cfg: PPOConfig, update: int, rank: int) -> tuple[list[int], list[int | None]]:
    """Training task seeds of one update on one rank (and GRPO group ids). Disjoint from held-out seeds."""
    rng = np.random.default_rng([cfg.seed, update, rank, 17])
    if cfg.algo == "grpo":
        tasks = rng.integers(0, 10**6, size=cfg.episodes_per_update // cfg.group_size).tolist()
        seeds = [t for t in tasks for _ in range(cfg.group_size)]
        return seeds, [i for i in range(len(tasks)) for _ in range(cfg.group_size)]
    return rng.integers(0, 10**6, size=cfg.episodes_per_update).tolist(), [None] * cfg.episodes_per_update


def fused_adamw(groups) -> bool | None:
    """``fused=True`` for AdamW where every parameter is a floating tensor on the CPU or a CUDA device (one kernel
    per tensor instead of the foreach ops' passes: 0.384 -> 0.063 CPU-s a step on the 6-layer SmolLM2 student's
    49.6M parameters, AVX2 host, 1 thread, 2026-12-07; the parameters after 4 steps within 6e-8 of foreach's,
    another rounding order), else None (torch's default). A checkpoint of an earlier run restores its own
    setting (torch's ``load_state_dict``)."""
    params = [p for g in groups for p in g["params"]]
    ok = all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params)
    return True if params and ok else None


def train_rl(cfg: PPOConfig, model=None, tokenizer=None, env_fn=None, *, extra_loss: LossHook | None = None,
             actor_forward: ActorForward | None = None, title: str | None = None) -> dict[str, Any]:
    """PPO or GRPO (``cfg.algo``); returns the last metrics row. Runs unchanged under torchrun.

    ``model``/``tokenizer``: an in-memory start (else ``cfg.model`` or a fresh tiny model); ``env_fn``: a
    callable making one env (else ``gym.make(cfg.env_id, **cfg.env_kwargs)``). ``extra_loss`` /
    ``actor_forward``: see the module doc (a hook's ``plot_keys`` attribute adds columns to the PNG);
    ``title``: of the learning curve."""
    from tqdm.auto import tqdm

    run = setup(cfg, model, tokenizer, env_fn, actor_forward, extra_loss)
    dist = run.dist
    bar = tqdm(total=cfg.updates, initial=run.start, desc=cfg.algo, unit="update",
               disable=not (cfg.progress and dist.main))
    timer, last = Timer(run.elapsed), {}
    if run.start == 0 and cfg.eval_every:
        evaluation = evaluate_off_budget(run.greedy, run.envs, cfg.eval_episodes, dist, timer,
                                         cfg.budget_counts_eval, cfg.progress)
        last = {"update": 0, "seconds": round(timer(), 2), "cpu_seconds": round(timer.cpu(), 2), **evaluation}
        run.log.append(last)
    for update in range(run.start, cfg.updates):
        t0 = Timer()
        set_warmup_lr(cfg, run.learner.optimizer, update)
        cpu = PartClock()  # this process's CPU seconds by part of the update (the *_cpu_s columns)
        episodes, records = rollout_step(run, update, cpu)  # 1. rollout
        rollout_s = t0()
        batch = advantages_step(run, episodes, records, cpu)  # 2. advantages
        stats, stop_early = ppo_update(cfg, dist, run.learner, batch, run.mb_rng, cpu, update)  # 3. update
        row = log_row(run, update, batch, stats, stop_early, timer, rollout_s, t0() - rollout_s)  # 4. log
        done = is_done(cfg, dist, update, timer)
        if cfg.eval_every and ((update + 1) % cfg.eval_every == 0 or done):
            with cpu("eval"), off_the_bar(bar):  # the bar's rate and ETA count updates only
                row.update(evaluate_off_budget(run.greedy, run.envs, cfg.eval_episodes, dist, timer,
                                               cfg.budget_counts_eval, cfg.progress))
        row.update(cpu.columns())
        run.log.append(row)
        last = row
        with timer.excluded():  # drawing the curve (matplotlib's first import: ~1-2 CPU-s) is no training
            run.log.plot("update", ["reward", "eval_f1", "kl_ref" if run.ref is not None else "approx_kl", "entropy",
                                    *getattr(extra_loss, "plot_keys", ())],
                         title or f"{cfg.algo.upper()} {cfg.env_id} {cfg.env_kwargs}")
        bar.update(1)
        bar.set_postfix(reward=f"{row['reward']:.3f}", **({"f1": f"{row['eval_f1']:.3f}"} if "eval_f1" in row else {}))
        if (update + 1) % cfg.save_every == 0 or done:  # 5. checkpoint
            with off_the_bar(bar):
                _save(cfg, dist, run.out, update + 1, run.lm, run.tok, run.learner.optimizer, run.model, timer,
                      {"sampler": run.policy.generator.get_state(), "minibatch": run.mb_rng.bit_generator.state})
        if done:
            break
    bar.close()
    dist.barrier()
    return last


@dataclass
class RLRun:
    """What the steps of :func:`train_rl` share, as :func:`setup` builds it."""

    cfg: PPOConfig
    dist: Any
    out: Path
    lm: torch.nn.Module  # the policy's LM (the sampler's and the trained one)
    tok: Any
    model: ActorCritic  # the LM with its value head (PPO)
    ref: ActorCritic | None  # the frozen starting policy (kl_coef > 0)
    learner: Learner
    policy: LLMPolicy  # sampling at cfg.temperature
    greedy: LLMPolicy  # evaluation
    envs: list
    log: MetricsLog
    mb_rng: np.random.Generator  # the minibatch shuffle
    recompute_old: bool
    on_update: Callable | None
    start: int
    elapsed: tuple[float, float]
    ref_may_equal: bool = True  # the actor may still equal the reference (same_as_reference)


def setup(cfg: PPOConfig, model, tokenizer, env_fn, actor_forward: ActorForward | None,
          extra_loss: LossHook | None) -> RLRun:
    """Everything before the first update: the process group, the models (resumed from ``cfg.out_dir``'s last
    checkpoint with ``cfg.resume``), the optimizer, the samplers, the envs and the metrics log."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    dist = init_distributed()
    train_autocast = resolve_autocast(cfg.train_autocast, dist.device)
    recompute_old = cfg.recompute_old_logprobs or train_autocast != "none"
    if dist.main and cfg.progress:  # rollouts always sample in fp32; the training passes as train_autocast says
        print(host_line(train_autocast, dist.device) + " (sampling fp32; training passes: "
              f"{'bf16 autocast: matmuls bf16, log-probs and losses fp32' if train_autocast != 'none' else 'fp32'})", flush=True)
    out = Path(cfg.out_dir)
    if dist.main:
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(cfg.to_json())
    seed_everything(cfg.seed)
    resume_from = latest_checkpoint(out) if cfg.resume else None
    lm, tok, actor, ref = build_models(cfg, dist, model, tokenizer, resume_from, train_autocast)
    head = list(actor.value_head.parameters()) if actor.value_head is not None else []
    head_ids = {id(p) for p in head}
    lm_params = [p for p in actor.parameters() if id(p) not in head_ids and (p.requires_grad or not cfg.lora_rank)]
    groups = [{"params": lm_params, "lr": cfg.lr}]
    if head:
        groups.append({"params": head, "lr": cfg.lr * cfg.value_lr_mult})
    optimizer = torch.optim.AdamW(groups, lr=cfg.lr, weight_decay=cfg.weight_decay, fused=fused_adamw(groups))
    start, elapsed, state = 0, (0.0, 0.0), {}
    if resume_from is not None:
        state = load_trainer_state(resume_from, optimizer=True)
        elapsed = tuple(state.get("elapsed", (0.0, 0.0)))
        optimizer.load_state_dict(state["optimizer"])
        if actor.value_head is not None and (resume_from / "value_head.pt").exists():
            actor.value_head.load_state_dict(torch.load(resume_from / "value_head.pt", map_location=dist.device))
        start = int(state["update"])
        set_rng_state(state["rng"][dist.rank] if isinstance(state["rng"], list) else state["rng"])
    train_model = torch.nn.parallel.DistributedDataParallel(actor) if dist.enabled else actor
    policy = LLMPolicy(lm, tok, temperature=cfg.temperature, top_p=cfg.top_p, max_new_tokens=cfg.max_new_tokens,
                       seed=cfg.seed * 1000 + dist.rank + 7919 * start, generation=cfg.generation)
    greedy = LLMPolicy(lm, tok, temperature=0.0, max_new_tokens=cfg.max_new_tokens, generation=cfg.generation)
    envs = [env_fn() for _ in range(cfg.num_envs)] if env_fn is not None else make_envs(cfg)
    log = MetricsLog(out, enabled=dist.main, resume=resume_from is not None)
    log.truncate("update", start)
    learner = Learner(train_model, actor_forward or collate_forward(tok.pad_token_id, dist.device), optimizer,
                      lm_params, head, policy.temperature if policy.temperature > 0 else 1.0, extra_loss)
    mb_rng = np.random.default_rng([cfg.seed, dist.rank, start, 23])
    if "sampling" in state:
        # The sampler's and the minibatch shuffle's states at the checkpoint: a resumed run draws exactly what the
        # uninterrupted run would have (checkpoints without them continue from fresh seeds, as before).
        sampling = state["sampling"][dist.rank]
        policy.generator.set_state(sampling["sampler"])
        mb_rng.bit_generator.state = sampling["minibatch"]
    return RLRun(cfg, dist, out, lm, tok, actor, ref, learner, policy, greedy, envs, log, mb_rng, recompute_old,
                 getattr(extra_loss, "on_update", None), start, elapsed)


def build_models(cfg: PPOConfig, dist, model, tokenizer, resume_from, train_autocast: str):
    """``(lm, tokenizer, actor, ref)``: the policy LM (``model``, else loaded or built), the actor(-critic) on it
    and the frozen reference (the starting policy, also after a resume; None without ``kl_coef``). With
    ``lora_rank``: the LM is the starting model with adapters (resumed: their weights from the checkpoint), and the
    reference is that LM with its adapters off."""
    start_lm = model
    if model is not None and (resume_from is None or cfg.lora_rank):
        lm, tok = model.to(dist.device), tokenizer
    else:  # with adapters, the base is the starting model, also on a resume (the adapters come from the checkpoint)
        lm, tok = load_or_build_model(cfg, dist, None if cfg.lora_rank else resume_from)
    if cfg.gradient_checkpointing:
        enable_activation_checkpointing(lm)
    if cfg.lora_rank:
        if resume_from is not None:
            resume_adapters(lm, resume_from, cfg.lora_rank, cfg.lora_alpha, cfg.lora_targets)
        else:
            add_adapters(lm, cfg.lora_rank, cfg.lora_alpha, cfg.lora_targets)
    actor = ActorCritic(lm, value_head=cfg.uses_value, detach_value=cfg.value_detach,
                        autocast=train_autocast).to(dist.device)
    ref = None
    if cfg.kl_coef > 0 and cfg.lora_rank:  # the base: the actor's LM with its adapters off (no second copy)
        ref = BaseReference(lm, autocast=train_autocast).to(dist.device)
    elif cfg.kl_coef > 0:  # the reference is the starting policy, also after a resume
        if start_lm is not None:
            ref_lm = copy.deepcopy(start_lm) if start_lm is not lm else copy.deepcopy(lm)
        else:
            ref_lm = copy.deepcopy(lm) if resume_from is None else load_or_build_model(cfg, dist)[0]
        ref = ActorCritic(ref_lm, autocast=train_autocast).to(dist.device).eval()
        for p in ref.parameters():
            p.requires_grad_(False)
    if train_autocast != "none" and torch.device(dist.device).type == "cpu":
        # the CPU attention kernels are several times slower in bf16: attention stays fp32 under the autocast
        for m in (lm, *((ref.lm,) if ref is not None else ())):
            if getattr(m.config, "_attn_implementation", None) == "sdpa":
                use_float32_attention(m)
    return lm, tok, actor, ref


def set_warmup_lr(cfg: PPOConfig, optimizer, update: int) -> None:
    """The warm-up's lr of ``update``, set from the update index alone (the LM's group, then the value head's),
    so a resumed run warms up exactly as it would have; nothing without ``warmup_updates``."""
    if cfg.warmup_updates:
        for group, base in zip(optimizer.param_groups, [cfg.lr, cfg.lr * cfg.value_lr_mult]):
            group["lr"] = base * cfg.lr_scale(update)


def rollout_step(run: RLRun, update: int, cpu: PartClock) -> tuple[list, list]:
    """Step 1: this rank's episodes of ``update`` with the current policy, and their invocation records."""
    seeds, group_ids = task_seeds(run.cfg, update, run.dist.rank)
    with cpu("rollout"):
        episodes = rollout(run.policy, run.envs, seeds, groups=group_ids, gamma=run.cfg.gamma)
    return episodes, records_of(episodes)


def advantages_step(run: RLRun, episodes, records, cpu: PartClock) -> UpdateBatch:
    """Step 2: old log-probs (the records' behaviour ones, or recomputed) and values, the advantages (GAE or
    GRPO's), the reference's log-probs, the loss hook's ``on_update`` (memory credit) and PPO's whitening
    moments."""
    cfg, dist, learner = run.cfg, run.dist, run.learner
    unit = cfg.minibatch_unit
    # the first epoch's minibatch order, drawn now (the same draw ppo_update would make): its first minibatch's
    # old / reference log-probs may come from that minibatch's own forward (PPOConfig.old_logprobs_from_first_forward)
    first_order = run.mb_rng.permutation(len(minibatch_units(records, unit)))
    with cpu("score"):  # the check reads every weight while they are equal (a fresh run's first update)
        ref_is_actor = run.ref is not None and cfg.ref_logprobs_from_actor and same_as_reference(run)
    first = first_minibatch(cfg, records, first_order) if (cfg.old_logprobs_from_first_forward and not cfg.uses_value
                                                           and not has_dropout(run.model)) else []
    actor_logps = old_values = None
    if cfg.uses_value or run.recompute_old or ref_is_actor:
        scored = [i for i in range(len(records)) if i not in set(first)]
        logps = values = []
        if scored:
            with cpu("score"):
                logps, values = score_records(run.model, [records[i] for i in scored], learner.forward,
                                              learner.temperature, values=cfg.uses_value, unit=unit)
        actor_logps, old_values = [None] * len(records), [None] * len(records)
        for i, lp, v in zip(scored, logps, values):
            actor_logps[i], old_values[i] = lp, v
    flat = assign_advantages(cfg, episodes, old_values)
    dropped = {id(r) for ep in episodes if ep.group in flat for r in ep.records} \
        if cfg.grpo_drop_zero_variance else set()
    old_logps = list(actor_logps) if run.recompute_old else \
        [[lp for lp, m in zip(r.response_logprobs, r.action_mask) if m] for r in records]
    ref_logps = list(actor_logps) if ref_is_actor else None
    if run.ref is not None and not ref_is_actor:
        with cpu("score"):
            ref_logps = score_records(run.ref, records, learner.forward, learner.temperature, values=False,
                                      unit=unit)[0]
    with cpu("hook"):
        hook_stats = run.on_update(episodes, records, run.model) if run.on_update is not None else {}
    if cfg.algo == "grpo" and cfg.grpo_drop_zero_variance:  # on every rank (DDP averages the same keys)
        # advantages the hook gave to dropped groups (memory credit) still train their tokens
        hook_stats["flat_credited_tokens"] = float(sum(
            1 for r in records if id(r) in dropped for a, m in zip(r.token_advantages, r.action_mask)
            if m and a != 0))
    adv_mean, adv_std = advantage_moments(flat_tokens(records, "token_advantages"), dist)
    return UpdateBatch(records, old_logps, ref_logps, dropped, adv_mean, adv_std, episodes, flat, hook_stats,
                       first_order)


def first_minibatch(cfg: PPOConfig, records, order: np.ndarray) -> list[int]:
    """The record indices of the first (non-empty) minibatch :func:`agents.llm.training.ppo_update.ppo_update` steps on
    when the first epoch's unit order is ``order``."""
    units = minibatch_units(records, cfg.minibatch_unit)
    for unit_part in np.array_split(order, cfg.num_minibatches):
        part = [i for u in unit_part for i in units[u]]
        if part:
            return part
    return []


def has_dropout(module: torch.nn.Module) -> bool:
    """Whether ``module`` drops anything in training mode (a dropout layer with p > 0, or an LM config's
    ``*dropout`` setting > 0): then a training forward's log-probs are not a scoring pass's."""
    if any(isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p > 0 for m in module.modules()):
        return True
    configs = [m.config for m in module.modules() if hasattr(m, "config") and hasattr(m.config, "to_dict")]
    return any(isinstance(v, float) and "dropout" in k and v > 0 for c in configs[:1] for k, v in c.to_dict().items())


def same_as_reference(run: RLRun) -> bool:
    """Whether the actor's LM computes what the reference computes: the same class, config, autocast and every
    parameter and buffer equal bit for bit (a fresh run until its first optimizer step). Once they differ, not
    checked again (the frozen reference does not come back)."""
    if not run.ref_may_equal:
        return False
    a, b = run.model.lm, run.ref.lm
    if a is b:  # adapters (PPOConfig.lora_rank): the reference is the base; the actor computes it while every B is 0
        run.ref_may_equal = run.model.autocast == run.ref.autocast and adapters_are_zero(a)
        return run.ref_may_equal
    same = (type(a) is type(b) and run.model.autocast == run.ref.autocast
            and a.config.to_dict() == b.config.to_dict())
    for named in ("named_parameters", "named_buffers"):
        if same:
            xs, ys = list(getattr(a, named)()), list(getattr(b, named)())
            same = len(xs) == len(ys) and all(n == m and x.dtype == y.dtype and x.shape == y.shape
                                              and torch.equal(x, y) for (n, x), (m, y) in zip(xs, ys))
    run.ref_may_equal = same
    return same


def log_row(run: RLRun, update: int, batch: UpdateBatch, stats: dict[str, list[float]], stop_early: bool,
            timer: Timer, rollout_s: float, update_s: float) -> dict[str, Any]:
    """Step 4: the metrics row of ``update`` (means over every rank; the evaluation and CPU columns follow)."""
    cfg, episodes, records = run.cfg, batch.episodes, batch.records
    sampled = sum(len(r.response_ids) for r in records)
    row = {"update": update + 1, "seconds": round(timer(), 2), "cpu_seconds": round(timer.cpu(), 2)}
    row.update(run.dist.mean({
        "reward": float(np.mean([ep.reward for ep in episodes])),
        "f1": float(np.mean([ep.f1 for ep in episodes])),
        "turns": float(np.mean([ep.turns for ep in episodes])),
        "invalid_rate": float(sum(ep.info.get("invalid_actions", 0) for ep in episodes) / max(1, len(records))),
        "response_tokens": sampled / max(1, len(records)),
        "memory_tokens": sum(sum(r.memory_mask) for r in records) / max(1, len(records)),
        "adv_mean": batch.adv_mean, "zero_variance_groups": float(len(batch.flat)), "rollout_s": rollout_s,
        "update_s": update_s, "sampled_tokens_per_s": sampled / max(1e-9, rollout_s),
        **{k: float(np.mean(v)) for k, v in stats.items()}, **batch.hook_stats,
        # the first minibatch's policy has not moved yet: ~0 unless training and sampling log-probs differ
        **({"first_approx_kl": stats["approx_kl"][0], "first_clipfrac": stats["clipfrac"][0]}
           if stats.get("approx_kl") else {}),
    }))
    row["early_stop"] = int(stop_early)
    if cfg.warmup_updates:
        row["lr"] = run.learner.optimizer.param_groups[0]["lr"]
    return row


def is_done(cfg: PPOConfig, dist, update: int, timer: Timer) -> bool:
    """Whether ``update`` is the last: the configured count, or the time budget spent (under DDP: on any rank)."""
    done = update + 1 == cfg.updates or (cfg.max_seconds is not None and timer.budget(cfg.budget_clock) > cfg.max_seconds)
    if dist.enabled and cfg.max_seconds is not None:
        done = dist.mean({"d": float(done)})["d"] > 0
    return done


class PartClock:
    """This process's CPU seconds (all threads, ``time.process_time``) spent in named parts of one update:
    ``with clock("rollout"): ...`` adds to ``rollout``; :meth:`columns` gives them as ``<part>_cpu_s``. CPU, not
    wall, seconds: on a shared host the wall clock also counts the other processes' time."""

    PARTS = ("rollout", "score", "hook", "actor", "optimizer", "eval")

    def __init__(self, clock: Callable[[], float] = time.process_time) -> None:
        self.clock = clock
        self.seconds = dict.fromkeys(self.PARTS, 0.0)

    @contextlib.contextmanager
    def __call__(self, part: str):
        if part not in self.seconds:
            raise ValueError(f"CPU part must be one of {', '.join(self.PARTS)}; got {part!r}")
        start = self.clock()
        try:
            yield
        finally:
            self.seconds[part] += self.clock() - start

    def columns(self) -> dict[str, float]:
        return {f"{part}_cpu_s": round(v, 3) for part, v in self.seconds.items()}


def _save(cfg, dist, out, update, lm, tok, optimizer, model, timer, sampling: dict[str, Any]) -> None:
    """A checkpoint with every rank's RNG states: the global generators and ``sampling`` (the rollout sampler's
    and the minibatch shuffle's), so that a resume continues the uninterrupted run exactly."""
    rngs, samplings = [rng_state()], [sampling]
    if dist.enabled:
        gathered: list[Any] = [None] * dist.world
        torch.distributed.all_gather_object(gathered, (rng_state(), sampling))
        rngs, samplings = [g[0] for g in gathered], [g[1] for g in gathered]
    if dist.main:
        extra = {}
        if cfg.lora_rank:  # the merged model (from_pretrained loads it), plus the adapters to resume from
            extra, lm = adapter_files(lm), merged_copy(lm)
        save_checkpoint(out, update, lm, tok, {"update": update, "optimizer": optimizer.state_dict(), "rng": rngs,
                                               "sampling": samplings,
                                               "config": cfg.to_json(), "algo": cfg.algo,
                                               "elapsed": (timer(), timer.cpu())},
                        value_head=model.value_head, keep=cfg.keep_checkpoints, keep_every=cfg.keep_every,
                        extra_files=extra)
    dist.barrier()


def param_checksum(module: torch.nn.Module) -> str:
    """A hash of every parameter's bytes (identical across DDP ranks after synchronised updates)."""
    import hashlib

    h = hashlib.sha256()
    for name, p in sorted(module.named_parameters()):
        h.update(name.encode())
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


__all__ = ["PPOConfig", "train_rl", "gae", "episode_gae", "group_advantages", "grpo_assign", "ppo_loss",
           "zero_variance_groups", "clip_gradients",
           "param_checksum", "task_seeds", "PartClock", "ActorOutput", "ActorForward", "LossHook", "collate_forward",
           "micro_batches", "setup", "rollout_step", "advantages_step", "log_row", "RLRun"]
