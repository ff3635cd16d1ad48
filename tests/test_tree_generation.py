"""Padding-free generation (``LLMPolicy(generation="tree")``): the prefix trie on a hand case, the same tokens and
log-probs as the left-padded path (``generation="padded"``) and as one full forward per sequence, over rows of
different lengths, shared prefixes, identical prompts and rows that finish early; finished rows leave the batch;
shared prefixes are prefilled once (and across calls inside ``reuse_prefixes``); the real model (slow)."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from llm_common import memqa_envs, memqa_tokenizer, tiny_model  # noqa: E402

from agents.llm.generation.policy import LLMPolicy, inverse_cdf_sample, sequence_logprobs  # noqa: E402
from agents.llm.records.rollouts import records_of, rollout  # noqa: E402
from agents.llm.generation.tree_generation import prefix_tree  # noqa: E402


def _model(tok, seed):
    # Large random weights: rows' greedy continuations differ (at the default scale every row repeats one token).
    return tiny_model(tok, seed=seed, initializer_range=0.5)


def _nodes(node, out=None):
    out = [] if out is None else out
    out.append(node)
    for child in node.children:
        _nodes(child, out)
    return out


def test_prefix_tree_splits_where_prompts_diverge_or_end():
    prompts = [[1, 2, 3, 4], [9], [1, 2, 3], [1, 2, 5], [1, 2, 3, 4]]
    root = prefix_tree(prompts)
    assert (root.start, root.end, root.ending, root.rows_below) == (0, 0, [], [0, 1, 2, 3, 4])
    shared, nine = root.children
    assert (shared.start, shared.end, shared.rows_below, shared.ending) == (0, 2, [0, 2, 3, 4], [])
    assert (nine.start, nine.end, nine.ending) == (0, 1, [1])
    three, five = shared.children
    assert (three.start, three.end, three.ending, three.rows_below) == (2, 3, [2], [0, 2, 4])
    assert (five.start, five.end, five.ending) == (2, 3, [3])
    (four,) = three.children
    assert (four.start, four.end, four.ending, four.children) == (3, 4, [0, 4], [])
    # every prompt ends at exactly one node, and each node's tokens are the same in every prompt below it
    ends = sorted(r for n in _nodes(root) for r in n.ending)
    assert ends == [0, 1, 2, 3, 4]
    for n in _nodes(root):
        assert len({tuple(prompts[r][n.start:n.end]) for r in n.rows_below}) == 1
    common = prefix_tree([[7, 8, 9], [7, 8]])
    assert (common.start, common.end, common.ending) == (0, 2, [1])
    with pytest.raises(ValueError, match="at least one token"):
        prefix_tree([[1], []])


def _observations(tok_policy):
    envs = memqa_envs(3)
    obs = [env.reset(seed=s)[0] for s, env in enumerate(envs)]
    # identical prompts (a GRPO group's first turn), prompts sharing a long prefix, different lengths
    return [obs[0], obs[1], obs[0], obs[0][:-25], obs[2], obs[1] + " more words here", "x"]


def _early_stop_token(responses):
    for row in responses:
        for token in row[1:len(row) // 2]:
            if any(token not in other for other in responses):
                return token
    raise AssertionError("every row samples the same tokens: pick another model seed")


def _trie_tokens(prompts):
    return len({tuple(p[:k]) for p in prompts for k in range(1, len(p) + 1)})


@pytest.mark.parametrize("temperature,top_p", [(0.0, 1.0), (1.0, 1.0), (0.8, 0.9)])
def test_tree_samples_the_padded_paths_tokens_with_its_log_probs(temperature, top_p):
    tok = memqa_tokenizer()
    model = _model(tok, 3)
    obs = _observations(tok)
    kw = dict(temperature=temperature, top_p=top_p, max_new_tokens=16, seed=5)
    padded = LLMPolicy(model, tok, generation="padded", **kw)
    tree = LLMPolicy(model, tok, generation="tree", **kw)
    # A token that some row samples early and another row never samples ends an action (as eos): the first row
    # finishes early, the other runs to the length limit.
    early = _early_stop_token([g.response_ids for g in padded.generate(obs)])
    for p in (padded, tree):
        p.eos_ids = p.eos_ids | {early}
        p.generator.manual_seed(5)
    padded_rows = padded.stats["decode_rows"]
    a, b = padded.generate(obs), tree.generate(obs)
    padded_rows = padded.stats["decode_rows"] - padded_rows
    assert [g.response_ids for g in b] == [g.response_ids for g in a]
    assert [g.finish_reason for g in b] == [g.finish_reason for g in a]
    assert {g.finish_reason for g in b} >= {"eos", "length"}
    assert len({len(g.prompt_ids) for g in b}) >= 5
    for ga, gb in zip(a, b):
        assert gb.prompt_ids == ga.prompt_ids and gb.text == ga.text and gb.temperature == ga.temperature
        ref = sequence_logprobs(model, gb.prompt_ids, gb.response_ids, gb.temperature)
        assert (ref - torch.tensor(gb.response_logprobs)).abs().max().item() <= 1e-4
        assert (torch.tensor(ga.response_logprobs) - torch.tensor(gb.response_logprobs)).abs().max().item() <= 1e-4
    # Finished rows left the batch; the trie's tokens were prefilled once each, the padded path ran n x width.
    prompts = [g.prompt_ids for g in b]
    assert tree.stats["decode_rows"] < padded_rows
    assert tree.stats["prefill_tokens"] == _trie_tokens(prompts) < sum(map(len, prompts))
    assert tree.stats["generated_tokens"] == sum(len(g.response_ids) for g in b)
    # Same seed, same samples: reproducible.
    again = LLMPolicy(model, tok, generation="tree", **kw)
    again.eos_ids = tree.eos_ids
    assert [g.response_ids for g in again.generate(obs)] == [g.response_ids for g in b]


def test_tree_in_small_batches_and_alone_matches_padded():
    tok = memqa_tokenizer()
    model = _model(tok, 4)
    obs = _observations(tok)
    padded = LLMPolicy(model, tok, temperature=0, max_new_tokens=10, generation="padded").generate(obs)
    split = LLMPolicy(model, tok, temperature=0, max_new_tokens=10, generation="tree", batch_size=3)
    assert [g.response_ids for g in split.generate(obs)] == [g.response_ids for g in padded]
    # each batch prefills at most its own trie (a prefix shared in an earlier batch of the call is reused)
    prompts = [g.prompt_ids for g in padded]
    per_batch = sum(_trie_tokens(prompts[i:i + 3]) for i in range(0, len(prompts), 3))
    assert _trie_tokens(prompts) <= split.stats["prefill_tokens"] <= per_batch < sum(map(len, prompts))
    alone = LLMPolicy(model, tok, temperature=0, max_new_tokens=10, generation="tree")
    assert [alone.generate([o])[0].response_ids for o in obs] == [g.response_ids for g in padded]


def test_reuse_prefixes_keeps_shared_prefixes_across_calls_only_inside_the_block():
    tok = memqa_tokenizer()
    model = _model(tok, 6)
    obs = _observations(tok)
    first, second = [obs[0], obs[0], obs[1]], [obs[0][:-10] + " other end", obs[3], obs[1]]
    fresh = LLMPolicy(model, tok, temperature=0, max_new_tokens=8)
    expected = fresh.generate(second)
    cold = fresh.stats["prefill_tokens"]
    policy = LLMPolicy(model, tok, temperature=0, max_new_tokens=8)
    with policy.reuse_prefixes() as store:
        policy.generate(first)
        before = policy.stats["prefill_tokens"]
        got = policy.generate(second)
        assert store.hits > 0
    assert [g.response_ids for g in got] == [g.response_ids for g in expected]
    for g, e in zip(got, expected):
        assert (torch.tensor(g.response_logprobs) - torch.tensor(e.response_logprobs)).abs().max().item() <= 1e-5
    assert policy.stats["prefill_tokens"] - before < cold
    assert policy._store is None  # outside the block nothing is kept (the weights may change)
    mark = policy.stats["prefill_tokens"]
    policy.generate(second)
    assert policy.stats["prefill_tokens"] - mark == cold


def test_rollout_records_of_tree_and_padded_agree_for_grpo_groups():
    tok = memqa_tokenizer()
    model = _model(tok, 7)
    seeds, groups = [11, 11, 11, 12, 12, 12], [0, 0, 0, 1, 1, 1]
    out = {}
    for generation in ("padded", "tree"):
        policy = LLMPolicy(model, tok, temperature=1.0, max_new_tokens=12, seed=2, generation=generation)
        out[generation] = records_of(rollout(policy, memqa_envs(6), seeds, groups=groups))
        for r in out[generation]:
            ref = sequence_logprobs(model, r.prompt_ids, r.response_ids, r.temperature)
            assert (ref - torch.tensor(r.response_logprobs)).abs().max().item() <= 1e-4
    assert [(r.episode_id, r.turn, r.prompt_ids, r.response_ids) for r in out["tree"]] == \
        [(r.episode_id, r.turn, r.prompt_ids, r.response_ids) for r in out["padded"]]
    assert max(r.turn for r in out["tree"]) >= 2


def test_uniforms_given_to_the_sampler_are_the_draws_it_uses():
    probs = torch.tensor([[0.5, 0.5, 0.0], [0.1, 0.2, 0.7]])
    assert inverse_cdf_sample(probs, uniforms=torch.tensor([[0.49], [0.31]])).tolist() == [0, 2]
    assert inverse_cdf_sample(probs, uniforms=torch.tensor([[0.51], [0.29]])).tolist() == [1, 1]
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    drawn = torch.rand((2, 1), generator=g2, dtype=torch.float64)
    assert torch.equal(inverse_cdf_sample(probs, g1), inverse_cdf_sample(probs, uniforms=drawn))


def test_bad_generation_and_empty_prompts_are_refused():
    tok = memqa_tokenizer()
    model = tiny_model(tok)
    with pytest.raises(ValueError, match="generation must be one of tree, padded, got 'fast'"):
        LLMPolicy(model, tok, generation="fast")
    with pytest.raises(ValueError, match="every prompt needs at least one token"):
        LLMPolicy(model, tok).generate_ids([[1, 2], []])


@pytest.mark.parametrize("options, message", [
    ({"max_new_tokens": 0}, "max_new_tokens must be a whole number >= 1, got 0"),
    ({"max_new_tokens": -3}, "max_new_tokens must be a whole number >= 1, got -3"),
    ({"max_new_tokens": 2.5}, "max_new_tokens must be a whole number >= 1, got 2.5"),
    ({"max_new_tokens": 2000}, "max_new_tokens 2000 exceeds the model's context window of 1024 positions"),
    ({"batch_size": 0}, "batch_size must be a whole number >= 1, got 0"),
    ({"stop": ["</answer>", ""]}, r"stop must be a list of non-empty strings, got \['</answer>', ''\]"),
    ({"stop": "</answer>"}, "stop must be a list of non-empty strings, got '</answer>'"),
    ({"temperature": float("nan")}, "temperature must be a finite number, got nan"),
    ({"temperature": float("inf")}, "temperature must be a finite number, got inf"),
    ({"temperature": -1.0}, r"temperature must be >= 0 \(0: greedy\), got -1.0"),
    ({"top_p": 0.0}, r"top_p must be in \(0, 1\] \(1: off\), got 0.0"),
    ({"max_prompt_tokens": 1000, "max_new_tokens": 100},
     "max_prompt_tokens 1000 \\+ max_new_tokens 100 exceed the model's context window of 1024 positions"),
])
def test_generation_options_outside_their_limits_are_refused_up_front(options, message):
    tok = memqa_tokenizer()
    with pytest.raises(ValueError, match=message):
        LLMPolicy(tiny_model(tok), tok, **options)


@pytest.mark.parametrize("generation", ["tree", "padded"])
def test_prompt_ids_outside_the_vocabulary_or_the_context_are_refused(generation):
    """Before: an id past the embedding crashed in torch (IndexError), a negative one was read from the end of
    the embedding, and a prompt longer than the context window was sampled at positions the model never had."""
    tok = memqa_tokenizer()
    policy = LLMPolicy(tiny_model(tok), tok, max_new_tokens=8, generation=generation)
    vocab = len(tok)
    cases = [([[1, 2], [3, vocab]], rf"prompt 1: token id {vocab} is outside the model's vocabulary \[0, {vocab}\)"),
             ([[1, -1]], r"prompt 0: token id -1 is outside the model's vocabulary"),
             ([[1, 2.0]], "prompt 0: token id 2.0 is not a whole number"),
             ([[5] * 1017], "prompt 0: 1017 tokens \\+ max_new_tokens 8 exceed the model's context window of 1024"),
             ([[1, 2], []], "prompt 1 is empty: every prompt needs at least one token")]
    for prompts, message in cases:
        with pytest.raises(ValueError, match=message):
            policy.generate_ids(prompts)
    assert len(policy.generate_ids([[5] * 1016])[0].response_ids) <= 8  # exactly fills the window: allowed


def test_real_model_tree_records_reproduce_and_greedy_matches_padded(smollm2):
    model, tok = smollm2
    envs = memqa_envs(3, objectives=2, hops=1, top_k=1)
    obs = [env.reset(seed=s)[0] for s, env in enumerate(envs)]
    question = obs[1].split("Question 1:")[1].split("\n")[0].strip()
    second = envs[1].step(f"<memory>Q1: {question}</memory><search>{question}</search>")[0]
    batch = [obs[0], obs[0], obs[1], second, obs[2]]  # a group's shared prompt, a longer second turn
    for temperature in (0.0, 0.7):
        kw = dict(temperature=temperature, max_new_tokens=24, seed=9)
        a = LLMPolicy(model, tok, generation="padded", **kw).generate(batch)
        tree = LLMPolicy(model, tok, generation="tree", **kw)
        b = tree.generate(batch)
        assert [g.response_ids for g in b] == [g.response_ids for g in a]
        for g in b:
            ref = sequence_logprobs(model, g.prompt_ids, g.response_ids, g.temperature)
            assert (ref - torch.tensor(g.response_logprobs)).abs().max().item() <= 1e-4
        assert tree.stats["prefill_tokens"] == _trie_tokens([g.prompt_ids for g in b])
