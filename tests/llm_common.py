"""Shared tiny tokenizers/models for the LLM tests (cached per test session; CPU, seconds to build)."""

from __future__ import annotations

import functools

import torch

torch.set_num_threads(1)

ENV_KW = {"objectives": 1, "hops": 2}

TOY_TEXTS = ["say yes", "say no", "<answer>yes</answer>", "<answer>no</answer>", "<search>maybe</search>",
             "<memory>yes no maybe</memory>"] * 5


@functools.lru_cache(maxsize=None)
def memqa_tokenizer():
    from agents.llm.models import build_tokenizer, task_texts

    return build_tokenizer(task_texts("MemQA-v0", ENV_KW, episodes=20, seed=10**6), vocab_size=600)


@functools.lru_cache(maxsize=None)
def toy_tokenizer():
    from agents.llm.models import build_tokenizer

    return build_tokenizer(TOY_TEXTS, vocab_size=40, min_frequency=1, byte_alphabet=False)


def tiny_model(tokenizer, seed: int = 0, **kw):
    from agents.llm.models import build_tiny_model

    kw = {"hidden_size": 32, "layers": 2, "heads": 2, "max_positions": 1024, **kw}
    return build_tiny_model(tokenizer, seed=seed, **kw)


def memqa_envs(n: int = 2, **kw):
    import gymnasium as gym

    import memenv  # noqa: F401

    return [gym.make("MemQA-v0", **{**ENV_KW, **kw}) for _ in range(n)]
