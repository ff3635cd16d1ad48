"""Shared tiny tokenizers/models for the LLM tests (cached per test session; CPU, seconds to build)."""

from __future__ import annotations

import functools

import gymnasium as gym
import torch

torch.set_num_threads(1)

ENV_KW = {"objectives": 1, "hops": 2}

TOY_TEXTS = ["say yes", "say no", "<answer>yes</answer>", "<answer>no</answer>", "<search>maybe</search>",
             "<memory>yes no maybe</memory>"] * 5


@functools.lru_cache(maxsize=None)
def memqa_tokenizer():
    from agents.llm.models.local import build_tokenizer, task_texts

    return build_tokenizer(task_texts("MemQA-v0", ENV_KW, episodes=20, seed=10**6), vocab_size=600)


@functools.lru_cache(maxsize=None)
def toy_tokenizer():
    from agents.llm.models.local import build_tokenizer

    return build_tokenizer(TOY_TEXTS, vocab_size=40, min_frequency=1, byte_alphabet=False)


def tiny_model(tokenizer, seed: int = 0, **kw):
    from agents.llm.models.local import build_tiny_model

    kw = {"hidden_size": 32, "layers": 2, "heads": 2, "max_positions": 1024, **kw}
    return build_tiny_model(tokenizer, seed=seed, **kw)


#: The small world of the tiny pretrained bases saved by :func:`save_tiny_base` (fresh facts, 2 objectives, 2 turns).
TINY_BASE_ENV = {"objectives": 2, "hops": 1, "comparison_rate": 0.0, "max_turns": 2, "fresh_facts": True,
                 "corpus_size": 400}


def save_tiny_base(folder) -> None:
    """A tiny pretrained base (d 32, 3 layers, its tokenizer made on :data:`TINY_BASE_ENV`'s episodes) saved to
    ``folder``: what the end-to-end tests of the real-model presets and benchmarks take in place of SmolLM2."""
    from agents.llm.models.local import make_tiny, save_pretrained

    lm, tok = make_tiny(None, env_kwargs=TINY_BASE_ENV, episodes=8, vocab_size=400, hidden_size=32, layers=3, heads=2)
    save_pretrained(lm, tok, folder)


def memqa_envs(n: int = 2, **kw):
    import gymnasium as gym

    import memenv  # noqa: F401

    return [gym.make("MemQA-v0", **{**ENV_KW, **kw}) for _ in range(n)]


def run_two_ranks_and_reference(ddp_script, ref_script, timeout: float = 120.0) -> None:
    """Run ``ddp_script`` under ``torchrun --standalone --nproc_per_node 2`` (gloo on CPU; the rendezvous on a port
    the OS picks, so tests on several xdist workers never share one) and ``ref_script`` as one plain
    process, side by side, with the repository on ``PYTHONPATH``; fail with the end of its log if either fails.
    Bounded: a hang (mismatched collectives) kills both and fails the test instead of stalling the suite."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    env.pop("WORLD_SIZE", None)
    procs = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                               str(ddp_script)], env=env, cwd=Path(ddp_script).parent,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True),
             subprocess.Popen([sys.executable, str(ref_script)], env=env, cwd=Path(ref_script).parent,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)]
    try:
        logs = [p.communicate(timeout=timeout)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    for p, log in zip(procs, logs):
        assert p.returncode == 0, log[-4000:]


class ToyYes(gym.Env):
    """One turn: reward 1 when the action contains "yes" (a reward a fresh model hits sometimes)."""

    observation_space = gym.spaces.Text(100)
    action_space = gym.spaces.Text(100)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return "say yes", {}

    def step(self, action):
        return "say yes", float("yes" in action), True, False, {}
