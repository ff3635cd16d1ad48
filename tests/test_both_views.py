"""A teacher at home in both views: the SFT's persistent-view demonstrations are exactly the ids that
``distill.reconstruct.persistent`` scores, and a policy acting in the persistent view is shown exactly that
transcript, plain template and chat template alike."""

import copy

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
import gymnasium as gym  # noqa: E402

from llm_common import ENV_KW, memqa_tokenizer, tiny_model  # noqa: E402

from agents.llm.generation.policy import LLMPolicy  # noqa: E402
from agents.llm.records.invocation import InvocationRecord  # noqa: E402
from agents.llm.records.rollouts import rollout  # noqa: E402
from agents.llm.training.sft import Demonstration, SFTConfig, expert_data  # noqa: E402
from distill.reconstruct import persistent  # noqa: E402

ENV = {**ENV_KW, "objectives": 2, "hops": 1, "comparison_rate": 0.0}
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _chat_tokenizer():
    tok = copy.deepcopy(memqa_tokenizer())
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.chat_template = CHATML
    return tok


def _oracle_records(policy, seeds):
    """The oracle's episodes as invocation records (prompt ids as the policy builds them, the oracle's action ids,
    the env's snapshots): what persistent() would score had a policy sampled those actions."""
    import memenv  # noqa: F401
    from agents.scripted.strategies.qa_strategies import make_strategy

    env, oracle, records = gym.make("MemQA-v0", **ENV), make_strategy("oracle", "MemQA-v0"), []
    for seed in seeds:
        obs, _ = env.reset(seed=seed)
        oracle.reset(env.unwrapped)
        turn, done = 0, False
        while not done:
            action = oracle.act(obs)
            ids = policy.encode_action(action)
            obs2, _, term, trunc, info = env.step(action)
            turn += 1
            records.append(InvocationRecord(episode_id=f"ep{seed}", turn=turn, prompt_ids=policy.encode_prompt(obs),
                                            response_ids=ids, response_logprobs=[0.0] * len(ids),
                                            action_mask=[1] * len(ids), memory_mask=[0] * len(ids),
                                            snapshot=info["invocation"]))
            obs, done = obs2, term or trunc
    env.close()
    return records


@pytest.mark.parametrize("chat", [False, True])
def test_persistent_view_demonstrations_are_the_ids_persistent_scores(chat):
    tok = _chat_tokenizer() if chat else memqa_tokenizer()
    policy = LLMPolicy(tiny_model(memqa_tokenizer(), seed=0), tok, temperature=0.0)
    seeds = [3, 4]
    cfg = SFTConfig(env_kwargs=ENV, views=("memory", "persistent"))
    data = expert_data(policy, cfg, seeds)
    transcripts = [d for d in data if d.action_mask is not None]
    invocations = [d for d in data if d.action_mask is None]
    records = _oracle_records(policy, seeds)
    assert len(transcripts) == len(seeds) and len(invocations) == len(records) > len(seeds)
    scored = persistent(records, tok)
    assert len(scored) == len(seeds)
    for demo, seq in zip(transcripts, scored):
        # the same ids, token for token, and the loss exactly on the actions persistent() scores
        assert demo.prompt_ids + demo.response_ids == seq.input_ids
        trained = {len(demo.prompt_ids) + i for i, m in enumerate(demo.action_mask) if m}
        assert trained == {s.start + t for s in seq.segments for t in range(s.length)}
    # the memory view is unchanged: one example per invocation, its prompt the observation's
    assert [(d.prompt_ids, d.response_ids) for d in invocations] == [(r.prompt_ids, r.response_ids) for r in records]
    if chat:  # the replies sit in user turns, as the chat template writes a conversation
        text = tok.decode(transcripts[0].response_ids)
        assert "<|im_end|>\n<|im_start|>user\n<information>" in text


def test_views_only_persistent_and_validation():
    policy = LLMPolicy(tiny_model(memqa_tokenizer(), seed=0), memqa_tokenizer(), temperature=0.0)
    data = expert_data(policy, SFTConfig(env_kwargs=ENV, views=("persistent",)), [5])
    assert len(data) == 1 and isinstance(data[0], Demonstration) and sum(data[0].action_mask) > 0
    with pytest.raises(ValueError, match="view must be one of"):
        SFTConfig(views=("history",))
    with pytest.raises(ValueError, match="views must name each view once"):
        SFTConfig(views=("memory", "memory"))


@pytest.mark.parametrize("chat", [False, True])
def test_acting_in_the_persistent_view_is_shown_the_transcript_persistent_scores(chat):
    import memenv  # noqa: F401

    tok = _chat_tokenizer() if chat else memqa_tokenizer()
    lm = tiny_model(memqa_tokenizer(), seed=1, initializer_range=0.3)
    if chat:
        lm.resize_token_embeddings(len(tok))
    policy = LLMPolicy(lm, tok, temperature=1.0, max_new_tokens=12, seed=0)
    envs = [gym.make("MemQA-v0", **{**ENV, "max_turns": 3}) for _ in range(2)]
    episodes = rollout(policy, envs, [0, 1, 2], view="persistent")
    multi = [ep for ep in episodes if ep.turns > 1]
    assert multi, "no episode ran past one turn: nothing to check"
    for ep in episodes:
        (seq,) = persistent(ep.records, tok)
        for record, segment in zip(ep.records, seq.segments):
            assert record.prompt_ids == seq.input_ids[:segment.start]  # what the policy was shown
            assert record.response_ids == seq.input_ids[segment.start:segment.start + segment.length]
    # the memory view (default) shows each observation on its own: later prompts are not transcripts
    memory = rollout(LLMPolicy(lm, tok, temperature=1.0, max_new_tokens=12, seed=0), envs, [0, 1, 2])
    later = [r for ep in memory for r in ep.records if r.turn > 1]
    assert later and all(r.prompt_ids == policy.encode_prompt(r.snapshot["observation"]) for r in later)
    with pytest.raises(ValueError, match="view must be one of"):
        rollout(policy, envs, [0], view="flat")


def _play(expert, seed, env_kwargs=ENV):
    import memenv  # noqa: F401

    env = gym.make("MemQA-v0", **env_kwargs)
    obs, _ = env.reset(seed=seed)
    expert.reset(env.unwrapped)
    actions = []
    while True:
        actions.append(expert.act(obs))
        obs, _, terminated, truncated, info = env.step(actions[-1])
        if terminated or truncated:
            env.close()
            return actions, info["summary"]["f1"]


def test_forgetful_experts_lose_the_same_fact_and_act_on_what_their_view_holds():
    """Issue 61's demonstrations: both experts drop the same document line when searching the last missing document;
    the memory view's expert then searches for it again, the transcript's copies it back and answers at once. Both
    still answer every question. At rate 0 they are the plain oracle."""
    from agents.scripted.strategies.qa_strategies import ForgetfulOracle, OraclePolicy
    from memenv.protocol import parse_action

    memory_expert, transcript_expert = (ForgetfulOracle(1.0, seed=3, reads_transcript=t) for t in (False, True))
    for seed in (0, 1, 2):
        mem, f1_mem = _play(memory_expert, seed)
        flat, f1_flat = _play(transcript_expert, seed)
        assert f1_mem == f1_flat == 1.0 and memory_expert.forgot and transcript_expert.forgot
        assert memory_expert.lost == transcript_expert.lost and len(memory_expert.lost) == 1
        (title, kept), = memory_expert.lost.items()
        assert len(mem) == len(flat) + 1  # one search more: the lost document, found again
        part = next(i for i, (a, b) in enumerate(zip(mem, flat)) if a != b)  # the same episode up to the loss
        assert f"{title}: " not in parse_action(mem[part - 1]).memory  # the search that lost the line
        assert parse_action(mem[part]).tool == "search" and parse_action(flat[part]).tool == "answer"
        assert f"{title}: {kept}" in parse_action(flat[part]).memory  # copied back from the transcript
        assert f"{title}: " not in parse_action(mem[part]).memory and parse_action(mem[part]).argument == title
    plain = OraclePolicy()
    for t in (False, True):
        assert _play(ForgetfulOracle(0.0, reads_transcript=t), 4)[0] == _play(plain, 4)[0]
    with pytest.raises(ValueError, match="forget_rate"):
        ForgetfulOracle(1.5)


def test_forgetful_demonstrations_render_each_views_own_expert():
    """SFTConfig.demo_forget_rate: the memory view's examples come from the expert that searches again, the
    persistent view's transcript from the one that answers from the transcript (one search fewer)."""
    from agents.llm.records.transcript import TranscriptFormat  # noqa: F401 - the transcript's renderer exists

    policy = LLMPolicy(tiny_model(memqa_tokenizer(), seed=0), memqa_tokenizer(), temperature=0.0)
    tok = memqa_tokenizer()
    seeds = [3, 4]
    data = expert_data(policy, SFTConfig(env_kwargs=ENV, views=("memory", "persistent"), demo_forget_rate=1.0), seeds)
    transcripts = [d for d in data if d.action_mask is not None]
    invocations = [d for d in data if d.action_mask is None]
    searches = sum("<search>" in tok.decode(d.response_ids) for d in invocations)
    flat_searches = sum(tok.decode(d.response_ids).count("<search>") for d in transcripts)
    assert len(transcripts) == 2 and searches == flat_searches + 2
    plain = expert_data(policy, SFTConfig(env_kwargs=ENV, views=("memory", "persistent")), seeds)
    assert [d.response_ids for d in plain if d.action_mask is not None] != [d.response_ids for d in transcripts]
    with pytest.raises(ValueError, match="demo_forget_rate"):
        SFTConfig(demo_forget_rate=2.0)
    with pytest.raises(ValueError, match="needs a MemQA env"):
        expert_data(policy, SFTConfig(env_id="MemDialog-v0", env_kwargs={}, demo_forget_rate=0.5), [0])
