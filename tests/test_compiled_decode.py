"""The compiled decode step (``LLMPolicy(compile_decode=True)``, :mod:`agents.llm.generation.compiled_decode`): the same
greedy tokens as the eager decode, token for token, and log-probs within fp32 rounding of it, over rows of different
lengths that finish at different steps and a lone row, without a recompile per step or per call, and after the
weights change in place (a training step) without a recompile and without stale weights; a compilation
that fails warns once and decodes eagerly; models the step does not know keep the forward.

The inductor test compiles two graphs (rows >= 2 and a lone row), ~25-35 s each on the loaded 2-core machine
(cold cache), so it is marked slow; the ``aot_eager`` test traces the same graph (dynamo, the functionalised
in-place cache op, the dynamic shapes) without generating C++ and runs in seconds."""

import warnings

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from llm_common import memqa_envs, memqa_tokenizer, tiny_model  # noqa: E402

from agents.llm.generation.compiled_decode import CompiledStep, compiled_step  # noqa: E402
from agents.llm.generation.policy import LLMPolicy, sequence_logprobs  # noqa: E402

EPS32 = torch.finfo(torch.float32).eps


def _observations():
    envs = memqa_envs(3)
    obs = [env.reset(seed=s)[0] for s, env in enumerate(envs)]
    return [obs[0], obs[1], obs[0][:-25], obs[2], obs[1] + " more words here", "x"]


def _pair(backend: str):
    """A tiny Llama with grouped KV heads (the packed-query attention) and two greedy policies on it, eager and
    compiled; a token one row emits early ends an action, so rows finish at different steps."""
    tok = memqa_tokenizer()
    model = tiny_model(tok, seed=3, arch="llama", heads=2, kv_heads=1, initializer_range=0.5).eval()
    kw = dict(temperature=0.0, max_new_tokens=14, seed=7)
    # the eager side with the plain head: the compiled step computes the head's product as the forward does
    # (the eager path's default packed head sums in another order, agents/llm/generation/packed_head.py)
    fast, slow = LLMPolicy(model, tok, compile_decode=True, **kw), LLMPolicy(model, tok, packed_head=False, **kw)
    fast._compiled = CompiledStep(model, backend)
    obs = _observations()
    responses = [g.response_ids for g in slow.generate(obs)]
    early = next(t for row in responses for t in row[1:len(row) // 2] if any(t not in other for other in responses))
    for p in (fast, slow):
        p.eos_ids = p.eos_ids | {early}
    return model, fast, slow, obs


def _tolerance(model, generations) -> float:
    """fp32 rounding of the fused element-wise ops: each of ~10 per layer (+4 outside) may round differently, a
    relative error of at most eps each in the hidden state, which moves a logit by at most that times the largest
    logit's size; a log-prob moves by at most twice the largest logit change."""
    ops = 10 * model.config.num_hidden_layers + 4
    with torch.no_grad():
        scale = max(model(input_ids=torch.tensor([g.prompt_ids + g.response_ids])).logits.abs().max().item()
                    for g in generations)
    return 2 * ops * EPS32 * max(1.0, scale)


def _check(model, fast, slow, obs, exact: bool) -> None:
    rows = slow.stats["decode_rows"]
    a, b = fast.generate(obs), slow.generate(obs)
    assert fast.stats["decode_rows"] == slow.stats["decode_rows"] - rows > 0
    assert [g.response_ids for g in a] == [g.response_ids for g in b]  # token for token
    assert len({len(g.response_ids) for g in a}) > 1 and max(len(g.response_ids) for g in a) > 4
    tol = 0.0 if exact else _tolerance(model, a)
    worst = max(abs(x - y) for g, h in zip(a, b) for x, y in zip(g.response_logprobs, h.response_logprobs))
    print(f"log-probs: max difference {worst:.2e}, bound {tol:.2e}")
    assert worst <= tol, (worst, tol)
    for g in a:  # the records' round trip
        ref = sequence_logprobs(model, g.prompt_ids, g.response_ids, g.temperature)
        assert (ref - torch.tensor(g.response_logprobs)).abs().max().item() <= 1e-4
    lone_fast, lone_slow = fast.generate(obs[3:4])[0], slow.generate(obs[3:4])[0]  # no masked column
    assert lone_fast.response_ids == lone_slow.response_ids
    assert max(abs(x - y) for x, y in zip(lone_fast.response_logprobs, lone_slow.response_logprobs)) <= tol
    graphs = fast._compiled.compiles
    assert fast._compiled.fallback is None and 1 <= graphs <= 2  # rows >= 2 and a lone row, not one per step
    fast.generate(obs[1:5])  # other rows, other widths: no new graph
    fast.generate(obs[2:3])
    assert fast._compiled.compiles == graphs
    with torch.no_grad():  # a training step changes the weights in place: the graphs read them, not a copy
        for param in model.parameters():
            param.mul_(1.25)
    again_fast, again_slow = fast.generate(obs), slow.generate(obs)
    assert [g.response_ids for g in again_fast] == [g.response_ids for g in again_slow] != [g.response_ids for g in a]
    assert fast._compiled.compiles == graphs


def test_compiled_decode_traced_graph_generates_the_eager_tokens():
    _check(*_pair("aot_eager"), exact=True)  # ATen ops run one by one, no C++: the tracing and the cache op, bit for bit


@pytest.mark.slow  # inductor compiles two graphs: ~70 s cold on the loaded 2-core machine
def test_compiled_decode_generates_the_eager_tokens_and_log_probs_within_rounding():
    _check(*_pair("inductor"), exact=False)


def test_a_failed_compilation_warns_once_and_decodes_eagerly(monkeypatch):
    model, fast, slow, obs = _pair("aot_eager")

    def broken(*args):
        raise RuntimeError("no C++ compiler\nmore detail")

    monkeypatch.setattr(fast._compiled, "compiled", broken)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        a = fast.generate(obs)
    assert [str(w.message) for w in caught if "compile_decode" in str(w.message)] == [
        "compile_decode: torch.compile failed (RuntimeError: no C++ compiler); decoding eagerly"]
    assert fast._compiled.fallback == "RuntimeError: no C++ compiler"
    b = slow.generate(obs)
    assert [g.response_ids for g in a] == [g.response_ids for g in b]
    assert [g.response_logprobs for g in a] == [g.response_logprobs for g in b]  # the eager step, bit for bit


def test_a_compiled_graph_that_disagrees_with_the_eager_step_is_dropped(monkeypatch):
    """Each newly compiled graph's first output is checked against the eager step (under AVX2 kernels the traced
    graph once gave every token wrong): a wrong graph warns once and the policy decodes eagerly, bit for bit."""
    model, fast, slow, obs = _pair("aot_eager")
    compiled = fast._compiled.compiled
    monkeypatch.setattr(fast._compiled, "compiled", lambda *args: compiled(*args) + 1.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        a = fast.generate(obs)
    messages = [str(w.message) for w in caught if "compile_decode" in str(w.message)]
    assert len(messages) == 1 and "disagrees with the eager one" in messages[0]
    assert "disagrees" in fast._compiled.fallback
    b = slow.generate(obs)
    assert [g.response_ids for g in a] == [g.response_ids for g in b]
    assert [g.response_logprobs for g in a] == [g.response_logprobs for g in b]


def test_inductor_skips_its_graph_cache_only_under_a_cpu_capability_override(monkeypatch):
    """inductor's FX graph cache key leaves out the vector ISA ATEN_CPU_CAPABILITY selects: a graph cached under
    AVX512 and served under avx2 gave NaN logits. Under an override the step compiles without that cache."""
    from agents.llm.generation.compiled_decode import inductor_patches

    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    assert inductor_patches() == {"freezing": False}
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    assert inductor_patches() == {"freezing": False, "fx_graph_cache": False}


def test_an_unknown_backend_is_refused_by_name():
    tok = memqa_tokenizer()
    with pytest.raises(ValueError, match="backend must be 'inductor', 'aot_eager' or 'eager', got 'inductr'"):
        CompiledStep(tiny_model(tok, seed=3, arch="llama"), "inductr")


def test_models_the_step_does_not_know_keep_the_forward():
    tok = memqa_tokenizer()
    model = tiny_model(tok, seed=1).eval()
    model.config._attn_implementation = "eager"
    assert compiled_step(model) is None
    policy = LLMPolicy(model, tok, temperature=0.0, max_new_tokens=6, compile_decode=True)
    plain = LLMPolicy(model, tok, temperature=0.0, max_new_tokens=6)
    obs = _observations()[:3]
    assert [g.response_logprobs for g in policy.generate(obs)] == [g.response_logprobs for g in plain.generate(obs)]
    assert policy._compiled is False
