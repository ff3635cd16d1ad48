"""Distillation losses against their direct formulas; chunking; JSD(beta) limits; top-k; the vocabulary check."""

import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from llm_common import memqa_tokenizer, tiny_model, toy_tokenizer  # noqa: E402

from distill.losses import (  # noqa: E402
    LOSS_KINDS,
    DistillLossConfig,
    chunked_action_logprobs,
    chunked_distill_loss,
    distill_loss,
    divergence,
    forward_kl,
    fused_head_reverse_kl,
    generalized_jsd,
    reverse_kl,
    top_k_distributions,
)

D = torch.distributions


def _logits(seed, n=5, v=11, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, v, generator=g, dtype=torch.float64) * scale


def _pair(seed=0, **kw):
    s, t = _logits(seed, **kw), _logits(seed + 100, **kw)
    return torch.log_softmax(s, -1), torch.log_softmax(t, -1)


def test_kls_equal_torch_distributions():
    s, t = _pair()
    P, Q = D.Categorical(logits=s), D.Categorical(logits=t)
    assert torch.allclose(reverse_kl(s, t), D.kl_divergence(P, Q), atol=1e-12)
    assert torch.allclose(forward_kl(s, t), D.kl_divergence(Q, P), atol=1e-12)
    assert not torch.allclose(reverse_kl(s, t), forward_kl(s, t))  # the two directions differ here


def test_jsd_equals_explicit_sum():
    s, t = _pair(1)
    ps, pt = s.exp(), t.exp()
    for beta in (0.1, 0.5, 0.9):
        m = beta * pt + (1 - beta) * ps
        expected = (beta * (pt * (pt / m).log()).sum(-1) + (1 - beta) * (ps * (ps / m).log()).sum(-1))
        assert torch.allclose(generalized_jsd(s, t, beta), expected, atol=1e-12)
    # beta = 0.5: the symmetric JSD, bounded by log 2
    j = generalized_jsd(s, t, 0.5)
    assert torch.allclose(j, generalized_jsd(t, s, 0.5), atol=1e-12) and bool((j <= math.log(2)).all())


def test_jsd_limits():
    s, t = _pair(2)
    # the end points are the KLs themselves (GKD / TRL convention)
    assert torch.allclose(generalized_jsd(s, t, 0.0), forward_kl(s, t))
    assert torch.allclose(generalized_jsd(s, t, 1.0), reverse_kl(s, t))
    # and near them JSD(beta) / beta -> KL(teacher || student), JSD(beta) / (1 - beta) -> KL(student || teacher)
    eps = 1e-9  # (the convergence is slow where one distribution is much smaller than eps times the other)
    assert torch.allclose(generalized_jsd(s, t, eps) / eps, forward_kl(s, t), rtol=1e-3)
    assert torch.allclose(generalized_jsd(s, t, 1 - eps) / eps, reverse_kl(s, t), rtol=1e-3)
    assert torch.allclose(generalized_jsd(s, s, 0.3), torch.zeros(s.shape[0], dtype=s.dtype), atol=1e-12)


def test_top_k_with_full_vocabulary_is_exact_and_smaller_k_matches_hand_formula():
    s, t = _pair(3)
    v = s.shape[-1]
    for kind in ("reverse_kl", "forward_kl", "jsd"):
        exact = distill_loss(s, t, DistillLossConfig(kind=kind))
        for mode in ("tail", "renorm"):
            approx = distill_loss(s, t, DistillLossConfig(kind=kind, top_k=v, top_k_mode=mode))
            assert torch.allclose(approx, exact, atol=1e-9), (kind, mode)
            assert torch.allclose(distill_loss(s, t, DistillLossConfig(kind=kind, top_k=10 * v, top_k_mode=mode)),
                                  exact, atol=1e-9)
    # k = 3, tail bucket: reverse KL over the teacher's 3 best tokens + one bucket with the rest, by hand
    k = 3
    idx = t.topk(k, -1).indices
    ps, pt = s.exp().gather(-1, idx), t.exp().gather(-1, idx)
    ps = torch.cat([ps, 1 - ps.sum(-1, keepdim=True)], -1)
    pt = torch.cat([pt, 1 - pt.sum(-1, keepdim=True)], -1)
    expected = (ps * (ps / pt).log()).sum(-1)
    got = distill_loss(s, t, DistillLossConfig(top_k=k, top_k_mode="tail"))
    assert torch.allclose(got, expected, atol=1e-9)
    # renorm: both restricted to the support and renormalised
    qs, qt = ps[:, :k] / ps[:, :k].sum(-1, keepdim=True), pt[:, :k] / pt[:, :k].sum(-1, keepdim=True)
    assert torch.allclose(distill_loss(s, t, DistillLossConfig(top_k=k, top_k_mode="renorm")),
                          (qs * (qs / qt).log()).sum(-1), atol=1e-9)
    assert not torch.allclose(got, distill_loss(s, t, DistillLossConfig()))  # an approximation for k < V
    sl, tl = top_k_distributions(s, t, k)
    assert sl.shape == (s.shape[0], k + 1) and torch.allclose(sl.exp().sum(-1), torch.ones(s.shape[0], dtype=s.dtype))


def test_top_k_tail_gradient_is_finite_when_the_tail_is_empty():
    s = _logits(4).requires_grad_(True)
    t = _logits(5)
    loss = distill_loss(torch.log_softmax(s, -1), torch.log_softmax(t, -1), DistillLossConfig(top_k=s.shape[-1]))
    loss.sum().backward()
    assert torch.isfinite(s.grad).all()


class _Heads(torch.nn.Module):
    def __init__(self, d=6, v=13):
        super().__init__()
        g = torch.Generator().manual_seed(7)
        self.student = torch.nn.Linear(d, v, bias=False)
        self.teacher = torch.nn.Linear(d + 2, v, bias=False)
        with torch.no_grad():
            self.student.weight.copy_(torch.randn(v, d, generator=g))
            self.teacher.weight.copy_(torch.randn(v, d + 2, generator=g))


@pytest.mark.parametrize("kind,top_k", [("reverse_kl", None), ("forward_kl", None), ("jsd", None), ("reverse_kl", 4)])
def test_chunked_equals_unchunked_in_value_and_gradient(kind, top_k):
    heads = _Heads()
    g = torch.Generator().manual_seed(8)
    h_t = torch.randn(10, 8, generator=g)
    h_s0 = torch.randn(10, 6, generator=g)
    results = []
    for chunk in (3, 10_000):
        h_s = h_s0.clone().requires_grad_(True)
        heads.zero_grad()
        cfg = DistillLossConfig(kind=kind, top_k=top_k, chunk=chunk, temperature=1.5)
        loss = chunked_distill_loss(heads.student, h_s, heads.teacher, h_t, cfg)
        loss.mean().backward()
        results.append((loss.detach(), h_s.grad.clone(), heads.student.weight.grad.clone()))
        assert heads.teacher.weight.grad is None  # the teacher gets no gradient
    with torch.no_grad():
        direct = distill_loss(torch.log_softmax(heads.student(h_s0) / 1.5, -1),
                              torch.log_softmax(heads.teacher(h_t) / 1.5, -1), DistillLossConfig(kind=kind, top_k=top_k))
    (a_loss, a_h, a_w), (b_loss, b_h, b_w) = results
    # Tolerances from the arithmetic (float32, eps = 1.19e-7), absolute because they scale with the terms summed,
    # not with the result: a loss sums K + V = 8 + 13 terms (a logit's dot product, then the softmax and the
    # divergence over the vocabulary) of size up to max|log p| (~10 here), in an order that the chunking and the
    # CPU's kernels (AVX2, AVX512) may change: |d loss| <= (K + V) eps max|log p| (~2.6e-5; seen: 2.4e-7). A
    # gradient entry also sums the 10 rows, which the chunks of 3 group differently, with terms below max|grad|
    # (~0.2): (K + V + 10) eps max|grad| (~8e-7; seen: 2e-8).
    eps = torch.finfo(torch.float32).eps
    with torch.no_grad():
        terms = max(float(torch.log_softmax(heads.student(h_s0) / 1.5, -1).abs().max()),
                    float(torch.log_softmax(heads.teacher(h_t) / 1.5, -1).abs().max()))
    tol_loss = (8 + 13) * eps * terms
    tol_grad = (8 + 13 + 10) * eps * float(torch.cat([a_h.flatten(), a_w.flatten()]).abs().max())
    assert torch.allclose(a_loss, b_loss, rtol=0, atol=tol_loss) and torch.allclose(a_loss, direct, rtol=0, atol=tol_loss)
    assert torch.allclose(a_h, b_h, rtol=0, atol=tol_grad) and torch.allclose(a_w, b_w, rtol=0, atol=tol_grad)


def test_chunked_action_logprobs_equal_full_log_softmax():
    heads = _Heads()
    h = torch.randn(9, 6, generator=torch.Generator().manual_seed(3)).requires_grad_(True)
    targets = torch.tensor([0, 1, 2, 3, 4, 5, 6, 7, 8])
    logp, ent = chunked_action_logprobs(heads.student, h, targets, temperature=0.7, chunk=4, entropy=True)
    full = torch.log_softmax(heads.student(h) / 0.7, -1)
    assert torch.allclose(logp, full[torch.arange(9), targets], atol=1e-6)
    assert torch.allclose(ent, D.Categorical(logits=full).entropy(), atol=1e-5)
    logp.sum().backward()
    assert torch.isfinite(h.grad).all() and h.grad.abs().sum() > 0


@pytest.mark.parametrize("chunk,t_ppo,t_distill", [(3, 1.5, 1.5), (10_000, 1.5, 1.5), (3, 0.7, 1.2), (4, 1.0, 1.0)])
def test_fused_head_equals_the_checkpointed_pair_in_value_and_gradient(chunk, t_ppo, t_distill):
    """One student-head application per chunk for the log-probs, entropies and reverse KL, analytic backward:
    the same values and gradients as chunked_action_logprobs + chunked_distill_loss (which apply it 4 times)."""
    g = torch.Generator().manual_seed(5)
    student = torch.nn.Linear(6, 13, bias=False)
    teacher = torch.nn.Linear(8, 13, bias=False)
    with torch.no_grad():
        student.weight.copy_(torch.randn(13, 6, generator=g))
        teacher.weight.copy_(torch.randn(13, 8, generator=g))
    h0, h_t = torch.randn(10, 6, generator=g), torch.randn(10, 8, generator=g)
    targets = torch.randint(0, 13, (10,), generator=g)
    # an arbitrary weighting of the three per-token outputs (as PPO's loss, the entropy bonus and lambda give)
    w_lp, w_ent, w_kl = (torch.randn(10, generator=g) for _ in range(3))
    outs = []
    for fused in (False, True):
        h = h0.clone().requires_grad_(True)
        student.zero_grad()
        if fused:
            logp, ent, kl = fused_head_reverse_kl(student.weight, h, targets, teacher, h_t, t_ppo, chunk,
                                                  distill_temperature=t_distill)
        else:
            logp, ent = chunked_action_logprobs(student, h, targets, t_ppo, chunk, entropy=True)
            kl = chunked_distill_loss(student, h, teacher, h_t, DistillLossConfig(temperature=t_distill, chunk=chunk))
        (w_lp * logp + w_ent * ent + w_kl * kl).sum().backward()
        outs.append((logp.detach(), ent.detach(), kl.detach(), h.grad.clone(), student.weight.grad.clone()))
        assert teacher.weight.grad is None
    for a, b in zip(*outs):
        assert torch.allclose(a, b, rtol=0, atol=1e-5), (a - b).abs().max()
    # the log-probs are the very ones of the unfused forward (what the PPO ratio compares with sampling)
    assert torch.equal(outs[0][0], outs[1][0])
    with pytest.raises(ValueError, match="different vocabularies"):
        fused_head_reverse_kl(student.weight, h0, targets, torch.nn.Linear(8, 12, bias=False), h_t)


def test_fused_head_under_bf16_autocast_gives_the_unfused_log_probs_and_close_gradients():
    """Under a bf16 autocast (PPOConfig.train_autocast) the fused head multiplies in bf16 as autocast does: its
    log-probs are bit for bit those of chunked_action_logprobs under the same autocast (the recomputed old
    log-probs the PPO ratio divides by), and its gradients match the checkpointed pair's to bf16 rounding."""
    g = torch.Generator().manual_seed(8)
    student = torch.nn.Linear(16, 40, bias=False)
    teacher = torch.nn.Linear(12, 40, bias=False)
    with torch.no_grad():
        student.weight.copy_(torch.randn(40, 16, generator=g) / 4)
        teacher.weight.copy_(torch.randn(40, 12, generator=g) / 4)
    h0, h_t = torch.randn(11, 16, generator=g), torch.randn(11, 12, generator=g)
    targets = torch.randint(0, 40, (11,), generator=g)
    w_lp, w_ent, w_kl = (torch.randn(11, generator=g) for _ in range(3))
    outs = []
    for fused in (False, True):
        h = h0.clone().requires_grad_(True)
        student.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            if fused:
                logp, ent, kl = fused_head_reverse_kl(student.weight, h, targets, teacher, h_t, 1.0, 4)
            else:
                logp, ent = chunked_action_logprobs(student, h, targets, 1.0, 4, entropy=True)
                kl = chunked_distill_loss(student, h, teacher, h_t, DistillLossConfig(chunk=4))
        assert logp.dtype == ent.dtype == kl.dtype == torch.float32
        (w_lp * logp + w_ent * ent + w_kl * kl).sum().backward()
        outs.append((logp.detach(), ent.detach(), kl.detach(), h.grad.clone(), student.weight.grad.clone()))
    assert torch.equal(outs[0][0], outs[1][0])
    for a, b in zip(outs[0][1:3], outs[1][1:3]):  # the same bf16 logits, fp32 arithmetic after them
        assert torch.allclose(a, b, rtol=0, atol=1e-5), (a - b).abs().max()
    # the backward's products take dz rounded to bf16 (8 bits of mantissa): relative error ~2^-8 per term
    for a, b in zip(outs[0][3:], outs[1][3:]):
        assert torch.allclose(a, b, rtol=0, atol=2e-2 * float(a.abs().max())), (a - b).abs().max()
    # ... and bf16 did act: the fp32 head's log-probs differ
    fp32 = chunked_action_logprobs(student, h0, targets, 1.0, 4)[0]
    assert not torch.equal(fp32, outs[1][0]) and torch.allclose(fp32, outs[1][0], atol=0.1)


def test_bad_loss_settings_name_the_option():
    with pytest.raises(ValueError, match="reverse_kl, forward_kl, jsd"):
        DistillLossConfig(kind="kl")
    with pytest.raises(ValueError, match="beta"):
        DistillLossConfig(kind="jsd", beta=1.5)
    with pytest.raises(ValueError, match="top_k"):
        DistillLossConfig(top_k=0)
    with pytest.raises(ValueError, match="tail, renorm"):
        DistillLossConfig(top_k=3, top_k_mode="drop")
    with pytest.raises(ValueError, match="kind"):
        divergence(*_pair(), kind="tvd")


def test_teacher_with_another_tokenizer_is_refused_naming_both():
    from distill.teacher import Teacher, VocabularyMismatchError, check_vocabulary

    student_tok, teacher_tok = memqa_tokenizer(), toy_tokenizer()
    teacher = tiny_model(teacher_tok, seed=3)
    calls = []
    teacher.register_forward_hook(lambda *a: calls.append(1))
    with pytest.raises(VocabularyMismatchError) as err:
        Teacher(teacher, teacher_tok, student_tokenizer=student_tok)
    msg = str(err.value)
    assert f"{len(teacher_tok)} tokens" in msg and f"{len(student_tok)} tokens" in msg and "fingerprint" in msg
    assert not calls  # refused before any compute
    # same tokenizer: accepted, frozen, and the shared vocabulary is the heads' width
    student = tiny_model(student_tok, seed=1)
    t = Teacher(tiny_model(student_tok, seed=2), student_tok, student_tokenizer=student_tok, student_model=student)
    assert t.vocab_size == len(student_tok) and not any(p.requires_grad for p in t.model.parameters())
    assert not t.model.training
    # a head narrower than the tokenizer is refused too
    narrow = tiny_model(student_tok, seed=2)
    narrow.resize_token_embeddings(len(student_tok) - 5)
    with pytest.raises(VocabularyMismatchError, match="teacher model's head"):
        check_vocabulary(student_tok, student_tok, narrow, student)


def test_teacher_from_pretrained_checks_before_loading_weights(tmp_path):
    from agents.llm.models.local import save_pretrained
    from distill.teacher import Teacher, VocabularyMismatchError

    teacher_tok = toy_tokenizer()
    save_pretrained(tiny_model(teacher_tok), teacher_tok, tmp_path / "teacher")
    (tmp_path / "teacher" / "model.safetensors").write_bytes(b"not weights")  # loading it would fail differently
    with pytest.raises(VocabularyMismatchError, match="teacher's tokenizer"):
        Teacher.from_pretrained(tmp_path / "teacher", student_tokenizer=memqa_tokenizer())


@pytest.mark.parametrize("kind", LOSS_KINDS)
def test_top_k_with_a_tail_is_a_lower_bound_blind_to_the_tails_shape(kind):
    """The tail bucket merges V - k outcomes: the divergence can only drop (never above the exact one), and
    reshaping the student's tail without changing its mass changes neither the loss nor its gradient's effect."""
    gen = torch.Generator().manual_seed(5)
    student = torch.log_softmax(torch.randn(64, 50, generator=gen) * 2, -1)
    teacher = torch.log_softmax(torch.randn(64, 50, generator=gen) * 2, -1)
    cfg = DistillLossConfig(kind=kind, top_k=5)
    exact = distill_loss(student, teacher, DistillLossConfig(kind=kind))
    approx = distill_loss(student, teacher, cfg)
    assert (approx <= exact + 1e-6).all() and (approx < exact - 1e-3).float().mean() > 0.9
    # the student's tail reshaped (mass kept): same loss
    top = teacher.topk(5, dim=-1).indices
    outside = torch.ones_like(student, dtype=torch.bool).scatter(-1, top, False)
    p = student.exp()
    tail_mass = (p * outside).sum(-1, keepdim=True)
    flat = torch.where(outside, tail_mass / outside.sum(-1, keepdim=True), p)  # the tail spread evenly
    reshaped = distill_loss(flat.log(), teacher, cfg)
    assert torch.allclose(reshaped, approx, atol=1e-5)
    assert not torch.allclose(distill_loss(flat.log(), teacher, DistillLossConfig(kind=kind)), exact, atol=1e-3)


@pytest.mark.parametrize("t", [1.0, 1.5])
def test_fused_head_with_a_teacher_log_prob_of_minus_inf_takes_the_guarded_path_exactly(t):
    """A teacher that gives a token no mass (log-prob -inf) where the student gives it none either: the fused
    head's guarded path (its logits recomputed, as the in-place log-softmax overwrote them) gives the checkpointed
    pair's values and gradients, finite."""
    g = torch.Generator().manual_seed(11)
    student = torch.nn.Linear(6, 13, bias=False)
    with torch.no_grad():
        student.weight.copy_(torch.randn(13, 6, generator=g))
        student.weight[0] = -200.0  # hidden states >= 0.1: token 0's logit <= -120, its probability exactly 0
    teacher_w = torch.randn(13, 8, generator=g)

    def teacher(x):
        z = torch.nn.functional.linear(x, teacher_w)
        z[:, 0] = float("-inf")
        return z

    h0, h_t = torch.rand(10, 6, generator=g) + 0.1, torch.randn(10, 8, generator=g)
    targets = torch.randint(1, 13, (10,), generator=g)
    w_lp, w_ent, w_kl = (torch.randn(10, generator=g) for _ in range(3))
    outs = []
    for fused in (False, True):
        h = h0.clone().requires_grad_(True)
        student.zero_grad()
        if fused:
            logp, ent, kl = fused_head_reverse_kl(student.weight, h, targets, teacher, h_t, t, 4)
        else:
            logp, ent = chunked_action_logprobs(student, h, targets, t, 4, entropy=True)
            kl = chunked_distill_loss(student, h, teacher, h_t, DistillLossConfig(temperature=t, chunk=4))
        (w_lp * logp + w_ent * ent + w_kl * kl).sum().backward()
        outs.append((logp.detach(), ent.detach(), kl.detach(), h.grad.clone(), student.weight.grad.clone()))
    for a, b in zip(*outs):
        assert torch.isfinite(b).all()
        assert torch.allclose(a, b, rtol=0, atol=1e-5), (a - b).abs().max()
    assert torch.equal(outs[0][0], outs[1][0])
