"""LLM policy and rollout: batched sampling, stop tags, records joined with snapshots, token-exact round trip."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from llm_common import memqa_envs, memqa_tokenizer, tiny_model, toy_tokenizer  # noqa: E402

from agents.llm.generation.policy import LLMPolicy, inverse_cdf_sample, sequence_logprobs  # noqa: E402
from agents.llm.records.invocation import InvocationRecord, load_records, memory_mask, save_records  # noqa: E402
from agents.llm.records.rollouts import rollout  # noqa: E402


def _check_round_trip(model, records, tol=1e-4):
    worst = 0.0
    for r in records:
        lp = sequence_logprobs(model, r.prompt_ids, r.response_ids, r.temperature)
        worst = max(worst, (lp - torch.tensor(r.response_logprobs)).abs().max().item())
    assert worst <= tol, worst


def test_batched_sampling_round_trips_including_left_padded_rows():
    tok = memqa_tokenizer()
    model = tiny_model(tok)
    policy = LLMPolicy(model, tok, temperature=0.7, top_p=0.9, max_new_tokens=12, seed=1)
    observations = ["<task>short</task>", "<task>a much longer observation " + "word " * 40 + "</task>", "x"]
    gens = policy.generate(observations)
    lengths = [len(g.prompt_ids) for g in gens]
    assert len(set(lengths)) == 3  # rows 0 and 2 were left-padded in the batch
    for obs, g in zip(observations, gens):
        assert g.prompt_ids == policy.encode_prompt(obs)
        assert g.text == tok.decode(g.response_ids, skip_special_tokens=True)
        assert g.temperature == 0.7
        lp = sequence_logprobs(model, g.prompt_ids, g.response_ids, temperature=0.7)
        assert (lp - torch.tensor(g.response_logprobs)).abs().max().item() <= 1e-4
    # Same seed, same samples; a row alone gives the same greedy continuation as in a batch.
    again = LLMPolicy(model, tok, temperature=0.7, top_p=0.9, max_new_tokens=12, seed=1).generate(observations)
    assert [g.response_ids for g in again] == [g.response_ids for g in gens]
    greedy = LLMPolicy(model, tok, temperature=0, max_new_tokens=8)
    batch = greedy.generate(observations)
    assert [greedy.generate([o])[0].response_ids for o in observations] == [g.response_ids for g in batch]


def test_inverse_cdf_sampler_draws_each_id_at_its_probability_and_never_a_zero_weight():
    g = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(1, 40, generator=g) * 2, -1)
    probs[0, [3, 17, 39]] = 0.0  # ids top-p removed (the last one too: the uniform never reaches the total)
    n = 200_000
    draws = inverse_cdf_sample(probs.expand(n, -1) * 5.0, g)  # unnormalised weights: proportional draws
    freq = torch.bincount(draws, minlength=40).double() / n
    p = probs[0].double() / probs[0].double().sum()
    assert freq[[3, 17, 39]].sum() == 0
    # 5 binomial SEs per id: a wrong offset (right=False, or an unscaled uniform) moves ids by far more
    assert ((freq - p).abs() <= 5 * (p * (1 - p) / n).sqrt() + 1e-12).all()
    one_hot = torch.zeros(4, 49_152)
    one_hot[torch.arange(4), torch.tensor([0, 7, 49_151, 300])] = 1.0
    assert inverse_cdf_sample(one_hot, g).tolist() == [0, 7, 49_151, 300]
    a = inverse_cdf_sample(probs.expand(64, -1), torch.Generator().manual_seed(5))
    assert torch.equal(a, inverse_cdf_sample(probs.expand(64, -1), torch.Generator().manual_seed(5)))
    for bad in (torch.zeros(2, 5), torch.full((1, 5), float("nan"))):
        with pytest.raises(ValueError, match="positive sum"):
            inverse_cdf_sample(bad, g)


def test_stops_at_closing_tag_or_eos_or_length():
    tok = toy_tokenizer()
    model = tiny_model(tok, seed=3)
    policy = LLMPolicy(model, tok, temperature=1.5, max_new_tokens=60, seed=0)
    stop_ids = {tok.convert_tokens_to_ids("</search>"), tok.convert_tokens_to_ids("</answer>")}
    gens = policy.generate(["say yes"] * 24)
    reasons = {g.finish_reason for g in gens}
    assert "stop" in reasons
    for g in gens:
        ids = g.response_ids
        early = [t for t in ids[:-1] if t in stop_ids or t == tok.eos_token_id]
        assert not early
        if g.finish_reason == "stop":
            assert ids[-1] in stop_ids and g.text.endswith(("</search>", "</answer>"))
        elif g.finish_reason == "eos":
            assert ids[-1] == tok.eos_token_id
        else:
            assert len(ids) == 60
    # A multi-token stop string is matched on the decoded tail.
    multi = LLMPolicy(model, tok, temperature=1.5, max_new_tokens=60, stop=("ye",), seed=0)
    for g in multi.generate(["say"] * 16):
        if g.finish_reason == "stop":
            assert "ye" in tok.decode(g.response_ids) and "ye" not in tok.decode(g.response_ids[:-1])


def test_chat_template_is_used_when_present():
    tok = memqa_tokenizer()
    chat_tok = type(tok)(tokenizer_object=tok.backend_tokenizer, pad_token="<pad>", eos_token="<eos>",
                         clean_up_tokenization_spaces=False, padding_side="left")
    chat_tok.chat_template = ("{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
                              "{% if add_generation_prompt %}[assistant] {% endif %}")
    policy = LLMPolicy(tiny_model(tok), chat_tok, system_prompt="be brief", max_new_tokens=4)
    assert policy.use_chat
    assert chat_tok.decode(policy.encode_prompt("obs")) == "[system] be brief\n[user] obs\n[assistant] "
    plain = LLMPolicy(tiny_model(tok), tok, max_new_tokens=4)
    assert not plain.use_chat and tok.decode(plain.encode_prompt("obs")) == "obs\n"


def test_memory_mask_on_ids():
    tok = memqa_tokenizer()
    ids = tok.encode("<think>x</think><memory>Wigei is a city</memory><search>Wigei</search>")
    mask = memory_mask(ids, tok)
    inside = [t for t, m in zip(ids, mask) if m]
    assert tok.decode(inside) == "Wigei is a city"
    unclosed = tok.encode("<memory>abc def")
    assert memory_mask(unclosed, tok) == [0] + [1] * (len(unclosed) - 1)

    class MultiTokenTags:  # a tokenizer whose tags are several tokens: offsets path (chars as tokens)
        def encode(self, text, add_special_tokens=False):
            return [ord(c) for c in text]

        def decode(self, ids, skip_special_tokens=False):
            return "".join(chr(i) for i in ids)

    fake = MultiTokenTags()
    ids = fake.encode("<memory>ab</memory><answer>c</answer>")
    assert "".join(chr(i) for i, m in zip(ids, memory_mask(ids, fake)) if m) == "ab"


def test_rollout_records_join_snapshots_and_round_trip(tmp_path):
    import gymnasium as gym

    tok = memqa_tokenizer()
    model = tiny_model(tok)
    policy = LLMPolicy(model, tok, temperature=1.0, max_new_tokens=16, seed=0)
    episodes = rollout(policy, memqa_envs(2, max_turns=2), [0, 1, 2], groups=[7, 7, 8])
    assert [ep.seed for ep in episodes] == [0, 1, 2] and [ep.group for ep in episodes] == [7, 7, 8]
    records = [r for ep in episodes for r in ep.records]
    for ep in episodes:
        assert [r.turn for r in ep.records] == list(range(1, ep.turns + 1))
        assert ep.records[-1].done and not any(r.done for r in ep.records[:-1])
        for r in ep.records:
            assert r.episode_id == ep.episode_id == r.snapshot["episode_id"] and r.snapshot["turn"] == r.turn
            assert r.snapshot["action"] == tok.decode(r.response_ids, skip_special_tokens=True)
            assert r.prompt_ids == policy.encode_prompt(r.snapshot["observation"])
            assert r.action_mask == [1] * len(r.response_ids)
            assert r.memory_mask == memory_mask(r.response_ids, tok)
            assert r.episode_return == ep.reward
    _check_round_trip(model, records)
    save_records(tmp_path / "r.jsonl", records)
    assert [r.to_dict() for r in load_records(tmp_path / "r.jsonl")] == [r.to_dict() for r in records]
    # The same seeds through a vector env give records of the same episodes.
    venv = gym.make_vec("MemQA-v0", num_envs=2, vectorization_mode="sync", objectives=1, hops=2, max_turns=2)
    vec_eps = rollout(LLMPolicy(model, tok, temperature=1.0, max_new_tokens=16, seed=0), venv, [0, 1, 2])
    venv.close()
    assert [ep.episode_id for ep in vec_eps] == [ep.episode_id for ep in episodes]
    for ep in vec_eps:
        assert ep.records[-1].done and ep.info["turns"] == ep.turns
        for r in ep.records:
            assert (r.snapshot["episode_id"], r.snapshot["turn"]) == r.key
    _check_round_trip(model, [r for ep in vec_eps for r in ep.records])
    # A group of episodes on one task seed: same env episode id, unique record ids.
    group = rollout(policy, memqa_envs(2, max_turns=2), [5, 5, 5])
    assert len({ep.episode_id for ep in group}) == 3
    assert {ep.records[0].snapshot["episode_id"] for ep in group} == {group[0].episode_id}


def test_record_validates_lengths():
    with pytest.raises(ValueError):
        InvocationRecord("e", 1, [1, 2], [3, 4], [0.0], [1, 1], [0, 0])


@pytest.mark.parametrize("vector", [False, True])
def test_rollout_reports_each_episode_as_it_ends_and_every_batch_of_invocations(vector, capsys):
    """A slow model's episodes must not show as a silent 0/N: ``on_episode`` fires as each episode ends (while
    others still run), ``on_invocations`` after each batch with the running total, and the bar shows both."""
    import gymnasium as gym

    tok = memqa_tokenizer()
    policy = LLMPolicy(tiny_model(tok), tok, temperature=1.0, max_new_tokens=16, seed=0)
    envs = gym.make_vec("MemQA-v0", num_envs=2, vectorization_mode="sync", objectives=1, hops=2, max_turns=3) \
        if vector else memqa_envs(2, max_turns=3)
    totals, ended = [], []
    episodes = rollout(policy, envs, [0, 1, 2, 3], progress=True, desc="eval",
                       on_episode=lambda ep: ended.append((ep.seed, totals[-1])), on_invocations=totals.append)
    turns = sum(ep.turns for ep in episodes)
    assert totals == sorted(totals) and len(set(totals)) == len(totals) and totals[-1] == turns
    assert sorted(seed for seed, _ in ended) == [0, 1, 2, 3]
    assert ended[0][1] < turns  # the first episode was reported before the last invocation ran
    err = capsys.readouterr().err
    assert "eval" in err and f"{turns} invocations" in err


@pytest.mark.parametrize("generation", ["tree", "padded"])
def test_rollout_progress_counts_every_generated_token_inside_invocations(generation, monkeypatch, capsys):
    """A real model spends seconds per invocation: the policy reports each decoding step to the rollout's bar
    (tokens so far and their rate), in both generation paths; the count is exactly the tokens the records hold,
    and the policy's hook is restored afterwards."""
    from agents.llm.records import rollouts

    monkeypatch.setattr(rollouts._Progress, "REDRAW_S", 0.0)  # redraw at every step, so the text is seen
    steps = []
    real_tokens = rollouts._Progress.tokens
    monkeypatch.setattr(rollouts._Progress, "tokens", lambda self, n: (steps.append(n), real_tokens(self, n)))
    tok = memqa_tokenizer()
    policy = LLMPolicy(tiny_model(tok), tok, temperature=1.0, max_new_tokens=12, seed=0, generation=generation)
    episodes = rollout(policy, memqa_envs(3, max_turns=3), [0, 1, 2, 3], progress=True, desc="eval")
    generated = sum(len(r.response_ids) for ep in episodes for r in ep.records)
    assert sum(steps) == generated and len(steps) > sum(ep.turns for ep in episodes) // 3  # per step, not per call
    assert policy.on_tokens is None
    assert f"{generated} tokens" in capsys.readouterr().err
    before = len(steps)
    rollout(policy, memqa_envs(1, max_turns=2), [5], progress=False)  # no bar: no hook installed
    assert len(steps) == before and policy.on_tokens is None
