"""The teacher's greedy F1 in each view, split by whether the episode's memory lost a fact its transcript holds
(issue 61 item 3: "each view's F1 on states with and without lost facts").

A teacher that reads each view as its demonstrations taught it should answer from the flattened transcript where
the memory lost a fact (the persistent view: its F1 on such episodes near its F1 elsewhere) and search again in
the memory view (there a lost fact costs turns, not the answer, while turns are left). For each pool (held-out and
seen subjects, the same seeds as the run's own evaluations) and each view, it plays the run's teacher greedily,
marks each episode by :func:`distill.views.lost_facts` (from the env's snapshots: some turn's memory state lacks a
gold answer an earlier search showed; the env keeps the memory in both views, so the mark means the same in each)
and prints F1 with and without a lost fact, the share of such episodes and their turns, and the host line.

    python benchmarks/teacher_lost_facts.py --run runs/memopd_budget [--episodes 100] [--json lost.json]

``--run`` is a ``memenv experiment memopd`` folder whose teacher is built (``--until teacher``). 1 torch thread.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from teacher_views import _refuse as _refuse_as, check_inputs  # noqa: E402

PROG = "teacher_lost_facts.py"


def _refuse(message: str) -> SystemExit:
    return _refuse_as(message, PROG)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", required=True, help="the experiment's --out folder (its teacher built)")
    parser.add_argument("--episodes", type=int, default=100, help="episodes per pool and view (default 100)")
    parser.add_argument("--json", default=None, help="write the table and the host here (atomically)")
    args = parser.parse_args(argv)
    if args.episodes < 1:
        raise _refuse(f"--episodes must be >= 1, got {args.episodes}")
    run = Path(args.run)
    paths, saved = check_inputs(run, args.json, stages=("teacher",), out_flag="--json", prog=PROG)

    import pandas as pd
    import torch

    from agents.llm.generation.policy import LLMPolicy
    from agents.llm.models.local import load_pretrained
    from agents.llm.models.precision import host_line
    from agents.llm.records.rollouts import records_of, rollout
    from agents.llm.training.common import eval_seeds
    from distill.experiment.config import ExperimentConfig, ModelSpec
    from distill.experiment.evaluation import make_env_fn
    from distill.views import lost_facts
    from memenv.files import write_text_atomic

    torch.set_num_threads(1)
    try:
        specs = {k: ModelSpec(**saved.pop(k)) for k in ("teacher", "student")}
        cfg = replace(ExperimentConfig(**{**saved, **specs}), out=str(run))
    except (TypeError, ValueError) as err:
        raise _refuse(f"{run / 'experiment.json'}: {err}") from None
    host = host_line()
    print(host, f"| the teacher greedy, {args.episodes} episodes per pool and view, {cfg.max_new_tokens}-token cap",
          flush=True)
    teacher, tok = load_pretrained(paths["teacher"])
    seeds = eval_seeds(args.episodes)
    rows, start = [], time.process_time()
    for pool, label in (("heldout", "held-out"), ("train", "seen")):
        envs = [make_env_fn(cfg, pool)() for _ in range(cfg.num_envs)]
        for view in ("memory", "persistent"):
            eps = rollout(LLMPolicy(teacher, tok, temperature=0.0, max_new_tokens=cfg.max_new_tokens), envs, seeds,
                          progress=cfg.progress, view=view)
            marks = lost_facts(records_of(eps)).set_index("episode")
            frame = pd.DataFrame({"f1": [ep.f1 for ep in eps], "turns": [ep.turns for ep in eps],
                                  "lost": [bool(marks.loc[ep.episode_id, "lost"]) for ep in eps]})
            for lost, part in frame.groupby("lost"):
                rows.append({"pool": label, "view": view, "lost_fact": bool(lost), "episodes": len(part),
                             "f1": float(part.f1.mean()), "f1_se": float(part.f1.std(ddof=1) / len(part) ** 0.5)
                             if len(part) > 1 else float("nan"), "turns": float(part.turns.mean())})
            rows.append({"pool": label, "view": view, "lost_fact": "all", "episodes": len(frame),
                         "f1": float(frame.f1.mean()), "f1_se": float(frame.f1.std(ddof=1) / len(frame) ** 0.5),
                         "turns": float(frame.turns.mean())})
        for env in envs:
            env.close()
    table = pd.DataFrame(rows)
    with pd.option_context("display.width", 160, "display.float_format", "{:.3f}".format):
        print(table.to_string(index=False))
    cpu = time.process_time() - start
    print(f"{cpu:.0f} CPU-s")
    if args.json:
        write_text_atomic(Path(args.json), json.dumps({"command": "python " + " ".join(sys.argv), "host": host,
                                                       "run": str(run), "episodes": args.episodes,
                                                       "cpu_seconds": cpu, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
