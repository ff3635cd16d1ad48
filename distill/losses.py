"""Distillation losses between the student's and the teacher's full-vocabulary distributions at action positions.

Every loss here takes log-probabilities over the whole vocabulary at the same positions (``[N, V]``, one row per
sampled action token) and returns one value per position; the trainer averages them over action tokens.

- ``reverse_kl`` (default): ``KL(student || teacher) = sum_v p_s (log p_s - log p_t)``: mode seeking, the usual
  choice for on-policy distillation (the student is penalised for mass where the teacher has none).
- ``forward_kl``: ``KL(teacher || student) = sum_v p_t (log p_t - log p_s)``: mean seeking (as SFT on teacher
  soft labels).
- ``jsd``: the generalized Jensen-Shannon divergence of GKD (Agarwal et al., 2024) with the convention of TRL's
  ``GKDTrainer``: ``M = beta * p_t + (1 - beta) * p_s`` and
  ``JSD(beta) = beta * KL(teacher || M) + (1 - beta) * KL(student || M)``. ``beta = 0.5`` is the symmetric
  JSD; as ``beta -> 0`` it behaves as ``beta * KL(teacher || student)`` and as ``beta -> 1`` as
  ``(1 - beta) * KL(student || teacher)``, so the end points ``beta = 0`` and ``beta = 1`` are defined (as in
  GKD/TRL) as the forward and the reverse KL themselves.

Top-k approximation (``top_k=k``): only the teacher's ``k`` most likely tokens at each position are kept, which
is what a cached or remote teacher can afford to send. Two ways to close the distribution (``top_k_mode``):

- ``"tail"`` (default): ``k + 1`` outcomes, the teacher's top-k tokens plus one *tail bucket* holding the rest of
  the mass (``1 - sum_topk p``) for each distribution. Both distributions stay normalised and exact on the top-k
  tokens, but the tail is one outcome: the divergence is that of a coarsening of both distributions, hence a
  **lower bound** of the exact one (every divergence here is an f-divergence, which merging outcomes can only
  lower; equal iff the student's tail is the teacher's tail scaled). The tail's *mass* is trained; its *shape*
  (how the student spreads that mass over the ``V - k`` other tokens) gets no signal at all. With ``k = V`` the
  tail is empty and the loss equals the exact one.
- ``"renorm"``: both distributions are restricted to the teacher's top-k tokens and renormalised there. Tokens
  outside the support get no signal (the student may keep mass there unpenalised), and the value is neither a
  lower nor an upper bound of the exact one; with ``k = V`` it is exact.

:func:`chunked_distill_loss` applies the language-model head to hidden states in position chunks and checkpoints
each chunk, so neither the forward nor the backward ever holds more than ``chunk x V`` logits of the student (and
of the teacher) at once: memory stays ``O(chunk x vocab)`` instead of ``O(N x vocab)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
from torch.utils.checkpoint import checkpoint

LOSS_KINDS = ("reverse_kl", "forward_kl", "jsd")
TOP_K_MODES = ("tail", "renorm")


@dataclass(frozen=True)
class DistillLossConfig:
    """What the distillation term is: the divergence, its JSD weight, the top-k approximation, the temperature
    both distributions are taken at, and the chunk size (positions per lm-head application)."""

    kind: str = "reverse_kl"
    beta: float = 0.5  # JSD(beta): weight of the teacher in the mixture (GKD / TRL convention)
    top_k: int | None = None  # None: the exact full-vocabulary loss
    top_k_mode: str = "tail"
    temperature: float = 1.0
    chunk: int = 1024

    def __post_init__(self) -> None:
        if self.kind not in LOSS_KINDS:
            raise ValueError(f"distillation loss kind must be one of {', '.join(LOSS_KINDS)}; got {self.kind!r}")
        if not 0.0 <= self.beta <= 1.0:
            raise ValueError(f"JSD beta must be in [0, 1], got {self.beta}")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k must be a positive number of tokens (or None for the exact loss), got {self.top_k}")
        if self.top_k_mode not in TOP_K_MODES:
            raise ValueError(f"top_k_mode must be one of {', '.join(TOP_K_MODES)}; got {self.top_k_mode!r}")
        if self.temperature <= 0:
            raise ValueError(f"distillation temperature must be > 0, got {self.temperature}")
        if self.chunk < 1:
            raise ValueError(f"chunk must be >= 1 position, got {self.chunk}")


# ---------------------------------------------------------------------- divergences on [N, V] log-probs
def _kl(logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    """``KL(p || q)`` per row from log-probabilities; terms with ``p = 0`` count 0 (also where ``q = 0``)."""
    p = logp.exp()
    diff = torch.where(p > 0, logp - logq, torch.zeros_like(logp))
    return (p * diff).sum(-1)


def reverse_kl(student_logp: torch.Tensor, teacher_logp: torch.Tensor) -> torch.Tensor:
    """``KL(student || teacher)`` per position."""
    return _kl(student_logp, teacher_logp)


def forward_kl(student_logp: torch.Tensor, teacher_logp: torch.Tensor) -> torch.Tensor:
    """``KL(teacher || student)`` per position."""
    return _kl(teacher_logp, student_logp)


def generalized_jsd(student_logp: torch.Tensor, teacher_logp: torch.Tensor, beta: float = 0.5) -> torch.Tensor:
    """GKD's ``JSD(beta)`` per position (see the module doc for the convention and the end points)."""
    if beta == 0.0:
        return forward_kl(student_logp, teacher_logp)
    if beta == 1.0:
        return reverse_kl(student_logp, teacher_logp)
    mixture = torch.logaddexp(teacher_logp + math.log(beta), student_logp + math.log1p(-beta))
    return beta * _kl(teacher_logp, mixture) + (1.0 - beta) * _kl(student_logp, mixture)


def divergence(student_logp: torch.Tensor, teacher_logp: torch.Tensor, kind: str = "reverse_kl",
               beta: float = 0.5) -> torch.Tensor:
    """The divergence ``kind`` (one of :data:`LOSS_KINDS`) per position."""
    if kind == "reverse_kl":
        return reverse_kl(student_logp, teacher_logp)
    if kind == "forward_kl":
        return forward_kl(student_logp, teacher_logp)
    if kind == "jsd":
        return generalized_jsd(student_logp, teacher_logp, beta)
    raise ValueError(f"distillation loss kind must be one of {', '.join(LOSS_KINDS)}; got {kind!r}")


def _tail_logmass(top_logp: torch.Tensor) -> torch.Tensor:
    """``log(1 - sum_topk p)`` ``[N, 1]``, floored at the smallest normal float: an (almost) empty tail stays
    finite, so it contributes ``~0`` to the loss and no NaN to the gradient."""
    lse = top_logp.logsumexp(-1, keepdim=True).clamp(max=0.0)
    return torch.log((-torch.expm1(lse)).clamp(min=torch.finfo(top_logp.dtype).tiny))


def top_k_distributions(student_logp: torch.Tensor, teacher_logp: torch.Tensor, k: int,
                        mode: str = "tail") -> tuple[torch.Tensor, torch.Tensor]:
    """Both distributions on the teacher's top-k support: ``[N, k + 1]`` with the tail bucket last (``"tail"``)
    or ``[N, k]`` renormalised (``"renorm"``). ``k`` larger than the vocabulary means the whole vocabulary."""
    k = min(int(k), teacher_logp.shape[-1])
    teacher_top, index = teacher_logp.topk(k, dim=-1)
    student_top = student_logp.gather(-1, index)
    if mode == "renorm":
        return (student_top - student_top.logsumexp(-1, keepdim=True),
                teacher_top - teacher_top.logsumexp(-1, keepdim=True))
    if mode != "tail":
        raise ValueError(f"top_k_mode must be one of {', '.join(TOP_K_MODES)}; got {mode!r}")
    return (torch.cat([student_top, _tail_logmass(student_top)], -1),
            torch.cat([teacher_top, _tail_logmass(teacher_top)], -1))


def distill_loss(student_logp: torch.Tensor, teacher_logp: torch.Tensor, cfg: DistillLossConfig) -> torch.Tensor:
    """Per-position loss of ``cfg`` from full-vocabulary log-probs (top-k applied here when configured)."""
    if cfg.top_k is not None:
        student_logp, teacher_logp = top_k_distributions(student_logp, teacher_logp, cfg.top_k, cfg.top_k_mode)
    return divergence(student_logp, teacher_logp, cfg.kind, cfg.beta)


# ---------------------------------------------------------------------- chunked application of the lm heads
def head_logprobs(head: Callable[[torch.Tensor], torch.Tensor], hidden: torch.Tensor,
                  temperature: float = 1.0) -> torch.Tensor:
    """``log_softmax(head(hidden) / temperature)`` in fp32 (bf16 logits, under an autocast, cast inside the
    softmax: no separate fp32 copy; no division at temperature 1). Outside autograd, fp32 logits become the
    log-probs in place, bit for bit the same values (no second ``[rows, V]`` tensor: see :class:`_Scratch`)."""
    logits = head(hidden)
    if logits.dtype == torch.float32 and not logits.requires_grad and logits.is_contiguous():
        if temperature != 1.0:
            logits.div_(temperature)
        return torch.log_softmax(logits, dim=-1, out=logits)
    if temperature != 1.0:
        logits = logits.float() / temperature
    return torch.log_softmax(logits, dim=-1, dtype=torch.float32)


def chunked_distill_loss(student_head: Callable[[torch.Tensor], torch.Tensor], student_hidden: torch.Tensor,
                         teacher_head: Callable[[torch.Tensor], torch.Tensor], teacher_hidden: torch.Tensor,
                         cfg: DistillLossConfig) -> torch.Tensor:
    """Per-position distillation loss ``[N]`` from hidden states ``[N, d_s]`` (student, with grad) and
    ``[N, d_t]`` (teacher, no grad), applying both heads ``cfg.chunk`` positions at a time.

    Each chunk is checkpointed: its logits are recomputed in the backward pass instead of kept, so peak memory
    is ``O(chunk x V)`` in both passes. The teacher's side is computed under ``no_grad``."""
    if student_hidden.shape[0] != teacher_hidden.shape[0]:
        raise ValueError(f"student and teacher hidden states cover different positions: "
                         f"{student_hidden.shape[0]} vs {teacher_hidden.shape[0]}")

    def one_chunk(h_s: torch.Tensor, h_t: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            teacher_logp = head_logprobs(teacher_head, h_t, cfg.temperature)
        student_logp = head_logprobs(student_head, h_s, cfg.temperature)
        if student_logp.shape[-1] != teacher_logp.shape[-1]:
            raise ValueError(f"student and teacher heads give different vocabularies: {student_logp.shape[-1]} "
                             f"vs {teacher_logp.shape[-1]} logits")
        return distill_loss(student_logp, teacher_logp, cfg)

    parts = []
    for i in range(0, student_hidden.shape[0], cfg.chunk):
        h_s, h_t = student_hidden[i:i + cfg.chunk], teacher_hidden[i:i + cfg.chunk]
        if torch.is_grad_enabled() and h_s.requires_grad:
            parts.append(checkpoint(one_chunk, h_s, h_t, use_reentrant=False))
        else:
            parts.append(one_chunk(h_s, h_t))
    return torch.cat(parts) if parts else student_hidden.new_zeros(0, dtype=torch.float32)


def chunked_action_logprobs(head: Callable[[torch.Tensor], torch.Tensor], hidden: torch.Tensor,
                            targets: torch.Tensor, temperature: float = 1.0, chunk: int = 1024,
                            entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs of ``targets`` ``[N]`` (and entropies ``[N]`` when asked) from hidden states ``[N, d]``, the head
    applied ``chunk`` positions at a time and checkpointed (memory ``O(chunk x V)``); the PPO side of the same
    student forward whose hidden states feed :func:`chunked_distill_loss`."""

    def one_chunk(h: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logp_all = head_logprobs(head, h, temperature)
        logp = logp_all.gather(-1, t[:, None])[:, 0]
        ent = -(logp_all.exp() * logp_all).sum(-1) if entropy else logp.new_zeros(logp.shape)
        return logp, ent

    logps, ents = [], []
    for i in range(0, hidden.shape[0], chunk):
        h, t = hidden[i:i + chunk], targets[i:i + chunk]
        if torch.is_grad_enabled() and h.requires_grad:
            logp, ent = checkpoint(one_chunk, h, t, use_reentrant=False)
        else:
            logp, ent = one_chunk(h, t)
        logps.append(logp)
        ents.append(ent)
    if not logps:
        empty = hidden.new_zeros(0, dtype=torch.float32)
        return empty, (empty if entropy else None)
    return torch.cat(logps), (torch.cat(ents) if entropy else None)


def _row_dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``(a * b).sum(-1)`` for ``[N, V]`` tensors as one batched product (no ``[N, V]`` temporary)."""
    return torch.bmm(a.unsqueeze(1), b.unsqueeze(2))[:, 0, 0]


class _Scratch:
    """Buffers reused from chunk to chunk of one call (``get(slot, like)``: a tensor shaped and typed as ``like``).
    On this CPU a fresh ``[1024, 49,152]`` fp32 tensor costs its 49k page faults on first touch (~0.2 CPU-s,
    measured 2026-12-07: an ``exp`` into a new tensor 276 ms, into a reused one 85), more than the pass itself."""

    def __init__(self) -> None:
        self.buffers: dict[int, torch.Tensor] = {}

    def get(self, slot: int, like: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
        dtype = like.dtype if dtype is None else dtype
        buf = self.buffers.get(slot)
        if buf is None or buf.dtype != dtype or buf.device != like.device or buf.numel() < like.numel():
            buf = self.buffers[slot] = torch.empty(like.numel(), dtype=dtype, device=like.device)
        return buf[:like.numel()].view(like.shape)


class _FusedHeadReverseKL(torch.autograd.Function):
    """One application of the student's head per chunk for the PPO side and the reverse KL together (see
    :func:`fused_head_reverse_kl`). Forward: per chunk ``z = h W^T`` once; at the PPO temperature ``T1``,
    ``log p = log_softmax(z / T1)`` gives the target log-probs and the entropies; at the distillation temperature
    ``T2``, ``log q = log_softmax(z / T2)`` gives ``KL(q || p_t)``. The backward needs no matmul but the two of the
    gradient itself:
    ``dz = (g_lp (onehot - p) - g_H p (log p + H)) / T1 + g_KL q (log q - log p_t - KL) / T2``.

    With one temperature (``q = p``; the default) and finite teacher log-probs, the forward keeps ``log p`` and
    the backward computes ``dz = (p ((g_KL - g_H) log p - g_KL log p_t - g_lp - g_H H - g_KL KL) + onehot g_lp) / T``
    in a few passes over the ``[chunk, V]`` values (the row sums as batched products): on a 49k vocabulary
    those passes, not the matmuls, were most of the head's cost. Otherwise it keeps ``z`` and recomputes both
    softmaxes. Under a bf16 autocast the head's three matmuls run in bf16 (fp32 accumulation) and everything
    else in fp32, as autocast itself would do them."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, teacher_logp_chunks, temperature, distill_temperature, chunk):
        device = hidden.device.type
        low = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else None
        h_mm, w_mm = (hidden.to(low), weight.to(low)) if low is not None else (hidden, weight)
        same = distill_temperature == temperature
        logps, ents, kls, saved = [], [], [], []
        scratch = _Scratch()
        with torch.autocast(device, enabled=False):
            for i, logp_t in zip(range(0, hidden.shape[0], chunk), teacher_logp_chunks):
                z = torch.nn.functional.linear(h_mm[i:i + chunk], w_mm)  # bf16 under an autocast
                if same and z.dtype == torch.float32:  # the logits become log p in place (no fresh [chunk, V])
                    if temperature != 1.0:
                        z.div_(temperature)
                    logp_s = torch.log_softmax(z, dim=-1, out=z)  # as head_logprobs, bit for bit
                elif z.dtype == torch.float32:  # two temperatures: z is kept; log p in a reused buffer
                    scaled = torch.div(z, temperature, out=scratch.get(0, z)) if temperature != 1.0 else z
                    logp_s = torch.log_softmax(scaled, dim=-1, out=scratch.get(0, z))  # bit for bit as above
                else:
                    scaled = z.float() / temperature if temperature != 1.0 else z
                    logp_s = torch.log_softmax(scaled, dim=-1, dtype=torch.float32)  # as head_logprobs, bit for bit
                logps.append(logp_s.gather(-1, targets[i:i + chunk, None])[:, 0])
                kl = None
                if same:
                    p = torch.exp(logp_s, out=scratch.get(0, logp_s))
                    ent = -_row_dot(p, logp_s)
                    kl = _row_dot(p, torch.sub(logp_s, logp_t, out=scratch.get(1, logp_s)))
                    # a teacher log-prob of -inf gives inf or nan here (0 x inf where p is 0): the guarded path
                    kl = kl if bool(torch.isfinite(kl).all()) else None
                if kl is not None:
                    saved.append(("p", logp_s, logp_t, ent, kl))
                elif not same and z.dtype == torch.float32:  # the ops below, each into a reused buffer
                    s0, s1 = logp_s, scratch.get(1, z)
                    p = torch.exp(s0, out=s1)
                    ent = -torch.mul(p, s0, out=s1).sum(-1)
                    logq = torch.log_softmax(torch.div(z, distill_temperature, out=s1), -1, out=s1)
                    q = torch.exp(logq, out=s0)
                    positive = torch.gt(q, 0, out=scratch.get(5, z, torch.bool))
                    diff = torch.where(positive, torch.sub(logq, logp_t, out=s1), z.new_zeros(()), out=s1)
                    kl = torch.mul(q, diff, out=s1).sum(-1)
                    saved.append(("z", z, logp_t, None, None))
                else:
                    if z is logp_s:  # overwritten in place: the same product again (rare: a teacher's -inf)
                        z = torch.nn.functional.linear(h_mm[i:i + chunk], w_mm)
                    z = z.float()
                    p = logp_s.exp()
                    ent = -(p * logp_s).sum(-1)
                    logq = logp_s if same else torch.log_softmax(z / distill_temperature, -1)
                    q = logq.exp()
                    kl = (q * torch.where(q > 0, logq - logp_t, torch.zeros_like(logq))).sum(-1)
                    saved.append(("z", z, logp_t, None, None))
                ents.append(ent)
                kls.append(kl)
        ctx.saved_chunks = saved
        ctx.temperatures, ctx.chunk, ctx.low = (temperature, distill_temperature), chunk, low
        ctx.save_for_backward(hidden, weight, targets)
        empty = hidden.new_zeros(0, dtype=torch.float32)
        return tuple(torch.cat(x) if x else empty for x in (logps, ents, kls))

    @staticmethod
    def backward(ctx, g_lp, g_ent, g_kl):
        hidden, weight, targets = ctx.saved_tensors
        saved, chunk, (t_ppo, t_distill), low = ctx.saved_chunks, ctx.chunk, ctx.temperatures, ctx.low
        ctx.saved_chunks = None
        grad_h = torch.zeros_like(hidden) if ctx.needs_input_grad[0] else None
        grad_w = None
        h_mm, w_mm = (hidden.to(low), weight.to(low)) if low is not None else (hidden, weight)
        scratch = _Scratch()
        for k, i in enumerate(range(0, hidden.shape[0], chunk)):
            kind, values, logp_t, ent, kl = saved[k]
            saved[k] = None
            rows = slice(i, i + chunk)
            n = values.shape[0]
            zero = values.new_zeros(n)
            glp = g_lp[rows] if g_lp is not None else zero
            gent = g_ent[rows] if g_ent is not None else zero
            gkl = g_kl[rows] if g_kl is not None else zero
            if kind == "p":  # one temperature: dz = (p (a log p - b log p_t + c) + onehot g_lp) / T
                logp_s = values
                c = (-glp - gent * ent - gkl * kl)[:, None]
                p = torch.exp(logp_s, out=scratch.get(0, logp_s))
                dz = torch.addcmul(c, logp_s, (gkl - gent)[:, None], out=logp_s)  # c + a log p, one pass, in place
                dz.addcmul_(logp_t, -gkl[:, None])
                dz.mul_(p)
                dz.scatter_add_(-1, targets[rows, None], glp[:, None])
                if t_ppo != 1.0:
                    dz /= t_ppo
            elif values.dtype == torch.float32:  # the ops of the branch below, each into a reused buffer
                z = values
                s0, s1, s2, s3 = (scratch.get(k, z) for k in (0, 1, 3, 4))
                logp_s = torch.log_softmax(torch.div(z, t_ppo, out=s0), dim=-1, out=s0)
                p = torch.exp(logp_s, out=s1)
                h_ent = -torch.mul(p, logp_s, out=s2).sum(-1, keepdim=True)
                inner = torch.add(logp_s, h_ent, out=s0)
                inner = torch.mul(-gent[:, None], inner, out=s0)
                inner = torch.sub(inner, glp[:, None], out=s0)
                dz = torch.mul(p, inner, out=s0)
                dz.scatter_add_(-1, targets[rows, None], glp[:, None])
                dz /= t_ppo
                logq = torch.log_softmax(torch.div(z, t_distill, out=s1), dim=-1, out=s1)
                q = torch.exp(logq, out=s2)
                diff = torch.where(torch.gt(q, 0, out=scratch.get(5, z, torch.bool)), torch.sub(logq, logp_t, out=s1),
                                   z.new_zeros(()), out=s1)
                kl_c = torch.mul(q, diff, out=s3).sum(-1, keepdim=True)
                term = torch.sub(diff, kl_c, out=s1)
                term = torch.mul(q, term, out=s1)
                dz += torch.mul(term, gkl[:, None] / t_distill, out=s1)
            else:
                z = values
                logp_s = torch.log_softmax(z / t_ppo, dim=-1)
                p = logp_s.exp()
                h_ent = -(p * logp_s).sum(-1, keepdim=True)
                dz = p * (-gent[:, None] * (logp_s + h_ent) - glp[:, None])
                dz.scatter_add_(-1, targets[rows, None], glp[:, None])
                dz /= t_ppo
                logq = torch.log_softmax(z / t_distill, dim=-1)
                q = logq.exp()
                diff = torch.where(q > 0, logq - logp_t, torch.zeros_like(logq))
                kl_c = (q * diff).sum(-1, keepdim=True)
                dz += q * (diff - kl_c) * (gkl[:, None] / t_distill)
            dz = dz.to(w_mm.dtype)
            if grad_h is not None:
                grad_h[rows] = (dz @ w_mm).to(grad_h.dtype)
            if ctx.needs_input_grad[1]:
                if grad_w is None:  # the first chunk's product is the gradient so far (0 + x = x)
                    grad_w = (dz.T @ h_mm[rows]).to(weight.dtype)
                elif dz.dtype == weight.dtype:  # later chunks' products into one reused buffer
                    grad_w += torch.mm(dz.T, h_mm[rows], out=scratch.get(2, weight))
                else:
                    grad_w += (dz.T @ h_mm[rows]).to(grad_w.dtype)
        if ctx.needs_input_grad[1] and grad_w is None:
            grad_w = torch.zeros_like(weight)
        return grad_h, grad_w, None, None, None, None, None


def fused_head_reverse_kl(weight: torch.Tensor, hidden: torch.Tensor, targets: torch.Tensor,
                          teacher_head: Callable[[torch.Tensor], torch.Tensor], teacher_hidden: torch.Tensor,
                          temperature: float = 1.0, chunk: int = 1024, distill_temperature: float | None = None
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(log-probs of targets, entropies, KL(student || teacher))``, each ``[N]``, from the student's hidden
    states ``[N, d]`` (with grad) through a bias-free head ``weight`` ``[V, d]`` and the teacher's hidden states
    through ``teacher_head`` (no grad): the log-probs and entropies at ``temperature`` (PPO's), the KL with both
    distributions at ``distill_temperature`` (default: ``temperature``).

    What :func:`chunked_action_logprobs` and :func:`chunked_distill_loss` compute from the same hidden states,
    with the student's head applied once per chunk instead of four times (once each in the two forwards and again
    in each checkpointed backward) and the teacher's once instead of twice; the backward is analytic. The price
    is memory: the chunks' student logits and teacher log-probs (``2 x N x V`` fp32) are kept until the backward
    instead of recomputed, so the peak is ``O(N x V)`` per forward (a packed batch's action tokens), not
    ``O(chunk x V)``: for a memory-bound GPU run keep the checkpointed pair (``MemOPDConfig.fused_head=False``)."""
    student_rows = weight.shape[0]
    if hidden.shape[0] != teacher_hidden.shape[0]:
        raise ValueError(f"student and teacher hidden states cover different positions: "
                         f"{hidden.shape[0]} vs {teacher_hidden.shape[0]}")
    distill_temperature = float(temperature if distill_temperature is None else distill_temperature)
    with torch.no_grad():
        teacher_logp = [head_logprobs(teacher_head, teacher_hidden[i:i + chunk], distill_temperature).to(hidden.device)
                        for i in range(0, hidden.shape[0], chunk)]
    if teacher_logp and teacher_logp[0].shape[-1] != student_rows:
        raise ValueError(f"student and teacher heads give different vocabularies: {student_rows} vs "
                         f"{teacher_logp[0].shape[-1]} logits")
    return _FusedHeadReverseKL.apply(hidden, weight, targets.to(hidden.device), teacher_logp, float(temperature),
                                     distill_temperature, int(chunk))


__all__ = ["DistillLossConfig", "LOSS_KINDS", "TOP_K_MODES", "reverse_kl", "forward_kl", "generalized_jsd",
           "divergence", "top_k_distributions", "distill_loss", "head_logprobs", "chunked_distill_loss",
           "chunked_action_logprobs", "fused_head_reverse_kl"]
