"""Exact attention on every backend for packed multi-row batches: the boundaries and masks each backend gets.

The flash path is transformers' own (``integrations.flash_attention.flash_attention_forward`` and
``modeling_flash_attention_utils._flash_attention_forward``, which decides between varlen with the given
``cu_seq_lens``, varlen inferred from ``position_ids`` (one-row batches only) and plain causal attention over
each row); only the kernel is replaced by a plain-torch varlen kernel, so these tests see exactly what
``flash_attn_varlen_func`` would be given on a GPU. flex_attention runs in eager mode (``torch.compile`` of
flex on CPU took ~31 s for its first call here, so the tests force eager; the mask and the math are the same).
Every packed log-prob must equal the dense reference (each sequence alone, plain causal sdpa) <= 1e-5 in fp32,
on every sequence of every row; and the old inputs (no boundaries) must leak, so the tests can fail.
"""

import functools
import random

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from llm_common import memqa_tokenizer, tiny_model  # noqa: E402

import distill.attention as attention  # noqa: E402
from distill.attention import (VARLEN_PACKINGS, flex_mask_mod, hidden_states, model_body, sequence_runs,  # noqa: E402
                               varlen_boundaries)
from distill.packing import PACKINGS, pack  # noqa: E402
from distill.reconstruct import Segment, TokenSequence  # noqa: E402
from distill.scoring import action_logprobs  # noqa: E402

EMULATED = "memenv_varlen_emulated"
TOL = 1e-5


# ------------------------------------------------------------------ a plain-torch flash-attn kernel
def _attend(q, k, v, causal, scale):
    """q ``[n, Hq, D]``, k/v ``[m, Hk, D]``: softmax attention, causal aligned bottom-right (flash-attn >= 2.1)."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    n, m = q.shape[0], k.shape[0]
    scores = torch.einsum("nhd,mhd->hnm", q.float(), k.float()) * (scale if scale is not None else q.shape[-1] ** -0.5)
    if causal:
        allowed = torch.arange(m)[None, :] <= torch.arange(n)[:, None] + (m - n)
        scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.einsum("hnm,mhd->nhd", scores.softmax(-1), v.float()).to(q.dtype)


CALLS: list[dict] = []


def _varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0, softmax_scale=None,
            causal=False):
    CALLS.append({"kind": "varlen", "tokens": q.shape[0], "cu": cu_seqlens_q.tolist(), "max": max_seqlen_q})
    out = torch.empty_like(q)
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    for i in range(len(cq) - 1):
        assert cq[i + 1] - cq[i] <= max_seqlen_q
        out[cq[i]:cq[i + 1]] = _attend(q[cq[i]:cq[i + 1]], k[ck[i]:ck[i + 1]], v[ck[i]:ck[i + 1]], causal,
                                       softmax_scale)
    return out


def _dense(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, **_):
    CALLS.append({"kind": "dense", "rows": q.shape[0]})
    return torch.stack([_attend(q[b], k[b], v[b], causal, softmax_scale) for b in range(q.shape[0])])


@pytest.fixture
def emulated_flash(monkeypatch):
    """transformers' flash path with the plain-torch kernel, registered as a varlen implementation."""
    from transformers import modeling_flash_attention_utils as fa
    from transformers.integrations.flash_attention import flash_attention_forward

    process = fa._lazy_define_process_function(_varlen)
    monkeypatch.setattr(fa, "lazy_import_flash_attention", lambda *a, **k: (
        (_dense, _varlen, None, fa._pad_input, fa._unpad_input), (process, dict)))
    attention.register_varlen_attention(EMULATED, flash_attention_forward)
    CALLS.clear()
    yield EMULATED
    CALLS.clear()


# ------------------------------------------------------------------ data: sequences with shared prefixes
@functools.lru_cache(maxsize=None)
def _model():
    tok = memqa_tokenizer()
    return tiny_model(tok, kv_heads=1, seed=3).eval()  # grouped-query attention: 2 query heads, 1 kv head


def _sequences(seed: int = 0):
    """Three groups of sequences that share a prefix within each group, varied lengths; each sequence scores
    its tail (one segment, record = its index)."""
    rng = random.Random(seed)
    vocab = _model().config.vocab_size
    out = []
    for _ in range(3):
        prefix = [rng.randrange(2, vocab) for _ in range(rng.randrange(12, 30))]
        for _ in range(rng.randrange(2, 5)):
            tail = [rng.randrange(2, vocab) for _ in range(rng.randrange(4, 25))]
            ids = prefix + tail
            start = len(prefix) + rng.randrange(0, 3)
            out.append(TokenSequence(ids, list(range(len(ids))), [Segment(len(out), start, len(ids) - start)]))
    return out


@functools.lru_cache(maxsize=None)
def _reference():
    """Per sequence, the log-probs of its scored tokens with the sequence alone in its row (plain causal)."""
    model = _model()
    refs = []
    with torch.no_grad():
        for s in _sequences():
            ids = torch.tensor([s.input_ids])
            logits = model(input_ids=ids, position_ids=torch.tensor([s.position_ids]), use_cache=False).logits[0]
            seg = s.segments[0]
            lp = torch.log_softmax(logits[seg.start - 1:seg.start - 1 + seg.length].float(), -1)
            refs.append(lp.gather(-1, ids[0, seg.start:seg.start + seg.length, None])[:, 0])
    return refs


def _batches(method):
    return pack(_sequences(), method, row_len=70, token_budget=10**6)


def _deltas(batch, logprobs):
    """Per (row, sequence index), max |packed - reference| of the sequence's scored tokens."""
    ref = _reference()
    out: dict[tuple[int, int], float] = {}
    for lp, row, rec, t in zip(logprobs.tolist(), batch.rows.tolist(), batch.record_index.tolist(),
                               batch.token_index.tolist()):
        key = (row, rec)
        out[key] = max(out.get(key, 0.0), abs(lp - float(ref[rec][t])))
    return out


def _first_in_row(batch) -> set[int]:
    """Records whose sequence is the first of its row (a leak cannot reach them)."""
    first = {}
    for row, col, rec in zip(batch.rows.tolist(), batch.cols.tolist(), batch.record_index.tolist()):
        if row not in first or col < first[row][0]:
            first[row] = (col, rec)
    return {rec for _, rec in first.values()}


# ------------------------------------------------------------------ flash-attention varlen
def test_varlen_boundaries_cover_every_sequence_of_every_row_and_refuse_shared_prefixes():
    a = TokenSequence([5, 6, 7, 8], [0, 1, 2, 3], [Segment(0, 1, 3)])
    b = TokenSequence([5, 6, 9], [0, 1, 2], [Segment(1, 1, 2)])
    c = TokenSequence([7, 8], [0, 1], [Segment(2, 1, 1)])
    (batch,) = pack([a, b, c], "padding_free", row_len=5, token_budget=100)
    # rows: [a a a a pad] and [b b b c c] (first-fit decreasing)
    assert batch.input_ids.tolist() == [[5, 6, 7, 8, 0], [5, 6, 9, 7, 8]]
    assert sequence_runs(batch) == [[(0, 4), (4, 5)], [(0, 3), (3, 5)]]
    kw = varlen_boundaries(batch)
    assert kw["cu_seq_lens_q"].dtype == torch.int32
    assert kw["cu_seq_lens_q"].tolist() == [0, 4, 5, 8, 10] and kw["cu_seq_lens_k"] is kw["cu_seq_lens_q"]
    assert kw["max_length_q"] == kw["max_length_k"] == 4 and isinstance(kw["max_length_q"], int)
    (padded,) = pack([a, b, c], "padded", token_budget=100)
    assert varlen_boundaries(padded)["cu_seq_lens_q"].tolist() == [0, 4, 7, 8, 10, 12]
    for method in ("shared_prefix", "prefix_tree"):
        (shared,) = pack([a, b, c], method, token_budget=100)
        with pytest.raises(ValueError, match=f"cannot express a {method} batch.*flex_attention"):
            varlen_boundaries(shared)


@pytest.mark.parametrize("method", VARLEN_PACKINGS)
def test_flash_path_with_explicit_boundaries_equals_the_dense_reference_on_every_row(method, emulated_flash,
                                                                                    monkeypatch):
    model = _model()
    monkeypatch.setattr(attention, "select_backend", lambda *a, **k: emulated_flash)
    checked = 0
    with torch.no_grad():
        for batch in _batches(method):
            CALLS.clear()
            lp = action_logprobs(model, batch)
            R, L = batch.input_ids.shape
            # transformers' flash path ran the varlen kernel once per layer over all R x L tokens, with our cuts
            assert [c["kind"] for c in CALLS] == ["varlen"] * model.config.num_hidden_layers
            assert CALLS[0]["tokens"] == R * L
            assert CALLS[0]["cu"] == varlen_boundaries(batch)["cu_seq_lens_q"].tolist()
            deltas = _deltas(batch, lp)
            assert max(deltas.values()) <= TOL, (method, deltas)
            checked += len(deltas)
    assert checked == len(_sequences())
    if method == "padding_free":
        assert any(b.input_ids.shape[0] > 1 for b in _batches(method))  # multi-row batches were tested


def test_without_boundaries_the_flash_path_leaks_across_sequences_of_a_multi_row_batch(emulated_flash):
    """The old inputs (no mask, no cu_seqlens, boundaries left to position_ids): transformers infers them only
    for a one-row batch; with several rows every sequence behind another attends it."""
    model = _model()
    body = model_body(model)
    (batch,) = [b for b in _batches("padding_free") if b.input_ids.shape[0] > 1][:1]
    head = model.get_output_embeddings()

    def old_logprobs(b):
        model.set_attn_implementation(EMULATED)
        try:
            h = body(input_ids=b.input_ids, attention_mask=None, position_ids=b.position_ids,
                     use_cache=False).last_hidden_state
        finally:
            model.set_attn_implementation("sdpa")
        logp = torch.log_softmax(head(h[b.rows, b.cols]).float(), -1)
        return logp.gather(-1, b.targets[:, None])[:, 0]

    with torch.no_grad():
        CALLS.clear()
        deltas = _deltas(batch, old_logprobs(batch))
    assert {c["kind"] for c in CALLS} == {"dense"}  # plain causal attention over each whole row
    first = _first_in_row(batch)
    behind = [d for (row, rec), d in deltas.items() if rec not in first]
    assert behind and min(behind) > 1e-3, deltas  # every sequence packed behind another is wrong
    assert max(d for (row, rec), d in deltas.items() if rec in first) <= TOL  # the first of a row is exact
    # one row: transformers reads the position resets (_is_packed_sequence), so a one-row test would pass
    one = pack(_sequences(), "padding_free", row_len=70, token_budget=70)
    single = next(b for b in one if b.input_ids.shape[0] == 1 and b.record_index.unique().numel() > 1)
    with torch.no_grad():
        CALLS.clear()
        assert max(_deltas(single, old_logprobs(single)).values()) <= TOL
    assert {c["kind"] for c in CALLS} == {"varlen"}


def test_flash_on_a_shared_prefix_batch_fails_clearly_before_any_compute(emulated_flash, monkeypatch):
    monkeypatch.setattr(attention, "select_backend", lambda *a, **k: emulated_flash)
    for method in ("shared_prefix", "prefix_tree"):
        with pytest.raises(ValueError, match="varlen cannot express"):
            hidden_states(_model(), _batches(method)[0])
    assert not CALLS and _model().config._attn_implementation == "sdpa"


# ------------------------------------------------------------------ flex_attention
@pytest.mark.parametrize("method", PACKINGS)
def test_flex_mask_mod_is_exactly_the_4d_mask_multi_row(method):
    for batch in _batches(method):
        R, L = batch.input_ids.shape
        b = torch.arange(R)[:, None, None]
        q = torch.arange(L)[None, :, None]
        kv = torch.arange(L)[None, None, :]
        dense = flex_mask_mod(batch)(b, 0, q, kv)
        assert torch.equal(dense, batch.attention_mask[:, 0])


@pytest.mark.parametrize("method", PACKINGS)
def test_flex_attention_forward_on_cpu_equals_the_dense_reference(method):
    model = _model()
    checked = 0
    with torch.no_grad(), torch.compiler.set_stance("force_eager"):
        for batch in _batches(method):
            lp = action_logprobs(model, batch, backend="flex_attention")
            deltas = _deltas(batch, lp)
            assert max(deltas.values()) <= TOL, (method, deltas)
            checked += len(deltas)
    assert checked == len(_sequences())
    assert model.config._attn_implementation == "sdpa"  # switched back
    assert any(b.input_ids.shape[0] > 1 for b in _batches(method))


def test_dense_sdpa_and_sdpa_blocks_agree_with_the_reference_on_the_same_batches():
    """The two CPU backends on the same multi-row batches (the reference the others are held to)."""
    model = _model()
    with torch.no_grad():
        for method in PACKINGS:
            for backend in ("sdpa", "sdpa_blocks"):
                for batch in _batches(method):
                    assert max(_deltas(batch, action_logprobs(model, batch, backend=backend)).values()) <= TOL


def test_gradients_through_the_flash_path_with_boundaries_equal_the_dense_mask(emulated_flash, monkeypatch):
    """The actor's training forward on the varlen path: log-probs and parameter gradients as with sdpa."""
    model = tiny_model(memqa_tokenizer(), kv_heads=1, seed=4)
    (batch,) = [b for b in _batches("padding_free") if b.input_ids.shape[0] > 1][:1]
    weights = torch.linspace(0.5, 1.5, batch.targets.numel())
    out = {}
    for name, backend in (("flash", emulated_flash), ("sdpa", "sdpa")):
        monkeypatch.setattr(attention, "select_backend", lambda *a, backend=backend, **k: backend)
        lp = action_logprobs(model, batch)
        (lp * weights).sum().backward()
        out[name] = (lp.detach(), torch.cat([p.grad.flatten() for p in model.parameters()]))
        model.zero_grad(set_to_none=True)
    assert torch.allclose(out["flash"][0], out["sdpa"][0], rtol=0, atol=TOL)
    assert out["sdpa"][1].abs().sum() > 0
    # as in tests/test_distill_packing.py: attention summed in another order moves entries by ~2 x 32 eps times
    # the gradient's largest entry
    tol = 2 * 32 * torch.finfo(torch.float32).eps * float(out["sdpa"][1].abs().max())
    assert torch.allclose(out["flash"][1], out["sdpa"][1], rtol=0, atol=tol)


def test_a_real_flash_backend_refuses_a_float32_model():
    (batch,) = _batches("padding_free")[:1]
    with pytest.raises(ValueError, match="flash_attention_2 computes in float16/bfloat16 only"):
        hidden_states(_model(), batch, backend="flash_attention_2")


# ------------------------------------------------------------------ torch_varlen (PyTorch's own varlen kernel)
@pytest.mark.parametrize("method", PACKINGS)
def test_torch_varlen_backend_equals_the_dense_reference_on_every_row(method, monkeypatch):
    """On CPU the backend runs distill.attention.varlen_reference over the same cu_seqlens (and, for a shared
    prefix or a prefix tree, the same gathered keys) it hands torch.nn.attention.varlen.varlen_attn on CUDA."""
    model = _model()
    seen = []
    real = attention.varlen_reference
    monkeypatch.setattr(attention, "varlen_reference", lambda *a, **k: seen.append(a[3].numel()) or real(*a, **k))
    checked = 0
    with torch.no_grad():
        for batch in _batches(method):
            plan = attention.varlen_plan(batch)
            assert (plan["memenv_kv_index"] is None) == (method in VARLEN_PACKINGS)
            if method in VARLEN_PACKINGS:
                assert torch.equal(plan["cu_seq_lens_q"], varlen_boundaries(batch)["cu_seq_lens_q"])
            seen.clear()
            deltas = _deltas(batch, action_logprobs(model, batch, backend="torch_varlen"))
            assert seen == [plan["cu_seq_lens_q"].numel()] * model.config.num_hidden_layers  # the kernel ran
            assert max(deltas.values()) <= TOL, (method, deltas)
            checked += len(deltas)
    assert checked == len(_sequences()) and model.config._attn_implementation == "sdpa"


def test_torch_varlen_gradients_through_gathered_prefix_keys_equal_the_dense_mask():
    model = tiny_model(memqa_tokenizer(), kv_heads=1, seed=4)
    for method in ("shared_prefix", "prefix_tree"):
        (batch,) = _batches(method)[:1]
        weights = torch.linspace(0.5, 1.5, batch.targets.numel())
        out = {}
        for backend in ("torch_varlen", "sdpa"):
            lp = action_logprobs(model, batch, backend=backend)
            (lp * weights).sum().backward()
            out[backend] = (lp.detach(), torch.cat([p.grad.flatten() for p in model.parameters()]))
            model.zero_grad(set_to_none=True)
        assert torch.allclose(out["torch_varlen"][0], out["sdpa"][0], rtol=0, atol=TOL)
        tol = 2 * 32 * torch.finfo(torch.float32).eps * float(out["sdpa"][1].abs().max())
        assert torch.allclose(out["torch_varlen"][1], out["sdpa"][1], rtol=0, atol=tol), method


def test_varlen_reference_matches_the_independent_test_kernel_with_gqa_and_unequal_lengths():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(n, h, 8, generator=g) for n, h in ((12, 4), (15, 2), (15, 2)))
    cu_q = torch.tensor([0, 5, 12], dtype=torch.int32)
    cu_k = torch.tensor([0, 7, 15], dtype=torch.int32)  # keys longer than queries: bottom-right causal
    got = attention.varlen_reference(q, k, v, cu_q, cu_k, 7, 8, causal=True, scale=0.3)
    want = _varlen(q, k, v, cu_q, cu_k, 7, 8, softmax_scale=0.3, causal=True)
    assert torch.allclose(got, want, atol=1e-6)
