"""Rollout tokens per second: :class:`agents.llm.policy.LLMPolicy` in this process against a vLLM server on the same
CPU, same model (SmolLM2-135M-Instruct, fp32), same prompts, side by side.

The prompts are ``--prompts`` MemQA observations (first turns, and second turns after a scripted search), encoded
once by :class:`agents.llm.policy.PromptFormat` (chat template + the protocol system prompt). Both sides decode
greedily to ``--max-new-tokens`` with the protocol's stop strings and eos:

- in-process: one ``LLMPolicy.generate_ids`` call over all prompts (one left-padded batch, KV cache) at
  ``--threads`` torch threads;
- served: every prompt sent at once (as token ids, ``/v1/completions``, one thread each) so vLLM batches them;
  vLLM on CPU computes on one core by default (it reserves the other), as logged at its start.

Tokens per second = generated tokens / wall-clock seconds of the whole batch (prefill included), best of
``--rounds``; the generated token counts of both are printed (greedy: equal when the actions agree).

    python benchmarks/rollout_throughput.py --url http://127.0.0.1:8765 [--prompts 8] [--max-new-tokens 64]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402


def observations(n: int) -> list[str]:
    import gymnasium as gym

    import memenv  # noqa: F401

    env = gym.make("MemQA-v0", objectives=1, hops=1)
    out: list[str] = []
    seed = 0
    while len(out) < n:
        obs, _ = env.reset(seed=seed)
        out.append(obs)
        question = obs.split("Question 1:")[1].split("\n")[0].strip()
        obs, *_ = env.step(f"<memory>Q1: {question}</memory><search>{question}</search>")
        out.append(obs)
        seed += 1
    env.close()
    return out[:n]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default=None, help="a running vLLM server serving the model as --name")
    parser.add_argument("--start", action="store_true", help="start a server for this run (and stop it)")
    parser.add_argument("--name", default="smollm2")
    parser.add_argument("--model", default=None, help="model folder (default: the prepared smollm2-135m-instruct)")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    from agents.llm.models import load_pretrained
    from agents.llm.policy import LLMPolicy
    from agents.llm.precision import host_line
    from agents.llm.pretrained import prepare
    from agents.served import ServedPolicy
    from agents.vllm_server import VLLMServer

    folder = str(args.model or prepare("smollm2-135m-instruct", progress=False))
    model, tokenizer = load_pretrained(folder)
    model.eval()
    local = LLMPolicy(model, tokenizer, temperature=0.0, max_new_tokens=args.max_new_tokens, system_prompt="protocol",
                      batch_size=args.prompts)
    obs = observations(args.prompts)
    prompts = [local.encode_prompt(o) for o in obs]
    server = None
    if args.url is None:
        if not args.start:
            parser.error("give --url of a running server or --start")
        server = VLLMServer(folder, args.name).start()
        print(f"started vLLM in {server.start_s:.0f} s")
    url = args.url or server.url
    try:
        served = ServedPolicy(f"openai:{args.name}@{url}?endpoint=completions&tokenizer={folder}", token_ids=True,
                              max_tokens=args.max_new_tokens, concurrency=args.prompts)
        served.act(obs[0])  # warm-up (first request)
        local.generate_ids(prompts[:1])
        local_best = served_best = float("inf")
        local_tokens = served_tokens = 0
        for _ in range(args.rounds):
            t0 = time.perf_counter()
            gens = local.generate_ids(prompts)
            local_best = min(local_best, time.perf_counter() - t0)
            local_tokens = sum(len(g.response_ids) for g in gens)

            def one(o):
                served.act(o)
                return served.last.completion_tokens or 0

            t0 = time.perf_counter()
            with ThreadPoolExecutor(max_workers=args.prompts) as pool:
                counts = list(pool.map(one, obs))
            served_best = min(served_best, time.perf_counter() - t0)
            served_tokens = sum(counts)
    finally:
        if server is not None:
            server.stop()
    local_tps, served_tps = local_tokens / local_best, served_tokens / served_best
    prompt_tokens = sum(map(len, prompts))
    print(host_line())
    print(f"{args.prompts} prompts ({prompt_tokens} prompt tokens), greedy, <= {args.max_new_tokens} new tokens each")
    print(f"in-process LLMPolicy: {local_tokens} tokens in {local_best:.2f} s = {local_tps:.1f} tokens/s "
          f"({args.threads} torch thread{'s' if args.threads != 1 else ''})")
    print(f"vLLM server:          {served_tokens} tokens in {served_best:.2f} s = {served_tps:.1f} tokens/s")
    print(f"ratio vLLM / in-process: {served_tps / local_tps:.2f}x")
    if args.json:
        from agents.files import write_text_atomic

        write_text_atomic(Path(args.json), json.dumps({
            "host": host_line(), "prompts": args.prompts, "prompt_tokens": prompt_tokens,
            "max_new_tokens": args.max_new_tokens, "local_tokens": local_tokens, "local_s": local_best,
            "served_tokens": served_tokens, "served_s": served_best, "local_tokens_per_s": local_tps,
            "served_tokens_per_s": served_tps, "ratio": served_tps / local_tps}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
