"""SFT step time on CPU: under bf16 autocast, transformers' "sdpa" attention vs fp32 attention
(``agents.llm.models.local.use_float32_attention``, what ``train_sft`` switches on under the autocast), and no autocast
at all (fp32, what ``autocast="auto"`` picks on a CPU without AMX), measured side by side in one run.

The batches are those of the tiny-model recipe (agents.llm.training.recipes, learn_memqa's and `memenv train`'s): 16
oracle invocations of MemQA-v0 (1 objective, 2 hops) from length buckets, the "suffix" tokenizer, tiny Qwen2 d=128 x 4
layers x 8 heads, LM loss on 30% of the prompt.

    python benchmarks/sft_step_speed.py [--steps 12] [--rounds 2]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=12, help="timed steps per measurement (after 3 warm-up steps)")
    p.add_argument("--rounds", type=int, default=2, help="alternating rounds of both variants")
    p.add_argument("--episodes", type=int, default=150, help="oracle episodes the batches are drawn from")
    args = p.parse_args()

    import numpy as np
    import torch

    from agents.llm.generation.policy import LLMPolicy
    from agents.llm.models.local import use_float32_attention
    from agents.llm.training.recipes import tiny_sft_config
    from agents.llm.training.sft import expert_data, length_buckets
    from agents.llm.training.common import ActorCritic, Dist, collate, load_or_build_model

    torch.set_num_threads(1)
    cfg = tiny_sft_config(episodes=args.episodes)  # the tiny-model recipe's tokenizer and model
    lm, tok = load_or_build_model(cfg, Dist())
    data = expert_data(LLMPolicy(lm, tok, temperature=0.0), cfg, range(cfg.episodes))
    model = ActorCritic(lm)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    rng = np.random.default_rng(0)
    batches = length_buckets([len(d.prompt_ids) + len(d.response_ids) for d in data], 16, 8, rng)

    def step(autocast: bool = True) -> float:
        idx = next(batches)
        start = time.process_time()
        batch = collate([(data[i].prompt_ids, data[i].response_ids) for i in idx], tok.pad_token_id, include_prompt=True)
        batch = batch.select_targets(~batch.prompt | (torch.from_numpy(rng.random(len(batch.prompt))) < 0.3))
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logp, _, _ = model(**batch.inputs())
        loss = -logp[~batch.prompt].mean() - logp[batch.prompt].mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return time.process_time() - start

    from agents.llm.models.precision import host_line

    print(host_line("bf16"), "(and fp32 beside it)", flush=True)
    times: dict[str, list[float]] = {"sdpa (bf16 attention)": [], "fp32 attention": [], "fp32, no autocast": []}
    for _ in range(args.rounds):
        for name in times:
            if name == "sdpa (bf16 attention)":
                lm.set_attn_implementation("sdpa")
            else:
                use_float32_attention(lm)
            autocast = name != "fp32, no autocast"
            for _ in range(3):
                step(autocast)
            times[name] += [step(autocast) for _ in range(args.steps)]
    for name, values in times.items():
        print(f"{name:>22}: {np.mean(values):.3f} CPU-s per step of 16 invocations")
    base, fast, fp32 = (np.mean(v) for v in times.values())
    print(f"speed-up of fp32 attention under bf16 autocast: {base / fast:.2f}x; of no autocast over that: "
          f"{fast / fp32:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
