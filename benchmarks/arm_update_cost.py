"""CPU cost of one arm update of ``memenv experiment memopd``, before and after the faster update, side by side in
one run, 1 torch thread, into scratch folders (no run folder is touched).

- **before**: the earlier update: left-padded prefill (``generation="padded"``), the teacher scoring on the actor's
  ``shared_prefix`` packing in fp32, the student's LM head applied separately (and checkpointed) for the PPO
  log-probs and for the distillation loss, every training pass in fp32;
- **after**: the arms' settings now (:func:`distill.experiment.stages.arm_config`): prefix-tree prefill
  (``generation="tree"``), the teacher on a ``prefix_tree`` packing in bf16 where the CPU computes bf16 natively
  (``teacher_dtype="native"``; fp32 elsewhere), the student's head applied once per chunk for both
  (``fused_head``), and the training passes (actor, reference, recomputed old log-probs) under bf16 autocast
  where the CPU has it (``train_autocast="auto"``: matmuls bf16, softmaxes, log-probs and losses fp32). Sampling
  stays fp32 on both sides (the records' log-probs are exact); after, the PPO ratio divides by old log-probs the
  bf16 forward recomputed, so the first minibatch's ratio is 1.

Both sides run the same workload: the same episodes' shapes, the ``--base`` folder's (or the run's) system prompt,
the preset's ``max_new_tokens``. They do not run the same episodes: each side samples its own, "before" is today's
code with its flags off, and one round runs after first. ``benchmarks/update_replay.py`` measures the update
against the code before issue 33 itself (a worktree of that commit) on one recorded rollout replayed through both,
the sides alternated over rounds (issue 62 item 4); its figures replace this script's before/after ratios in
docs/distill_speed.md.

Per side it prints this process's CPU seconds by part of the update (the trainer's ``*_cpu_s`` columns: rollout,
reference/old log-prob scoring, the teacher (hook), actor forward + backward, optimizer, evaluation), the total
(teacher loading included), the first minibatch's ``approx_kl`` / ``clipfrac`` (~0: the actor's training log-probs
reproduce the sampled ones), the ratio, and the host line. CPU seconds, not wall: the host may be shared.

Models: ``--run`` takes a run's cached teacher and weak start (``memenv experiment memopd --until student``; a
teacher still training: its latest checkpoint, and the student's latest SFT checkpoint); ``--base`` builds them
straight from a prepared base model instead (teacher = the whole base, student = its first ``student.layers``
layers, :func:`agents.llm.models.pretrained.shrink`, or the whole base when that is 0, as in the preset), no SFT: the
costs depend on shapes and on the actions' lengths, and an untrained model's actions are not an SFT'd model's
(SmolLM2-Instruct, unprompted by demonstrations, mostly writes to the ``max_new_tokens`` cap: the upper end of
the action lengths; the printed
``response_tokens`` and ``turns`` say what each side sampled). With ``--teacher-check N`` it also rolls out N
episodes and prints the teacher's sampled-token log-prob difference bf16 vs fp32 on them.

    python benchmarks/arm_update_cost.py --base ~/.cache/memenv/models/smollm2-135m-instruct --teacher-check 2
    python benchmarks/arm_update_cost.py --run runs/memopd_smol --arm memopd [--updates 1]
    python benchmarks/arm_update_cost.py --base ... --student-layers 6 --baseline reuse --updates 2   # issue 46's lever

``--baseline reuse``: the left side is the update now without the scoring passes it saves by reusing forwards (the
first minibatch's old log-probs from its training forward; no reference pass while the actor equals the reference,
a fresh run's first update only: hence ``--updates 2``). ``--baseline precision``: the left side is the update now
with its training passes under bf16 autocast and the teacher's weights in bf16 (what ``"auto"`` / ``"native"``
chose on any CPU with AVX512-BF16 before they were limited to CPUs with AMX; agents/llm/models/precision.py).

``--lora-rank R``: the right side trains rank-R low-rank adapters on the actor's linear layers instead of its weights
(``PPOConfig.lora_rank``, :mod:`agents.llm.training.lora`; the reference is the base with the adapters off); the left
side is the update now with the full weights (``--baseline`` does not apply). ``benchmarks/lora_actor_cost.py`` times
the actor's step alone.

    python benchmarks/arm_update_cost.py --base ... --student-layers 6 --lora-rank 8 --updates 2

``--side after --threads T --json``: the update now alone, at T torch threads, its totals as one JSON line (what
``benchmarks/update_threads.py`` runs in its child processes).

Utilisation (issue 62): beside the CPU seconds, each side prints every phase's achieved rate as a share of what
this CPU can do at the model's own shapes (:mod:`benchmarks.limits`): the rollout's prefill forwards, the actor's
forward/backward, the reference / old log-prob passes and the teacher's pass against the matmul rate (FLOPs from
the shapes and the tokens the forwards really processed, counted by hooks on each model's body and head; the head
apart), the decode steps against the bandwidth bound (weights + each row's KV cache read per step / triad
bandwidth, at the batch used), AdamW against the bandwidth. The limits come from ``--limits`` (a
``benchmarks/machine_limits.py`` record) or are measured at the start at this run's thread count;
``--record PATH`` writes the table and the counts as JSON.

    python benchmarks/arm_update_cost.py --base ~/.cache/memenv/models/smollm2-135m-instruct --student-layers 6 \
        --side after --limits results/limits/machine_limits.json --record results/limits/arm_update_cost.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import resource
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PARTS = (("rollout", "rollout_cpu_s"), ("reference log-probs", "score_cpu_s"), ("teacher scoring", "hook_cpu_s"),
         ("actor forward/backward", "actor_cpu_s"), ("optimizer", "optimizer_cpu_s"), ("evaluation", "eval_cpu_s"))


def before(run_cfg, baseline: str = "before"):
    """The earlier update's settings on the same arm config (see the module doc); ``baseline="reuse"``: the
    arms' settings now less the scoring passes saved by reusing forwards (``old_logprobs_from_first_forward``,
    ``ref_logprobs_from_actor``), everything else as after."""
    if baseline == "reuse":
        return replace(run_cfg, old_logprobs_from_first_forward=False, ref_logprobs_from_actor=False)
    if baseline == "precision":  # bf16 forced where "auto"/"native" now choose by fast_bf16 (fp32 without AMX)
        extra = {"teacher_dtype": "bfloat16"} if hasattr(run_cfg, "teacher_dtype") else {}
        return replace(run_cfg, train_autocast="bf16", **extra)
    changes = {"generation": "padded", "train_autocast": "none",
               "old_logprobs_from_first_forward": False, "ref_logprobs_from_actor": False}
    if hasattr(run_cfg, "teacher_packing"):
        changes.update(teacher_packing=None, teacher_dtype=None, fused_head=False)
    return replace(run_cfg, **changes)


def run_side(run_cfg, arm: str, student_fn) -> dict:
    import pandas as pd

    from agents.llm.training.ppo import train_rl
    from benchmarks.limits import PhaseMeter
    from distill.trainer import train_memopd

    lm, tok = student_fn()
    meter = PhaseMeter()
    meter.watch(lm)
    with metered(meter):
        cpu, wall = time.process_time(), time.perf_counter()
        (train_rl if arm == "rl" else train_memopd)(run_cfg, model=lm, tokenizer=tok)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    metrics = pd.read_csv(Path(run_cfg.out_dir) / "metrics.csv")
    return {"cpu": cpu, "wall": wall, "metrics": metrics, "meter": meter}


@contextlib.contextmanager
def metered(meter):
    """While the side runs: the trainer's part clock also names ``meter``'s phase, the teacher's model is watched
    when it is made, a fused head (applied by its weight, not as a module) is counted, optimizer steps are counted.
    Everything is put back after (the hooks stay on models that are dropped with the side)."""
    import torch

    import agents.llm.training.ppo as ppo
    import distill.trainer as trainer
    from distill.teacher import Teacher

    clock_cls, fused, init = ppo.PartClock, trainer.fused_head_reverse_kl, Teacher.__init__

    class MeteredClock(clock_cls):
        @contextlib.contextmanager
        def __call__(self, part: str):
            with clock_cls.__call__(self, part), meter.phase(part):
                yield

    def fused_counted(weight, hidden, *args, **kwargs):
        # the student's head, applied by its weight: counted here; its forward timed less the teacher's head
        # (a module call inside, timed by its own hooks)
        training = torch.is_grad_enabled() and hidden.requires_grad
        key = meter.add_head(weight.shape, int(hidden.shape[0]), "train" if training else "forward")
        timed = sum(t.get("head_cpu_s", 0.0) for t in meter.totals.values())
        start = time.process_time()
        out = fused(weight, hidden, *args, **kwargs)
        inner = sum(t.get("head_cpu_s", 0.0) for t in meter.totals.values()) - timed
        meter.totals[key]["head_cpu_s"] += time.process_time() - start - inner
        return out

    def init_watched(self, model, *args, **kwargs):
        init(self, model, *args, **kwargs)
        meter.watch(self.model)

    ppo.PartClock, trainer.fused_head_reverse_kl, Teacher.__init__ = MeteredClock, fused_counted, init_watched
    meter.count_optimizer_steps()
    try:
        yield
    finally:
        ppo.PartClock, trainer.fused_head_reverse_kl, Teacher.__init__ = clock_cls, fused, init
        meter.close()


def utilisation(meter, metrics, limits: dict, threads: int) -> list[dict]:
    """Each phase of a side's updates as a share of its limit (see the module doc; :mod:`benchmarks.limits`)."""
    from benchmarks.limits import DECODE_ROWS, optimizer_work, phase_work, utilisation_row

    def col(name: str) -> float:
        return float(metrics[name].sum()) if name in metrics else 0.0

    def note(work: dict) -> str:
        if not work["flops"]:
            return ""
        parts = [f"{work['tokens']:.0f} body tokens", f"head {100 * work['head_flops'] / work['flops']:.0f}% of "
                 f"FLOPs", f"attention (est., not counted) +{100 * work['attn_flops'] / work['flops']:.0f}%"]
        if work["missing"]:
            parts.append("no rate for " + "; ".join(work["missing"]))
        return ", ".join(parts)

    rows = []
    pre = phase_work(meter, limits, "rollout", ["forward"], threads)
    dec = phase_work(meter, limits, "rollout", ["decode"], threads)
    rows.append(utilisation_row("rollout: prefill forwards", pre["forward_cpu_s"], pre["flops"], pre["compute_s"],
                                "FLOP", note(pre)))
    batch = dec["tokens"] / dec["calls"] if dec["calls"] else 0.0
    floor = dec["compute_s"] / dec["forward_cpu_s"] if dec["forward_cpu_s"] else float("nan")
    rows.append(utilisation_row(f"rollout: decode steps (mean batch {batch:.1f})", dec["forward_cpu_s"], dec["bytes"],
                                dec["bandwidth_s"], "B", f"{dec['calls']:.0f} steps; against the matmul rate at "
                                f"{DECODE_ROWS} rows instead: {100 * floor:.0f}%"))
    rest = col("rollout_cpu_s") - pre["forward_cpu_s"] - dec["forward_cpu_s"]
    rows.append(utilisation_row("rollout: rest (sampling, stops, envs, Python)", rest, 0.0, 0.0, "",
                                f"{100 * rest / max(col('rollout_cpu_s'), 1e-9):.0f}% of the rollout"))
    for label, part, column in (("reference / old log-prob passes", "score", "score_cpu_s"),
                                ("teacher scoring", "hook", "hook_cpu_s"),
                                ("actor forward/backward", "actor", "actor_cpu_s")):
        work = phase_work(meter, limits, part, None, threads)
        rows.append(utilisation_row(label, col(column), work["flops"], work["compute_s"], "FLOP", note(work)))
        if part != "actor" and work["body_cpu_s"]:
            rows.append(utilisation_row(f"  {part}: the body's forwards", work["body_cpu_s"], work["body_flops"],
                                        work["body_compute_s"], "FLOP", f"hook-timed; of which the attention core "
                                        f"{work['attn_core_cpu_s']:.1f} CPU-s (not in the FLOPs)"))
    train = phase_work(meter, limits, "actor", ["train"], threads)
    if train["body_cpu_s"]:
        rows.append(utilisation_row("  actor: the body's forwards", train["body_cpu_s"], train["body_flops"] / 3,
                                    train["body_compute_s"] / 3, "FLOP", f"hook-timed; of which the attention core "
                                    f"{train['attn_core_cpu_s']:.1f} CPU-s (not in the FLOPs)"))
        heads = phase_work(meter, limits, "actor", ["forward"], threads)  # the teacher's head inside the fused head
        if heads["head_cpu_s"]:
            rows.append(utilisation_row("  actor: the teacher's head (no grad)", heads["head_cpu_s"],
                                        heads["head_flops"], heads["compute_s"], "FLOP", "hook-timed"))
        if train["head_cpu_s"]:
            rows.append(utilisation_row("  actor: the student's head, forward", train["head_cpu_s"],
                                        train["head_flops"] / 3, (train["compute_s"] - train["body_compute_s"]) / 3,
                                        "FLOP", "timed around the fused head (its softmax passes included)"))
        rest = col("actor_cpu_s") - train["body_cpu_s"] - train["head_cpu_s"] - heads["head_cpu_s"]
        rows.append(utilisation_row("  actor: the rest (backward, losses)", rest,
                                    train["flops"] * 2 / 3, (train["compute_s"]) * 2 / 3, "FLOP",
                                    "the backward's matmuls (2x the forwards') against everything untimed"))
    opt = optimizer_work(meter, limits, "optimizer", threads)
    rows.append(utilisation_row("optimizer (AdamW)", col("optimizer_cpu_s"), opt["bytes"], opt["bandwidth_s"], "B",
                                f"{opt['steps']:.0f} steps of {opt['params'] / max(opt['steps'], 1) / 1e6:.1f}M "
                                f"parameters, 7 values each"))
    return rows


def load_limits(path: str | None, model_configs: list[Path], threads: int) -> dict:
    """The machine_limits.py record at ``path``, else one measured now at the models' shapes and ``threads``."""
    from benchmarks.limits import host_info

    if path:
        limits = {**json.loads(Path(path).read_text()), "source": path}
        host = host_info()
        if limits["host"]["capability"] != host["capability"] or limits["host"]["cpu"] != host["cpu"]:
            print(f"note: the limits were measured on {limits['host']['cpu']} ({limits['host']['capability']}), "
                  f"this is {host['cpu']} ({host['capability']})", flush=True)
        return limits
    from agents.llm.models.precision import native_bf16
    from benchmarks.machine_limits import measure, model_shapes

    models = {str(c): model_shapes(str(c)) for c in dict.fromkeys(model_configs)}
    print(f"measuring this CPU's limits at the models' shapes, {threads} thread(s) (--limits skips this) ...",
          flush=True)
    return measure(models, [threads], ["float32"] + (["bfloat16"] if native_bf16("cpu") else []), repeats=3,
                   log=lambda *a, **k: None)


def teacher_check(teacher_path: str, student_fn, cfg, episodes: int, layout_packing: str = "prefix_tree") -> str:
    """Roll out ``episodes`` episodes (one group) with the student; the teacher's log-probs of the sampled tokens
    in bf16 vs fp32 on them (``prefix_tree`` packing, aligned)."""
    import torch

    from agents.llm.models.local import load_pretrained
    from agents.llm.generation.policy import LLMPolicy
    from agents.llm.records.rollouts import records_of, rollout
    from agents.llm.training.common import make_envs
    from distill.experiment.stages import arm_config
    from distill.scoring import score_records

    lm, tok = student_fn()
    run_cfg = arm_config(cfg, "memopd", 0, {"path": "unused"}, {"path": teacher_path})
    envs = make_envs(replace(run_cfg, num_envs=1))
    policy = LLMPolicy(lm, tok, temperature=run_cfg.temperature, max_new_tokens=run_cfg.max_new_tokens, seed=5)
    records = records_of(rollout(policy, envs, [12345] * episodes, groups=[0] * episodes))
    out = {}
    for dtype in ("float32", "bfloat16"):
        teacher, _ = load_pretrained(teacher_path, dtype=dtype)
        scored = score_records(teacher, records, layout_packing, tokenizer=tok)
        out[dtype] = torch.cat(scored["logprobs"])
        del teacher
    delta = (out["bfloat16"] - out["float32"]).abs()
    return (f"teacher bf16 vs fp32 on {len(records)} records, {delta.numel()} sampled tokens ({layout_packing}): "
            f"|d logp| max {float(delta.max()):.4f}, p99 {float(torch.quantile(delta.double(), 0.99)):.4f}, "
            f"mean {float(delta.mean()):.5f}; mean teacher logp fp32 {float(out['float32'].mean()):.3f}")


def print_utilisation(side: str, result: dict, limits: dict, threads: int) -> None:
    """The side's phases as shares of the limits (kept in ``result["utilisation"]``), with the host line."""
    from benchmarks.limits import format_rows, host_info, host_text

    result["utilisation"] = utilisation(result["meter"], result["metrics"], limits, threads)
    print(f"\n{side}: each phase against this CPU's limit at {threads} thread(s) (rates per CPU-second; limits: "
          f"{limits.get('source', 'measured at the start')})\n{host_text(host_info())}")
    print(format_rows(result["utilisation"]) + "\n", flush=True)


def write_record(args, results: dict, limits: dict) -> None:
    from memenv.files import write_text_atomic
    from benchmarks.limits import host_info

    record = {"command": " ".join(["python", "benchmarks/arm_update_cost.py", *sys.argv[1:]]), "host": host_info(),
              "limits": args.limits or "measured at the start", "limits_host": limits["host"], "sides": {}}
    for side, result in results.items():
        m = result["metrics"]
        record["sides"][side] = {
            "cpu_s": result["cpu"], "wall_s": result["wall"], "updates": len(m),
            "parts_cpu_s": {col: float(m[col].sum()) for _, col in PARTS if col in m},
            **{c: float(m[c].mean()) for c in ("response_tokens", "turns") if c in m},
            "utilisation": result.get("utilisation"), "counts": result["meter"].rows()}
    write_text_atomic(args.record, json.dumps(record, indent=1))
    print(f"wrote {args.record}", flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--run", help="the experiment's --out folder (teacher and student built)")
    source.add_argument("--base", help="a prepared base model folder: teacher = it, student = it or its first "
                                       "layers (the preset's student.layers, or --student-layers)")
    parser.add_argument("--arm", choices=["rl", "memopd", "teacher_persistent"], default="memopd")
    parser.add_argument("--updates", type=int, default=1)
    parser.add_argument("--student-layers", type=int, default=None, metavar="N",
                        help="with --base: the student keeps the base's first N decoder layers (default: the preset's "
                             "student.layers; 0 = the whole model)")
    parser.add_argument("--baseline", choices=["before", "reuse", "precision"], default="before",
                        help="the left side: the update before issue 33's speed work (default), or the update now "
                             "without the scoring passes it saves by reusing forwards (reuse), or the update now in bf16 "
                             "(precision: bf16 autocast, bf16 teacher)")
    parser.add_argument("--lora-rank", type=int, default=0, metavar="R",
                        help="the right side trains rank-R adapters (PPOConfig.lora_rank), the left side the full "
                             "weights, both with the arms' settings now (0: off, the default)")
    parser.add_argument("--side", choices=["both", "after"], default="both",
                        help="after: the update now only (no baseline side)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of this process (default 1)")
    parser.add_argument("--json", action="store_true",
                        help="with --side after: print its totals as one JSON line instead of the table")
    parser.add_argument("--limits", default=None, metavar="JSON",
                        help="a benchmarks/machine_limits.py record to compare the phases with (default: measure the "
                             "limits now, at the models' shapes and --threads)")
    parser.add_argument("--record", default=None, metavar="PATH",
                        help="write each side's utilisation table and counts here as JSON (atomically)")
    parser.add_argument("--teacher-check", type=int, default=0, metavar="N",
                        help="also compare the teacher's log-probs bf16 vs fp32 on N rolled-out episodes")
    args = parser.parse_args(argv)
    if args.threads < 1:
        parser.error(f"--threads must be >= 1, got {args.threads}")
    if args.json and args.side != "after":
        parser.error("--json needs --side after (one side's totals)")

    import torch

    from agents.llm.models.local import load_pretrained
    from agents.llm.models.precision import fast_bf16, host_line
    from agents.llm.training.common import latest_checkpoint
    from distill.experiment.config import ExperimentConfig, ModelSpec, pretrained_config
    from distill.experiment.stages import arm_config

    torch.set_num_threads(args.threads)
    if args.run:
        run = Path(args.run)
        saved = json.loads((run / "experiment.json").read_text())
        specs = {k: ModelSpec(**saved.pop(k)) for k in ("teacher", "student")}
        cfg = replace(ExperimentConfig(**{**saved, **specs}), updates=args.updates, curve_every=args.updates)
        result = run / "teacher" / "result.json"
        if result.exists():
            teacher = json.loads(result.read_text())
        else:  # a run whose teacher is still training: its latest checkpoint
            teacher_ckpt = latest_checkpoint(run / "teacher")
            if teacher_ckpt is None:
                raise SystemExit(f"{run / 'teacher'} has no checkpoint: run the experiment with --until teacher")
            teacher = {"path": str(teacher_ckpt.resolve())}
        student_ckpt = latest_checkpoint(run / "student" / "sft")
        if student_ckpt is None:
            raise SystemExit(f"{run / 'student' / 'sft'} has no checkpoint: run the experiment with --until student")
        student = {"path": str(student_ckpt.resolve())}

        def student_fn():
            return load_pretrained(student["path"])
    else:
        from agents.llm.models.pretrained import shrink

        base = Path(args.base).expanduser()
        if not (base / "config.json").exists():
            raise SystemExit(f"--base {base}: not a prepared model folder (no config.json)")
        cfg = replace(pretrained_config("unused"), updates=args.updates, curve_every=args.updates)
        if args.student_layers is not None:
            if args.student_layers < 0:
                raise SystemExit(f"--student-layers must be >= 0 (0: the whole model), got {args.student_layers}")
            cfg = replace(cfg, student=replace(cfg.student, layers=args.student_layers))
        teacher, student = {"path": str(base)}, {"path": str(base)}

        def student_fn():
            model, tok = load_pretrained(base)
            if not cfg.student.layers:  # 0: the whole model (the preset's same-size student)
                return model, tok
            small = shrink(model, cfg.student.layers)
            del model
            return small, tok

    limits = None
    if not args.json:
        limits = load_limits(args.limits, [Path(teacher["path"]), Path(student["path"])], args.threads)
        print(host_line(), f"| {args.arm}, {args.updates} update(s) of {cfg.tasks_per_update * cfg.group_size} "
          f"episodes, {cfg.max_new_tokens}-token action cap; teacher bf16 on this host: "
              f"{'yes' if fast_bf16('cpu') else 'no (fp32)'}", flush=True)
    results = {}
    for side in ("after",) if args.side == "after" else ("after", "before"):  # the new path first: a failure there shows before the long side
        with tempfile.TemporaryDirectory() as scratch:
            run_cfg = replace(arm_config(cfg, args.arm, 0, student, teacher), out_dir=scratch, progress=False,
                              threads=args.threads)
            if args.lora_rank and side == "after":
                run_cfg = replace(run_cfg, lora_rank=args.lora_rank)
            elif side == "before" and not args.lora_rank:
                run_cfg = before(run_cfg, args.baseline)
            results[side] = run_side(run_cfg, args.arm, student_fn)
        m = results[side]["metrics"]
        if args.json:
            end = time.time()  # the training's span on the wall clock (update_threads.py spans the processes)
            print(json.dumps({"cpu": results[side]["cpu"], "wall": results[side]["wall"], "updates": len(m),
                              "train_start": end - results[side]["wall"], "train_end": end,
                              "update_cpu": float(sum(m[c].sum() for _, c in PARTS if c in m)),
                              **{c: float(m[c].mean()) for c in ("response_tokens", "turns") if c in m},
                              "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6}), flush=True)
            return 0
        print(f"{side}: {results[side]['cpu']:.1f} CPU-s, {results[side]['wall']:.0f} wall-s; "
              + ", ".join(f"{c} {m[c].iloc[-1]:.4g}" for c in ("response_tokens", "turns", "first_approx_kl",
                                                             "first_clipfrac", "distill_loss") if c in m), flush=True)
        print_utilisation(side, results[side], limits, args.threads)
    if args.record:
        write_record(args, results, limits)
    if args.side == "after":  # no baseline side: its line above is the figure
        return 0
    rows = []
    for label, col in PARTS:
        b, a = (float(results[s]["metrics"][col].sum()) if col in results[s]["metrics"] else 0.0
                for s in ("before", "after"))
        rows.append((label, b, a))
    rows.append(("other (loading, setup)", results["before"]["cpu"] - sum(r[1] for r in rows),
                 results["after"]["cpu"] - sum(r[2] for r in rows)))
    rows.append(("total", results["before"]["cpu"], results["after"]["cpu"]))
    print(f"\n{'CPU-s (' + str(args.updates) + ' update(s))':<28}{'before':>10}{'after':>10}{'ratio':>8}")
    for label, b, a in rows:
        print(f"{label:<28}{b:>10.1f}{a:>10.1f}{(b / a if a > 0 else float('nan')):>8.2f}")
    per_update = [results[s]["cpu"] - rows[-2][1 if s == "before" else 2] for s in ("before", "after")]
    print(f"update (the parts' sum): {per_update[0]:.1f} -> {per_update[1]:.1f} CPU-s, "
          f"{per_update[0] / per_update[1]:.2f}x; peak RSS "
          f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6:.1f} GB")
    if args.teacher_check:
        print(teacher_check(teacher["path"], student_fn, cfg, args.teacher_check), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
