"""The decode steps' LM head on a once-reordered weight (:mod:`agents.llm.generation.packed_head`): the plain
head's logits to float rounding (another summation order), only inside its block, only for no-grad fp32 calls on
an unchanged weight; the tree path samples the same tokens with it as without it."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from llm_common import memqa_envs, memqa_tokenizer, tiny_model  # noqa: E402

from agents.llm.generation import packed_head as packed_head_module  # noqa: E402
from agents.llm.generation.packed_head import MIN_HEAD_BYTES, applicable, packed_head  # noqa: E402
from agents.llm.generation.policy import LLMPolicy  # noqa: E402

pytestmark = pytest.mark.skipif(not applicable(torch.nn.Linear(4, 6, bias=False), min_bytes=0),
                                reason="no oneDNN reorder in this torch build")


class _Model(torch.nn.Module):
    def __init__(self, head):
        super().__init__()
        self.head = head

    def get_output_embeddings(self):
        return self.head


@pytest.mark.parametrize("bias", [False, True])
def test_packed_head_gives_the_plain_logits_to_rounding_inside_its_block_only(bias):
    g = torch.Generator().manual_seed(3)
    head = torch.nn.Linear(64, 1000, bias=bias)
    with torch.no_grad():
        head.weight.copy_(torch.randn(1000, 64, generator=g))
    x = torch.randn(5, 1, 64, generator=g)
    plain = head(x).detach()
    with torch.no_grad(), packed_head(_Model(head), min_bytes=0) as on:
        assert on and "forward" in vars(head)
        got = head(x)
        # fp32 sums of 64 products of ~unit terms (|logit| ~ 8): ~1e-6 relative, 1e-5 with margin
        assert got.shape == plain.shape and torch.allclose(got, plain, rtol=0, atol=1e-5 * float(plain.abs().max()))
        one = x[:1]  # a lone row: the plain matrix-vector product, bit for bit
        assert torch.equal(head(one), torch.nn.functional.linear(one, head.weight, head.bias))
        head.weight.add_(1.0)  # the weight changed in place: the plain product from now on
        assert torch.equal(head(x), torch.nn.functional.linear(x, head.weight, head.bias))
    assert "forward" not in vars(head)
    with packed_head(_Model(head), min_bytes=0):  # a call that needs gradients keeps the plain product (and its graph)
        out = head(x)
        assert out.requires_grad and torch.equal(out.detach(), torch.nn.functional.linear(x, head.weight, head.bias))


def test_packed_head_leaves_heads_it_does_not_fit_alone():
    bf16 = torch.nn.Linear(8, 16).to(torch.bfloat16)
    with packed_head(_Model(bf16)) as on:
        assert not on and "forward" not in vars(bf16)
    with packed_head(_Model(torch.nn.Linear(8, 16)), enabled=False, min_bytes=0) as on:
        assert not on


def test_a_head_under_the_size_floor_keeps_the_plain_product():
    """The reorder costs more than a small head's decode saves (module doc), so by default a head under
    MIN_HEAD_BYTES is left alone: tiny runs decode bit for bit as without the packed head."""
    d = 64
    rows = MIN_HEAD_BYTES // (4 * d)
    small, at_floor = torch.nn.Linear(d, rows - 1, bias=False), torch.nn.Linear(d, rows, bias=False)
    with packed_head(_Model(small)) as on:
        assert not on and "forward" not in vars(small)
    with packed_head(_Model(at_floor)) as on:
        assert on and "forward" in vars(at_floor)
    with packed_head(_Model(small), min_bytes=0) as on:
        assert on


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_tree_path_with_the_packed_head_samples_the_plain_heads_tokens(temperature, monkeypatch):
    monkeypatch.setattr(packed_head_module, "MIN_HEAD_BYTES", 0)  # the tiny model's head is under the floor
    tok = memqa_tokenizer()
    model = tiny_model(tok, seed=3, initializer_range=0.5)
    envs = memqa_envs(3)
    obs = [env.reset(seed=s)[0] for s, env in enumerate(envs)] * 2
    kw = dict(temperature=temperature, max_new_tokens=12, seed=7)
    a = LLMPolicy(model, tok, packed_head=True, **kw).generate(obs)
    b = LLMPolicy(model, tok, packed_head=False, **kw).generate(obs)
    assert [g.response_ids for g in a] == [g.response_ids for g in b]
    for ga, gb in zip(a, b):
        assert (torch.tensor(ga.response_logprobs) - torch.tensor(gb.response_logprobs)).abs().max().item() <= 1e-5


def test_tiny_models_decode_bit_for_bit_as_with_the_plain_head():
    """The tiny experiment models' heads (4,096 x 64-128) are under the floor: packed_head=True changes nothing."""
    tok = memqa_tokenizer()
    model = tiny_model(tok, seed=3, initializer_range=0.5)
    assert model.get_output_embeddings().weight.numel() * 4 < MIN_HEAD_BYTES
    obs = [env.reset(seed=s)[0] for s, env in enumerate(memqa_envs(3))] * 2
    kw = dict(temperature=1.0, max_new_tokens=12, seed=7)
    a = LLMPolicy(model, tok, packed_head=True, **kw).generate(obs)
    b = LLMPolicy(model, tok, packed_head=False, **kw).generate(obs)
    assert [g.response_ids for g in a] == [g.response_ids for g in b]
    assert [g.response_logprobs for g in a] == [g.response_logprobs for g in b]
