"""The lean decode step (``LLMPolicy(fast_decode=True)``, :mod:`agents.llm.generation.lean_decode`): the same tokens and
the same log-probs, bit for bit, as the model's forward (``fast_decode=False``), greedy and sampled, on tiny Qwen2 and
Llama models with and without grouped KV heads, over rows of different lengths that finish at different steps
and a lone row (no masked column); models it does not know keep the forward."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from llm_common import memqa_envs, memqa_tokenizer, tiny_model  # noqa: E402

from agents.llm.generation.lean_decode import lean_step  # noqa: E402
from agents.llm.generation.policy import LLMPolicy, sequence_logprobs  # noqa: E402


def _observations():
    envs = memqa_envs(3)
    obs = [env.reset(seed=s)[0] for s, env in enumerate(envs)]
    return [obs[0], obs[1], obs[0][:-25], obs[2], obs[1] + " more words here", "x"]


@pytest.mark.parametrize("arch,kv_heads", [("qwen2", None), ("llama", 1), ("llama", None)])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_lean_decode_generates_the_forwards_tokens_and_log_probs_exactly(arch, kv_heads, temperature):
    tok = memqa_tokenizer()
    model = tiny_model(tok, seed=3, arch=arch, heads=2, kv_heads=kv_heads, initializer_range=0.5)
    assert lean_step(model.eval()) is not None
    obs = _observations()
    kw = dict(temperature=temperature, max_new_tokens=14, seed=7)
    fast, slow = LLMPolicy(model, tok, fast_decode=True, **kw), LLMPolicy(model, tok, **kw)
    # A token that one row samples early and another never samples ends an action (as eos): rows finish apart.
    responses = [g.response_ids for g in slow.generate(obs)]
    early = next(t for row in responses for t in row[1:len(row) // 2] if any(t not in other for other in responses))
    for p in (fast, slow):
        p.eos_ids = p.eos_ids | {early}
        p.generator.manual_seed(7)
    rows = slow.stats["decode_rows"]
    a, b = fast.generate(obs), slow.generate(obs)
    assert fast.stats["decode_rows"] == slow.stats["decode_rows"] - rows > 0
    assert [g.response_ids for g in a] == [g.response_ids for g in b]
    assert [g.response_logprobs for g in a] == [g.response_logprobs for g in b]  # bit for bit
    assert len({len(g.response_ids) for g in a}) > 1  # rows left the batch at different steps
    assert max(len(g.response_ids) for g in a) > 4
    for g in a:
        ref = sequence_logprobs(model, g.prompt_ids, g.response_ids, g.temperature)
        assert (ref - torch.tensor(g.response_logprobs)).abs().max().item() <= 1e-4
    # a lone row: no column is masked (the forward then attends without a mask)
    assert fast.generate(obs[3:4])[0].response_logprobs == slow.generate(obs[3:4])[0].response_logprobs


def test_models_the_lean_step_does_not_know_keep_the_forward():
    tok = memqa_tokenizer()
    model = tiny_model(tok, seed=1)
    assert lean_step(model.train()) is None  # training mode (dropout): the forward
    model.eval()
    model.config._attn_implementation = "eager"
    assert lean_step(model) is None
    model.config._attn_implementation = "sdpa"
    model.config.model_type = "mistral"
    assert lean_step(model) is None
    assert lean_step(object()) is None
