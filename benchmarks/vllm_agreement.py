"""A real vLLM server against the same model in this process: greedy actions of the served policy, and teacher
log-probs of the served teacher.

Needs a vLLM server for the prepared SmolLM2-135M-Instruct folder (``python -m agents.llm.adapters.vllm_server start
--model DIR --name smollm2 --port 8765``; or ``--start`` here, which starts one and stops it at the end).

1. Policy (issue 20, deliverable 3). In-process :class:`agents.llm.generation.policy.LLMPolicy` (fp32, greedy, the chat
   template with :data:`agents.llm.generation.policy.PROTOCOL_SYSTEM_PROMPT`, ``--max-new-tokens``) plays ``--episodes``
   MemQA episodes; every invocation's observation is then sent to the server (temperature 0, same stop strings,
   same token cap) on both endpoints: ``completions`` with the invocation's own prompt ids
   (``?endpoint=completions&tokenizer=DIR``; the reply's ``token_ids`` compared with the sampled ids) and
   ``chat`` (the server's chat template; the action text compared). Reported: the share of invocations whose
   greedy action is identical (ids; text), and where the first differing token falls. The same episodes are then
   played by the served policy alone (``memenv bench``'s runner) and the mean F1 of both is printed.
2. Teacher (issue 20, the served teacher). ``--teacher-episodes`` episodes sampled at T=1 give records; their
   action tokens are scored by :class:`distill.served_teacher.ServedTeacher` (``prompt_logprobs=k``) and by the
   in-process model (one sequence at a time, :func:`agents.llm.generation.policy.sequence_logprobs`, fp32). Reported:
   max and p99 |delta log-prob| of the sampled tokens, top-k id agreement, and both scorers' tokens per second (the
   in-process one on the prefix-tree packing of :class:`distill.teacher.Teacher`).

    python benchmarks/vllm_agreement.py --url http://127.0.0.1:8765 [--episodes 6] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402


def _envs(n: int, max_turns: int):
    import gymnasium as gym

    import memenv  # noqa: F401

    return [gym.make("MemQA-v0", objectives=1, hops=1, max_turns=max_turns) for _ in range(n)]


def policy_agreement(url: str, model, tokenizer, folder: str, episodes: int, max_new_tokens: int,
                     max_turns: int = 4, seed: int = 0) -> dict:
    """Section 1 of the module doc: greedy agreement of the served policy with the in-process one."""
    from agents.llm.generation.policy import LLMPolicy
    from agents.llm.records.rollouts import records_of, rollout
    from agents.scripted.bench import run_bench
    from agents.llm.adapters.served import ServedPolicy

    local = LLMPolicy(model, tokenizer, temperature=0.0, max_new_tokens=max_new_tokens, system_prompt="protocol",
                      batch_size=8)
    t0 = time.perf_counter()
    played = rollout(local, _envs(min(episodes, 4), max_turns), list(range(seed, seed + episodes)))
    local_s = time.perf_counter() - t0
    records = records_of(played)
    completions = ServedPolicy(f"openai:smollm2@{url}?endpoint=completions&tokenizer={folder}",
                               token_ids=True, max_tokens=max_new_tokens, concurrency=4)
    chat = ServedPolicy(f"openai:smollm2@{url}?endpoint=chat", max_tokens=max_new_tokens, concurrency=4)
    same_ids = same_text = same_chat = 0
    first_diff: list[int] = []
    prompt_tokens_match = 0
    for r in records:
        obs = r.snapshot["observation"]
        assert completions.prompt(obs) == r.prompt_ids, "the served prompt ids differ from LLMPolicy's"
        text = completions.act(obs)
        served_ids = completions.last.token_ids or []
        local_text = tokenizer.decode(r.response_ids, skip_special_tokens=True)
        same_ids += served_ids == r.response_ids
        same_text += text == local_text
        if served_ids != r.response_ids:
            first_diff.append(next((i for i, (a, b) in enumerate(zip(served_ids, r.response_ids)) if a != b),
                                   min(len(served_ids), len(r.response_ids))))
        chat_text = chat.act(obs)
        same_chat += chat_text == local_text
        prompt_tokens_match += chat.last.prompt_tokens == len(r.prompt_ids)
    n = len(records)
    seeds = list(range(seed, seed + episodes))
    t0 = time.perf_counter()
    _, served_eps = run_bench([f"openai:smollm2@{url}?max_tokens={max_new_tokens}"],
                              [f"MemQA-v0:objectives=1,hops=1,max_turns={max_turns}"], episodes, seed,
                              progress=False)
    served_s = time.perf_counter() - t0
    return {
        "invocations": n, "episodes": episodes, "max_new_tokens": max_new_tokens,
        "completions_same_ids": same_ids / n, "completions_same_text": same_text / n, "chat_same_text": same_chat / n,
        "chat_prompt_tokens_equal_local": prompt_tokens_match / n,
        "first_differing_token_median": statistics.median(first_diff) if first_diff else None,
        "local_f1": statistics.mean(e.f1 for e in played), "served_chat_f1": float(served_eps.f1.mean()),
        "served_chat_invalid_rate": float(served_eps.invalid_actions.sum() / max(1, served_eps.invocations.sum())),
        "served_prompt_tokens_per_episode": float(served_eps.server_prompt_tokens.mean()),
        "served_completion_tokens_per_episode": float(served_eps.server_completion_tokens.mean()),
        "local_rollout_s": local_s, "served_bench_s": served_s, "seeds": seeds,
    }


def teacher_agreement(url: str, model, tokenizer, episodes: int, max_new_tokens: int, top_k: int = 5,
                      seed: int = 100) -> dict:
    """Section 2 of the module doc: the served teacher's log-probs against the in-process model's."""
    from agents.llm.generation.policy import LLMPolicy, sequence_logprobs
    from agents.llm.records.rollouts import records_of, rollout
    from distill.served_teacher import ServedTeacher
    from distill.teacher import ScoringLayout, Teacher

    policy = LLMPolicy(model, tokenizer, temperature=1.0, max_new_tokens=max_new_tokens, system_prompt="protocol",
                       seed=seed, batch_size=8)
    records = records_of(rollout(policy, _envs(min(episodes, 4), 2), list(range(seed, seed + episodes))))
    served = ServedTeacher(f"openai:smollm2@{url}", tokenizer, top_k=top_k, concurrency=4)
    scores = served.score(records)
    reference, full_top = [], []
    t0 = time.perf_counter()
    with torch.no_grad():
        for r in records:
            reference.append(sequence_logprobs(model, r.prompt_ids, r.response_ids))
    one_by_one_s = time.perf_counter() - t0
    with torch.no_grad():
        for r in records:
            ids = torch.tensor([r.input_ids])
            logits = model(input_ids=ids).logits[0, r.prompt_len - 1:len(r) - 1].float()
            full_top.append(torch.log_softmax(logits, -1).topk(top_k, dim=-1).indices)
    reference = torch.cat(reference)
    full_top = torch.cat(full_top)
    teacher = Teacher(model, tokenizer)
    t0 = time.perf_counter()
    teacher.action_hidden(records, ScoringLayout(packing="prefix_tree"))
    packed_s = time.perf_counter() - t0  # hidden states only; the head on N positions is small beside the body
    delta = (scores.sampled - reference).abs()
    tokens = sum(len(r) for r in records)
    return {
        "records": len(records), "action_tokens": int(delta.numel()), "sequence_tokens": tokens, "top_k": top_k,
        "max_abs_delta_logprob": float(delta.max()), "p99_abs_delta_logprob": float(delta.quantile(0.99)),
        "mean_abs_delta_logprob": float(delta.mean()),
        "top1_agreement": float((scores.top_ids[:, 0] == full_top[:, 0]).float().mean()),
        "topk_set_agreement": float(sum(set(a.tolist()) == set(b.tolist()) for a, b in zip(scores.top_ids, full_top))
                                    / len(full_top)),
        "served_tokens_per_s": tokens / scores.seconds, "local_one_by_one_tokens_per_s": tokens / one_by_one_s,
        "local_prefix_tree_tokens_per_s": tokens / packed_s,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default=None, help="a running vLLM server (else --start)")
    parser.add_argument("--start", action="store_true", help="start a server for this run and stop it at the end")
    parser.add_argument("--model", default=None, help="model folder (default: memenv models prepare smollm2-135m-instruct)")
    parser.add_argument("--episodes", type=int, default=6)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--teacher-episodes", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", default=None, help="also write the figures here")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    from agents.llm.models.local import load_pretrained
    from agents.llm.models.precision import host_line
    from agents.llm.models.pretrained import prepare
    from agents.llm.adapters.vllm_server import VLLMServer

    folder = str(args.model or prepare("smollm2-135m-instruct", progress=False))
    model, tokenizer = load_pretrained(folder)
    model.eval()
    server = None
    if args.url is None:
        if not args.start:
            parser.error("give --url of a running server or --start")
        server = VLLMServer(folder, "smollm2").start()
        print(f"started vLLM in {server.start_s:.0f} s at {server.url}")
    url = args.url or server.url
    try:
        policy = policy_agreement(url, model, tokenizer, folder, args.episodes, args.max_new_tokens)
        teacher = teacher_agreement(url, model, tokenizer, args.teacher_episodes, 48)
    finally:
        if server is not None:
            server.stop()
    print(host_line())
    print(f"policy (greedy, {policy['invocations']} invocations of {policy['episodes']} episodes, "
          f"<= {policy['max_new_tokens']} tokens): identical ids on completions {policy['completions_same_ids']:.2f}, "
          f"identical text on completions {policy['completions_same_text']:.2f}, on chat {policy['chat_same_text']:.2f} "
          f"(chat prompt tokens == local prompt ids on {policy['chat_prompt_tokens_equal_local']:.2f}); "
          f"first differing token (median) {policy['first_differing_token_median']}")
    print(f"episodes: local F1 {policy['local_f1']:.3f}, served chat F1 {policy['served_chat_f1']:.3f} "
          f"(invalid rate {policy['served_chat_invalid_rate']:.2f}; per episode {policy['served_prompt_tokens_per_episode']:.0f} "
          f"prompt + {policy['served_completion_tokens_per_episode']:.0f} completion tokens)")
    print(f"teacher ({teacher['action_tokens']} action tokens of {teacher['records']} records): max |d logp| "
          f"{teacher['max_abs_delta_logprob']:.2e}, p99 {teacher['p99_abs_delta_logprob']:.2e}; top-1 agreement "
          f"{teacher['top1_agreement']:.3f}, top-{teacher['top_k']} set agreement {teacher['topk_set_agreement']:.3f}; "
          f"tokens/s served {teacher['served_tokens_per_s']:.0f}, in-process one by one "
          f"{teacher['local_one_by_one_tokens_per_s']:.0f}, in-process prefix tree {teacher['local_prefix_tree_tokens_per_s']:.0f}")
    if args.json:
        from memenv.files import write_text_atomic

        write_text_atomic(Path(args.json), json.dumps({"host": host_line(), "policy": policy, "teacher": teacher},
                                                      indent=1))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
