"""Prefix-tree packing (``pack(..., "prefix_tree")``): the trie layout on a hand case, every scored token seeing
exactly its own record's prefix, and log-probs and gradients equal to one forward per record (the dense
reference), over several rows, split tries and both CPU attentions; the teacher and trainer paths use it."""

import functools

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from llm_common import memqa_envs, memqa_tokenizer, tiny_model  # noqa: E402

from agents.llm.generation.policy import LLMPolicy  # noqa: E402
from agents.llm.records.rollouts import records_of, rollout  # noqa: E402
from distill.attention import SDPA_BLOCKS, select_backend  # noqa: E402
from distill.packing import build_tree_mask, pack, tree_pieces, unpack  # noqa: E402
from distill.reconstruct import Segment, TokenSequence, aligned  # noqa: E402
from distill.scoring import action_logprobs  # noqa: E402

EPS = torch.finfo(torch.float32).eps


def _hand_sequences():
    # A and B share [1, 2, 3]; C shares [1, 2] with both; D shares nothing.
    a = TokenSequence([1, 2, 3, 4, 5], [0, 1, 2, 3, 4], [Segment(0, 3, 2)])
    b = TokenSequence([1, 2, 3, 6], [0, 1, 2, 3], [Segment(1, 3, 1)])
    c = TokenSequence([1, 2, 7, 8], [0, 1, 2, 3], [Segment(2, 2, 2)])
    d = TokenSequence([9, 9], [0, 1], [Segment(3, 1, 1)])
    return [d, c, a, b]  # input order does not matter: the trie is laid out in lexicographic order


def test_hand_trie_layout_subtree_ends_pieces_and_scored_columns():
    (batch,) = pack(_hand_sequences(), "prefix_tree", pad_id=0)
    assert batch.input_ids.tolist() == [[1, 2, 3, 4, 5, 6, 7, 8, 9, 9]]
    assert batch.position_ids.tolist() == [[0, 1, 2, 3, 4, 3, 2, 3, 0, 1]]  # each path continues its own positions
    assert batch.tree_end.tolist() == [[8, 8, 6, 5, 5, 6, 8, 8, 10, 10]]
    assert batch.n_tokens == 10 and batch.is_prefix.tolist() == [[True] * 3 + [False] * 7]
    # query i sees key j iff j is i or an ancestor of i: the tree's parent links written out by hand
    parent = {0: None, 1: 0, 2: 1, 3: 2, 4: 3, 5: 2, 6: 1, 7: 6, 8: None, 9: 8}
    expected = torch.zeros(10, 10, dtype=torch.bool)
    for i in range(10):
        j = i
        while j is not None:
            expected[i, j] = True
            j = parent[j]
    assert torch.equal(batch.attention_mask[0, 0], expected)
    assert torch.equal(build_tree_mask(batch.tree_end)[0, 0], expected)
    # chains of the trie, each attending the chains above it
    assert tree_pieces(batch) == [[(0, 2, ()), (2, 3, (0,)), (3, 5, (0, 1)), (5, 6, (0, 1)), (6, 8, (0,)),
                                   (8, 10, ())]]
    # (record, token) -> column of the predicting logit, and the target
    got = list(zip(batch.record_index.tolist(), batch.token_index.tolist(), batch.cols.tolist(),
                   batch.targets.tolist()))
    assert got == [(0, 0, 2, 4), (0, 1, 3, 5), (1, 0, 2, 6), (2, 0, 1, 7), (2, 1, 6, 8), (3, 0, 8, 9)]


def test_identical_prompts_share_their_scoring_logit_and_padding_attends_only_itself():
    # two records with one prompt and different actions: the logit of the first action token is one column
    a = TokenSequence([1, 2, 3], [0, 1, 2], [Segment(0, 2, 1)])
    b = TokenSequence([1, 2, 4, 5], [0, 1, 2, 3], [Segment(1, 2, 2)])
    c = TokenSequence([1, 2, 4, 6, 7, 8, 9], list(range(7)), [Segment(2, 3, 4)])
    batches = pack([a, b, c], "prefix_tree", row_len=7, token_budget=14, pad_id=0)
    (batch,) = batches
    assert batch.input_ids.shape == (2, 7)  # c's trie does not fit next to a, b's: two rows, the first padded
    first = {(r, t): (row, col) for r, t, row, col in zip(batch.record_index.tolist(), batch.token_index.tolist(),
                                                         batch.rows.tolist(), batch.cols.tolist())}
    assert first[0, 0] == first[1, 0]
    pad = batch.unit_ids < 0
    assert pad.any()
    mask = batch.attention_mask[:, 0]
    rows, cols = pad.nonzero(as_tuple=True)
    for r, j in zip(rows.tolist(), cols.tolist()):
        assert mask[r, j].nonzero().flatten().tolist() == [j]  # padding sees itself only
        assert mask[r, :, j].nonzero().flatten().tolist() == [j]  # and nothing real sees it


def test_a_repeated_sequence_adds_no_tokens_and_scores_on_the_same_columns():
    a = TokenSequence([1, 2, 3, 4], [0, 1, 2, 3], [Segment(0, 2, 2)])
    twin = TokenSequence([1, 2, 3, 4], [0, 1, 2, 3], [Segment(1, 2, 2)])
    shifted = TokenSequence([1, 2, 3, 4], [5, 6, 7, 8], [Segment(2, 2, 2)])  # same ids, other positions
    (batch,) = pack([a, twin, shifted], "prefix_tree")
    assert batch.n_tokens == 8  # the twin is free; other positions are another context, not shared
    cols = dict(zip(zip(batch.record_index.tolist(), batch.token_index.tolist()), batch.cols.tolist()))
    assert [cols[0, t] for t in (0, 1)] == [cols[1, t] for t in (0, 1)]
    assert {cols[2, 0], cols[2, 1]}.isdisjoint({cols[0, 0], cols[0, 1]})


@functools.lru_cache(maxsize=None)
def _group_records():
    tok = memqa_tokenizer()
    model = tiny_model(tok)
    policy = LLMPolicy(model, tok, temperature=0.9, max_new_tokens=20, seed=0)
    # two GRPO groups of three episodes (seeds 0 and 1)
    seeds = [0, 1, 0, 1, 0, 1]
    records = records_of(rollout(policy, memqa_envs(3, max_turns=4), seeds, groups=seeds))
    return model, tok, records


SIZES = [{}, {"row_len": 500, "token_budget": 1500}, {"row_len": 350, "token_budget": 10**6}]


@pytest.mark.parametrize("sizes", SIZES)
def test_every_scored_token_sees_exactly_its_record_prefix(sizes):
    _, _, records = _group_records()
    sequences = aligned(records)
    batches = pack(sequences, "prefix_tree", records=records, **sizes)
    scored = 0
    for b in batches:
        mask = b.attention_mask[:, 0]
        pieces = tree_pieces(b)
        for k, (row, col) in enumerate(zip(b.rows.tolist(), b.cols.tolist())):
            s = sequences[int(b.record_index[k])]
            j = len(records[int(b.record_index[k])].prompt_ids) + int(b.token_index[k]) - 1
            seen = mask[row, col].nonzero().flatten()
            assert b.input_ids[row, seen].tolist() == s.input_ids[:j + 1]
            assert b.position_ids[row, seen].tolist() == s.position_ids[:j + 1]
            assert int(b.targets[k]) == s.input_ids[j + 1]
            scored += 1
        # the block plan attends exactly what the dense mask allows
        for row, row_pieces in enumerate(pieces):
            assert sum(bb - a for a, bb, _ in row_pieces) == b.input_ids.shape[1]
            for a, bb, ancestors in row_pieces:
                if ancestors is None:
                    continue
                context = [c for p in ancestors for c in range(row_pieces[p][0], row_pieces[p][1])]
                for i in range(a, bb):
                    assert mask[row, i].nonzero().flatten().tolist() == context + list(range(a, i + 1))
    assert scored == sum(len(r.response_ids) for r in records)
    if not sizes:  # whole tries: fewer tokens than one copy of each shared prefix per group
        shared = pack(sequences, "shared_prefix", records=records)
        assert sum(b.n_tokens for b in batches) < sum(b.n_tokens for b in shared) < sum(len(s) for s in sequences)
        assert len(batches) == 1 and batches[0].input_ids.shape[0] == 2  # one trie per GRPO group, one row each


def _weighted_pass(model, batches, records, backend):
    """Log-probs per record and the gradient of a weighted sum of them (weights fixed per scored token)."""
    temps = torch.tensor([r.temperature for r in records])
    lps = [action_logprobs(model, b, temps[b.record_index], backend=backend) for b in batches]
    per_record = unpack(lps, batches, len(records))
    flat = torch.cat(per_record)
    weights = torch.linspace(0.5, 1.5, flat.numel())
    (flat * weights).sum().backward()
    grad = torch.cat([p.grad.flatten() for p in model.parameters()])
    model.zero_grad(set_to_none=True)
    return flat.detach(), grad


@pytest.mark.parametrize("sizes", SIZES)
def test_logprobs_and_gradients_equal_one_forward_per_record(sizes):
    model, _, records = _group_records()
    sequences = aligned(records)
    reference = [pack([s], "padded") for s in sequences]  # each record alone, dense causal attention
    ref_lp, ref_grad = [], 0
    for i, batches in enumerate(reference):
        lp = action_logprobs(model, batches[0], records[i].temperature, backend="sdpa")
        w = torch.linspace(0.5, 1.5, sum(len(r.response_ids) for r in records))
        start = sum(len(r.response_ids) for r in records[:i])
        (lp * w[start:start + lp.numel()]).sum().backward()
        ref_lp.append(lp.detach())
    ref_lp = torch.cat(ref_lp)
    ref_grad = torch.cat([p.grad.flatten() for p in model.parameters()])
    model.zero_grad(set_to_none=True)
    # fp32: only summation orders differ (key sets, matmul shapes): 16 ulp of the largest |log-prob| (measured:
    # 4-8 ulp, AVX2 and AVX-512), 64 ulp of the largest gradient entry, a sum over every scored token (measured
    # 8 ulp); a leak of one key across records moves log-probs by ~1e-2
    lp_tol = 16 * EPS * max(1.0, float(ref_lp.abs().max()))
    grad_tol = 64 * EPS * float(ref_grad.abs().max())
    assert (ref_lp - torch.cat([torch.tensor(r.response_logprobs) for r in records])).abs().max() <= 1e-4
    batches = pack(sequences, "prefix_tree", records=records, **sizes)
    if sizes.get("row_len") == 350:  # split tries: several rows in one batch, padded row ends
        assert len(batches) == 1 and batches[0].input_ids.shape[0] > 2 and (batches[0].unit_ids < 0).any()
    for backend in ("sdpa", SDPA_BLOCKS):
        lp, grad = _weighted_pass(model, batches, records, backend)
        assert (lp - ref_lp).abs().max() <= lp_tol, backend
        assert (grad - ref_grad).abs().max() <= grad_tol, backend
    assert ref_grad.abs().sum() > 0


def test_auto_backend_and_the_layouts_of_teacher_and_trainer():
    from distill.teacher import ScoringLayout, records_action_hidden
    from distill.trainer import MemOPDConfig

    model, tok, records = _group_records()
    (batch,) = pack(aligned(records), "prefix_tree", records=records)
    assert select_backend(model, batch) == SDPA_BLOCKS  # on CPU: the dense mask would pay row length^2
    with torch.no_grad():
        tree_h, tree_t = records_action_hidden(model, records, ScoringLayout("aligned", "prefix_tree"), tok, 0)
        ref_h, ref_t = records_action_hidden(model, records, ScoringLayout("aligned", "padded"), tok, 0)
    assert torch.equal(tree_t, ref_t)
    assert (tree_h - ref_h).abs().max() <= 16 * EPS * max(1.0, float(ref_h.abs().max()))
    assert MemOPDConfig(packing="prefix_tree").layout().packing == "prefix_tree"
    with pytest.raises(ValueError, match="prefix_tree"):
        MemOPDConfig(packing="trie")


def test_teacher_packing_is_its_own_option_and_scores_as_the_actor_packing_does():
    from distill.cli import PACKINGS as CLI_PACKINGS
    from distill.losses import DistillLossConfig
    from distill.packing import PACKINGS
    from distill.teacher import Teacher
    from distill.trainer import MemOPDConfig, distillation_loss

    assert CLI_PACKINGS == PACKINGS  # the torch-free CLI offers every packing
    cfg = MemOPDConfig(teacher_packing="prefix_tree", teacher_reconstruction="persistent")
    assert (cfg.layout().packing, cfg.layout().reconstruction) == ("shared_prefix", "aligned")
    assert (cfg.teacher_layout().packing, cfg.teacher_layout().reconstruction) == ("prefix_tree", "persistent")
    assert MemOPDConfig().teacher_layout() == MemOPDConfig().layout()
    with pytest.raises(ValueError, match="teacher_packing: packing must be one of .*prefix_tree"):
        MemOPDConfig(teacher_packing="trie")
    model, tok, records = _group_records()
    teacher = Teacher(tiny_model(tok, seed=3), tok)
    layout = MemOPDConfig().layout()
    losses = {p: distillation_loss(model, teacher, records, layout, DistillLossConfig(), tok,
                                   MemOPDConfig(teacher_packing=p).teacher_layout())
              for p in ("padded", "prefix_tree")}
    assert losses["padded"] > 0
    assert losses["prefix_tree"] == pytest.approx(losses["padded"], rel=64 * EPS)
