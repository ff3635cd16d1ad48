"""A lean decode step for :class:`agents.llm.generation.policy.LLMPolicy`'s tree path: the same operations as the
model's forward for one new token per row, in the same order, without the forward's per-call machinery.

Why: at one thread on a 2-core CPU the decode of a 135M model runs a few rows at a time (the rows of a call
finish at different steps and leave), where the Python around each step weighs: the causal-mask builder, the
output-capturing and argument-merging wrappers of the transformers forward, the attention-interface lookup and
the keyword plumbing of 30 layers. :func:`lean_step` keeps every tensor operation of the forward (the modules'
own ``__call__`` for the embedding, the norms, the projections, the MLP and the rotary embedding, so adapters
and hooks on them still run) and drops the rest: the mask is the rows' padding mask as one boolean
``[rows, 1, 1, width]`` tensor (what the forward builds for a one-token query; none when no column is masked,
as the forward then does), attention is :func:`torch.nn.functional.scaled_dot_product_attention` called as
transformers' SDPA integration calls it for a one-token query (grouped heads packed, no repeat of the KV).

Exactness: the same kernels on the same inputs: the logits equal the forward's bit for bit (tested on the tiny
Qwen2 and Llama models, greedy tokens and sampled log-probs of whole generations). Models it does not know
(anything but Llama and Qwen2 decoders with SDPA attention, full attention only, default RoPE scaling, eval mode)
get ``None`` from :func:`lean_step` and keep the model's forward. ``LLMPolicy(fast_decode=True)`` turns it on.

Measured (``benchmarks/rollout_throughput.py``, SmolLM2-135M, 1 thread, all the calls of one GRPO update, side by
side, 3 rounds): decode tokens per CPU-second 1.03 +- 0.05x of the forward's, no gain beyond the noise, so it is
off by default: at the 4-8 rows a call decodes, the step is the matrix products', not Python's.
"""

from __future__ import annotations

from typing import Callable

import torch

KNOWN = ("llama", "qwen2")


def known(model) -> bool:
    """Whether ``model`` is one the lean step (and :mod:`agents.llm.generation.compiled_decode`) reproduces exactly: a
    Llama or Qwen2 decoder in eval mode, SDPA attention, full attention only, default RoPE, SiLU MLP."""
    config = getattr(model, "config", None)
    inner = getattr(model, "model", None)
    if config is None or inner is None or getattr(config, "model_type", None) not in KNOWN or model.training:
        return False
    if getattr(config, "_attn_implementation", None) != "sdpa" or getattr(config, "pretraining_tp", 1) != 1:
        return False
    rope = getattr(config, "rope_parameters", None) or {}
    if rope.get("rope_type", "default") != "default" or getattr(config, "hidden_act", None) != "silu":
        return False
    types = getattr(config, "layer_types", None)
    if types is not None and any(t != "full_attention" for t in types):
        return False
    needed = ("embed_tokens", "layers", "norm", "rotary_emb")
    if not all(hasattr(inner, a) for a in needed) or not hasattr(model, "lm_head"):
        return False
    if len(inner.layers) != config.num_hidden_layers:
        return False
    return True


def decoder_layer(layer, hidden: torch.Tensor, cos, sin, apply_rope, attend) -> torch.Tensor:
    """One decoder layer for a one-token step, as transformers' Llama/Qwen2 layer computes it (the same ops in the
    same order): ``attend(q, k, v)`` (``[n, heads | kv_heads, 1, head]``) writes the cache and returns the attention
    output ``[n, heads, 1, head]``; shared by the lean step and the compiled one
    (:mod:`agents.llm.generation.compiled_decode`)."""
    att = layer.self_attn
    n, shape = hidden.shape[0], (hidden.shape[0], 1, -1, att.head_dim)
    residual = hidden
    x = layer.input_layernorm(hidden)
    q = att.q_proj(x).view(shape).transpose(1, 2)
    k = att.k_proj(x).view(shape).transpose(1, 2)
    v = att.v_proj(x).view(shape).transpose(1, 2)
    q, k = apply_rope(q, k, cos, sin)
    out = attend(q, k, v)
    hidden = residual + att.o_proj(out.transpose(1, 2).contiguous().reshape(n, 1, -1).contiguous())
    return hidden + layer.mlp(layer.post_attention_layernorm(hidden))


def lean_step(model) -> Callable | None:
    """``step(ids [n, 1], positions [n, 1], mask [n, width] (0/1), layers) -> logits [n, V]`` (the last
    position's), ``layers``: the cache's :class:`agents.llm.generation.tree_generation.BufferLayer` list (updated in place);
    or None when the model is not one this step reproduces exactly."""
    if not known(model):
        return None
    config, inner = model.config, model.model
    if config.model_type == "llama":
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
    else:
        from transformers.models.qwen2.modeling_qwen2 import apply_rotary_pos_emb
    sdpa = torch.nn.functional.scaled_dot_product_attention
    attn = [layer.self_attn for layer in inner.layers]
    head = attn[0].head_dim
    groups = attn[0].num_key_value_groups
    kv_heads = config.num_key_value_heads

    def step(ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, layers) -> torch.Tensor:
        n = ids.shape[0]
        hidden = inner.embed_tokens(ids)
        cos, sin = inner.rotary_emb(hidden, position_ids=positions)
        full = bool(mask.all())
        attn_mask = None if full else mask.bool()[:, None, None, :]
        extra = {"enable_gqa": True} if full and groups > 1 else {}
        for layer, att, cache in zip(inner.layers, attn, layers):
            def attend(q, k, v, att=att, cache=cache):
                k, v = cache.update(k, v)
                if groups > 1 and not full:  # transformers' pack_gqa for a one-token query
                    q = q.reshape(n, kv_heads, groups, head)
                out = sdpa(q, k, v, attn_mask=attn_mask, dropout_p=0.0, scale=att.scaling, is_causal=False, **extra)
                return out.reshape(n, -1, 1, head)

            hidden = decoder_layer(layer, hidden, cos, sin, apply_rotary_pos_emb, attend)
        hidden = inner.norm(hidden)
        return model.lm_head(hidden[:, -1:, :])[:, -1]

    return step
