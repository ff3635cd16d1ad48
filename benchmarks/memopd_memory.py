"""Peak memory of one MemOPD update (CPU, peak RSS), at two token budgets, with and without gradient accumulation
over the packed batches (and with activation checkpointing).

    python benchmarks/memopd_memory.py                    # the table (about 2 minutes on 2 busy cores)
    python benchmarks/memopd_memory.py --budgets 256 4096 --hidden 256 --layers 4

The records of one update (MemQA episodes sampled once by a tiny random student) are written to a file; each
configuration then runs in a fresh process that loads them, builds the student and the teacher, notes its peak
RSS (``ru_maxrss``), runs one MemOPD update on exactly those records (``train_rl``'s rollout replaced by them: no
generation inside the measurement; one minibatch, one epoch, no evaluation) and reports the growth of the peak:
the memory the update itself needed (old log-probs, teacher scoring, the training forward and backward, the
optimizer state). Without accumulation the whole minibatch's graph is alive at its backward whatever the token
budget; with it, one packed batch's.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _tokenizer():
    from agents.llm.models.local import build_tokenizer, task_texts

    return build_tokenizer(task_texts("MemQA-v0", {"objectives": 1, "hops": 2}, episodes=20, seed=10**6),
                           vocab_size=600)


def _model(tok, args, seed):
    from agents.llm.models.local import build_tiny_model

    return build_tiny_model(tok, seed=seed, hidden_size=args.hidden, layers=args.layers, heads=args.heads,
                            max_positions=4096)


def _env_kwargs():
    return {"objectives": 2, "hops": 2, "max_turns": 3}


def make_records(args, path: Path) -> dict:
    import gymnasium as gym
    import torch

    import memenv  # noqa: F401 - registers the environments
    from agents.llm.generation.policy import LLMPolicy
    from agents.llm.records.rollouts import rollout

    torch.set_num_threads(args.threads)
    tok = _tokenizer()
    policy = LLMPolicy(_model(tok, args, 1), tok, temperature=1.0, max_new_tokens=args.max_new_tokens, seed=0)
    envs = [gym.make("MemQA-v0", **_env_kwargs()) for _ in range(4)]
    seeds = [s for s in range(args.episodes // 2) for _ in range(2)]
    episodes = rollout(policy, envs, seeds, groups=[s for s in seeds])
    path.write_bytes(pickle.dumps(episodes))
    records = [r for ep in episodes for r in ep.records]
    return {"records": len(records), "tokens": sum(len(r.prompt_ids) + len(r.response_ids) for r in records),
            "action_tokens": sum(sum(r.action_mask) for r in records)}


def measure(args) -> dict:
    import copy
    import resource
    import time

    import torch

    import agents.llm.training.ppo as ppo
    from distill.trainer import MemOPDConfig, train_memopd

    torch.set_num_threads(args.threads)
    episodes = pickle.loads(Path(args.records).read_bytes())
    ppo.rollout = lambda *a, **k: copy.deepcopy(episodes)  # the same records, no generation in the measurement
    tok = _tokenizer()
    student, teacher = _model(tok, args, 1), _model(tok, args, 2)
    cfg = MemOPDConfig(out_dir=tempfile.mkdtemp(prefix="memopd_memory_"), env_kwargs=_env_kwargs(), algo="grpo",
                       updates=1, episodes_per_update=len(episodes), group_size=2, epochs=1, num_minibatches=1,
                       lr=1e-4, max_new_tokens=args.max_new_tokens, num_envs=1, eval_every=0, save_every=10**6,
                       progress=False, threads=args.threads, chunk=256, token_budget=args.budget,
                       packing=args.packing, grad_accumulation=args.accumulate,
                       gradient_checkpointing=args.checkpointing, grpo_drop_zero_variance=False)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    row = train_memopd(cfg, model=student, tokenizer=tok, teacher=teacher)
    seconds = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"budget": args.budget, "accumulate": args.accumulate, "checkpointing": args.checkpointing,
            "micro_batches": row.get("micro_batches"), "update_peak_mb": (after - before) / 1024,
            "process_peak_mb": after / 1024, "seconds": seconds, "distill_loss": row.get("distill_loss")}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budgets", type=int, nargs=2, default=[512, 2048])
    parser.add_argument("--episodes", type=int, default=12)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--packing", default="shared_prefix")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--records", help=argparse.SUPPRESS)
    parser.add_argument("--budget", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--accumulate", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--checkpointing", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.measure:
        print(json.dumps(measure(args)))
        return 0
    import torch

    from agents.llm.models.precision import host_line

    torch.set_num_threads(args.threads)
    print(host_line("none", "cpu") + f" (fp32, {args.threads} thread(s))")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "episodes.pkl"
        info = make_records(args, path)
        print(f"one update: {info['records']} records, {info['tokens']} tokens ({info['action_tokens']} action "
              f"tokens), student = teacher size: hidden {args.hidden}, {args.layers} layers; packing {args.packing}")
        runs = [(b, a, 0) for b in args.budgets for a in (0, 1)] + [(args.budgets[1], 1, 1)]
        env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               "OMP_NUM_THREADS": str(args.threads)}
        common = ["--hidden", str(args.hidden), "--layers", str(args.layers), "--heads", str(args.heads),
                  "--packing", args.packing, "--threads", str(args.threads),
                  "--max-new-tokens", str(args.max_new_tokens)]
        print(f"{'token budget':>12} {'accumulate':>10} {'checkpoint':>10} {'micro-batches':>13} "
              f"{'update peak MB':>14} {'process peak MB':>15} {'seconds':>8}")
        for budget, acc, ckpt in runs:
            out = subprocess.run([sys.executable, __file__, "--measure", "--records", str(path), "--budget",
                                  str(budget), "--accumulate", str(acc), "--checkpointing", str(ckpt), *common],
                                 env=env, capture_output=True, text=True, check=False)
            if out.returncode:
                print(out.stderr[-2000:], file=sys.stderr)
                return 1
            r = json.loads(out.stdout.strip().splitlines()[-1])
            print(f"{budget:>12} {'yes' if acc else 'no':>10} {'yes' if ckpt else 'no':>10} "
                  f"{int(r['micro_batches'] or 1):>13} {r['update_peak_mb']:>14.1f} {r['process_peak_mb']:>15.1f} "
                  f"{r['seconds']:>8.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
