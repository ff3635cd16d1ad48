"""verl adapter: the verl-free episode loop against a fake verl server backed by a tiny model returns, per
invocation, exactly the sampled ids and log-probs; the AgentLoopBase subclass is checked only where verl is."""

from __future__ import annotations

import asyncio

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from llm_common import ENV_KW, memqa_tokenizer, tiny_model  # noqa: E402

from agents.llm.generation.policy import LLMPolicy, sequence_logprobs  # noqa: E402
from agents.llm.adapters.verl import AGENT_NAME, MemenvEpisodeLoop, memenv_verl_dataset, sample_kwargs  # noqa: E402


class FakeServer:
    """verl's ``server_manager.generate`` interface, sampling with an :class:`LLMPolicy` (a tiny model)."""

    def __init__(self, policy: LLMPolicy) -> None:
        self.policy = policy
        self.calls = []  # (request_id, prompt_ids, sampling_params, Generation)

    async def generate(self, request_id, *, prompt_ids, sampling_params):
        self.policy.max_new_tokens = sampling_params["max_tokens"]
        gen = self.policy.generate_ids([prompt_ids])[0]
        self.calls.append((request_id, list(prompt_ids), dict(sampling_params), gen))
        await asyncio.sleep(0)  # let the other episodes run
        return {"token_ids": list(gen.response_ids), "log_probs": list(gen.response_logprobs)}


async def _episodes(loop, seeds, env_kwargs):
    return await asyncio.gather(*(loop.run({"temperature": 1.0, "top_p": 1.0}, env_id="MemQA-v0", seed=s,
                                           env_kwargs=env_kwargs) for s in seeds))


def test_loop_returns_the_sampled_ids_and_logprobs_one_output_per_invocation():
    tok = memqa_tokenizer()
    model = tiny_model(tok)
    server = FakeServer(LLMPolicy(model, tok, seed=5))
    loop = MemenvEpisodeLoop(server, tok, response_length=12)
    env_kwargs = {**ENV_KW, "max_turns": 3}
    episodes = asyncio.run(_episodes(loop, [1, 2, 3], env_kwargs))
    outputs = [o for ep in episodes for o in ep]
    assert len(outputs) == len(server.calls) and all(len(ep) == 3 for ep in episodes)  # random model: turn limit
    by_prompt = {}
    for request_id, prompt_ids, params, gen in server.calls:
        by_prompt.setdefault(tuple(prompt_ids), []).append(gen)
        assert params["stop"] == ["</search>", "</answer>"] and params["max_tokens"] == 12
    for episode in episodes:
        ids = {o.extra_fields["episode_id"] for o in episode}
        assert len(ids) == 1 and [o.extra_fields["turn"] for o in episode] == [1, 2, 3]
        assert len({o.reward_score for o in episode}) == 1
        assert episode[0].reward_score == pytest.approx(sum(o.extra_fields["step_reward"] for o in episode))
        for out in episode:
            gens = by_prompt[tuple(out.prompt_ids)]
            assert any(out.response_ids == g.response_ids and out.response_logprobs == g.response_logprobs for g in gens)
            assert out.response_mask == [1] * len(out.response_ids)
            # re-scoring the invocation alone reproduces the log-probs (memory mode: its own sequence)
            assert torch.allclose(sequence_logprobs(model, out.prompt_ids, out.response_ids),
                                  torch.tensor(out.response_logprobs), atol=1e-4)
    # one sticky request id per episode
    per_episode = {}
    for request_id, *_ in server.calls:
        per_episode[request_id] = per_episode.get(request_id, 0) + 1
    assert sorted(per_episode.values()) == [3, 3, 3]


def test_prompt_is_the_observation_of_each_turn():
    tok = memqa_tokenizer()
    server = FakeServer(LLMPolicy(tiny_model(tok), tok, seed=0))
    loop = MemenvEpisodeLoop(server, tok, response_length=8)
    (episode,) = asyncio.run(_episodes(loop, [7], {**ENV_KW, "max_turns": 2}))
    import gymnasium as gym

    env = gym.make("MemQA-v0", **ENV_KW, max_turns=2)
    obs, _ = env.reset(seed=7)
    assert episode[0].prompt_ids == loop.format.encode_prompt(obs)
    obs, *_ = env.step(tok.decode(episode[0].response_ids, skip_special_tokens=True))
    assert episode[1].prompt_ids == loop.format.encode_prompt(obs)  # not prompt + response + env text


def test_sample_fields_and_dataset():
    frame = memenv_verl_dataset("MemQA-v0", 3, seed=10, env_kwargs=ENV_KW)
    assert list(frame.agent_name) == [AGENT_NAME] * 3
    row = frame.iloc[1].to_dict()
    assert sample_kwargs(row) == {"env_id": "MemQA-v0", "seed": 11, "env_kwargs": ENV_KW}
    with pytest.raises(ValueError, match="the sample has no 'seed'"):
        sample_kwargs({"extra_info": {"env_id": "MemQA-v0"}})
    with pytest.raises(ValueError, match="unknown environment 'Nope-v0'"):
        asyncio.run(MemenvEpisodeLoop(None, memqa_tokenizer()).run({}, env_id="Nope-v0", seed=0))


def test_verl_subclass_is_registered():
    pytest.importorskip("verl")
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry

    from agents.llm.adapters.verl import MemenvAgentLoop  # noqa: F401

    assert AGENT_NAME in _agent_loop_registry
