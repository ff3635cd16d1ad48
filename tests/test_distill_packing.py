"""distill reconstruction and packing: exact masks/positions on hand cases, RCE on real rollout records,
the persistent control, unpack, the bad-input checks and the diagnostic."""

import functools

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from llm_common import memqa_envs, memqa_tokenizer, tiny_model, toy_tokenizer  # noqa: E402

from agents.llm.generation.policy import LLMPolicy  # noqa: E402
from agents.llm.records.invocation import InvocationRecord, tokenizer_fingerprint  # noqa: E402
from agents.llm.records.rollouts import records_of, rollout  # noqa: E402
from distill.attention import attention_blocks  # noqa: E402
from distill.diagnose import diagnose  # noqa: E402
from distill.packing import PACKINGS, build_mask, pack, unpack  # noqa: E402
from distill.reconstruct import (REPLY_TEMPLATE, Segment, TokenSequence, aligned, environment_reply,  # noqa: E402
                                 persistent, reconstruct)
from distill.scoring import action_logprobs, check_records, rce, score_records  # noqa: E402

T, F = True, False


def _hand_sequences():
    # A and B share the prefix [1, 2]; C shares nothing. Segment record indices 0, 1, 2.
    a = TokenSequence([1, 2, 3, 4], [0, 1, 2, 3], [Segment(0, 2, 2)])
    b = TokenSequence([1, 2, 5], [0, 1, 2], [Segment(1, 2, 1)])
    c = TokenSequence([7, 8], [0, 1], [Segment(2, 1, 1)])
    return [a, b, c]


def test_padded_rows_are_per_sequence_with_self_attending_padding():
    (batch,) = pack(_hand_sequences(), "padded", pad_id=0)
    assert batch.input_ids.tolist() == [[1, 2, 3, 4], [1, 2, 5, 0], [7, 8, 0, 0]]
    assert batch.position_ids.tolist() == [[0, 1, 2, 3], [0, 1, 2, 0], [0, 1, 0, 0]]
    causal4 = torch.ones(4, 4, dtype=torch.bool).tril()
    assert torch.equal(batch.attention_mask[0, 0], causal4)
    assert batch.attention_mask[1, 0].tolist() == [[T, F, F, F], [T, T, F, F], [T, T, T, F], [F, F, F, T]]
    assert batch.attention_mask[2, 0].tolist() == [[T, F, F, F], [T, T, F, F], [F, F, T, F], [F, F, F, T]]
    # scored tokens in record order, each predicted by the logit one column before it
    assert batch.record_index.tolist() == [0, 0, 1, 2]
    assert batch.token_index.tolist() == [0, 1, 0, 0]
    assert batch.rows.tolist() == [0, 0, 1, 2]
    assert batch.cols.tolist() == [1, 2, 1, 0]
    assert batch.targets.tolist() == [3, 4, 5, 8]
    assert batch.n_tokens == 9 and batch.n_slots == 12
    assert attention_blocks(batch) == [[(0, 4, 0, 0)], [(0, 3, 0, 0), (3, 4, -1, -1)], [(0, 2, 0, 0), (2, 4, -1, -1)]]


def test_padding_free_first_fit_decreasing_block_diagonal_mask_and_reset_positions():
    (batch,) = pack(_hand_sequences(), "padding_free", row_len=5, pad_id=0)
    # FFD: A (4) opens row 0, B (3) does not fit there and opens row 1, C (2) fills row 1
    assert batch.input_ids.tolist() == [[1, 2, 3, 4, 0], [1, 2, 5, 7, 8]]
    assert batch.position_ids.tolist() == [[0, 1, 2, 3, 0], [0, 1, 2, 0, 1]]
    assert batch.attention_mask[0, 0].tolist() == [
        [T, F, F, F, F], [T, T, F, F, F], [T, T, T, F, F], [T, T, T, T, F], [F, F, F, F, T]]
    assert batch.attention_mask[1, 0].tolist() == [
        [T, F, F, F, F], [T, T, F, F, F], [T, T, T, F, F], [F, F, F, T, F], [F, F, F, T, T]]
    assert batch.rows.tolist() == [0, 0, 1, 1] and batch.cols.tolist() == [1, 2, 1, 3]
    assert batch.targets.tolist() == [3, 4, 5, 8]
    # a token budget of one row per forward splits the rows into two batches
    b1, b2 = pack(_hand_sequences(), "padding_free", row_len=5, token_budget=5)
    assert b1.input_ids.tolist() == [[1, 2, 3, 4]] and b2.input_ids.tolist() == [[1, 2, 5, 7, 8]]


def test_sorted_padded_buckets_rows_of_like_length_under_the_same_budget():
    lengths = [3, 9, 4, 8, 5]
    sequences = [TokenSequence(list(range(1, n + 1)), list(range(n)), [Segment(i, 1, n - 1)])
                 for i, n in enumerate(lengths)]
    naive = pack(sequences, "padded", token_budget=18)
    best = pack(sequences, "sorted_padded", token_budget=18)
    # record order: [3, 9] | [4, 8] | [5]; longest first: [9, 8] | [5, 4, 3]
    assert [tuple(b.input_ids.shape) for b in naive] == [(2, 9), (2, 8), (1, 5)]
    assert [tuple(b.input_ids.shape) for b in best] == [(2, 9), (3, 5)]
    assert sum(b.n_slots for b in best) == 33 < sum(b.n_slots for b in naive) == 39
    assert all(b.n_slots <= 18 for b in best)
    per_record = unpack([b.targets for b in best], best, len(lengths))
    assert [p.tolist() for p in per_record] == [list(range(2, n + 1)) for n in lengths]


def test_shared_prefix_keeps_one_copy_and_positions_continue_after_it():
    (batch,) = pack(_hand_sequences(), "shared_prefix", row_len=7, pad_id=0)
    # unit [1 2 | 3 4 | 5] (5 tokens) and C (2 tokens) share one row of 7
    assert batch.input_ids.tolist() == [[1, 2, 3, 4, 5, 7, 8]]
    assert batch.position_ids.tolist() == [[0, 1, 2, 3, 2, 0, 1]]
    assert batch.is_prefix.tolist() == [[T, T, F, F, F, F, F]]
    assert batch.attention_mask[0, 0].tolist() == [
        [T, F, F, F, F, F, F],
        [T, T, F, F, F, F, F],
        [T, T, T, F, F, F, F],  # branch A sees the prefix and itself
        [T, T, T, T, F, F, F],
        [T, T, F, F, T, F, F],  # branch B sees the prefix, not A
        [F, F, F, F, F, T, F],  # C sees only itself
        [F, F, F, F, F, T, T]]
    # B's first sampled token is predicted by the last prefix column
    assert batch.cols.tolist() == [1, 2, 1, 5] and batch.targets.tolist() == [3, 4, 5, 8]
    # the same visibility as query blocks (a, b, prefix start, prefix end) for the sdpa_blocks attention
    assert attention_blocks(batch) == [[(0, 2, 0, 0), (2, 4, 0, 2), (4, 5, 0, 2), (5, 7, 5, 5)]]
    assert batch.n_tokens == 7
    # a row too short for the unit splits it: each part keeps its own prefix copy (a lone branch is unshared)
    batches = pack(_hand_sequences(), "shared_prefix", row_len=4, token_budget=4)
    assert sorted(b.input_ids[0, :b.n_tokens].tolist() for b in batches) == [[1, 2, 3, 4], [1, 2, 5], [7, 8]]
    assert not any(bool(b.is_prefix.any()) for b in batches)


def test_shared_prefix_never_covers_a_scored_token():
    a = TokenSequence([1, 2, 3, 4], [0, 1, 2, 3], [Segment(0, 1, 3)])  # everything after token 0 is sampled
    b = TokenSequence([1, 2, 3, 5], [0, 1, 2, 3], [Segment(1, 2, 2)])
    (batch,) = pack([a, b], "shared_prefix")
    assert batch.input_ids.tolist() == [[1, 2, 3, 4, 2, 3, 5]]
    assert batch.position_ids.tolist() == [[0, 1, 2, 3, 1, 2, 3]]
    assert batch.targets.tolist() == [2, 3, 4, 3, 5]


def test_build_mask_rule_matches_a_direct_loop():
    unit = torch.tensor([[0, 0, 0, 0, 1, 1, -7]])
    seq = torch.tensor([[0, 1, 1, 2, 3, 3, -7]])
    pref = torch.tensor([[T, F, F, F, F, F, F]])
    mask = build_mask(unit, seq, pref)[0, 0]
    for i in range(7):
        for j in range(7):
            want = j <= i and unit[0, i] == unit[0, j] and (seq[0, i] == seq[0, j] or bool(pref[0, j]))
            assert bool(mask[i, j]) == bool(want), (i, j)


def test_pack_rejects_bad_arguments():
    with pytest.raises(ValueError, match="padded.*padding_free.*shared_prefix"):
        pack(_hand_sequences(), "zigzag")
    with pytest.raises(ValueError, match="no sequences"):
        pack([], "padded")
    with pytest.raises(ValueError, match="token_budget"):
        pack(_hand_sequences(), "padded", token_budget=0)


# ------------------------------------------------------------------------------------------ real records
@functools.lru_cache(maxsize=None)
def _rollout_records():
    tok = memqa_tokenizer()
    model = tiny_model(tok)
    policy = LLMPolicy(model, tok, temperature=0.9, max_new_tokens=20, seed=0)
    # seeds 0 and 1 twice each: two GRPO groups of two episodes
    records = records_of(rollout(policy, memqa_envs(2), [0, 1, 0, 1], groups=[0, 1, 0, 1]))
    return model, tok, records


@pytest.mark.parametrize("method", PACKINGS)
@pytest.mark.parametrize("sizes", [{}, {"row_len": 600, "token_budget": 1200},
                                   {"row_len": 600, "token_budget": 1200, "backend": "sdpa_blocks"}])
def test_rce_every_packing_reproduces_the_sampled_logprobs(method, sizes):
    model, tok, records = _rollout_records()
    report = rce(model, records, method, **sizes)
    assert report["scored"] == sum(len(r.response_ids) for r in records)
    assert report["max_abs"] <= 1e-4, report
    if method == "shared_prefix":  # the GRPO groups share their task block: fewer tokens than the invocations
        assert report["tokens"] < 0.8 * sum(len(r) for r in records)
    if method == "padding_free":
        assert report["tokens"] == sum(len(r) for r in records)


def test_unpack_round_trips_to_each_record_and_batches_are_disjoint():
    model, tok, records = _rollout_records()
    for method in PACKINGS:
        batches = pack(aligned(records), method, records=records, row_len=700, token_budget=1400)
        assert len(batches) > 1
        per_record = unpack([b.targets for b in batches], batches, len(records))
        assert [p.tolist() for p in per_record] == [r.response_ids for r in records]
        # the ids the rows hold at (row, col + 1) for non-prefix columns are the targets themselves (a prefix
        # tree's branches start anywhere: tests/test_prefix_tree.py checks each scored token's context there)
        for b in batches if method != "prefix_tree" else []:
            nxt = b.input_ids[b.rows, b.cols + 1]
            branch = ~b.is_prefix[b.rows, b.cols + 1]
            assert torch.equal(nxt[branch], b.targets[branch])
    with pytest.raises(ValueError, match="values"):
        unpack(torch.zeros(3), batches[0], len(records))


def test_action_logprobs_gradients_flow_and_agree_across_attention_backends():
    model, tok, records = _rollout_records()
    records = [r for r in records if r.group == 0][:6]
    (batch,) = pack(aligned(records), "shared_prefix", records=records)
    assert batch.is_prefix.any()
    temps = torch.tensor([r.temperature for r in records])[batch.record_index]
    ref = torch.cat([torch.tensor(r.response_logprobs) for r in records])
    grads = {}
    for backend in ("sdpa", "sdpa_blocks"):
        lp = action_logprobs(model, batch, temps, backend=backend)
        lp.sum().backward()
        grads[backend] = torch.cat([p.grad.flatten() for p in model.parameters()])
        model.zero_grad(set_to_none=True)
        assert (lp.detach() - ref).abs().max() <= 1e-4, backend
    assert grads["sdpa"].abs().sum() > 0
    # Tolerance from the arithmetic (float32, eps = 1.19e-7): the backends sum attention in other orders, which
    # moves each attention output by a few eps; the backward carries that through 2 layers of 32-wide matmuls
    # into sums over every scored token, so an entry moves by up to ~2 * 32 eps times the gradient's scale (its
    # largest entry, ~11 here: small entries are sums of cancelling terms of that size, so the bound is absolute,
    # not relative): ~8e-5; seen 1.6e-6 on AVX512 and AVX2 (the fixed atol=1e-5, rtol=1e-4 gave entries near 0
    # only 1e-5).
    tol = 2 * 32 * torch.finfo(torch.float32).eps * float(grads["sdpa"].abs().max())
    assert torch.allclose(grads["sdpa"], grads["sdpa_blocks"], rtol=0, atol=tol)
    assert model.config._attn_implementation == "sdpa"  # the backend switch is undone


def test_persistent_keeps_sampled_ids_and_tokenises_only_env_replies():
    model, tok, records = _rollout_records()
    sequences = persistent(records, tok)
    episodes = {(r.rollout_id, r.episode_id) for r in records}
    assert len(sequences) == len(episodes)
    for s in sequences:
        members = [records[seg.record] for seg in s.segments]
        assert [r.turn for r in members] == sorted(r.turn for r in members)
        assert s.input_ids[:s.segments[0].start] == members[0].prompt_ids
        assert s.position_ids == list(range(len(s.input_ids)))
        for k, seg in enumerate(s.segments):
            assert s.input_ids[seg.start:seg.start + seg.length] == members[k].response_ids  # exactly as sampled
            if k + 1 < len(s.segments):  # between two actions: the env's reply, tokenised
                between = s.input_ids[seg.start + seg.length:s.segments[k + 1].start]
                reply = environment_reply(members[k].snapshot["observation"], members[k + 1].snapshot["observation"])
                assert reply.startswith("<information>") and reply in members[k + 1].snapshot["observation"]
                assert between == tok.encode(REPLY_TEMPLATE.format(reply=reply), add_special_tokens=False)
        assert len(s.input_ids) == s.segments[-1].start + s.segments[-1].length  # nothing after the last action
    assert reconstruct(records, "persistent", tok)[0].input_ids == sequences[0].input_ids
    with pytest.raises(ValueError, match="tokenizer"):
        reconstruct(records, "persistent")
    with pytest.raises(ValueError, match="aligned.*persistent"):
        reconstruct(records, "flattened")


def test_environment_reply_takes_the_newest_information_block_or_the_new_suffix():
    prev = "<task>q</task>\n<memory>\n\n</memory>\n<information>[turns left: 3]\nNo results.\n</information>"
    nxt = "<task>q</task>\n<memory>\nm\n</memory>\n<information>[turns left: 2]\nDoc 1 x\n</information>"
    assert environment_reply(prev, nxt) == "<information>[turns left: 2]\nDoc 1 x\n</information>"
    assert environment_reply("chunk 1 of a book", "chunk 1 of a book; chunk 2") == "; chunk 2"


def test_persistent_control_moves_logprobs_and_the_diagnostic_reports_it():
    model, tok, records = _rollout_records()
    table = diagnose(records, model, tok, clip=0.2, row_len=800, token_budget=1600)
    assert table["method"].tolist() == ["aligned", "padding_free", "shared_prefix", "persistent"]
    rows = table.set_index("method")
    n = sum(len(r.response_ids) for r in records)
    assert (rows["action_tokens"] == n).all()
    for m in ("aligned", "padding_free", "shared_prefix"):
        assert rows.loc[m, "max_abs_dlogp"] <= 1e-4
        assert rows.loc[m, "top1_flips"] == 0 and rows.loc[m, "clip_share"] == 0.0
    assert rows.loc["aligned", "saved_vs_padded"] == 0.0
    assert rows.loc["shared_prefix", "saved_vs_padded"] > rows.loc["padding_free", "saved_vs_padded"] > 0
    # the persistent control scores actions after text the policy never saw
    persistent_row = rows.loc["persistent"]
    assert persistent_row["max_abs_dlogp"] > 1e-3
    assert persistent_row["p99_abs_dlogp"] <= persistent_row["max_abs_dlogp"]
    # the same quantities computed directly
    direct = score_records(model, records, "padded", reconstruction="persistent", tokenizer=tok)
    delta = torch.cat(direct["logprobs"]) - torch.cat([torch.tensor(r.response_logprobs) for r in records])
    assert persistent_row["max_abs_dlogp"] == pytest.approx(float(delta.abs().max()), abs=1e-6)
    outside = ((delta.exp() < 0.8) | (delta.exp() > 1.2)).float().mean()
    assert persistent_row["clip_share"] == pytest.approx(float(outside), abs=1e-9)
    with pytest.raises(ValueError, match="methods"):
        diagnose(records, model, tok, methods=("aligned", "flat"))
    with pytest.raises(ValueError, match="tokenizer"):
        diagnose(records, model, None)


# ------------------------------------------------------------------------------------------ bad input
def _record(**kw):
    base = dict(episode_id="ep7", turn=3, prompt_ids=[5, 6, 7], response_ids=[8, 9], response_logprobs=[-1.0, -2.0],
                action_mask=[1, 1], memory_mask=[0, 0], rollout_id="r42")
    return InvocationRecord(**{**base, **kw})


def test_check_records_names_the_bad_record_before_any_compute():
    tok = memqa_tokenizer()
    model = tiny_model(tok, max_positions=64)
    vocab = model.get_input_embeddings().num_embeddings
    fp = tokenizer_fingerprint(tok)
    check_records([_record(tokenizer_fingerprint=fp)], model, tok)  # fine
    with pytest.raises(ValueError, match="empty"):
        check_records([], model, tok)
    named = r"episode_id='ep7', turn=3, rollout_id='r42'"
    with pytest.raises(ValueError, match=rf"{named}.*token id {vocab} outside .*\[0, {vocab}\)"):
        check_records([_record(), _record(response_ids=[8, vocab])], model)
    with pytest.raises(ValueError, match=rf"{named}.*70 tokens.*max positions \(64\)"):
        check_records([_record(prompt_ids=[5] * 68)], model)
    other = tokenizer_fingerprint(toy_tokenizer())
    assert other != fp
    with pytest.raises(ValueError, match=rf"{named}.*tokenizer {other}.*model's tokenizer is {fp}"):
        check_records([_record(tokenizer_fingerprint=other)], model, tok)
    with pytest.raises(ValueError, match=rf"turn=4.*{other}.*turn=3.*{fp}"):
        check_records([_record(tokenizer_fingerprint=fp), _record(turn=4, tokenizer_fingerprint=other)], model)
    with pytest.raises(ValueError, match=rf"{named}.*empty prompt"):
        check_records([_record(prompt_ids=[])], model)
    # scoring runs the checks first
    with pytest.raises(ValueError, match="empty"):
        rce(model, [], "padded")
    with pytest.raises(ValueError, match=named):
        score_records(model, [_record(tokenizer_fingerprint=other)], tokenizer=tok)


@pytest.mark.parametrize("arch,attn", [("llama", "sdpa"), ("qwen2", "eager")])
def test_packings_match_one_sequence_scoring_on_other_architectures_and_attention(arch, attn):
    from agents.llm.generation.policy import sequence_logprobs

    _, tok, records = _rollout_records()
    records = records[:10]
    model = tiny_model(tok, arch=arch, seed=5)
    if attn != "sdpa":
        model.set_attn_implementation(attn)
    ref = torch.cat([sequence_logprobs(model, r.prompt_ids, r.response_ids, r.temperature) for r in records])
    for method in PACKINGS:
        got = torch.cat(score_records(model, records, method, row_len=900)["logprobs"])
        assert (got - ref).abs().max() <= 1e-4, method


def test_sdpa_blocks_over_several_rows_with_padding_matches_the_dense_mask_with_gradients(monkeypatch):
    import distill.attention as attention

    model, tok, records = _rollout_records()
    sequences = aligned(records)
    # short rows: units split (each piece with its own prefix copy), several rows per batch, padded row ends
    (batch,) = pack(sequences, "shared_prefix", records=records, row_len=400, token_budget=10**6)
    assert batch.input_ids.shape[0] > 2 and batch.is_prefix.any() and (batch.unit_ids < 0).any()
    plans = attention._block_plans(batch, torch.float32, torch.device("cpu"))
    for plan, blocks in zip(plans, attention_blocks(batch)):
        assert sum(plan.sizes) == batch.input_ids.shape[1]  # the blocks tile the row: one split per row
        for (a, b, p0, p1), block in zip(blocks, plan.blocks):
            if p0 >= 0 and p1 > p0:  # a branch: its prefix is the block that starts at p0, mask [n, p + n]
                (k,), mask = block
                assert blocks[k][:2] == (p0, p1) and mask.shape[-2:] == (b - a, p1 - p0 + b - a)
    seen_masks = []
    real = attention._sdpa_blocks_attention

    def spy(module, query, key, value, attention_mask, **kw):
        seen_masks.append(attention_mask)
        return real(module, query, key, value, attention_mask, **kw)

    monkeypatch.setattr(attention, "_sdpa_blocks_attention", spy)
    temps = torch.tensor([r.temperature for r in records])[batch.record_index]
    out = {}
    for backend in ("sdpa", "sdpa_blocks"):
        lp = action_logprobs(model, batch, temps, backend=backend)
        (lp * torch.linspace(0.5, 1.5, lp.numel())).sum().backward()
        out[backend] = (lp.detach(), torch.cat([p.grad.flatten() for p in model.parameters()]))
        model.zero_grad(set_to_none=True)
    # the block attention ran, and transformers built no dense [R, 1, L, L] mask for it
    assert seen_masks and all(m is None for m in seen_masks)
    assert torch.allclose(out["sdpa"][0], out["sdpa_blocks"][0], atol=1e-5)
    # Tolerance from the arithmetic, as in test_action_logprobs_gradients_flow_and_agree_across_attention_backends:
    # ~2 * 32 eps times the gradient's largest entry (~18 here): ~1.3e-4; seen 5.7e-6 (AVX2), 3.8e-6 (AVX512).
    tol = 2 * 32 * torch.finfo(torch.float32).eps * float(out["sdpa"][1].abs().max())
    assert torch.allclose(out["sdpa"][1], out["sdpa_blocks"][1], rtol=0, atol=tol)


def test_teacher_views_part_after_the_first_turn_and_next_actions_are_greedy_under_each():
    """Turn 0's aligned and persistent views are the same prompt; from turn 1 the persistent view is the flattened
    transcript (the first prompt, then the sampled ids, then the env's reply) and the aligned one the record's own
    prompt. The teacher's next action under a view is its greedy continuation of exactly those ids."""
    from distill.diagnose import action_kind, teacher_next_actions, teacher_views

    model, tok, records = _rollout_records()
    views = teacher_views(records, tok)
    assert sorted(v["record"] for v in views) == list(range(len(records)))
    later = [v for v in views if v["turn"] > 0]
    assert later, "the rollout must have episodes of two or more turns"
    for v in views:
        r = records[v["record"]]
        assert v["aligned"] == list(r.prompt_ids)
        if v["turn"] == 0:
            assert v["persistent"] == v["aligned"]
    for v in later:
        first = next(u for u in views if u["turn"] == 0 and u["record"] < v["record"]
                     and records[u["record"]].episode_id == records[v["record"]].episode_id)
        prev = next(u for u in views if u["turn"] == v["turn"] - 1
                    and records[u["record"]].episode_id == records[v["record"]].episode_id)
        # the transcript holds the first prompt, then the previous action's sampled ids exactly, then more text
        assert v["persistent"][:len(first["aligned"])] == first["aligned"]
        sampled = list(records[prev["record"]].response_ids)
        assert v["persistent"][len(prev["persistent"]):len(prev["persistent"]) + len(sampled)] == sampled
        assert len(v["persistent"]) > len(prev["persistent"]) + len(sampled)
    table = teacher_next_actions(model, tok, records, max_new_tokens=6)
    assert len(table) == 2 * len(later) and set(table["turn"]) == {v["turn"] for v in later}
    row = table.iloc[1]  # the persistent view of the first later invocation
    ids = torch.tensor([later[0]["persistent"]])
    greedy = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=False,
                            pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id)
    full = tok.decode(greedy[0, ids.shape[1]:], skip_special_tokens=True)
    # generation stops after the policy's first stop string, the text up to it unchanged
    assert full.startswith(row["text"]) and (row["text"] == full or row["text"].endswith(("</search>", "</answer>")))
    assert row["view"] == "persistent" and row["context_tokens"] == ids.shape[1]
    assert set(table["kind"]) <= {"search", "answer", "invalid"}
    # beside it, what the student itself sampled at that invocation (the same for both views of it)
    for _, r in table.iterrows():
        sampled = tok.decode(records[r["record"]].response_ids, skip_special_tokens=True)
        assert r["student_kind"] == action_kind(sampled)
    assert (table.groupby("record")["student_kind"].nunique() == 1).all()
    # whether answering was possible in each view: every objective's gold answer in that view's text
    from distill.views import information_gaps

    gaps = information_gaps(records, tok).set_index("record")
    for _, r in table.iterrows():
        assert r["answerable"] == gaps.loc[r["record"], f"answerable_{r['view']}"]
    with pytest.raises(ValueError, match="min_turn"):
        teacher_next_actions(model, tok, records, min_turn=-1)


@pytest.mark.parametrize("text, kind", [
    ("<memory>a: 1</memory><search>b</search>then more text", "search"),
    ("<memory>a: 1</memory><answer>1; 2</answer></answer><memory>x</memory>", "answer"),
    ("<memory>a</memory><search>b</search></search>1991</search><answer>x</answer>", "search"),
    ("<search>b</search>", "invalid"),  # no memory rewrite first
    ("<memory>a</memory>", "invalid"),  # no tool call
    ("The answer is 5", "invalid"),
])
def test_action_kind_reads_the_action_as_the_policy_would_have_cut_it(text, kind):
    from distill.diagnose import action_kind

    assert action_kind(text) == kind
