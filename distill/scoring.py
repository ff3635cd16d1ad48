"""Scoring records: the log-probs of their sampled tokens recomputed on a reconstruction and a packing
(:func:`score_records`), the RCE check against the records' own log-probs (:func:`rce`), the LM head applied in
chunks at the action positions (:func:`action_hidden`, :func:`chunked_logprobs`, :func:`action_logprobs`), and the
input checks that fail before any compute, naming the record (:func:`check_records`, :func:`check_sequences`).
Layouts are :mod:`distill.packing`, the attention back-ends :mod:`distill.attention`."""

from __future__ import annotations

import torch

from agents.llm.models.local import model_limits
from agents.llm.records.invocation import tokenizer_fingerprint
from distill.attention import hidden_states
from distill.packing import PackedBatch, pack, unpack
from distill.reconstruct import reconstruct


def action_hidden(model, batch: PackedBatch, backend: str = "auto") -> torch.Tensor:
    """``[N, d]`` hidden states of the logits that predict the sampled tokens (``hidden[rows, cols]``)."""
    h = hidden_states(model, batch, backend)
    return h[batch.rows.to(h.device), batch.cols.to(h.device)]


def chunked_logprobs(model, hidden: torch.Tensor, targets: torch.Tensor, temperature=1.0, chunk: int = 1024,
                     return_argmax: bool = False):
    """``log_softmax(lm_head(hidden) / T)[targets]`` in fp32, ``chunk`` positions at a time (O(chunk x vocab)).
    ``temperature``: a float or an ``[N]`` tensor. With ``return_argmax`` also the argmax ids."""
    head = model.get_output_embeddings()
    targets = targets.to(hidden.device)
    temp = temperature if not isinstance(temperature, torch.Tensor) else temperature.to(hidden.device).float()
    out, best = [], []
    for a in range(0, hidden.shape[0], max(1, int(chunk))):
        logits = head(hidden[a:a + chunk]).float()
        t = temp[a:a + chunk, None] if isinstance(temp, torch.Tensor) else temp
        logp = torch.log_softmax(logits / t, dim=-1)
        out.append(logp.gather(-1, targets[a:a + chunk, None])[:, 0])
        if return_argmax:
            best.append(logits.argmax(-1))
    lp = torch.cat(out) if out else hidden.new_zeros(0, dtype=torch.float32)
    if return_argmax:
        return lp, (torch.cat(best) if best else torch.zeros(0, dtype=torch.long, device=hidden.device))
    return lp


def action_logprobs(model, batch: PackedBatch, temperature=1.0, chunk: int = 1024, backend: str = "auto",
                    return_argmax: bool = False):
    """``[N]`` log-probs of the sampled tokens of ``batch`` (fp32; see :func:`chunked_logprobs`)."""
    return chunked_logprobs(model, action_hidden(model, batch, backend), batch.targets, temperature, chunk,
                            return_argmax)


# --------------------------------------------------------------------------------------------- input checks
def check_records(records, model, tokenizer=None) -> None:
    """Fail before any compute, naming the record, when ``records`` cannot be scored by ``model``: an empty
    list, an empty prompt (its first sampled token has no predicting logit), ids outside ``[0, vocab)``, an
    invocation longer than the model's max positions, or a tokenizer fingerprint that differs from
    ``tokenizer``'s (or, without ``tokenizer``, from the other records'). Records without a fingerprint
    (written before the field existed) are not fingerprint-checked."""
    if records is None or len(records) == 0:
        raise ValueError("no records to score: the record list is empty")
    vocab, max_pos = model_limits(model)
    expected = tokenizer_fingerprint(tokenizer) if tokenizer is not None else None
    first_fp = None
    for r in records:
        if not r.prompt_ids:
            raise ValueError(f"{r.describe()} has an empty prompt: its first sampled token cannot be scored")
        ids = list(r.prompt_ids) + list(r.response_ids)
        bad = [t for t in ids if not 0 <= int(t) < vocab]
        if bad:
            raise ValueError(f"{r.describe()} has token id {bad[0]} outside the model's vocabulary [0, {vocab}) "
                             f"({len(bad)} such ids): records from another tokenizer/model?")
        if max_pos is not None and len(ids) > max_pos:
            raise ValueError(f"{r.describe()} has {len(ids)} tokens, more than the model's max positions "
                             f"({max_pos})")
        fp = getattr(r, "tokenizer_fingerprint", "")
        if not fp:
            continue
        if expected is not None and fp != expected:
            raise ValueError(f"{r.describe()} was tokenised by tokenizer {fp}, but the model's tokenizer is "
                             f"{expected}: the ids mean different tokens")
        if first_fp is None:
            first_fp = (fp, r)
        elif fp != first_fp[0]:
            raise ValueError(f"{r.describe()} was tokenised by tokenizer {fp}, but {first_fp[1].describe()} by "
                             f"{first_fp[0]}: records from different tokenizers cannot be scored together")


def check_sequences(sequences, records, model) -> None:
    """Reconstructed sequences (the persistent control grows with the episode) must fit the model's positions."""
    _, max_pos = model_limits(model)
    if max_pos is None:
        return
    for s in sequences:
        if s.position_ids and max(s.position_ids) >= max_pos:
            r = records[s.segments[0].record]
            raise ValueError(f"the sequence of episode (rollout_id={getattr(r, 'rollout_id', '')!r}, "
                             f"episode_id={r.episode_id!r}) needs positions up to {max(s.position_ids)}, beyond "
                             f"the model's max positions ({max_pos})")


# --------------------------------------------------------------------------------------------- scoring records
@torch.no_grad()
def score_records(model, records, method: str = "padded", *, reconstruction: str = "aligned", tokenizer=None,
                  chunk: int = 1024, backend: str = "auto", **pack_kw) -> dict:
    """Score every sampled token of ``records`` under one reconstruction and packing (eval mode, no grad).

    Returns ``logprobs`` and ``argmax`` (per-record tensors, at each record's temperature), ``tokens`` (real
    tokens run), ``slots`` (tokens run, padding included) and ``batches``."""
    check_records(records, model, tokenizer)
    sequences = reconstruct(records, reconstruction, tokenizer)
    check_sequences(sequences, records, model)
    pack_kw.setdefault("pad_id", _pad_id(model))
    batches = pack(sequences, method, records=records, **pack_kw)
    temps = torch.tensor([float(r.temperature) or 1.0 for r in records])
    was_training = model.training
    model.eval()
    try:
        lps, best = [], []
        for b in batches:
            lp, am = action_logprobs(model, b, temps[b.record_index], chunk, backend, return_argmax=True)
            lps.append(lp.cpu())
            best.append(am.cpu())
    finally:
        model.train(was_training)
    return {"logprobs": unpack(lps, batches, len(records)), "argmax": unpack(best, batches, len(records)),
            "tokens": sum(b.n_tokens for b in batches), "slots": sum(b.n_slots for b in batches),
            "batches": batches}


def _pad_id(model) -> int:
    pad = getattr(model.config, "pad_token_id", None)
    return int(pad) if pad is not None else 0


def rce(model, records, method: str = "shared_prefix", **pack_kw) -> dict:
    """The RCE check: log-probs of the sampled tokens recomputed under ``method`` (aligned reconstruction) vs
    the records' ``response_logprobs``: ``max_abs`` and ``p99_abs`` of |delta|, ``tokens``, ``slots``."""
    scored = score_records(model, records, method, **pack_kw)
    ref = torch.cat([torch.tensor(r.response_logprobs, dtype=torch.float32) for r in records])
    delta = (torch.cat(scored["logprobs"]) - ref).abs()
    return {"method": method, "max_abs": float(delta.max()) if delta.numel() else 0.0,
            "p99_abs": float(torch.quantile(delta.double(), 0.99)) if delta.numel() else 0.0,
            "tokens": scored["tokens"], "slots": scored["slots"], "scored": int(delta.numel())}
