"""The README's tiny-agent command, run as written (only ``--out`` moved), stopped after ``--stop-at`` steps: its
held-out F1 and loss curve so far, the training and evaluation CPU time, and the process's peak RSS.

The command is read from README.md (the line whose comment says "a tiny LLM agent"), so this is the command a
reader runs: ``memenv train --algo sft --out runs/sft --steps 2000``, a tiny Qwen2 from scratch with the tiny-model
recipe (``agents.llm.training.recipes.TINY_SFT_RECIPE``; the LR cosine spans all of ``--steps``, so a prefix of the run
is the same run, not a shorter one). ``--stop-at`` N: the run is interrupted (Ctrl-C, as a user would) once its
evaluation at step >= N is logged; 0 runs it to the end.

    python benchmarks/tiny_agent.py --out bench_out/tiny_agent --stop-at 400
    python benchmarks/tiny_agent.py --out bench_out/tiny_agent_full --stop-at 0       # the whole command
    python benchmarks/tiny_agent.py --out bench_out/tiny_agent --stop-at 400 --extra "--eval-episodes 32"

``--extra``: flags appended to the command (they override its own); printed with the figures. Prints a host line
first; writes ``OUT/tiny_agent.json`` (the curve and the costs) beside the run's own files in ``OUT/run``.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import resource
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MARKER = "a tiny LLM agent"


def readme_command(readme: Path = ROOT / "README.md") -> list[str]:
    """The argv (after ``memenv``) of the README's tiny-agent command."""
    for line in readme.read_text(encoding="utf-8").splitlines():
        command, _, comment = line.partition("  #")
        if MARKER in comment:
            part = next((p.strip() for p in command.split("&&") if p.strip().startswith("memenv train")), None)
            if part:
                return shlex.split(part)[1:]
    raise SystemExit(f"README.md has no `memenv train` line commented {MARKER!r}")


def with_out(argv: list[str], out: Path) -> list[str]:
    """``argv`` with its ``--out`` value replaced by ``out``."""
    argv = list(argv)
    if "--out" not in argv:
        return argv + ["--out", str(out)]
    argv[argv.index("--out") + 1] = str(out)
    return argv


def read_rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    with open(path, newline="") as fh:
        return [r for r in csv.DictReader(fh) if r.get("step") and None not in r.values()]


def curve(rows: list[dict]) -> list[dict]:
    """Per evaluation: step, training CPU-min, F1, the action-token loss logged last, evaluation CPU-min so far."""
    out, loss = [], None
    for r in rows:
        if r.get("loss"):
            loss = float(r["loss"])
        if r.get("eval_f1"):
            out.append({"step": int(float(r["step"])), "train_cpu_min": round(float(r["cpu_seconds"]) / 60, 2),
                        "eval_f1": float(r["eval_f1"]), "loss": loss,
                        "eval_cpu_min": round(float(r.get("eval_cpu_seconds") or 0) / 60, 2)})
    return out


def losses(rows: list[dict], every: int) -> list[dict]:
    """The logged training rows at multiples of ``every`` steps (and the last): step, training CPU-min, the
    action-token loss and argmax accuracy."""
    logged = [r for r in rows if r.get("loss")]
    keep = [r for i, r in enumerate(logged) if int(float(r["step"])) % every == 0 or i == len(logged) - 1]
    return [{"step": int(float(r["step"])), "train_cpu_min": round(float(r["cpu_seconds"]) / 60, 2),
             "loss": float(r["loss"]), "token_acc": float(r["token_acc"])} for r in keep]


def rss_mb(pid: int) -> float | None:
    """The resident set of process ``pid`` now (MB), or None once it has gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def last_step(rows: list[dict]) -> int:
    return int(float(rows[-1]["step"])) if rows else 0


def rss_at(samples: list[dict], steps: list[int]) -> dict[int, float]:
    """The RSS sampled while the run was at each of ``steps`` (the last sample whose logged step is <= it)."""
    out = {}
    for step in steps:
        before = [s["rss_mb"] for s in samples if s["step"] <= step]
        if before:
            out[step] = before[-1]
    return out


def run(argv: list[str], run_dir: Path, stop_at: int, poll: float) -> dict:
    cmd = [sys.executable, "-m", "memenv.cli", *argv]
    start = time.perf_counter()
    # Ctrl-C (SIGINT) back to its default in the command: started in the background by a non-interactive shell,
    # it would inherit SIGINT ignored and never stop
    proc = subprocess.Popen(cmd, cwd=ROOT, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    stopped, samples = False, []
    try:
        while proc.poll() is None:
            time.sleep(poll)
            rows = read_rows(run_dir / "metrics.csv")
            rss = rss_mb(proc.pid)
            if rss is not None:  # the step logged last: the memory of the run at that point
                samples.append({"step": last_step(rows), "rss_mb": round(rss, 1)})
            evals = curve(rows)
            if stop_at and evals and evals[-1]["step"] >= stop_at and not stopped:
                proc.send_signal(signal.SIGINT)  # as a user's Ctrl-C: the command keeps its checkpoints
                stopped = True
    except KeyboardInterrupt:  # the figures so far are still printed
        proc.send_signal(signal.SIGINT)
        proc.wait()
        stopped = True
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"returncode": proc.returncode, "stopped_at_step_limit": stopped,
            "wall_min": round((time.perf_counter() - start) / 60, 2),
            "process_cpu_min": round((usage.ru_utime + usage.ru_stime) / 60, 2),
            "peak_rss_gb": round(usage.ru_maxrss / 2**20, 2),  # ru_maxrss: KiB on Linux
            "rss_samples": samples}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("bench_out/tiny_agent"))
    p.add_argument("--stop-at", type=int, default=400, help="stop after the evaluation at this step (0: the whole run)")
    p.add_argument("--extra", default="", help="flags appended to the README's command (they override it)")
    p.add_argument("--loss-every", type=int, default=50, help="print the training loss every N steps")
    p.add_argument("--poll", type=float, default=5.0, help="seconds between looks at metrics.csv")
    args = p.parse_args()
    if args.stop_at < 0:
        raise SystemExit(f"--stop-at must be >= 0, got {args.stop_at}")
    if args.loss_every < 1:
        raise SystemExit(f"--loss-every must be >= 1, got {args.loss_every}")
    signal.signal(signal.SIGINT, signal.default_int_handler)  # a Ctrl-C stops the run and prints its figures

    from agents.llm.models.precision import host_line, resolve_autocast
    from agents.llm.training.recipes import TINY_SFT_RECIPE

    readme = readme_command()
    args.out = args.out.resolve()  # the command runs from the repository root
    run_dir = args.out / "run"
    if (run_dir / "metrics.csv").exists():
        raise SystemExit(f"--out {args.out}: holds an earlier run ({run_dir}); choose another --out")
    argv = with_out(readme, run_dir) + shlex.split(args.extra)
    print(host_line(resolve_autocast(TINY_SFT_RECIPE["autocast"])), flush=True)
    print(f"README command: memenv {shlex.join(readme)}\nrun as:         memenv {shlex.join(argv)}"
          + (f" (stopped after the evaluation at step >= {args.stop_at})" if args.stop_at else ""), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    costs = run(argv, run_dir, args.stop_at, args.poll)
    points = curve(read_rows(run_dir / "metrics.csv"))
    print(f"\n{'step':>6} {'train CPU-min':>13} {'eval CPU-min':>12} {'loss':>7} {'held-out F1':>11}")
    for pt in points:
        loss = f"{pt['loss']:.3f}" if pt["loss"] is not None else "-"
        print(f"{pt['step']:>6} {pt['train_cpu_min']:>13.2f} {pt['eval_cpu_min']:>12.2f} {loss:>7} {pt['eval_f1']:>11.3f}")
    trained = losses(read_rows(run_dir / "metrics.csv"), args.loss_every)
    print(f"\n{'step':>6} {'train CPU-min':>13} {'loss':>7} {'token acc':>9}")
    for pt in trained:
        print(f"{pt['step']:>6} {pt['train_cpu_min']:>13.2f} {pt['loss']:>7.3f} {pt['token_acc']:>9.3f}")
    first_eval = points[0]["step"] if points else None
    marks = sorted({200, 1000, costs["rss_samples"][-1]["step"] if costs["rss_samples"] else 0}
                   | ({first_eval} if first_eval else set()))
    at = rss_at(costs["rss_samples"], marks)
    if at:
        print("\nRSS (sampled every --poll seconds; the step logged last): "
              + ", ".join(f"step {k}: {v:,.0f} MB" for k, v in at.items()))
    print(f"\nthe command's process: {costs['process_cpu_min']} CPU-min, {costs['wall_min']} wall-min, "
          f"peak RSS {costs['peak_rss_gb']} GB; exit status {costs['returncode']}")
    result = {"readme_command": ["memenv", *readme], "argv": ["memenv", *argv], "stop_at": args.stop_at,
              "curve": points, "losses": trained, **costs}
    (args.out / "tiny_agent.json").write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out / 'tiny_agent.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
