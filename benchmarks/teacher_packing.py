"""Teacher scoring and actor forward+backward on packed invocations vs the best padded per-invocation batches.

Records (``--source``) are invocations on MemQA-v0 with 4 objectives:

- ``oracle`` (default): the records a trained policy would produce. The oracle strategy plays ``--episodes``
  distinct task seeds (one episode each: the oracle is deterministic, so GRPO groups of it would be identical
  invocations and inflate sharing); each invocation's prompt is encoded exactly as ``LLMPolicy.encode_prompt``
  does, its response ids are the oracle action's ids, and its ``response_logprobs`` are the student's log-probs
  of those ids, one sequence at a time (``agents.llm.generation.policy.sequence_logprobs``): what a policy that sampled
  these actions would have recorded, so RCE stays meaningful. Action lengths vary (a short search, a growing
  memory rewrite) and prompts grow with the memory, as with a trained policy; the invocations of an episode
  share their task block and, turn to turn, the memory the previous invocation kept.
- ``random``: GRPO groups: rollouts of the tiny random-init Qwen2 student at T=1 (``--groups`` task seeds x
  ``--group-size`` episodes each). It samples to ``--max-new-tokens`` on every turn, so responses have one
  length (up to an early stop) and padding is a few %: only prefix sharing can gain.

In one run, each packing of the same records is timed for

- teacher scoring: a frozen teacher (wider than the student), no grad, full-vocabulary log-probs at the sampled
  action positions only (``distill.scoring.action_hidden`` + the lm head in chunks), reported as invocation
  tokens per second (the same records for every packing, so the ratio is the time ratio);
- actor forward+backward: the student's log-probs of the sampled tokens with grad, ``-mean`` backward.

Baselines: ``padded`` rows hold one invocation each in record order (the naive baseline); ``sorted_padded``
takes them longest first, so a batch holds rows of like length (the best padded baseline). Both run with both
exact CPU attentions, ``sdpa`` with the explicit 4D mask and ``sdpa_blocks`` (each query block attends only its
context and itself, ``distill.attention.attention_blocks``), and the best padded baseline of each pass is the
fastest of those four. Packed layouts: ``padding_free`` and ``shared_prefix`` in rows of ``--row-lens`` x the
longest invocation, and ``prefix_tree`` (one trie per episode / GRPO group; whole tries per row), with
``sdpa_blocks``. Every layout runs forwards of at most ``--token-budget`` tokens, padding included, in one
process at ``--threads`` threads. Round 0 warms up every layout (and checks RCE); the timed rounds then run
the layouts in an order rotated by one each round, and each figure is the median over the rounds, so load from
other processes on a shared machine falls on every layout alike. Times are process CPU seconds
(``time.process_time``; with several threads they sum over threads).

RCE is checked in each: the student's recomputed log-probs vs the records' (max |delta|, must be <= 1e-4 in
fp32) and the teacher's log-probs vs its naive padded scoring.

    python benchmarks/teacher_packing.py [--source oracle|random] [--threads 1] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _spread(values) -> str:
    v = sorted(values)
    return f"{v[0]} / {statistics.median(v):g} / {v[-1]}"


def oracle_records(policy, env, seeds, progress: bool = True) -> list:
    """One episode of the oracle strategy per task seed, as the :class:`InvocationRecord` s a policy that
    sampled the oracle's actions would have written: prompts from ``policy.encode_prompt``, response ids from
    ``policy.encode_action``, ``response_logprobs`` from the policy model, one sequence at a time (T=1)."""
    from tqdm.auto import tqdm

    from agents.llm.generation.policy import sequence_logprobs
    from agents.llm.records.invocation import InvocationRecord, memory_mask, tokenizer_fingerprint
    from agents.scripted.strategies.qa_strategies import make_strategy

    oracle = make_strategy("oracle", env.spec.id if env.spec is not None else "MemQA-v0")
    fingerprint = tokenizer_fingerprint(policy.tokenizer)
    records = []
    for seed in tqdm(list(seeds), desc="oracle episodes", disable=not progress):
        obs, _ = env.reset(seed=int(seed))
        oracle.reset(env.unwrapped)
        episode, turn, done = [], 0, False
        while not done:
            turn += 1
            action = oracle.act(obs)
            prompt, response = policy.encode_prompt(obs), policy.encode_action(action)
            logprobs = sequence_logprobs(policy.model, prompt, response, 1.0).tolist()
            next_obs, reward, terminated, truncated, _ = env.step(action)
            done = terminated or truncated
            episode.append(InvocationRecord(
                episode_id=f"oracle-seed{seed}", turn=turn, prompt_ids=prompt, response_ids=response,
                response_logprobs=logprobs, action_mask=[1] * len(response),
                memory_mask=memory_mask(response, policy.tokenizer), reward=float(reward), done=done,
                terminated=bool(terminated), temperature=1.0, seed=int(seed), rollout_id="oracle",
                snapshot={"turn": turn, "observation": obs, "action": action},
                tokenizer_fingerprint=fingerprint))
            obs = next_obs
        total = sum(r.reward for r in episode)
        for r in episode:
            r.episode_return = total
        records += episode
    return records


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--source", choices=("oracle", "random"), default="oracle",
                   help="oracle: the oracle's actions scored by the student (trained-policy lengths); random: "
                        "random-init student rollouts (equal response lengths)")
    p.add_argument("--episodes", type=int, default=8, help="oracle: task seeds, one episode each")
    p.add_argument("--groups", type=int, default=3, help="random: task seeds (GRPO groups)")
    p.add_argument("--group-size", type=int, default=4, help="random: episodes per task seed")
    p.add_argument("--objectives", type=int, default=4)
    p.add_argument("--max-turns", type=int, default=None,
                   help="invocations per episode at most (default: the env's for oracle, 6 for random)")
    p.add_argument("--max-new-tokens", type=int, default=48, help="random: tokens sampled per invocation")
    p.add_argument("--hidden", type=int, default=128, help="student width (the teacher is twice as wide)")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=64, help="attention head size (64-128 in real checkpoints)")
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--token-budget", type=int, default=8192, help="tokens per forward pass, padding included")
    p.add_argument("--row-lens", default="1,8",
                   help="padding-free and shared-prefix row lengths, in multiples of the longest invocation")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=5, help="timed rounds after the warm-up (the median is reported)")
    from records import add_record_option  # benchmarks/records.py: the committed record

    add_record_option(p)
    args = p.parse_args(argv)

    import gymnasium as gym
    import torch

    import memenv  # noqa: F401
    from agents.llm.models.local import build_tiny_model, build_tokenizer, task_texts
    from agents.llm.generation.policy import LLMPolicy
    from agents.llm.records.rollouts import records_of, rollout
    from distill.packing import pack, unpack
    from distill.scoring import action_hidden, chunked_logprobs
    from distill.reconstruct import aligned

    torch.set_num_threads(args.threads)
    max_turns = args.max_turns if args.max_turns is not None else (6 if args.source == "random" else None)
    env_kw = {"objectives": args.objectives} | ({"max_turns": max_turns} if max_turns is not None else {})
    t0 = time.perf_counter()
    tok = build_tokenizer(task_texts("MemQA-v0", env_kw, episodes=30, seed=10**6), vocab_size=args.vocab,
                          split_spaces="suffix")
    size = {"layers": args.layers, "max_positions": 4096}
    student = build_tiny_model(tok, hidden_size=args.hidden, heads=max(1, args.hidden // args.head_dim), seed=0, **size)
    teacher = build_tiny_model(tok, hidden_size=2 * args.hidden, heads=max(1, 2 * args.hidden // args.head_dim),
                               seed=1, **size).eval().requires_grad_(False)
    policy = LLMPolicy(student, tok, temperature=1.0, max_new_tokens=args.max_new_tokens, seed=0)
    if args.source == "oracle":
        records = oracle_records(policy, gym.make("MemQA-v0", **env_kw), range(args.episodes))
        source = f"oracle actions on {args.episodes} task seeds (one episode each), student log-probs"
    else:
        envs = [gym.make("MemQA-v0", **env_kw) for _ in range(4)]
        seeds = [s for s in range(args.groups) for _ in range(args.group_size)]
        records = records_of(rollout(policy, envs, seeds, groups=seeds, progress=True))
        source = f"random-init student rollouts, {args.groups} groups x {args.group_size} episodes"
    sequences = aligned(records)
    n_tokens = sum(len(s) for s in sequences)
    n_actions = sum(len(r.response_ids) for r in records)
    longest = max(len(s) for s in sequences)
    recorded = torch.cat([torch.tensor(r.response_logprobs) for r in records])
    temps = torch.tensor([r.temperature for r in records])
    n_episodes = len({(r.rollout_id, r.episode_id) for r in records})
    print(f"records: {len(records)} invocations from {n_episodes} episodes ({source}), {n_tokens} tokens, "
          f"{n_actions} action tokens, longest {longest}, vocab {len(tok)}; setup {time.perf_counter() - t0:.1f}s")
    print("lengths (min / median / max): prompt " + _spread(len(r.prompt_ids) for r in records)
          + ", response " + _spread(len(r.response_ids) for r in records)
          + ", invocation " + _spread(len(s) for s in sequences))

    naive = pack(sequences, "padded", token_budget=args.token_budget, pad_id=tok.pad_token_id)
    naive_slots = sum(b.n_slots for b in naive)
    layouts = {}  # name -> (batches, attention backend)
    for method in ("padded", "sorted_padded"):
        batches = naive if method == "padded" else pack(sequences, method, token_budget=args.token_budget,
                                                         pad_id=tok.pad_token_id)
        for backend in ("sdpa", "sdpa_blocks"):
            layouts[f"{method} {backend}"] = (batches, backend)
    for k in [float(x) for x in args.row_lens.split(",")]:
        for method in ("padding_free", "shared_prefix"):
            layouts[f"{method} {k:g}x sdpa_blocks"] = (
                pack(sequences, method, token_budget=args.token_budget, row_len=int(k * longest),
                     pad_id=tok.pad_token_id, records=records), "sdpa_blocks")
    layouts["prefix_tree sdpa_blocks"] = (pack(sequences, "prefix_tree", token_budget=args.token_budget,
                                               pad_id=tok.pad_token_id, records=records), "sdpa_blocks")
    padded_names = [n for n in layouts if n.startswith(("padded ", "sorted_padded "))]
    sorted_slots = sum(b.n_slots for b in layouts["sorted_padded sdpa"][0])
    tree_tokens = sum(b.n_tokens for b in layouts["prefix_tree sdpa_blocks"][0])
    print(f"padding share: {1 - n_tokens / naive_slots:.1%} of the {naive_slots} slots in record order, "
          f"{1 - n_tokens / sorted_slots:.1%} of the {sorted_slots} sorted by length; the prefix tries hold "
          f"{tree_tokens} tokens ({sorted_slots / tree_tokens:.2f}x fewer than the sorted padded slots)")

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
        start = time.process_time()  # CPU time of this process: other processes' load is not counted
        values = fn(batches, backend)
        return time.process_time() - start, torch.cat(unpack(values, batches, len(records)))

    student.eval()  # dropout is 0 anyway; eval keeps the forward identical to sampling
    times = {name: {"teacher": [], "actor": []} for name in layouts}
    rce = {}
    teacher_ref = None
    names = list(layouts)
    for round_ in range(args.rounds + 1):  # round 0 warms every layout up (and checks RCE)
        shift = round_ % len(names)  # the order rotates each round: no layout always runs first or last
        for name in names[shift:] + names[:shift]:
            batches, backend = layouts[name]
            t_teacher, lp_teacher = timed(teacher_pass, batches, backend)
            t_actor, lp_actor = timed(actor_pass, batches, backend)
            if round_ == 0:
                if teacher_ref is None:  # round 0 starts with naive padded sdpa: the teacher's reference
                    teacher_ref = lp_teacher
                rce[name] = (float((lp_actor - recorded).abs().max()), float((lp_teacher - teacher_ref).abs().max()))
            else:
                times[name]["teacher"].append(t_teacher)
                times[name]["actor"].append(t_actor)

    print(f"host: cpu capability {torch.backends.cpu.get_cpu_capability()}, dtype float32, "
          f"threads {torch.get_num_threads()}, torch {torch.__version__}; student d={args.hidden} x {args.layers} "
          f"layers, teacher d={2 * args.hidden}; token budget {args.token_budget}; median of {args.rounds} rounds "
          f"after a warm-up round, order rotated each round")
    med = {name: {k: statistics.median(v) for k, v in t.items()} for name, t in times.items()}
    naive_t = med["padded sdpa"]
    best = {k: min(padded_names, key=lambda n: med[n][k]) for k in ("teacher", "actor")}
    best_t = {k: med[best[k]][k] for k in ("teacher", "actor")}
    print(f"naive padded baseline: padded sdpa (record order); best padded baseline: teacher {best['teacher']}, "
          f"actor {best['actor']} (the fastest of {', '.join(padded_names)})")
    header = (f"{'packing, row length, attention':<30}{'batches':>8}{'slots':>8}{'saved':>7}{'teacher tok/s':>14}"
              f"{'x naive':>8}{'x best':>7}{'actor f+b cpu-s':>16}{'x naive':>8}{'x best':>7}"
              f"{'RCE actor':>10}{'teacher':>9}")
    print(header)
    ok = True
    for name, (batches, _) in layouts.items():
        slots = sum(b.n_slots for b in batches)
        t_teacher, t_actor = med[name]["teacher"], med[name]["actor"]
        d_actor, d_teacher = rce[name]
        ok &= d_actor <= 1e-4 and d_teacher <= 1e-4
        print(f"{name:<30}{len(batches):>8}{slots:>8}{1 - slots / naive_slots:>7.0%}{n_tokens / t_teacher:>14.0f}"
              f"{naive_t['teacher'] / t_teacher:>8.2f}{best_t['teacher'] / t_teacher:>7.2f}{t_actor:>16.3f}"
              f"{naive_t['actor'] / t_actor:>8.2f}{best_t['actor'] / t_actor:>7.2f}{d_actor:>10.1e}{d_teacher:>9.1e}")
    tree = med["prefix_tree sdpa_blocks"]
    print(f"prefix tree vs the best padded baseline: teacher scoring {best_t['teacher'] / tree['teacher']:.2f}x, "
          f"actor forward+backward {best_t['actor'] / tree['actor']:.2f}x (token limit "
          f"{sorted_slots / tree_tokens:.2f}x)")
    print("RCE " + ("passes (<= 1e-4) for every packing" if ok else "FAILS for some packing"))
    if args.record:
        from records import write_record

        rows = {name: {"batches": len(batches), "slots": sum(b.n_slots for b in batches),
                       "teacher_cpu_s": med[name]["teacher"], "actor_cpu_s": med[name]["actor"],
                       "teacher_x_naive": naive_t["teacher"] / med[name]["teacher"],
                       "teacher_x_best": best_t["teacher"] / med[name]["teacher"],
                       "actor_x_naive": naive_t["actor"] / med[name]["actor"],
                       "actor_x_best": best_t["actor"] / med[name]["actor"], "rce_actor": rce[name][0],
                       "rce_teacher": rce[name][1]} for name, (batches, _) in layouts.items()}
        write_record(args.record, __file__, argv, {
            "source": source, "records": len(records), "tokens": n_tokens, "action_tokens": n_actions,
            "dtype": "float32", "threads": torch.get_num_threads(), "rounds": args.rounds, "best_padded": best,
            "token_limit_x": sorted_slots / tree_tokens, "rce_ok": bool(ok), "layouts": rows})
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
