"""MemOPD on TRL: :class:`MemOPDTrainer`, trl's ``GRPOTrainer`` plus the teacher's distillation term.

The rows come from :class:`agents.llm.trl.MemenvRollout` in memory mode: one row per invocation, its prompt the
exact observation ids of that turn and its completion the sampled ids, so every row already *is* the student's
state when it sampled (MemOPD's aligned reconstruction, with no packing). On each training micro-batch the
trainer adds

    distill_coef * mean over the loss tokens of D(student || teacher)

to TRL's GRPO loss, ``D`` the full-vocabulary divergence of :mod:`distill.losses` (``reverse_kl`` by default;
``forward_kl``, ``jsd`` and the teacher top-k approximations as in :class:`distill.trainer.MemOPDConfig`), at the
completion tokens TRL trains (``completion_mask x tool_mask``: ``MemenvRollout``'s padding rows get none), with
lambda as in ``MemOPDConfig`` (``distill_coef``: total = GRPO loss + lambda x distillation loss, divided by the
gradient-accumulation steps as TRL's own terms are). The student's hidden states are the ones of TRL's own
training forward (a forward hook on the backbone: no second student forward); its LM head is applied in
checkpointed position chunks (``O(chunk x vocab)``). The teacher (:class:`distill.teacher.Teacher`: same
tokenizer, checked) runs under ``no_grad`` in eval mode on the same ``input_ids`` / ``attention_mask``. The
per-token mean is logged as ``distill_loss``.

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

import os
from typing import Any

import torch

from agents.llm.trl import require_trl
from distill.losses import DistillLossConfig, chunked_distill_loss
from distill.teacher import Teacher

trl = require_trl()


class MemOPDTrainer(trl.GRPOTrainer):
    """``trl.GRPOTrainer`` + ``distill_coef`` x the teacher's distillation loss at the trained completion tokens.

    Args (besides ``GRPOTrainer``'s):
        teacher: a local checkpoint path, a transformers causal LM, or a :class:`distill.teacher.Teacher`.
        distill_coef: lambda (``MemOPDConfig.distill_coef``); 0 makes it plain GRPO (the term is still logged).
        distill_loss: the divergence (:class:`distill.losses.DistillLossConfig`; default: reverse KL, exact).
        memopd_config: a :class:`distill.trainer.MemOPDConfig` to take ``distill_coef`` and the loss from instead.
        teacher_tokenizer: the teacher model's tokenizer (default: ``processing_class``).
    """

    def __init__(self, *args: Any, teacher, distill_coef: float = 1.0, distill_loss: DistillLossConfig | None = None,
                 memopd_config=None, teacher_tokenizer=None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
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

    # ------------------------------------------------------------------ the loss
    def _compute_loss(self, model, inputs):
        student = self.accelerator.unwrap_model(model)
        captured: list[torch.Tensor] = []

        def keep(module, args, output):
            states = getattr(output, "last_hidden_state", None)
            if states is None:  # e.g. a PEFT model, whose base_model is the wrapped causal LM
                raise RuntimeError(f"MemOPDTrainer: the student's base_model ({type(module).__name__}) returned no "
                                   "last_hidden_state; a plain transformers causal LM is supported (not PEFT)")
            captured.append(states)

        hook = student.base_model.register_forward_hook(keep)
        try:
            loss = super()._compute_loss(model, inputs)
        finally:
            hook.remove()
        if not captured:
            raise RuntimeError("MemOPDTrainer: TRL's training forward did not run the student's backbone "
                               "(checked against trl 1.16's fused LM head)")
        hidden = torch.cat(captured, dim=0)  # [B, P + C, d], the rows in order (TRL may chunk by rows)
        prompt_ids, completion_ids = inputs["prompt_ids"], inputs["completion_ids"]
        mask = inputs["completion_mask"]
        if "tool_mask" in inputs:
            mask = mask * inputs["tool_mask"]
        rows, cols = mask.nonzero(as_tuple=True)
        positions = prompt_ids.shape[1] + cols - 1  # the state that predicts completion token t
        student_hidden = hidden[rows, positions]
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        with torch.no_grad():
            teacher_model = self.teacher.model
            body = getattr(teacher_model, "module", teacher_model).base_model
            teacher_states = body(input_ids=input_ids, attention_mask=attention_mask,
                                  use_cache=False).last_hidden_state
            teacher_hidden = teacher_states[rows, positions]
        vocab = self.teacher.vocab_size
        head = student.get_output_embeddings()
        per_token = chunked_distill_loss(lambda h: head(h)[..., :vocab], student_hidden, self.teacher.head,
                                         teacher_hidden.to(student_hidden.device), self.distill_loss)
        mode = "train" if self.model.training else "eval"
        if per_token.numel():
            mean = per_token.mean()
        else:  # no trained token in this micro-batch: a zero that still reaches every rank's backward
            mean = student_hidden.sum() * 0.0 + hidden.sum() * 0.0
        steps = self.current_gradient_accumulation_steps if mode == "train" else 1.0
        self._metrics[mode]["distill_loss"].append(self.accelerator.gather(mean.detach()[None]).mean().item())
        return loss + self.distill_coef * mean / steps


__all__ = ["MemOPDTrainer"]
