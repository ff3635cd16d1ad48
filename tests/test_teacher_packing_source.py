"""The oracle record source of benchmarks/teacher_packing.py: records a policy that sampled the oracle's actions
would have written (prompts as the policy encodes them, one episode per task seed, log-probs that RCE
reproduces under every packing)."""

import importlib.util
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from llm_common import memqa_envs, memqa_tokenizer, tiny_model  # noqa: E402

from agents.llm.generation.policy import LLMPolicy  # noqa: E402
from distill.packing import PACKINGS  # noqa: E402
from distill.scoring import rce  # noqa: E402

_SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "teacher_packing.py"


def _benchmark():
    spec = importlib.util.spec_from_file_location("teacher_packing_benchmark", _SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_oracle_records_are_one_episode_per_seed_with_policy_prompts_and_reproducible_logprobs():
    tok = memqa_tokenizer()
    model = tiny_model(tok, max_positions=4096)
    policy = LLMPolicy(model, tok)
    seeds = [3, 4, 5]
    records = _benchmark().oracle_records(policy, memqa_envs(1, max_turns=4)[0], seeds, progress=False)

    episodes = {}
    for r in records:
        episodes.setdefault(r.episode_id, []).append(r)
        assert r.group is None  # no GRPO duplicates of a deterministic policy
        assert r.prompt_ids == policy.encode_prompt(r.snapshot["observation"])
        assert r.response_ids == policy.encode_action(r.snapshot["action"])
        assert len(r.response_logprobs) == len(r.response_ids) and max(r.response_logprobs) <= 0
    assert sorted({r.seed for r in records}) == seeds and len(episodes) == len(seeds)
    for turns in episodes.values():
        assert [r.turn for r in turns] == list(range(1, len(turns) + 1))
        assert 1 < len(turns) <= 4
        assert [r.done for r in turns] == [False] * (len(turns) - 1) + [True]
    # a trained policy's lengths: actions of different lengths, prompts that grow with the memory
    assert len({len(r.response_ids) for r in records}) > 2
    assert len({len(r.prompt_ids) for r in records}) > 2

    n_tokens = sum(len(r) for r in records)
    for method in PACKINGS:
        report = rce(model, records, method)
        assert report["max_abs"] <= 1e-4, report
        if method == "shared_prefix":  # one episode's invocations share their task block
            assert report["tokens"] < 0.9 * n_tokens
