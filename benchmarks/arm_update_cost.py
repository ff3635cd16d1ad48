"""CPU cost of one arm update of ``memenv experiment memopd`` at a run's own sizes: GRPO alone (``rl``) or MemOPD
(``memopd``), from the run's cached teacher and weak start (the stages ``--until student`` leaves), 1 torch
thread, into a scratch folder (the run's own folders are not touched). Prints the trainer's per-update figures
(rollout, update and teacher seconds from its ``metrics.csv``), the process CPU seconds and peak RSS, with the
host line.

    memenv experiment memopd --model smollm2-135m-instruct --out runs/memopd_smol --until student
    python benchmarks/arm_update_cost.py --run runs/memopd_smol --arm memopd [--updates 1]
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", required=True, help="the experiment's --out folder (teacher and student built)")
    parser.add_argument("--arm", choices=["rl", "memopd", "teacher_persistent"], default="memopd")
    parser.add_argument("--updates", type=int, default=1)
    args = parser.parse_args(argv)

    import pandas as pd
    import torch

    from agents.llm.models import load_pretrained
    from agents.llm.ppo import train_rl
    from agents.llm.precision import host_line
    from agents.llm.training import latest_checkpoint
    from distill.experiment.config import ExperimentConfig, ModelSpec
    from distill.experiment.stages import arm_config
    from distill.trainer import train_memopd

    torch.set_num_threads(1)
    run = Path(args.run)
    saved = json.loads((run / "experiment.json").read_text())
    specs = {k: ModelSpec(**saved.pop(k)) for k in ("teacher", "student")}
    cfg = replace(ExperimentConfig(**{**saved, **specs}), updates=args.updates, curve_every=args.updates)
    teacher = json.loads((run / "teacher" / "result.json").read_text())
    student_ckpt = latest_checkpoint(run / "student" / "sft")
    if student_ckpt is None:
        raise SystemExit(f"{run / 'student' / 'sft'} has no checkpoint: run the experiment with --until student")
    student = {"path": str(student_ckpt.resolve())}
    print(host_line(), f"| {args.arm}, {args.updates} update(s), {cfg.tasks_per_update * cfg.group_size} episodes each")
    with tempfile.TemporaryDirectory() as scratch:
        run_cfg = replace(arm_config(cfg, args.arm, 0, student, teacher), out_dir=scratch, progress=False,
                          threads=1)
        lm, tok = load_pretrained(student["path"])
        cpu, wall = time.process_time(), time.perf_counter()
        (train_rl if args.arm == "rl" else train_memopd)(run_cfg, model=lm, tokenizer=tok)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        metrics = pd.read_csv(Path(scratch) / "metrics.csv")
    cols = [c for c in ("update", "rollout_s", "update_s", "teacher_s", "sampled_tokens_per_s", "distill_loss")
            if c in metrics]
    print(metrics[cols].to_string(index=False))
    print(f"{args.arm}: {cpu:.0f} CPU-s, {wall:.0f} wall-s for {args.updates} update(s); peak RSS "
          f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6:.1f} GB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
