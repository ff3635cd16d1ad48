"""Sampling cost in :class:`agents.llm.generation.policy.LLMPolicy` rollouts: the inverse-CDF sampler it uses
(:func:`agents.llm.generation.policy.inverse_cdf_sample`) against ``torch.multinomial``, side by side on the same model
and prompts.

Two measurements, each of the two samplers in rotated rounds (best of ``--rounds``):

1. the sampler alone on ``[B, V]`` probabilities of the model's vocabulary (V = 49,152 for SmolLM2);
2. whole rollouts: ``LLMPolicy.generate_ids`` at temperature 0.7 over ``--prompts`` MemQA first-turn prompts
   (chat template + protocol system prompt) to ``--max-new-tokens``, on the first ``--layers`` decoder layers of
   the model (``agents.llm.models.pretrained.shrink``; the cheap students of ``memenv experiment memopd --model``), in
   tokens per second. The two policies differ only in ``_sample``'s draw; both generate every row to the cap
   (stop strings off) so they decode the same number of tokens.

    python benchmarks/sampler_speed.py [--model smollm2-135m-instruct] [--layers 2] [--prompts 8]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    import gymnasium as gym

    import memenv  # noqa: F401
    from agents.llm.models.local import load_pretrained
    from agents.llm.generation.policy import LLMPolicy, inverse_cdf_sample
    from agents.llm.models.precision import host_line
    from agents.llm.models.pretrained import resolve, shrink

    class MultinomialPolicy(LLMPolicy):  # the previous draw, otherwise the same policy
        def _sample(self, logits):
            logp = torch.log_softmax(logits / self.temperature, dim=-1)
            token = torch.multinomial(logp.exp(), 1, generator=self.generator)[:, 0]
            return token, logp.gather(-1, token[:, None])[:, 0]

    lm, tok = load_pretrained(resolve(args.model))
    lm = shrink(lm, args.layers).eval()
    vocab = lm.config.vocab_size
    print(host_line(), f"| {args.model}, first {args.layers} layers, V = {vocab}")

    g = torch.Generator().manual_seed(0)
    for rows in (1, args.prompts):
        probs = torch.softmax(torch.randn(rows, vocab, generator=g) * 3, -1)
        best = {"multinomial": float("inf"), "inverse_cdf": float("inf")}
        for _ in range(args.rounds):
            for name, draw in (("multinomial", lambda: torch.multinomial(probs, 1, generator=g)),
                               ("inverse_cdf", lambda: inverse_cdf_sample(probs, g))):
                t = time.perf_counter()
                for _ in range(50):
                    draw()
                best[name] = min(best[name], (time.perf_counter() - t) / 50)
        print(f"sampler alone, {rows} row(s): multinomial {best['multinomial'] * 1e3:.2f} ms, inverse CDF "
              f"{best['inverse_cdf'] * 1e3:.2f} ms per draw ({best['multinomial'] / best['inverse_cdf']:.1f}x)")

    env = gym.make("MemQA-v0", objectives=2, hops=1, comparison_rate=0.0, top_k=1)
    observations = [env.reset(seed=s)[0] for s in range(args.prompts)]
    kw = dict(temperature=0.7, max_new_tokens=args.max_new_tokens, stop=(), seed=0)
    policies = {"multinomial": MultinomialPolicy(lm, tok, **kw), "inverse_cdf": LLMPolicy(lm, tok, **kw)}
    prompts = [policies["inverse_cdf"].encode_prompt(o) for o in observations]
    policies["inverse_cdf"].eos_ids = policies["multinomial"].eos_ids = set()  # every row to the cap
    rate = {name: 0.0 for name in policies}
    for r in range(args.rounds):
        for name in (list(policies) if r % 2 == 0 else list(policies)[::-1]):
            t = time.perf_counter()
            gens = policies[name].generate_ids(prompts)
            tokens = sum(len(x.response_ids) for x in gens)
            rate[name] = max(rate[name], tokens / (time.perf_counter() - t))
    print(f"rollouts, {args.prompts} prompts x {args.max_new_tokens} tokens (temperature 0.7): multinomial "
          f"{rate['multinomial']:.1f} tokens/s, inverse CDF {rate['inverse_cdf']:.1f} tokens/s "
          f"({rate['inverse_cdf'] / rate['multinomial']:.2f}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
