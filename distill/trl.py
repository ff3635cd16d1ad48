"""MemOPD on TRL: :class:`MemOPDTrainer`, trl's ``GRPOTrainer`` plus the teacher's distillation term, with the
native trainer's gradient however TRL cuts the batch (micro-batches, accumulation, padding rows, ranks).

The rows come from :class:`agents.llm.adapters.trl.MemenvRollout` in memory mode: one row per invocation, its prompt the
exact observation ids of that turn and its completion the sampled ids, so every row already *is* the student's
state when it sampled (MemOPD's aligned reconstruction, with no packing). The loss is

    TRL's GRPO loss + distill_coef * sum over trained tokens of D(student || teacher) / N

``D`` the full-vocabulary divergence of :mod:`distill.losses` (``reverse_kl`` by default; ``forward_kl``,
``jsd`` and the teacher top-k approximations as in :class:`distill.trainer.MemOPDConfig`), at the completion
tokens TRL trains (``completion_mask x tool_mask``: ``MemenvRollout``'s padding rows get none), ``N`` the count of
those tokens in the whole generation batch, every micro-batch and rank: each micro-batch divides its sum by
TRL's own ``loss_type="dapo"`` normaliser (``num_items_in_batch / processes x accumulation steps / steps per
generation``), so the term is the token mean of the native :class:`distill.trainer.MemOPDHook` whatever the
batching, under every supported ``loss_type``. The whole gradient is ``train_memopd``'s only with
``loss_type="dapo"`` and a native run with ``grpo_drop_zero_variance=False`` (or no group of equal returns)
(``benchmarks/memopd_trl_vs_native.py``: cosine 1.000000000 with accumulation 1, 4, 12 and 2 ranks). Elsewhere the
policy term is TRL's own and differs from native, and with it the distillation term's weight relative to it:
under ``grpo``, ``bnpo``, ``dr_grpo``, ``sapo``, ``luspo`` its normalisation (rows, micro-batches, a fixed length:
docs/distill_scale.md's table), under ``cispo`` and ``vespo`` its surrogate; and native's default
``grpo_drop_zero_variance=True`` leaves a group of equal returns out of the policy term's token count, where TRL
counts its tokens (their advantage is 0), so TRL's policy term is smaller by that share.

- GRPO advantages are per episode, as the native trainer's: TRL's (unbiased std over a group's *rows*, which
  padding rows fill with repeated returns) are replaced by :func:`episode_advantages` (population std over the
  group's episodes) of TRL's weighted reward sum, each run of ``rollout_func.rows_per_episode`` rows one episode.
- ``loss_type``: :data:`SUPPORTED_LOSS_TYPES` (the others are refused by name). TRL's policy term keeps its own
  normalisation; for the row-count-free ones (:data:`ROW_COUNT_FREE`) rows without a trained token skip the
  training forward (every rank keeps as many rows as the rank with the most weighted ones: TRL gathers per-row
  tensors), for the row-mean ones they run, since they count in TRL's mean over rows.
- ``scale_rewards`` must be ``"group"`` (or ``"none"``: no std, as ``grpo_std_norm=False``) and
  ``multi_objective_aggregation`` ``"sum_then_normalize"``: the others have no native counterpart.

The student's hidden states are the ones of TRL's own training forward (a forward hook on the backbone: no second
student forward); its LM head is applied in checkpointed position chunks (``O(chunk x vocab)``). The teacher
(:class:`distill.teacher.Teacher`: same tokenizer, checked) runs under ``no_grad`` in eval mode on the same
``input_ids`` / ``attention_mask``, on the rows that have trained tokens. ``distill_loss`` is logged as the token
mean over the step's rows (every rank's).

Under ``accelerate launch`` (DDP) each process loads the teacher and scores its own rows; DeepSpeed ZeRO-3 and
FSDP wrap the teacher as TRL wraps its reference model (``prepare_deepspeed`` / ``prepare_fsdp``; not run here: no
GPU). Checked against trl 1.16.0 (``GRPOTrainer._compute_loss``, ``add_fused_lm_head``'s backbone call).

    rollout = MemenvRollout("MemQA-v0", {"objectives": 1, "hops": 2})
    args = GRPOConfig(num_generations=4 * rollout.rows_per_episode, beta=0.0, ...)
    trainer = MemOPDTrainer(model, teacher="runs/teacher", distill_coef=1.0, reward_funcs=episode_return_reward,
                            args=args, train_dataset=rollout.dataset(64), processing_class=tokenizer,
                            rollout_func=rollout)
"""

from __future__ import annotations

import math
import os
from typing import Any, Sequence

import torch

from agents.llm.training.ppo import group_advantages, zero_variance_groups
from agents.llm.adapters.trl import require_trl
from distill.losses import DistillLossConfig, chunked_distill_loss
from distill.teacher import Teacher

trl = require_trl()

TRL_CHECKED = "1.16.0"
# trl's loss types whose terms are sums over each row's trained tokens divided by a count of trained tokens (or
# a constant): a row without trained tokens changes nothing, so its forward can be skipped.
ROW_COUNT_FREE = ("dapo", "bnpo", "cispo", "vespo")
# ... and those whose policy term also averages over rows (a padding row still counts in the mean: it is run).
ROW_MEAN = ("grpo", "dr_grpo", "sapo", "luspo")
SUPPORTED_LOSS_TYPES = ROW_COUNT_FREE + ROW_MEAN


class MemOPDTrainer(trl.GRPOTrainer):
    """``trl.GRPOTrainer`` + ``distill_coef`` x the teacher's distillation loss at the trained completion tokens
    (the token mean over the generation batch), with GRPO advantages per episode (see the module doc).

    Args (besides ``GRPOTrainer``'s):
        teacher: a local checkpoint path, a transformers causal LM, or a :class:`distill.teacher.Teacher`.
        distill_coef: lambda (``MemOPDConfig.distill_coef``); 0: GRPO alone (per-episode advantages; the term is
            still logged).
        distill_loss: the divergence (:class:`distill.losses.DistillLossConfig`; default: reverse KL, exact).
        memopd_config: a :class:`distill.trainer.MemOPDConfig` to take ``distill_coef`` and the loss from instead.
        teacher_tokenizer: the teacher model's tokenizer (default: ``processing_class``).
    """

    def __init__(self, *args: Any, teacher, distill_coef: float = 1.0, distill_loss: DistillLossConfig | None = None,
                 memopd_config=None, teacher_tokenizer=None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        check_grpo_config(self.args)
        self._rows_per_episode = int(getattr(self.rollout_func, "rows_per_episode", 1) or 1)
        self._rewards_per_func = None
        if memopd_config is not None:
            distill_coef, distill_loss = memopd_config.distill_coef, memopd_config.loss_config()
        if distill_coef < 0:
            raise ValueError(f"distill_coef (lambda) must be >= 0, got {distill_coef}")
        self.distill_coef = float(distill_coef)
        self.distill_loss = distill_loss or DistillLossConfig()
        tokenizer = getattr(self.processing_class, "tokenizer", self.processing_class)
        student = self.accelerator.unwrap_model(self.model)
        device = self.accelerator.device
        if isinstance(teacher, Teacher):
            scorer = teacher
        elif isinstance(teacher, (str, os.PathLike)):
            scorer = Teacher.from_pretrained(teacher, student_tokenizer=tokenizer, student_model=student,
                                             device=device, temperature=self.distill_loss.temperature,
                                             chunk=self.distill_loss.chunk)
        else:
            scorer = Teacher(teacher, teacher_tokenizer or tokenizer, student_tokenizer=tokenizer,
                             student_model=student, temperature=self.distill_loss.temperature,
                             chunk=self.distill_loss.chunk)
        if self.is_deepspeed_enabled:
            scorer.model = trl.models.prepare_deepspeed(scorer.model, self.accelerator)
        elif self.is_fsdp_enabled:
            scorer.model = trl.models.prepare_fsdp(scorer.model, self.accelerator)
        else:
            scorer.model = scorer.model.to(device)
        self.teacher = scorer

    # ------------------------------------------------------------------ GRPO advantages per episode
    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._rewards_per_func = rewards_per_func  # every rank's rows (trl gathers them before normalising)
        return rewards_per_func

    def _generate_and_score_completions(self, inputs):
        self._rewards_per_func = None
        output = super()._generate_and_score_completions(inputs)
        if self._rewards_per_func is None:  # pragma: no cover - depends on trl's internals
            raise RuntimeError("MemOPDTrainer: trl did not compute rewards through _calculate_rewards "
                               f"(checked against trl {TRL_CHECKED})")
        mode = "train" if self.model.training else "eval"
        generations = self.num_generations if mode == "train" else self.num_generations_eval
        rewards = (self._rewards_per_func * self.reward_weights.to(self._rewards_per_func.device)).nansum(dim=1)
        rewards[torch.isnan(self._rewards_per_func).all(dim=1)] = torch.nan  # unscorable, as trl marks them
        advantages = episode_advantages(rewards.tolist(), generations, self._rows_per_episode,
                                        std_norm=self.scale_rewards == "group")
        local = output["advantages"].shape[0]
        start = self.accelerator.process_index * local
        output["advantages"] = torch.tensor(advantages[start:start + local], dtype=output["advantages"].dtype,
                                            device=output["advantages"].device)
        self._rewards_per_func = None
        return output

    # ------------------------------------------------------------------ the loss
    def _compute_loss(self, model, inputs):
        mask = inputs["completion_mask"]
        if "tool_mask" in inputs:
            mask = mask * inputs["tool_mask"]
        weighted = mask.sum(dim=1) > 0
        if self.loss_type in ROW_COUNT_FREE and not _has_media(inputs):
            # Rows without a trained token (MemenvRollout's padding rows) change none of this loss type's terms:
            # skip their forwards. Every rank keeps as many rows as the rank with the most weighted rows (trl
            # gathers per-row tensors, which must have one shape), and at least one (each rank runs a backward).
            count = weighted.sum().reshape(1)
            if self.accelerator.num_processes > 1:
                count = self.accelerator.gather(count).max().reshape(1)
            n_keep = max(1, int(count.item()))
            order = torch.argsort((~weighted).to(torch.int8), stable=True)  # weighted rows first, in order
            keep = order[:n_keep].sort().values
            if n_keep < len(weighted):
                inputs = _select_rows(inputs, keep)
                mask = mask[keep]
        student = self.accelerator.unwrap_model(model)
        captured: list[torch.Tensor] = []

        def keep_states(module, args, output):
            states = getattr(output, "last_hidden_state", None)
            if states is None:  # e.g. a PEFT model, whose base_model is the wrapped causal LM
                raise RuntimeError(f"MemOPDTrainer: the student's base_model ({type(module).__name__}) returned no "
                                   "last_hidden_state; a plain transformers causal LM is supported (not PEFT)")
            captured.append(states)

        hook = student.base_model.register_forward_hook(keep_states)
        try:
            loss = super()._compute_loss(model, inputs)
        finally:
            hook.remove()
        if not captured:
            raise RuntimeError("MemOPDTrainer: TRL's training forward did not run the student's backbone "
                               f"(checked against trl {TRL_CHECKED}'s fused LM head)")
        hidden = torch.cat(captured, dim=0)  # [B, P + C, d], the rows in order (TRL may chunk by rows)
        prompt_ids, completion_ids = inputs["prompt_ids"], inputs["completion_ids"]
        rows, cols = mask.nonzero(as_tuple=True)
        positions = prompt_ids.shape[1] + cols - 1  # the state that predicts completion token t
        student_hidden = hidden[rows, positions]
        scored = mask.sum(dim=1).nonzero(as_tuple=True)[0]  # the teacher runs only on rows with trained tokens
        slot = torch.full((mask.shape[0],), -1, dtype=torch.long, device=mask.device)
        slot[scored] = torch.arange(len(scored), device=mask.device)
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)[scored]
        attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)[scored]
        if len(scored):
            with torch.no_grad():
                teacher_model = self.teacher.model
                body = getattr(teacher_model, "module", teacher_model).base_model
                teacher_states = body(input_ids=input_ids, attention_mask=attention_mask,
                                      use_cache=False).last_hidden_state
                teacher_hidden = teacher_states[slot[rows], positions]
            vocab = self.teacher.vocab_size
            head = student.get_output_embeddings()
            per_token = chunked_distill_loss(lambda h: head(h)[..., :vocab], student_hidden, self.teacher.head,
                                             teacher_hidden.to(student_hidden.device), self.distill_loss)
            total = per_token.sum()
        else:  # no trained token in this micro-batch: a zero that still reaches every rank's backward
            total = hidden.sum() * 0.0
        mode = "train" if self.model.training else "eval"
        # The token mean over the whole generation batch (every micro-batch, every rank), with trl's own
        # normaliser of loss_type="dapo": num_items_in_batch (the trained tokens of the generation batch, over
        # every rank) / ranks, x accumulation steps / steps per generation in training. DDP's mean over ranks and
        # the sum over micro-batches then give sum(per-token divergence) / tokens, as the native MemOPDHook.
        window = (self.current_gradient_accumulation_steps / self.args.steps_per_generation) if mode == "train" else 1.0
        tokens = inputs["num_items_in_batch"].clamp(min=1.0).to(torch.float32)
        normalizer = tokens / self.accelerator.num_processes * window
        term = total / normalizer
        # Logged so that trl's mean over the step's micro-batches is the token mean of the step's rows.
        steps = self.current_gradient_accumulation_steps if mode == "train" else 1.0
        logged = self.accelerator.gather(total.detach().reshape(1)).sum() / (tokens * window) * steps
        self._metrics[mode]["distill_loss"].append(logged.item())
        return loss + self.distill_coef * term


def check_grpo_config(args) -> None:
    """Refuse, by name, the ``GRPOConfig`` settings whose normalisation this adapter has not been checked with."""
    loss_type = getattr(args, "loss_type", "dapo")
    if loss_type not in SUPPORTED_LOSS_TYPES:
        raise ValueError(f"MemOPDTrainer supports GRPOConfig.loss_type in {', '.join(SUPPORTED_LOSS_TYPES)} "
                         f"(checked against trl {TRL_CHECKED}), not {loss_type!r}")
    scale = {True: "group", False: "none"}.get(getattr(args, "scale_rewards", "group"),
                                               getattr(args, "scale_rewards", "group"))
    if scale not in ("group", "none"):
        raise ValueError(f"MemOPDTrainer computes GRPO advantages per group of episodes, as the native trainer: "
                         f"GRPOConfig.scale_rewards must be 'group' or 'none', not {scale!r}")
    aggregation = getattr(args, "multi_objective_aggregation", "sum_then_normalize")
    if aggregation != "sum_then_normalize":
        raise ValueError(f"MemOPDTrainer normalises the weighted sum of the rewards per group of episodes: "
                         f"GRPOConfig.multi_objective_aggregation must be 'sum_then_normalize', not "
                         f"{aggregation!r}")


def episode_advantages(rewards: Sequence[float], generations: int, rows_per_episode: int, *,
                       std_norm: bool = True) -> list[float]:
    """Per-row GRPO advantages computed over episodes, as the native trainer does.

    ``rewards`` holds one reward per row of the whole generation batch (every rank's, in order); each run of
    ``generations`` rows is a GRPO group and each run of ``rows_per_episode`` rows one episode
    (:class:`agents.llm.adapters.trl.MemenvRollout`'s layout), whose rows must carry one reward (NaN: unscorable, left
    out of its group's statistics with advantage 0, as trl does). The advantage of an episode is
    :func:`agents.llm.training.ppo.group_advantages` over its group's episodes (population std, exactly 0 in a group of
    equal returns) and every row of the episode gets it."""
    if generations % rows_per_episode:
        raise ValueError(f"num_generations={generations} is not a multiple of rows_per_episode={rows_per_episode}")
    if len(rewards) % generations:
        raise ValueError(f"{len(rewards)} rows do not split into groups of num_generations={generations}")
    episodes, groups = [], []
    for start in range(0, len(rewards), rows_per_episode):
        block = [float(r) for r in rewards[start:start + rows_per_episode]]
        scored = [r for r in block if not math.isnan(r)]
        if scored and (len(scored) != len(block) or max(scored) - min(scored) > 1e-6 * max(1.0, abs(scored[0]))):
            raise ValueError(f"rows {start}..{start + rows_per_episode - 1} (one episode) got different rewards "
                             f"{block}: MemOPDTrainer's GRPO advantages are per episode, so the reward functions "
                             "must give every row of an episode its return (as episode_return_reward does)")
        episodes.append(block[0])
        groups.append(start // generations)
    keep = [i for i, r in enumerate(episodes) if not math.isnan(r)]
    adv = [0.0] * len(episodes)
    kept_returns, kept_groups = [episodes[i] for i in keep], [groups[i] for i in keep]
    flat = zero_variance_groups(kept_returns, kept_groups)
    for i, a in zip(keep, group_advantages(kept_returns, kept_groups, std_norm)):
        adv[i] = 0.0 if groups[i] in flat else float(a)
    return [a for a in adv for _ in range(rows_per_episode)]


def _has_media(inputs) -> bool:
    return any(k in inputs for k in ("pixel_values", "image_grid_thw", "num_images", "pixel_attention_mask"))


def _select_rows(inputs: dict, keep: torch.Tensor) -> dict:
    """``inputs`` with only the rows ``keep`` (every per-row tensor; scalars such as num_items_in_batch as they
    are)."""
    rows = inputs["prompt_ids"].shape[0]
    out = {}
    for key, value in inputs.items():
        if torch.is_tensor(value) and value.dim() >= 1 and value.shape[0] == rows:
            out[key] = value[keep.to(value.device)]
        else:
            out[key] = value
    return out


__all__ = ["MemOPDTrainer", "SUPPORTED_LOSS_TYPES", "episode_advantages"]
