"""fp32 against bf16 on this host, side by side: which precision ``autocast="auto"`` / ``dtype="native"`` should pick.

    python benchmarks/precision_speed.py                      # the tiny model, and SmolLM2 where it is installed
    python benchmarks/precision_speed.py --rounds 3 --base ~/.cache/memenv/models/smollm2-135m-instruct

Three workloads, each timed in CPU seconds of this process (``time.process_time``), the two precisions alternating
within every round after one warm-up call of each (oneDNN builds its kernels on first use):

* ``tiny train``: a from-scratch Qwen2 of the tiny recipe's shape (d 128, 4 layers, 8 heads, vocab 8,192), forward
  and backward of a causal-LM loss over 16 x 300 tokens: fp32 vs bf16 autocast (weights fp32);
* ``base train``: the pretrained base (all its layers), forward and backward over 2 x 314 tokens with the loss on
  the last 58 (an actor's record: prompt + action): fp32 vs bf16 autocast;
* ``base score``: the base's no-grad forward and log-softmax over the same tokens (a teacher scoring): fp32
  weights vs bf16 weights (what ``teacher_dtype="native"`` loads) vs fp32 weights under bf16 autocast.

Prints the host line (capability, native bf16, AMX, threads) and, per workload and round, the CPU seconds and the
ratio bf16 / fp32 (above 1: bf16 is the slower). Measured figures: agents/llm/models/precision.py's docstring and
docs/distill_speed.md (the lever "fp32 instead of bf16").
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def cpu_seconds(fn) -> float:
    start = time.process_time()
    fn()
    return time.process_time() - start


def train_step(torch, model, ids, autocast: bool, loss_tokens: int | None = None) -> None:
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        hidden = model.model(input_ids=ids).last_hidden_state
        tail = hidden if loss_tokens is None else hidden[:, -loss_tokens:]
        logits = model.lm_head(tail).float()
    target = ids if loss_tokens is None else ids[:, -loss_tokens:]
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), target[:, 1:].reshape(-1))
    loss.backward()
    model.zero_grad(set_to_none=True)


def score(torch, model, ids, autocast: bool, loss_tokens: int) -> None:
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        hidden = model.model(input_ids=ids).last_hidden_state
        model.lm_head(hidden[:, -loss_tokens:]).float().log_softmax(-1)


def compare(name: str, variants: dict, rounds: int) -> None:
    for fn in variants.values():  # warm-up: oneDNN's kernels for these shapes
        fn()
    for r in range(rounds):
        times = {label: cpu_seconds(fn) for label, fn in variants.items()}
        base = times["fp32"]
        cells = "  ".join(f"{label} {t:.2f}" + ("" if label == "fp32" else f" ({t / base:.2f}x)")
                          for label, t in times.items())
        print(f"{name:11s} round {r + 1}: {cells} CPU-s", flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=2, help="alternating rounds per workload")
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    p.add_argument("--base", default=os.path.expanduser("~/.cache/memenv/models/smollm2-135m-instruct"),
                   help="a pretrained model folder for the base rows (skipped when absent)")
    args = p.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

    from agents.llm.models.precision import host_line

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(host_line(), flush=True)
    tiny = Qwen2ForCausalLM(Qwen2Config(vocab_size=8192, hidden_size=128, intermediate_size=512, num_hidden_layers=4,
                                        num_attention_heads=8, num_key_value_heads=8, tie_word_embeddings=True))
    ids = torch.randint(0, 8192, (16, 300))
    compare("tiny train", {"fp32": lambda: train_step(torch, tiny, ids, False),
                           "bf16 autocast": lambda: train_step(torch, tiny, ids, True)}, args.rounds)
    if not Path(args.base, "config.json").is_file():
        print(f"no model at {args.base}: the base rows are skipped", flush=True)
        return 0
    model = AutoModelForCausalLM.from_pretrained(args.base, dtype=torch.float32)
    ids = torch.randint(0, model.config.vocab_size, (2, 314))
    compare("base train", {"fp32": lambda: train_step(torch, model, ids, False, 58),
                           "bf16 autocast": lambda: train_step(torch, model, ids, True, 58)}, args.rounds)
    model.eval()
    bf16 = copy.deepcopy(model).to(torch.bfloat16)
    compare("base score", {"fp32": lambda: score(torch, model, ids, False, 58),
                           "bf16 weights": lambda: score(torch, bf16, ids, False, 58),
                           "bf16 autocast": lambda: score(torch, model, ids, True, 58)}, args.rounds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
