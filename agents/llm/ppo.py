"""PPO and GRPO on invocation records, CleanRL style: one file, one config dataclass, one loop.

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
a reconstruction of the context).

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence

import numpy as np
import torch

from agents.llm.models import use_float32_attention
from agents.llm.policy import LLMPolicy
from agents.llm.precision import host_line, resolve_autocast
from agents.llm.records import InvocationRecord
from agents.llm.rollouts import records_of, rollout
from agents.llm.training import (
    ActorCritic,
    MetricsLog,
    RunConfig,
    Timer,
    check_finite_step,
    collate,
    off_the_bar,
    enable_activation_checkpointing,
    evaluate_off_budget,
    init_distributed,
    latest_checkpoint,
    load_or_build_model,
    load_trainer_state,
    make_envs,
    rng_state,
    save_checkpoint,
    seed_everything,
    set_rng_state,
    unwrap_ddp,
)


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
    minibatch_unit: str = "invocation"  # "invocation" | "episode" (whole episodes: a persistent reconstruction)
    grad_accumulation: bool = False  # backward per micro-batch of a minibatch (bounded memory; same gradient)
    micro_batch_size: int = 8  # records per micro-batch of the default (collate) forward, with grad_accumulation
    gradient_checkpointing: bool = False  # recompute the LM body's activations in the backward
    eval_every: int = 10
    save_every: int = 20
    generation: str = "tree"  # the rollout sampler's prefill: agents.llm.policy.GENERATIONS (tree | padded)
    # The training passes' precision (agents.llm.precision.AUTOCAST_CHOICES): "none" fp32; "bf16" the actor's and
    # the reference's forwards under bf16 autocast (the body's and the LM head's matmuls bf16; weights, softmaxes,
    # log-probs and losses fp32; attention fp32 on CPU); "auto" bf16 where the device computes it natively.
    # Sampling stays fp32, so the records' log-probs stay exact; under bf16 the
    # old log-probs are recomputed by the training forward (recompute_old_logprobs), so the first minibatch's
    # ratio is exactly 1 and the clip acts on the policy's movement, not on bf16 rounding.
    train_autocast: str = "none"

    def __post_init__(self) -> None:
        from agents.llm.policy import GENERATIONS
        from agents.llm.precision import AUTOCAST_CHOICES

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


# ---------------------------------------------------------------------- advantage math (pure)
def gae(rewards: Sequence[float], values: Sequence[float], gamma: float = 1.0, lam: float = 0.95,
        last_value: float = 0.0) -> tuple[list[float], list[float]]:
    """Generalised advantage estimation over one token sequence; returns ``(advantages, returns)``.

    ``delta_j = r_j + gamma v_{j+1} - v_j`` (``v_T = last_value``), ``A_j = delta_j + gamma lam A_{j+1}``,
    ``R_j = A_j + v_j``."""
    n = len(rewards)
    adv = [0.0] * n
    running = 0.0
    for j in reversed(range(n)):
        next_value = values[j + 1] if j + 1 < n else last_value
        delta = rewards[j] + gamma * next_value - values[j]
        running = delta + gamma * lam * running
        adv[j] = running
    return adv, [a + v for a, v in zip(adv, values)]


def episode_gae(records: Sequence[InvocationRecord], values: Sequence[Sequence[float]], gamma: float = 1.0,
                lam: float = 0.95) -> None:
    """PPO credit: GAE over the concatenated action tokens of one episode (records in turn order); the env
    reward of each invocation sits on its last action token. Sets ``token_advantages``, ``token_returns`` and
    ``values`` (per response token; non-action tokens get 0 advantage)."""
    flat_r, flat_v, where = [], [], []
    for k, (rec, vals) in enumerate(zip(records, values)):
        action = [t for t, m in enumerate(rec.action_mask) if m]
        if len(vals) != len(action):
            raise ValueError(f"record {rec.key}: {len(vals)} values for {len(action)} action tokens")
        for i, t in enumerate(action):
            flat_r.append(rec.reward if i == len(action) - 1 else 0.0)
            flat_v.append(float(vals[i]))
            where.append((k, t))
        if not action and rec.reward:  # an empty response still carries its reward to the previous token
            if flat_r:
                flat_r[-1] += rec.reward
    adv, ret = gae(flat_r, flat_v, gamma, lam)
    for rec in records:
        n = len(rec.response_ids)
        rec.token_advantages, rec.token_returns, rec.values = [0.0] * n, [0.0] * n, [0.0] * n
    for (k, t), a, r, v in zip(where, adv, ret, flat_v):
        records[k].token_advantages[t] = a
        records[k].token_returns[t] = r
        records[k].values[t] = v


def group_advantages(returns: Sequence[float], groups: Sequence[Any], std_norm: bool = True,
                     eps: float = 1e-6, std_floor: float = 0.0) -> list[float]:
    """GRPO: ``(R_i - mean_g) / (max(std_g, std_floor) + eps)`` per group g (population std), or
    ``R_i - mean_g``."""
    returns = np.asarray(returns, dtype=np.float64)
    out = np.zeros_like(returns)
    keys = list(groups)
    for g in dict.fromkeys(keys):
        idx = np.array([i for i, k in enumerate(keys) if k == g])
        centred = returns[idx] - returns[idx].mean()
        out[idx] = centred / (max(returns[idx].std(), std_floor) + eps) if std_norm else centred
    return out.tolist()


def zero_variance_groups(returns: Sequence[float], groups: Sequence[Any], tol: float = 1e-9) -> set:
    """The groups whose returns are all equal (within ``tol``): no relative signal to learn from."""
    by_group: dict[Any, list[float]] = {}
    for r, g in zip(returns, groups):
        by_group.setdefault(g, []).append(float(r))
    return {g for g, rs in by_group.items() if max(rs) - min(rs) <= tol}


def grpo_assign(episodes, std_norm: bool = True, std_floor: float = 0.0) -> None:
    """Trajectory advantage of each episode, broadcast to all action tokens of its invocations."""
    adv = group_advantages([ep.reward for ep in episodes], [ep.group for ep in episodes], std_norm,
                           std_floor=std_floor)
    for ep, a in zip(episodes, adv):
        for rec in ep.records:
            rec.advantage = float(a)
            rec.token_advantages = [float(a) if m else 0.0 for m in rec.action_mask]


def ppo_loss(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, *, clip: float = 0.2,
             values: torch.Tensor | None = None, old_values: torch.Tensor | None = None,
             returns: torch.Tensor | None = None, clip_vf: float | None = 0.2, vf_coef: float = 0.5,
             entropy: torch.Tensor | None = None, ent_coef: float = 0.0, ref_logp: torch.Tensor | None = None,
             kl_coef: float = 0.0, mask: torch.Tensor | None = None,
             pg_mask: torch.Tensor | None = None, denom: float | None = None,
             pg_denom: float | None = None) -> dict[str, torch.Tensor]:
    """The token-mean PPO/GRPO loss over action tokens (1-D tensors of equal length); see the module doc.

    ``mask`` (bool, same length): only these tokens count, in the loss terms and in the token-mean's
    denominator (GRPO's zero-variance groups are masked out); with no token left every term is 0 (and still a
    function of ``logp``, so ``backward`` runs). ``pg_mask``: the tokens of the policy-gradient term alone
    (default ``mask``; GRPO passes ``mask`` plus the tokens of zero-variance groups that carry memory credit).
    The ``approx_kl`` / ``clipfrac`` diagnostics still cover every token.

    ``denom`` / ``pg_denom``: the token-means' denominators (of ``mask``'s tokens and ``pg_mask``'s), when these
    tokens are part of a larger minibatch (gradient accumulation, DDP ranks: the global count / world size);
    default: the count of the tokens given."""
    def masked_mean(m, d):
        if m is None:
            return torch.mean if d is None else (lambda x: x.sum() / d)
        keep = m.to(logp.device, torch.float32)
        if d is not None:
            return lambda x: (x * keep).sum() / d
        return lambda x: (x * keep).sum() / keep.sum().clamp(min=1.0)

    mean = masked_mean(mask, denom)
    pg_mean = masked_mean(mask if pg_mask is None else pg_mask, denom if pg_mask is None else pg_denom)
    log_ratio = logp - old_logp
    ratio = log_ratio.exp()
    pg = pg_mean(torch.max(-adv * ratio, -adv * ratio.clamp(1 - clip, 1 + clip)))
    out = {"pg_loss": pg}
    loss = pg
    if values is not None:
        v_unclipped = (values - returns) ** 2
        if clip_vf is not None:
            v_clipped = (old_values + (values - old_values).clamp(-clip_vf, clip_vf) - returns) ** 2
            v_loss = 0.5 * mean(torch.max(v_unclipped, v_clipped))
        else:
            v_loss = 0.5 * mean(v_unclipped)
        out["v_loss"] = v_loss
        loss = loss + vf_coef * v_loss
    if entropy is not None:
        out["entropy"] = mean(entropy)
        loss = loss - ent_coef * out["entropy"]
    if ref_logp is not None:
        d = ref_logp - logp
        out["kl_ref"] = mean(d.exp() - d - 1)
        loss = loss + kl_coef * out["kl_ref"]
    with torch.no_grad():
        # diagnostics of how far the policy moved: over every token, masked or not (target_kl reads it)
        out["approx_kl"] = ((ratio - 1) - log_ratio).mean()
        out["clipfrac"] = ((ratio - 1).abs() > clip).float().mean()
    out["loss"] = loss
    return out


def clip_gradients(policy_params, value_params, max_norm: float) -> tuple[float, float | None]:
    """Clip the LM's and the value head's gradients to ``max_norm`` each; returns both norms before clipping.

    Apart, not as one norm: a fresh value head's gradient is several times the policy's (measured 1.7 vs 0.5
    on a MemQA SFT checkpoint), and one shared norm would shrink every policy step with it."""
    policy_norm = float(torch.nn.utils.clip_grad_norm_(list(policy_params), max_norm))
    value_params = list(value_params)
    value_norm = float(torch.nn.utils.clip_grad_norm_(value_params, max_norm)) if value_params else None
    return policy_norm, value_norm


# ---------------------------------------------------------------------- forward and loss hooks
@dataclass
class ActorOutput:
    """What one actor forward gives for a list of records, per action token (``action_mask == 1``) in record
    order, then token order (the order of the flattened per-token record fields)."""

    logp: torch.Tensor  # [N] log_softmax(logits / T)[token], fp32
    entropy: torch.Tensor | None = None  # [N]
    values: torch.Tensor | None = None  # [N] (PPO's value head)
    hidden: torch.Tensor | None = None  # [N, d] the states that predict the action tokens (with grad in training)
    head: Callable[[torch.Tensor], torch.Tensor] | None = None  # hidden -> logits (the LM head)
    batch: Any = None  # whatever the forward built (a training.Batch, packed batches, ...)
    # the denominator of a token-mean over the minibatch's action tokens, when this forward sees a part of it
    # (gradient accumulation, DDP: the count over every micro-batch and rank / world size); a loss hook divides
    # its per-token sum by it (None: its own tokens' mean)
    token_denom: float | None = None
    # a loss hook's per-token term computed by the same forward from the same logits ([N], with grad; e.g.
    # distill.trainer's fused LM head), or None: the hook computes its own
    distill: torch.Tensor | None = None


ActorForward = Callable[..., ActorOutput]  # (module, records, *, temperature, entropy) -> ActorOutput


class LossHook(Protocol):
    """An extra loss term on the PPO/GRPO minibatch; returns ``(term, metrics)``, the term already weighted.

    With ``grad_accumulation`` (or under DDP) it is called on each micro-batch: a per-token term divides its sum
    by ``actor.token_denom`` when that is set, so the micro-batches' terms add up to the minibatch's."""

    def __call__(self, records: Sequence[InvocationRecord], actor: ActorOutput) -> tuple[torch.Tensor, dict[str, float]]:
        ...


def micro_batches(forward, records: Sequence[InvocationRecord], cfg: PPOConfig) -> list[list[int]]:
    """Index groups of ``records``, one per forward + backward of a minibatch (see the module doc)."""
    if not cfg.grad_accumulation or len(records) <= 1:
        return [list(range(len(records)))]
    split = getattr(forward, "split", None)
    if split is not None:
        groups = [list(g) for g in split(records) if len(g)]
    else:
        groups = [list(range(i, min(i + cfg.micro_batch_size, len(records))))
                  for i in range(0, len(records), cfg.micro_batch_size)]
    covered = sorted(i for g in groups for i in g)
    if covered != list(range(len(records))):
        raise ValueError(f"the micro-batches of a minibatch of {len(records)} records cover {covered}")
    return groups


def collate_forward(pad_id: int, device) -> ActorForward:
    """The default actor forward: one invocation per right-padded row (:func:`agents.llm.training.collate`)."""

    def forward(module, records, *, temperature: float = 1.0, entropy: bool = False) -> ActorOutput:
        b = _batch(records, pad_id, device)
        logp, ent, values, hidden = module(**b.inputs(), temperature=temperature, entropy=entropy,
                                           return_hidden=True)
        return ActorOutput(logp, ent, values, hidden, unwrap_ddp(module).lm.get_output_embeddings(), b)

    return forward


# ---------------------------------------------------------------------- trainer
def _flat(records: Sequence[InvocationRecord], name: str) -> torch.Tensor:
    return torch.tensor([v for r in records for v, m in zip(getattr(r, name), r.action_mask) if m],
                        dtype=torch.float32)


def _batch(records, pad_id, device):
    return collate([(r.prompt_ids, r.response_ids) for r in records], pad_id,
                   memory_masks=[r.memory_mask for r in records], action_masks=[r.action_mask for r in records],
                   device=device)


def _units(records: Sequence[InvocationRecord], unit: str) -> list[list[int]]:
    """Record indices grouped into minibatch units: one invocation each, or whole episodes (consecutive records
    with the same ``(rollout_id, episode_id)``, as ``records_of`` lists them)."""
    if unit == "invocation":
        return [[i] for i in range(len(records))]
    groups: dict[tuple, list[int]] = {}
    for i, r in enumerate(records):
        groups.setdefault((getattr(r, "rollout_id", ""), r.episode_id), []).append(i)
    return list(groups.values())


@torch.no_grad()
def _score(module, records, forward: ActorForward, temperature, chunk: int = 16, values: bool = True,
           unit: str = "invocation"):
    """Per-record lists of log-probs and values at action tokens (no grad)."""
    logps, vals = [None] * len(records), [None] * len(records)
    module.eval()
    units = _units(records, unit)
    for i in range(0, len(units), chunk):
        idx = [k for u in units[i:i + chunk] for k in u]
        out = forward(module, [records[k] for k in idx], temperature=temperature, entropy=False)
        counts = [sum(records[k].action_mask) for k in idx]
        for k, lp, v in zip(idx, out.logp.split(counts),
                            out.values.split(counts) if (values and out.values is not None) else [None] * len(idx)):
            logps[k] = lp.tolist()
            vals[k] = v.tolist() if v is not None else None
    module.train()
    return logps, vals


def task_seeds(cfg: PPOConfig, update: int, rank: int) -> tuple[list[int], list[int | None]]:
    """Training task seeds of one update on one rank (and GRPO group ids). Disjoint from held-out seeds."""
    rng = np.random.default_rng([cfg.seed, update, rank, 17])
    if cfg.algo == "grpo":
        tasks = rng.integers(0, 10**6, size=cfg.episodes_per_update // cfg.group_size).tolist()
        seeds = [t for t in tasks for _ in range(cfg.group_size)]
        return seeds, [i for i in range(len(tasks)) for _ in range(cfg.group_size)]
    return rng.integers(0, 10**6, size=cfg.episodes_per_update).tolist(), [None] * cfg.episodes_per_update


def train_rl(cfg: PPOConfig, model=None, tokenizer=None, env_fn=None, *, extra_loss: LossHook | None = None,
             actor_forward: ActorForward | None = None, title: str | None = None) -> dict[str, Any]:
    """PPO or GRPO (``cfg.algo``); returns the last metrics row. Runs unchanged under torchrun.

    ``model``/``tokenizer``: an in-memory start (else ``cfg.model`` or a fresh tiny model); ``env_fn``: a
    callable making one env (else ``gym.make(cfg.env_id, **cfg.env_kwargs)``). ``extra_loss`` /
    ``actor_forward``: see the module doc (a hook's ``plot_keys`` attribute adds columns to the PNG);
    ``title``: of the learning curve."""
    from tqdm.auto import tqdm


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
    start_lm = model
    if model is not None and resume_from is None:
        lm, tok = model.to(dist.device), tokenizer
    else:
        lm, tok = load_or_build_model(cfg, dist, resume_from)
    if cfg.gradient_checkpointing:
        enable_activation_checkpointing(lm)
    model = ActorCritic(lm, value_head=cfg.uses_value, detach_value=cfg.value_detach,
                        autocast=train_autocast).to(dist.device)
    ref = None
    if cfg.kl_coef > 0:  # the reference is the starting policy, also after a resume
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
    head = list(model.value_head.parameters()) if model.value_head is not None else []
    head_ids = {id(p) for p in head}
    lm_params = [p for p in model.parameters() if id(p) not in head_ids]
    groups = [{"params": lm_params, "lr": cfg.lr}]
    if head:
        groups.append({"params": head, "lr": cfg.lr * cfg.value_lr_mult})
    optimizer = torch.optim.AdamW(groups, lr=cfg.lr, weight_decay=cfg.weight_decay)
    start, elapsed = 0, (0.0, 0.0)
    if resume_from is not None:
        state = load_trainer_state(resume_from)
        elapsed = tuple(state.get("elapsed", (0.0, 0.0)))
        optimizer.load_state_dict(state["optimizer"])
        if model.value_head is not None and (resume_from / "value_head.pt").exists():
            model.value_head.load_state_dict(torch.load(resume_from / "value_head.pt", map_location=dist.device))
        start = int(state["update"])
        set_rng_state(state["rng"][dist.rank] if isinstance(state["rng"], list) else state["rng"])
    train_model = torch.nn.parallel.DistributedDataParallel(model) if dist.enabled else model
    policy = LLMPolicy(lm, tok, temperature=cfg.temperature, top_p=cfg.top_p, max_new_tokens=cfg.max_new_tokens,
                       seed=cfg.seed * 1000 + dist.rank + 7919 * start, generation=cfg.generation)
    greedy = LLMPolicy(lm, tok, temperature=0.0, max_new_tokens=cfg.max_new_tokens, generation=cfg.generation)
    envs = [env_fn() for _ in range(cfg.num_envs)] if env_fn is not None else make_envs(cfg)
    log = MetricsLog(out, enabled=dist.main, resume=resume_from is not None)
    log.truncate("update", start)
    pad = tok.pad_token_id
    forward = actor_forward or collate_forward(pad, dist.device)
    on_update = getattr(extra_loss, "on_update", None)
    temperature = policy.temperature if policy.temperature > 0 else 1.0
    mb_rng = np.random.default_rng([cfg.seed, dist.rank, start, 23])
    if resume_from is not None and "sampling" in state:
        # The sampler's and the minibatch shuffle's states at the checkpoint: a resumed run draws exactly what the
        # uninterrupted run would have (checkpoints without them continue from fresh seeds, as before).
        sampling = state["sampling"][dist.rank]
        policy.generator.set_state(sampling["sampler"])
        mb_rng.bit_generator.state = sampling["minibatch"]
    bar = tqdm(total=cfg.updates, initial=start, desc=cfg.algo, unit="update",
               disable=not (cfg.progress and dist.main))
    timer, last = Timer(elapsed), {}
    if start == 0 and cfg.eval_every:
        evaluation = evaluate_off_budget(greedy, envs, cfg.eval_episodes, dist, timer, cfg.budget_counts_eval,
                                         cfg.progress)
        last = {"update": 0, "seconds": round(timer(), 2), "cpu_seconds": round(timer.cpu(), 2), **evaluation}
        log.append(last)
    update = start
    for update in range(start, cfg.updates):
        t0 = Timer()
        if cfg.warmup_updates:  # set from the update index alone (the LM's group, then the value head's), so a
            # resumed run warms up exactly as it would have
            for group, base in zip(optimizer.param_groups, [cfg.lr, cfg.lr * cfg.value_lr_mult]):
                group["lr"] = base * cfg.lr_scale(update)
        cpu = PartClock()  # this process's CPU seconds by part of the update (the *_cpu_s columns)
        seeds, group_ids = task_seeds(cfg, update, dist.rank)
        with cpu("rollout"):
            episodes = rollout(policy, envs, seeds, groups=group_ids, gamma=cfg.gamma)
        records = records_of(episodes)
        rollout_s = t0()
        unit = cfg.minibatch_unit
        old_logps = None
        if cfg.uses_value or recompute_old:
            with cpu("score"):
                old_logps, old_values = _score(model, records, forward, temperature, values=cfg.uses_value,
                                               unit=unit)
        if cfg.uses_value:
            k0 = 0
            for ep in episodes:
                episode_gae(ep.records, old_values[k0:k0 + len(ep.records)], cfg.gamma, cfg.lam)
                k0 += len(ep.records)
        else:
            grpo_assign(episodes, cfg.grpo_std_norm, cfg.adv_std_floor)
        flat = zero_variance_groups([ep.reward for ep in episodes], [ep.group for ep in episodes]) \
            if cfg.algo == "grpo" else set()
        for ep in episodes:  # no relative signal: exactly 0 (not the float noise of r - mean(r))
            if ep.group in flat:
                for rec in ep.records:
                    rec.advantage, rec.token_advantages = 0.0, [0.0] * len(rec.response_ids)
        dropped = {id(r) for ep in episodes if ep.group in flat for r in ep.records} \
            if cfg.grpo_drop_zero_variance else set()
        if not recompute_old:
            old_logps = [[lp for lp, m in zip(r.response_logprobs, r.action_mask) if m] for r in records]
        with cpu("score"):
            ref_logps = _score(ref, records, forward, temperature, values=False, unit=unit)[0] \
                if ref is not None else None
        with cpu("hook"):
            hook_stats = on_update(episodes, records, model) if on_update is not None else {}
        if cfg.algo == "grpo" and cfg.grpo_drop_zero_variance:  # on every rank (DDP averages the same keys)
            # advantages the hook gave to dropped groups (memory credit) still train their tokens
            hook_stats["flat_credited_tokens"] = float(sum(
                1 for r in records if id(r) in dropped for a, m in zip(r.token_advantages, r.action_mask)
                if m and a != 0))
        adv_all = _flat(records, "token_advantages")
        adv_mean, adv_std = float(adv_all.mean()), float(adv_all.std()) if len(adv_all) > 1 else 1.0
        if dist.enabled:  # PPO whitens over the global batch (every rank's tokens)
            n, s1, s2 = dist.sum([float(len(adv_all)), float(adv_all.double().sum()),
                                  float(adv_all.double().pow(2).sum())])
            adv_mean = s1 / max(n, 1.0)
            adv_std = ((s2 - n * adv_mean ** 2) / (n - 1)) ** 0.5 if n > 1 else 1.0
        stats: dict[str, list[float]] = {}
        stop_early = False
        units = _units(records, unit)
        for epoch in range(cfg.epochs):
            order = mb_rng.permutation(len(units))
            for unit_part in np.array_split(order, cfg.num_minibatches):
                part = [i for u in unit_part for i in units[u]]
                if not part:
                    continue
                mb = [records[i] for i in part]
                mask = pg_mask = None
                adv = _flat(mb, "token_advantages").to(dist.device)
                if dropped:
                    # A minibatch whose tokens are all dropped still runs backward and step (a zero loss):
                    # DDP ranks must take the same steps.
                    mask = torch.tensor([id(r) not in dropped for r in mb for m in r.action_mask if m],
                                        device=dist.device)
                    pg_mask = mask | (adv != 0)  # dropped groups' advantages are 0 but for the hook's credit
                if cfg.uses_value and cfg.norm_adv:
                    adv = (adv - adv_mean) / (adv_std + 1e-8)
                old_logp = torch.tensor([v for i in part for v in old_logps[i]], device=dist.device)
                ref_logp = torch.tensor([v for i in part for v in ref_logps[i]], device=dist.device) \
                    if ref_logps is not None else None
                counts = [float(len(adv)), float(mask.sum()) if mask is not None else float(len(adv)),
                          float(pg_mask.sum()) if pg_mask is not None else float(len(adv))]
                if dist.enabled:
                    counts = dist.sum(counts)
                # token-mean denominators of the whole minibatch over every rank (DDP averages over ranks)
                denom_all, denom, pg_denom = (max(c, 1.0) / dist.world for c in counts)
                token_ends = np.cumsum([0] + [sum(r.action_mask) for r in mb])
                micro = micro_batches(forward, mb, cfg)
                optimizer.zero_grad(set_to_none=True)
                sums: dict[str, float] = {}
                n_local = max(1, int(token_ends[-1]))
                for j, idx in enumerate(micro):
                    sub = [mb[i] for i in idx]
                    tix = torch.tensor([t for i in idx for t in range(token_ends[i], token_ends[i + 1])],
                                       dtype=torch.long, device=dist.device)
                    share = len(tix) / n_local
                    sync = not dist.enabled or j == len(micro) - 1  # DDP: only the last backward all-reduces
                    with (train_model.no_sync() if not sync else contextlib.nullcontext()), cpu("actor"):
                        actor_out = forward(train_model, sub, temperature=temperature, entropy=True)
                        actor_out.token_denom = denom_all
                        kw: dict[str, Any] = {}
                        if cfg.uses_value:
                            kw = {"values": actor_out.values, "old_values": _flat(sub, "values").to(dist.device),
                                  "returns": _flat(sub, "token_returns").to(dist.device), "clip_vf": cfg.clip_vf,
                                  "vf_coef": cfg.vf_coef}
                        if ref_logp is not None:
                            kw["ref_logp"] = ref_logp[tix]
                            kw["kl_coef"] = cfg.kl_coef
                        losses = ppo_loss(actor_out.logp, old_logp[tix], adv[tix], clip=cfg.clip,
                                          entropy=actor_out.entropy, ent_coef=cfg.ent_coef,
                                          mask=mask[tix] if mask is not None else None,
                                          pg_mask=pg_mask[tix] if pg_mask is not None else None,
                                          denom=denom, pg_denom=pg_denom, **kw)
                        if extra_loss is not None:
                            term, extra_stats = extra_loss(sub, actor_out)
                            losses["loss"] = losses["loss"] + term
                            for k, v in extra_stats.items():  # per-token means: weighted by the micro-batch
                                sums[k] = sums.get(k, 0.0) + float(v) * share
                        losses["loss"].backward()
                    for k, v in losses.items():  # loss terms are partial sums; diagnostics are means
                        w = share if k in ("approx_kl", "clipfrac") else 1.0
                        sums[k] = sums.get(k, 0.0) + float(v.detach()) * w
                with cpu("optimizer"):
                    grad_norm, value_grad_norm = clip_gradients(lm_params, head, cfg.grad_clip)
                    check_finite_step(grad_norm + (value_grad_norm or 0.0), f"update {update + 1}")
                    optimizer.step()
                if head:
                    stats.setdefault("value_grad_norm", []).append(value_grad_norm)
                for k, v in sums.items():
                    stats.setdefault(k, []).append(v)
                stats.setdefault("grad_norm", []).append(float(grad_norm))
                stats.setdefault("micro_batches", []).append(float(len(micro)))
            if cfg.target_kl is not None and stats.get("approx_kl"):
                kl = dist.mean({"kl": float(np.mean(stats["approx_kl"][-cfg.num_minibatches:]))})["kl"]
                if kl > cfg.target_kl:
                    stop_early = True
                    break
        sampled = sum(len(r.response_ids) for r in records)
        row = {"update": update + 1, "seconds": round(timer(), 2), "cpu_seconds": round(timer.cpu(), 2)}
        row.update(dist.mean({
            "reward": float(np.mean([ep.reward for ep in episodes])),
            "f1": float(np.mean([ep.f1 for ep in episodes])),
            "turns": float(np.mean([ep.turns for ep in episodes])),
            "invalid_rate": float(sum(ep.info.get("invalid_actions", 0) for ep in episodes) / max(1, len(records))),
            "response_tokens": sampled / max(1, len(records)),
            "memory_tokens": sum(sum(r.memory_mask) for r in records) / max(1, len(records)),
            "adv_mean": adv_mean, "zero_variance_groups": float(len(flat)), "rollout_s": rollout_s, "update_s": t0() - rollout_s,
            "sampled_tokens_per_s": sampled / max(1e-9, rollout_s),
            **{k: float(np.mean(v)) for k, v in stats.items()}, **hook_stats,
            # the first minibatch's policy has not moved yet: ~0 unless training and sampling log-probs differ
            **({"first_approx_kl": stats["approx_kl"][0], "first_clipfrac": stats["clipfrac"][0]}
               if stats.get("approx_kl") else {}),
        }))
        row["early_stop"] = int(stop_early)
        if cfg.warmup_updates:
            row["lr"] = optimizer.param_groups[0]["lr"]
        done = update + 1 == cfg.updates or (cfg.max_seconds is not None and timer.budget(cfg.budget_clock) > cfg.max_seconds)
        if dist.enabled and cfg.max_seconds is not None:
            done = dist.mean({"d": float(done)})["d"] > 0
        if cfg.eval_every and ((update + 1) % cfg.eval_every == 0 or done):
            with cpu("eval"), off_the_bar(bar):
                row.update(evaluate_off_budget(greedy, envs, cfg.eval_episodes, dist, timer, cfg.budget_counts_eval,
                                               cfg.progress))
        row.update(cpu.columns())
        log.append(row)
        last = row
        log.plot("update", ["reward", "eval_f1", "kl_ref" if ref is not None else "approx_kl", "entropy",
                            *getattr(extra_loss, "plot_keys", ())],
                 title or f"{cfg.algo.upper()} {cfg.env_id} {cfg.env_kwargs}")
        bar.update(1)
        bar.set_postfix(reward=f"{row['reward']:.3f}", **({"f1": f"{row['eval_f1']:.3f}"} if "eval_f1" in row else {}))
        if (update + 1) % cfg.save_every == 0 or done:
            with off_the_bar(bar):
                _save(cfg, dist, out, update + 1, lm, tok, optimizer, model, timer,
                      {"sampler": policy.generator.get_state(), "minibatch": mb_rng.bit_generator.state})
        if done:
            break
    bar.close()
    dist.barrier()
    return last


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
        save_checkpoint(out, update, lm, tok, {"update": update, "optimizer": optimizer.state_dict(), "rng": rngs,
                                               "sampling": samplings,
                                               "config": cfg.to_json(), "algo": cfg.algo,
                                               "elapsed": (timer(), timer.cpu())},
                        value_head=model.value_head, keep=cfg.keep_checkpoints, keep_every=cfg.keep_every)
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
           "zero_variance_groups",
           "param_checksum", "task_seeds", "PartClock", "ActorOutput", "ActorForward", "LossHook", "collate_forward",
           "micro_batches"]
