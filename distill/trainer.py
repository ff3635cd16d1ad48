"""The MemOPD trainer: PPO or GRPO on the environment reward + ``distill_coef`` x an on-policy distillation loss
against a frozen teacher at the student's sampled action positions, optionally with memory credit.

It is :func:`agents.llm.training.ppo.train_rl` with two plug-ins, not a copy of its loop:

- the **actor forward** (:class:`PackedActorForward`): each minibatch's records are reconstructed
  (``reconstruction="aligned"``: each invocation as sampled; ``"persistent"``: the episode flattened into one
  transcript, MemOPD's matched control) and packed (``packing``: one of :data:`distill.packing.PACKINGS`,
  ``"padded"`` to ``"prefix_tree"``); one student body forward gives the hidden states at the action positions,
  from which the PPO side (log-probs, entropies, values) and the distillation side are both computed, the LM
  head applied in checkpointed chunks (memory ``O(chunk x vocab)``);
- the **loss hook** (:class:`MemOPDHook`): once per update it scores the update's records with the teacher on
  the *teacher's* reconstruction and packing (``teacher_packing``, default the actor's; keeping only the
  ``[N, d]`` hidden states at the action positions) and applies memory credit to the advantages; on every
  minibatch it adds ``distill_coef * mean_over_action_tokens(D(student || teacher))`` (:mod:`distill.losses`).

Two reconstructions, set apart: ``reconstruction`` is the actor's (its PPO ratio, its entropy, the student side
of the distillation term), ``teacher_reconstruction`` the teacher's scoring state (default: the actor's). The
arms of the matched comparison:

- MemOPD: both ``aligned``;
- the teacher-persistent control: actor ``aligned``, teacher ``persistent``: the student's update is MemOPD's
  (same minibatches, same PPO ratio), only the teacher scores each action after the flattened episode;
- a flattening trainer: both ``persistent`` with ``recompute_old_logprobs=True``, as multi-turn trainers that
  flatten an episode do (their old log-probs come from the same flattened forward, so the PPO ratio starts at 1).

With an actor ``persistent``, minibatches hold whole episodes. The PPO ratio's old log-probs are the records'
behaviour log-probs unless ``recompute_old_logprobs=True`` (then the training forward recomputes them before the
first minibatch: needed where training differs from sampling in precision or in the reconstruction of the
context).

Under ``torchrun`` (DDP): the packed forward runs as the DDP-wrapped actor's forward (``ActorCritic(call=...)``),
so DDP all-reduces its gradients; each rank loads the teacher and scores its own records; GRPO groups stay on one
rank; metrics and checkpoints come from rank 0; ``resume`` continues every rank (see
:func:`agents.llm.training.ppo.train_rl`). The update equals one process's on the global batch (tested with 2 gloo
ranks).

Memory: with ``grad_accumulation`` (default on here) each minibatch is split into its packed batches
(:meth:`PackedActorForward.split`) and each one's forward is followed by its backward, so one update holds one
packed batch's graph, not the minibatch's; ``gradient_checkpointing`` also recomputes the body's activations.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Sequence

import torch

from agents.llm.models.local import load_tokenizer
from agents.llm.training.ppo import ActorOutput, PPOConfig, train_rl
from agents.llm.records.invocation import InvocationRecord
from agents.llm.adapters.served import is_served
from agents.llm.training.common import init_distributed, latest_checkpoint, load_or_build_model, unwrap_ddp
from distill import check_attention_backend
from distill.credit import CreditConfig, apply_memory_credit
from distill.losses import DistillLossConfig, chunked_action_logprobs, chunked_distill_loss, fused_head_reverse_kl
from distill.served_teacher import ServedTeacher, ServedTeacherHook, check_served_options
from distill.teacher import ScoringLayout, Teacher, records_action_hidden


@dataclass
class MemOPDConfig(PPOConfig):
    """:class:`agents.llm.training.ppo.PPOConfig` plus the teacher, the distillation loss, the layout and memory
    credit."""

    out_dir: str = "runs/distill"
    teacher: str | None = None  # local checkpoint of the teacher (same tokenizer as the student), or openai:NAME@URL
    distill_coef: float = 1.0  # lambda: total loss = PPO/GRPO loss + lambda * distillation loss
    loss: str = "reverse_kl"  # reverse_kl | forward_kl | jsd
    beta: float = 0.5  # JSD(beta)
    top_k: int | None = None  # teacher top-k approximation (None: exact full vocabulary)
    top_k_mode: str = "tail"  # tail | renorm
    distill_temperature: float = 1.0  # both distributions at this temperature
    chunk: int = 1024  # action positions per LM-head application
    reconstruction: str = "aligned"  # aligned | persistent: the actor's (PPO ratio, student side of the loss)
    teacher_reconstruction: str | None = None  # aligned | persistent: the teacher's scoring (None: the actor's)
    packing: str = "shared_prefix"  # distill.packing.PACKINGS (padded, ..., prefix_tree): the actor's
    teacher_packing: str | None = None  # the teacher scoring's packing (None: the actor's); prefix_tree: fastest
    token_budget: int = 4096  # tokens per packed forward (rows x row length)
    attention_backend: str = "auto"  # distill.ATTENTION_BACKENDS; auto: dense-mask sdpa on CPU, flash/flex on CUDA
    credit: str = "none"  # none | mempo | himpo
    credit_coef: float = 1.0
    credit_gate_temperature: float = 1.0  # HiMPO's soft gate
    teacher_dtype: str | None = None  # the teacher's weights: float32 | bfloat16 | float16 | auto (None: dtype)
    teacher_attn_implementation: str | None = None  # the teacher's loaded attention (None: attn_implementation)
    grad_accumulation: bool = True  # backward per packed batch of a minibatch (memory: one packed batch's graph)
    # the student's LM head applied once per chunk for the PPO side and the reverse KL together, analytic
    # backward (distill.losses.fused_head_reverse_kl; memory O(packed batch's action tokens x vocab)); only where
    # it computes the same thing: reverse_kl over the full vocabulary (else the checkpointed pair, memory
    # O(chunk x vocab))
    fused_head: bool = True
    # "teacher": the distillation term; "constant": the teacher-free control (issue 61, arXiv 2608.31046): the same
    # update with that term replaced by a fixed negative advantage -constant_signal on every sampled action token
    # (its size matched to a MemOPD run's mean distillation loss per token); no teacher is loaded
    distill_signal: str = "teacher"
    constant_signal: float = 0.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.distill_signal not in ("teacher", "constant"):
            raise ValueError(f"distill_signal must be 'teacher' or 'constant', got {self.distill_signal!r}")
        if not (isinstance(self.constant_signal, (int, float)) and self.constant_signal >= 0):
            raise ValueError(f"constant_signal must be a number >= 0, got {self.constant_signal!r}")
        if self.distill_coef < 0:
            raise ValueError(f"distill_coef (lambda) must be >= 0, got {self.distill_coef}")
        check_attention_backend(self.attention_backend)
        from agents.llm.models.precision import ATTN_IMPLEMENTATIONS, check_dtype

        check_dtype(self.dtype, "dtype")
        check_dtype(self.teacher_dtype, "teacher_dtype")
        for name in ("attn_implementation", "teacher_attn_implementation"):
            value = getattr(self, name)
            if value is not None and value not in ATTN_IMPLEMENTATIONS:
                raise ValueError(f"{name} must be one of {', '.join(ATTN_IMPLEMENTATIONS)}; got {value!r}")
        self.loss_config()  # each raises a ValueError naming the bad option
        self.layout()
        self.teacher_layout()
        self.credit_config()
        if self.reconstruction == "persistent":
            self.minibatch_unit = "episode"  # a persistent sequence holds the whole episode

    def loss_config(self) -> DistillLossConfig:
        return DistillLossConfig(kind=self.loss, beta=self.beta, top_k=self.top_k, top_k_mode=self.top_k_mode,
                                 temperature=self.distill_temperature, chunk=self.chunk)

    def fuses_head(self) -> bool:
        """Whether the training forward computes the distillation term with the PPO log-probs (``fused_head``)."""
        return self.fused_head and self.loss == "reverse_kl" and self.top_k is None

    def layout(self) -> ScoringLayout:
        """The actor's layout."""
        return ScoringLayout(self.reconstruction, self.packing, self.token_budget, self.attention_backend)

    def teacher_layout(self) -> ScoringLayout:
        """The teacher's layout (its reconstruction and packing; each, when None, the actor's)."""
        layout = self.layout()
        for name, value in (("teacher_reconstruction", self.teacher_reconstruction),
                            ("teacher_packing", self.teacher_packing)):
            if value is not None:
                try:
                    layout = replace(layout, **{name.removeprefix("teacher_"): value})
                except ValueError as err:
                    raise ValueError(f"{name}: {err}") from None
        return layout

    def credit_config(self) -> CreditConfig:
        return CreditConfig(kind=self.credit, coef=self.credit_coef, gate_temperature=self.credit_gate_temperature)


class PackedActorForward:
    """The actor forward of :func:`agents.llm.training.ppo.train_rl` on a reconstruction + packing (see the module doc).

    Given a DDP-wrapped actor it runs inside DDP's forward (``module(call=...)``), so the gradients are averaged
    over ranks; :meth:`split` gives the records of each packed batch (gradient accumulation)."""

    def __init__(self, layout: ScoringLayout, tokenizer, chunk: int = 1024, distill: "MemOPDHook | None" = None
                 ) -> None:
        self.layout, self.tokenizer, self.chunk = layout, tokenizer, chunk
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        # a hook whose reverse KL this forward computes from its own logits (training forwards only)
        self.distill = distill

    def split(self, records: Sequence[InvocationRecord]) -> list[list[int]]:
        """Indices of ``records``, one group per packed batch of the layout (records sharing a batch stay
        together; records with no action token join the last group)."""
        batches = self.layout.batches(records, self.tokenizer, self.pad_id)
        owner: dict[int, int] = {}
        groups: list[set[int]] = []
        for b in batches:
            members = set(b.record_index.tolist())
            merged = {owner[i] for i in members if i in owner}  # a record scored in several batches: merge them
            target = set(members)
            for g in merged:
                target |= groups[g]
                groups[g] = set()
            groups.append(target)
            for i in target:
                owner[i] = len(groups) - 1
        out = [sorted(g) for g in groups if g]
        rest = [i for i in range(len(records)) if i not in owner]
        if rest:
            out = out[:-1] + [sorted((out[-1] if out else []) + rest)]
        return out

    def _body(self, ac, records: Sequence[InvocationRecord], temperature: float, entropy: bool):
        with ac.autocast_context():  # PPOConfig.train_autocast: bf16 matmuls, fp32 log-probs and losses
            return self._forward(ac, records, temperature, entropy)

    def _forward(self, ac, records: Sequence[InvocationRecord], temperature: float, entropy: bool):
        hidden, targets = records_action_hidden(ac.lm, records, self.layout, self.tokenizer, self.pad_id)
        head = ac.lm.get_output_embeddings()
        teacher_hidden = self.distill.scored(records) if self.distill is not None else None
        fused = (teacher_hidden is not None and torch.is_grad_enabled() and hidden.requires_grad
                 and getattr(head, "bias", None) is None and head.weight.shape[0] == self.distill.teacher.vocab_size)
        distill = None
        if fused:
            logp, ent, distill = fused_head_reverse_kl(head.weight, hidden, targets, self.distill.teacher.head,
                                                       teacher_hidden, temperature, self.chunk,
                                                       distill_temperature=self.distill.loss.temperature)
            ent = ent if entropy else None
        else:
            logp, ent = chunked_action_logprobs(head, hidden, targets, temperature, self.chunk, entropy)
        values = None
        if ac.value_head is not None:
            hv = hidden.detach() if ac.detach_value else hidden
            values = ac.value_head(hv.to(ac.value_head.weight.dtype))[:, 0]
        return logp, ent, values, hidden, distill

    def __call__(self, module, records: Sequence[InvocationRecord], *, temperature: float = 1.0,
                 entropy: bool = False) -> ActorOutput:
        ac = unwrap_ddp(module)
        if isinstance(module, torch.nn.parallel.DistributedDataParallel):
            logp, ent, values, hidden, distill = module(call=self._body, records=records, temperature=temperature,
                                                        entropy=entropy)
        else:
            logp, ent, values, hidden, distill = self._body(ac, records, temperature, entropy)
        return ActorOutput(logp, ent, values, hidden, ac.lm.get_output_embeddings(), distill=distill)


class MemOPDHook:
    """The distillation term (and memory credit) as a :class:`agents.llm.training.ppo.LossHook`."""

    plot_keys = ("distill_loss",)

    def __init__(self, teacher: Teacher, layout: ScoringLayout, loss: DistillLossConfig, coef: float,
                 credit: CreditConfig | None = None, tokenizer=None, fuse: bool = False) -> None:
        self.teacher, self.layout, self.loss, self.coef = teacher, layout, loss, coef
        # whether an actor forward may compute this term with its own logits (the caller checked that the loss
        # is the fused one: reverse KL, full vocabulary, the PPO temperature)
        self.fuse = fuse
        self.credit = credit or CreditConfig()
        self.tokenizer = tokenizer if tokenizer is not None else teacher.tokenizer
        self._hidden: dict[int, torch.Tensor] = {}

    def on_update(self, episodes, records: Sequence[InvocationRecord], module) -> dict[str, float]:
        """Memory credit on the fresh advantages; teacher hidden states of every action token of the update."""
        stats = apply_memory_credit(records, unwrap_ddp(module), self.tokenizer, self.credit)
        t0 = time.perf_counter()
        hidden = self.teacher.action_hidden(records, self.layout)
        counts = [sum(r.action_mask) for r in records]
        self._hidden = {id(r): h for r, h in zip(records, hidden.split(counts))}
        stats["teacher_s"] = time.perf_counter() - t0
        return stats

    def scored(self, records: Sequence[InvocationRecord]) -> torch.Tensor | None:
        """The teacher's ``[N, d]`` hidden states at ``records``' action tokens when this update scored them all
        and the loss can be fused into the actor forward (reverse KL, full vocabulary), else None."""
        if not self.fuse or not all(id(r) in self._hidden for r in records):
            return None
        return torch.cat([self._hidden[id(r)] for r in records])

    def __call__(self, records: Sequence[InvocationRecord], actor: ActorOutput) -> tuple[torch.Tensor, dict[str, float]]:
        if actor.distill is not None:  # computed by the actor forward from its own logits (fused head)
            per_token = actor.distill
        else:
            try:
                teacher_hidden = torch.cat([self._hidden[id(r)] for r in records])
            except KeyError:
                raise RuntimeError("MemOPDHook was called on records it has not scored: on_update runs first") \
                    from None
            vocab = self.teacher.vocab_size
            student_head = (lambda h: actor.head(h)[..., :vocab])  # noqa: E731 (the vocabulary both heads share)
            per_token = chunked_distill_loss(student_head, actor.hidden, self.teacher.head,
                                             teacher_hidden.to(actor.hidden.device), self.loss)
        if not per_token.numel():
            return actor.hidden.sum() * 0.0, {"distill_loss": 0.0}
        mean = per_token.mean()
        # a part of the minibatch (micro-batch, DDP rank): its sum over the minibatch's token count
        term = per_token.sum() / actor.token_denom if actor.token_denom is not None else mean
        return self.coef * term, {"distill_loss": float(mean.detach())}


class ConstantSignalHook:
    """The teacher-free control of MemOPD (issue 61): a fixed negative advantage ``-value`` on every sampled action
    token in place of the distillation term. Its loss is the policy-gradient loss of that advantage,
    ``coef * value * mean_t log pi(a_t)``: it lowers the sampled tokens' log-probabilities by a constant push, as the
    reverse KL to a teacher does on average (``value``: a MemOPD run's mean distillation loss per token), with no
    information about which token the teacher prefers. What is left of MemOPD's gain over GRPO under it is the
    generic effect of a dense negative signal, not the teacher's."""

    plot_keys = ("constant_signal",)

    def __init__(self, value: float, coef: float = 1.0) -> None:
        self.value, self.coef = float(value), float(coef)

    def __call__(self, records: Sequence[InvocationRecord], actor: ActorOutput) -> tuple[torch.Tensor, dict[str, float]]:
        if not actor.logp.numel():
            return actor.logp.sum() * 0.0, {"constant_signal": self.value}
        per_token = self.value * actor.logp
        term = per_token.sum() / actor.token_denom if actor.token_denom is not None else per_token.mean()
        return self.coef * term, {"constant_signal": self.value}


@torch.no_grad()
def distillation_loss(student, teacher: Teacher, records: Sequence[InvocationRecord], layout: ScoringLayout,
                      loss: DistillLossConfig, tokenizer=None, teacher_layout: ScoringLayout | None = None) -> float:
    """Mean per-action-token distillation loss of ``student`` (a causal LM, on ``layout``) against ``teacher``
    (on ``teacher_layout``, default ``layout``) on ``records``."""
    tok = tokenizer if tokenizer is not None else teacher.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    was_training = student.training
    student.eval()
    hidden, _ = records_action_hidden(student, records, layout, tok, pad)
    student.train(was_training)
    vocab = teacher.vocab_size
    per_token = chunked_distill_loss(lambda h: student.get_output_embeddings()(h)[..., :vocab], hidden,
                                     teacher.head, teacher.action_hidden(records, teacher_layout or layout).to(
                                         hidden.device), loss)
    return float(per_token.mean())


def train_memopd(cfg: MemOPDConfig, model=None, tokenizer=None, *, teacher=None, teacher_tokenizer=None,
                 env_fn=None) -> dict[str, Any]:
    """MemOPD (see the module doc); returns the last metrics row (``distill_loss``, ``teacher_s``, the credit
    metrics and every PPO/GRPO column of ``metrics.csv``).

    ``model``/``tokenizer``: an in-memory student (else ``cfg.model`` or a fresh tiny model, as ``memenv train``);
    ``teacher``: an in-memory teacher LM (else loaded from ``cfg.teacher``), with ``teacher_tokenizer`` (default
    the student's); ``env_fn``: a callable making one env. ``cfg.resume`` continues from ``cfg.out_dir/latest``."""
    if cfg.distill_signal == "teacher" and teacher is None and not cfg.teacher:
        raise ValueError("MemOPD needs a teacher: set MemOPDConfig.teacher to a local checkpoint (--teacher PATH)")
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    dist = init_distributed()  # under torchrun: the process group and this rank's device
    resume_from = latest_checkpoint(Path(cfg.out_dir)) if cfg.resume else None
    if model is None:
        if resume_from is not None:
            tokenizer = load_tokenizer(resume_from)  # train_rl loads the weights from the checkpoint
        else:
            model, tokenizer = load_or_build_model(cfg, dist)
    elif tokenizer is None:
        raise ValueError("an in-memory student model needs its tokenizer")
    if cfg.distill_signal == "constant":  # the teacher-free control: no teacher to load
        title = (f"GRPO + constant negative advantage {cfg.constant_signal:g} on sampled tokens (teacher-free control, "
                 f"lambda={cfg.distill_coef}) {cfg.env_id}")
        return train_rl(cfg, model=model, tokenizer=tokenizer, env_fn=env_fn,
                        extra_loss=ConstantSignalHook(cfg.constant_signal, cfg.distill_coef),
                        actor_forward=PackedActorForward(cfg.layout(), tokenizer, cfg.chunk), title=title)
    device = dist.device  # every rank scores its own records with its own copy of the teacher
    if teacher is None and is_served(cfg.teacher):  # --teacher openai:NAME@URL: log-probs from a server
        check_served_options(cfg.loss_config(), cfg.teacher_reconstruction, cfg.reconstruction)
        served = ServedTeacher(cfg.teacher, tokenizer, top_k=cfg.top_k)  # probes the server's tokenizer now
        hook = ServedTeacherHook(served, cfg.loss_config(), cfg.distill_coef, cfg.credit_config(), tokenizer)
        kind = f"top-{cfg.top_k} {cfg.loss}" if cfg.top_k else "sampled-token reverse_kl"
        title = (f"MemOPD {cfg.algo.upper()} (served teacher {served.spec.model}, {kind}, lambda={cfg.distill_coef}"
                 f"{', credit=' + cfg.credit if cfg.credit != 'none' else ''}) {cfg.env_id}")
        return train_rl(cfg, model=model, tokenizer=tokenizer, env_fn=env_fn, extra_loss=hook,
                        actor_forward=PackedActorForward(cfg.layout(), tokenizer, cfg.chunk), title=title)
    if teacher is None:
        scorer = Teacher.from_pretrained(cfg.teacher, student_tokenizer=tokenizer, student_model=model, device=device,
                                         dtype=cfg.teacher_dtype if cfg.teacher_dtype is not None else cfg.dtype,
                                         attn_implementation=cfg.teacher_attn_implementation or cfg.attn_implementation,
                                         temperature=cfg.distill_temperature, chunk=cfg.chunk)
    else:
        scorer = Teacher(teacher.to(device), teacher_tokenizer or tokenizer, student_tokenizer=tokenizer,
                         student_model=model, temperature=cfg.distill_temperature, chunk=cfg.chunk)
    layout, teacher_layout = cfg.layout(), cfg.teacher_layout()
    hook = MemOPDHook(scorer, teacher_layout, cfg.loss_config(), cfg.distill_coef, cfg.credit_config(), tokenizer,
                      fuse=cfg.fuses_head())
    scoring = (cfg.reconstruction if teacher_layout.reconstruction == cfg.reconstruction
               else f"actor {cfg.reconstruction}, teacher {teacher_layout.reconstruction}")
    title = (f"MemOPD {cfg.algo.upper()} ({scoring}, {cfg.packing}, {cfg.loss}, lambda={cfg.distill_coef}"
             f"{', credit=' + cfg.credit if cfg.credit != 'none' else ''}) {cfg.env_id}")
    return train_rl(cfg, model=model, tokenizer=tokenizer, env_fn=env_fn, extra_loss=hook,
                    actor_forward=PackedActorForward(layout, tokenizer, cfg.chunk, distill=hook), title=title)


__all__ = ["MemOPDConfig", "train_memopd", "MemOPDHook", "ConstantSignalHook", "PackedActorForward",
           "distillation_loss"]
