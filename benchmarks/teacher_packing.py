"""Teacher scoring and actor forward+backward on packed invocations vs padded per-invocation batches.

Records come from MemQA-v0 rollouts with 4 objectives (GRPO-style: ``--groups`` task seeds x ``--group-size``
episodes each) of a tiny random-init Qwen2 student. In one run, alternating rounds, each packing of the same
records is timed for

- teacher scoring: a frozen teacher (wider than the student), no grad, full-vocabulary log-probs at the sampled
  action positions only (``distill.packing.action_hidden`` + the lm head in chunks), reported as invocation
  tokens per second (the same records for every packing, so the ratio is the time ratio);
- actor forward+backward: the student's log-probs of the sampled tokens with grad, ``-mean`` backward.

RCE is checked in each: the student's recomputed log-probs vs the records' (max |delta|, must be <= 1e-4 in
fp32) and the teacher's log-probs vs its padded scoring. Times are process CPU seconds (``time.process_time``),
which other load on a shared machine does not inflate (with several threads they sum over threads). ``padded`` rows hold one invocation each, in record
order, as many rows as ``--token-budget`` allows; packed rows hold up to ``row_len`` tokens (x the longest
invocation, several values measured), forwards of at most ``--token-budget`` tokens for every method. Packed
layouts run with two exact CPU attentions: ``sdpa`` with the explicit 4D mask (the reference; it pays O(row
length^2) whatever the mask hides) and ``sdpa_blocks`` (each block of queries attends only its prefix and
itself: ``distill.packing.attention_blocks``). The padded baseline uses sdpa with its mask.

    python benchmarks/teacher_packing.py [--threads 1] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--groups", type=int, default=3, help="task seeds (GRPO groups)")
    p.add_argument("--group-size", type=int, default=4, help="episodes per task seed")
    p.add_argument("--objectives", type=int, default=4)
    p.add_argument("--max-turns", type=int, default=6, help="invocations per episode at most")
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--hidden", type=int, default=128, help="student width (the teacher is twice as wide)")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=64, help="attention head size (64-128 in real checkpoints)")
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--token-budget", type=int, default=8192, help="tokens per forward pass, padding included")
    p.add_argument("--row-lens", default="1,2,4", help="packed row lengths, in multiples of the longest invocation")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=3, help="alternating timed rounds (the median is reported)")
    args = p.parse_args(argv)

    import gymnasium as gym
    import torch

    import memenv  # noqa: F401
    from agents.llm.models import build_tiny_model, build_tokenizer, task_texts
    from agents.llm.policy import LLMPolicy
    from agents.llm.rollout import records_of, rollout
    from distill.packing import action_hidden, chunked_logprobs, pack, unpack
    from distill.reconstruct import aligned

    torch.set_num_threads(args.threads)
    env_kw = {"objectives": args.objectives, "max_turns": args.max_turns}
    t0 = time.perf_counter()
    tok = build_tokenizer(task_texts("MemQA-v0", env_kw, episodes=30, seed=10**6), vocab_size=args.vocab,
                          split_spaces="suffix")
    size = {"layers": args.layers, "max_positions": 4096}
    student = build_tiny_model(tok, hidden_size=args.hidden, heads=max(1, args.hidden // args.head_dim), seed=0, **size)
    teacher = build_tiny_model(tok, hidden_size=2 * args.hidden, heads=max(1, 2 * args.hidden // args.head_dim),
                               seed=1, **size).eval().requires_grad_(False)
    policy = LLMPolicy(student, tok, temperature=1.0, max_new_tokens=args.max_new_tokens, seed=0)
    envs = [gym.make("MemQA-v0", **env_kw) for _ in range(4)]
    seeds = [s for s in range(args.groups) for _ in range(args.group_size)]
    records = records_of(rollout(policy, envs, seeds, groups=seeds, progress=True))
    sequences = aligned(records)
    n_tokens = sum(len(s) for s in sequences)
    n_actions = sum(len(r.response_ids) for r in records)
    longest = max(len(s) for s in sequences)
    recorded = torch.cat([torch.tensor(r.response_logprobs) for r in records])
    temps = torch.tensor([r.temperature for r in records])
    print(f"records: {len(records)} invocations from {len(seeds)} episodes ({args.groups} groups x "
          f"{args.group_size}), {n_tokens} tokens, {n_actions} action tokens, longest {longest}, "
          f"vocab {len(tok)}; setup {time.perf_counter() - t0:.1f}s")

    padded = pack(sequences, "padded", token_budget=args.token_budget, pad_id=tok.pad_token_id)
    layouts = {"padded": (padded, "sdpa")}  # name -> (batches, attention backend)
    for k in [float(x) for x in args.row_lens.split(",")]:
        for method in ("padding_free", "shared_prefix"):
            batches = pack(sequences, method, token_budget=args.token_budget, row_len=int(k * longest),
                           pad_id=tok.pad_token_id, records=records)
            for backend in ("sdpa", "sdpa_blocks"):
                layouts[f"{method} {k:g}x {backend}"] = (batches, backend)

    def teacher_pass(batches, backend):
        with torch.no_grad():
            return [chunked_logprobs(teacher, action_hidden(teacher, b, backend), b.targets, temps[b.record_index])
                    for b in batches]

    def actor_pass(batches, backend):
        out = []
        for b in batches:
            lp = chunked_logprobs(student, action_hidden(student, b, backend), b.targets, temps[b.record_index])
            (-lp.sum() / n_actions).backward()
            out.append(lp.detach())
        student.zero_grad(set_to_none=True)
        return out

    def timed(fn, batches, backend):
        start = time.process_time()  # CPU time of this process: fair on a shared machine with --threads 1
        values = fn(batches, backend)
        return time.process_time() - start, torch.cat(unpack(values, batches, len(records)))

    student.eval()  # dropout is 0 anyway; eval keeps the forward identical to sampling
    times = {name: {"teacher": [], "actor": []} for name in layouts}
    rce = {}
    teacher_ref = None
    for round_ in range(args.rounds + 1):  # round 0 warms up (and checks RCE)
        names = list(layouts)
        shift = round_ % len(names)  # rotate the order each round: no layout always runs first
        for name in names[shift:] + names[:shift]:
            batches, backend = layouts[name]
            t_teacher, lp_teacher = timed(teacher_pass, batches, backend)
            t_actor, lp_actor = timed(actor_pass, batches, backend)
            if round_ == 0:
                if teacher_ref is None:  # round 0 starts with padded: the teacher's reference
                    teacher_ref = lp_teacher
                rce[name] = (float((lp_actor - recorded).abs().max()), float((lp_teacher - teacher_ref).abs().max()))
            else:
                times[name]["teacher"].append(t_teacher)
                times[name]["actor"].append(t_actor)

    print(f"host: cpu capability {torch.backends.cpu.get_cpu_capability()}, dtype float32, "
          f"threads {torch.get_num_threads()}, torch {torch.__version__}; student d={args.hidden} x {args.layers} "
          f"layers, teacher d={2 * args.hidden}; median of {args.rounds} rounds")
    base = {k: statistics.median(times["padded"][k]) for k in ("teacher", "actor")}
    header = (f"{'packing, row length, attention':<34}{'batches':>8}{'slots':>8}{'saved':>7}{'teacher tok/s':>15}{'x':>6}"
              f"{'actor f+b cpu-s':>17}{'x':>6}{'RCE actor':>11}{'teacher':>10}")
    print(header)
    ok = True
    padded_slots = sum(b.n_slots for b in padded)
    for name, (batches, _) in layouts.items():
        slots = sum(b.n_slots for b in batches)
        t_teacher = statistics.median(times[name]["teacher"])
        t_actor = statistics.median(times[name]["actor"])
        d_actor, d_teacher = rce[name]
        ok &= d_actor <= 1e-4 and d_teacher <= 1e-4
        print(f"{name:<34}{len(batches):>8}{slots:>8}{1 - slots / padded_slots:>7.0%}"
              f"{n_tokens / t_teacher:>15.0f}{base['teacher'] / t_teacher:>6.2f}{t_actor:>17.3f}"
              f"{base['actor'] / t_actor:>6.2f}{d_actor:>11.1e}{d_teacher:>10.1e}")
    print("RCE " + ("passes (<= 1e-4) for every packing" if ok else "FAILS for some packing"))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
