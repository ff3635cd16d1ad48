"""Memory credit (MemPO, HiMPO) on hand-made records, against log-probs computed directly with the model."""

import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from llm_common import memqa_tokenizer, tiny_model  # noqa: E402

from agents.llm.records.invocation import InvocationRecord, memory_mask  # noqa: E402
from distill.credit import CreditConfig, apply_memory_credit, memory_credits, split_memory_slot  # noqa: E402

TASK = "<task>\nAnswer the questions.\nQuestion 1: Who founded Datre Foundation?\n</task>"
GOLD = [["Grawi Kaijawul", "G. Kaijawul"]]


def _obs(memory_text, info):
    return f"{TASK}\n<memory>\n{memory_text}\n</memory>\n<information>[turns left: 3]\n{info}\n</information>"


def _record(tok, episode, turn, memory, obs, valid=True, group=0, memory_before=""):
    ids = tok.encode(f"<memory>{memory}</memory><search>Datre Foundation</search>", add_special_tokens=False)
    return InvocationRecord(
        episode, turn, tok.encode(obs + "\n", add_special_tokens=False), ids, [0.0] * len(ids), [1] * len(ids),
        memory_mask(ids, tok), group=group, rollout_id="r0", gold=GOLD, token_advantages=[0.5] * len(ids),
        snapshot={"observation": obs, "valid": valid, "memory_before": memory_before,
                  "memory_after": "SANITISED TEXT NOT THE SAMPLED IDS",
                  "action": f"<memory>{memory}</memory><search>Datre Foundation</search>"})


def _records(tok):
    return [
        _record(tok, "A", 1, "Datre Foundation founder", _obs("", "No search results yet.")),
        _record(tok, "A", 2, "wrong write", _obs("Datre Foundation founder", "Doc 1 Grawi Kaijawul founded it."),
                valid=False),  # discarded by the env: no credit, and not the m_{t-1} of turn 3
        _record(tok, "A", 3, "Grawi Kaijawul founded Datre Foundation",
                _obs("Datre Foundation founder", "Doc 1 Grawi Kaijawul founded it.")),
        _record(tok, "B", 1, "nothing useful", _obs("", "No search results yet.")),
    ]


def _direct_logp(model, tok, before, memory_ids, after):
    """log p(gold | probe) by hand: text pieces tokenised, memory ids inserted, one plain forward."""
    enc = lambda t: tok.encode(t, add_special_tokens=False)  # noqa: E731
    prompt = enc(before) + list(memory_ids) + enc(after + "\n<answer>")
    gold = enc("Grawi Kaijawul")
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + gold])).logits[0]
    logp = torch.log_softmax(logits.float(), -1)
    return sum(float(logp[len(prompt) + t - 1, g]) for t, g in enumerate(gold)), len(gold)


def _mem(tok, text):
    return tok.encode(text, add_special_tokens=False)


def _normalise(values):
    m = sum(values) / len(values)
    sd = math.sqrt(sum((v - m) ** 2 for v in values) / len(values))
    return [(v - m) / (sd + 1e-6) for v in values]


def test_mempo_hand_case():
    tok = memqa_tokenizer()
    model = tiny_model(tok, seed=5).eval()
    records = _records(tok)
    cfg = CreditConfig(kind="mempo", coef=0.7)
    before, after = TASK + "\n<memory>\n", "\n</memory>"
    scores = []
    for text in ("Datre Foundation founder", "Grawi Kaijawul founded Datre Foundation", "nothing useful"):
        lp, n = _direct_logp(model, tok, before, _mem(tok, text), after)
        scores.append(math.exp(lp / n))  # geometric mean of the gold tokens' probabilities
    expected = [0.7 * a for a in _normalise(scores)]  # one GRPO group: episodes A and B
    credits = memory_credits(records, model, tok, cfg)
    assert credits[1] is None  # the invalid write
    # Tolerance from the arithmetic: credit = 0.7 z(s), s = exp(lp / n), lp a sum of n = 11 float32 log-probs of
    # |lp| ~ 70. The batched probe and this plain forward add in other orders (and other kernels on other CPUs),
    # so lp may differ by n float32 roundings of that sum: dlp <= n ulp32(|lp|) ~ 8e-5 (each token's log-softmax
    # error, ~eps32 * 6.4 = 8e-7, is below one ulp of the sum). Then ds <= s dlp / n, and the z-score divides by
    # the scores' spread (sd ~ 1.4e-6 against s ~ 1.7e-3) and moves with the mean and sd too:
    # |dz| <= 2 (1 + max|z|) max|ds| / sd: ~0.03 here, against credits 0.5 apart.
    sd = math.sqrt(sum((s - sum(scores) / len(scores)) ** 2 for s in scores) / len(scores))
    ulp = 2.0 ** (math.floor(math.log2(n * max(abs(math.log(s)) for s in scores))) - 23)
    tol = 0.7 * 2 * (1 + max(abs(z) for z in _normalise(scores))) * max(scores) * ulp / sd
    assert [credits[0], credits[2], credits[3]] == pytest.approx(expected, abs=tol)
    assert len({round(c, 6) for c in expected}) == 3  # the hand case separates the writes
    apply_memory_credit(records, model, tok, cfg)
    for r, c in zip(records, credits):
        for a, m in zip(r.token_advantages, r.memory_mask):
            assert a == pytest.approx(0.5 + (c if (m and c is not None) else 0.0))  # memory tokens only
    assert any(records[0].memory_mask) and not all(records[0].memory_mask)


def test_himpo_hand_case_holds_context_fixed_and_skips_discarded_writes():
    tok = memqa_tokenizer()
    model = tiny_model(tok, seed=6).eval()
    records = _records(tok)
    cfg = CreditConfig(kind="himpo", coef=2.0, gate_temperature=0.5)
    cases = [  # (record, its new memory, the memory it replaced)
        (0, "Datre Foundation founder", ""),
        (2, "Grawi Kaijawul founded Datre Foundation", "Datre Foundation founder"),  # turn 2 was discarded
        (3, "nothing useful", ""),
    ]
    new, old = [], []
    for i, m_new, m_old in cases:
        before, after = split_memory_slot(records[i].snapshot["observation"], cfg)
        new.append(_direct_logp(model, tok, before, _mem(tok, m_new), after)[0])
        old.append(_direct_logp(model, tok, before, _mem(tok, m_old), after)[0])
    z = _normalise(new)
    expected = [2.0 / (1 + math.exp(-zi / 0.5)) * (n - o) for zi, n, o in zip(z, new, old)]
    credits = memory_credits(records, model, tok, cfg)
    assert credits[1] is None
    assert [credits[i] for i, _, _ in cases] == pytest.approx(expected, rel=1e-2, abs=2e-6)
    assert all(abs(e) > 1e-4 for e in expected), expected  # (a random tiny model: small but clear utilities)


def test_split_memory_slot_keeps_the_frame_and_the_context():
    cfg = CreditConfig()
    before, after = split_memory_slot(_obs("old memory", "doc"), cfg)
    assert before.endswith("<memory>\n") and after.startswith("\n</memory>\n<information>")
    assert "old memory" not in before + after and before.startswith(TASK)
    before, after = split_memory_slot("no slot here", cfg)
    assert before == "no slot here\n<memory>\n" and after == "\n</memory>"


def test_no_credit_without_gold_or_memory_and_bad_kind_is_named():
    tok = memqa_tokenizer()
    model = tiny_model(tok, seed=5)
    records = _records(tok)
    records[0].gold = None
    ids = tok.encode("<search>x</search>", add_special_tokens=False)
    records[3] = InvocationRecord("B", 1, [1, 2], ids, [0.0] * len(ids), [1] * len(ids), [0] * len(ids), gold=GOLD,
                                  rollout_id="r0", group=0, snapshot={"valid": True, "observation": "x"})
    credits = memory_credits(records, model, tok, CreditConfig(kind="mempo"))
    assert credits[0] is None and credits[1] is None and credits[3] is None and credits[2] == pytest.approx(0.0)
    assert memory_credits(records, model, tok, CreditConfig()) == [None] * 4
    with pytest.raises(ValueError, match="none, mempo, himpo"):
        CreditConfig(kind="memory")
