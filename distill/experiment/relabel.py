"""Continue a run's teacher on relabelled demonstrations: the start student plays, each view's expert labels
every state it reached (:mod:`agents.llm.training.relabel`), and the teacher's SFT goes on, from its checkpoint,
over those examples mixed with its own oracle demonstrations (issue 61: a teacher right where the student goes,
that answers from the transcript where the transcript holds every answer).

    python -m distill.experiment.relabel --run runs/memopd_budget --out runs/memopd_relabel --minutes 70

``OUT`` becomes a run folder the benchmarks read as they read ``RUN`` (``view_divergence.py``,
``teacher_views.py``, ``teacher_lost_facts.py --run OUT``): ``experiment.json`` and ``student/result.json`` are
``RUN``'s (the same start), ``teacher/`` holds the continued SFT (its checkpoints, metrics, ``config.json``) and,
once trained, its evaluations in both views and ``result.json``; ``relabel/`` the examples (cached: a resumed
run trains on the same ones) and one row per labelled state (``states.csv``). Every step resumes: the SFT from its
latest checkpoint, the evaluations from their cached rows. The student's episodes use task seeds
``RELABEL_SEED_BASE + i`` of the training pool: neither the teacher's demonstrations (0..), the instrument's
batches (9 * 10**6 ..), the probes (2 * 10**7 ..) nor any held-out question.
"""

from __future__ import annotations

import argparse
import json
import pickle
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from memenv.files import write_atomic, write_text_atomic

#: Task seeds of the relabelled episodes (training pool).
RELABEL_SEED_BASE = 3 * 10**7


def _refuse(message: str) -> SystemExit:
    print(f"relabel: error: {message}", file=sys.stderr)
    return SystemExit(2)


def _load_run(run: Path):
    """The run's saved settings and its teacher's and student's result (checkpoints re-resolved under ``run``)."""
    from distill.experiment.config import ExperimentConfig, ModelSpec
    from distill.experiment.stages import StageFileError, read_stage_json, relocated

    if not (run / "experiment.json").is_file():
        raise _refuse(f"--run {run}: no experiment.json (a memenv experiment memopd --out folder)")
    try:
        saved = read_stage_json(run / "experiment.json", "the run's settings")
        stages = {}
        for stage in ("teacher", "student"):
            path = run / stage / "result.json"
            if not path.is_file():
                raise _refuse(f"{path} is missing: run the experiment with --until student first")
            stages[stage] = relocated(read_stage_json(path, "that stage's result"), run / stage)
        specs = {k: ModelSpec(**saved.pop(k)) for k in ("teacher", "student")}
        cfg = ExperimentConfig(**{**saved, **specs})
    except (StageFileError, TypeError, ValueError) as err:
        raise _refuse(f"--run {run}: {err}") from None
    for stage, res in stages.items():
        if not Path(str(res.get("path"))).is_dir():
            raise _refuse(f"{run / stage / 'result.json'}: its checkpoint {res.get('path')!r} is not there")
    return cfg, stages


def relabelled_data(cfg, student_path: str, episodes: int, cache: Path, progress: bool = True):
    """The student's ``episodes`` relabelled episodes (cached in ``cache``): examples and per-state rows."""
    import pandas as pd

    from agents.llm.generation.policy import LLMPolicy
    from agents.llm.models.local import load_pretrained
    from agents.llm.training.relabel import relabelled_demonstrations
    from distill.experiment.evaluation import make_env_fn

    data_file, states_file = cache / "examples.pkl", cache / "states.csv"
    if data_file.is_file() and states_file.is_file():
        try:
            with data_file.open("rb") as fh:
                stored = pickle.load(fh)
        except (pickle.UnpicklingError, EOFError, AttributeError, ValueError) as err:  # unreadable: made again
            print(f"relabel: {data_file} unreadable ({err}); relabelling again", file=sys.stderr)
            stored = {}
        if stored.get("episodes") == episodes and stored.get("student") == student_path:
            return stored["data"], pd.read_csv(states_file)
    lm, tok = load_pretrained(student_path)
    policy = LLMPolicy(lm, tok, temperature=cfg.temperature, max_new_tokens=cfg.max_new_tokens, seed=0)
    seeds = [RELABEL_SEED_BASE + i for i in range(episodes)]
    out = relabelled_demonstrations(policy, make_env_fn(cfg), seeds, num_envs=cfg.num_envs, progress=progress)
    cache.mkdir(parents=True, exist_ok=True)
    write_atomic(data_file, lambda tmp: Path(tmp).write_bytes(pickle.dumps(
        {"episodes": episodes, "student": student_path, "data": out.data})))
    write_atomic(states_file, lambda tmp: out.stats.to_csv(tmp, index=False))
    return out.data, out.stats


def summarise(states) -> dict[str, float]:
    """What the labels say about the student's states: how often each view's expert answers, how often the two
    views' labels differ, how often the student did what the label says."""
    summary = {"states": int(len(states)), "episodes": int(states.seed.nunique())}
    for view in ("memory", "persistent"):
        if f"{view}_label" in states:
            summary[f"{view}_answers"] = float((states[f"{view}_label"] == "answer").mean())
            summary[f"student_agrees_{view}"] = float(states[f"{view}_agrees"].mean())
    if "views_differ" in states:
        summary["views_differ"] = float(states.views_differ.mean())
    return summary


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m distill.experiment.relabel", description=__doc__.splitlines()[0])
    parser.add_argument("--run", required=True, help="a memenv experiment memopd --out folder (teacher and start)")
    parser.add_argument("--out", required=True, help="the new run folder (resumed where it exists)")
    parser.add_argument("--minutes", type=float, default=70.0, help="CPU-minutes of continued SFT (default 70)")
    parser.add_argument("--episodes", type=int, default=2000, help="relabelled student episodes (default 2000)")
    parser.add_argument("--lr", type=float, default=1e-3, help="peak learning rate, cosine to 0.1x (default 1e-3)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    args = parser.parse_args(argv)
    if args.minutes <= 0 or args.episodes < 1 or args.lr <= 0 or args.threads < 1:
        raise _refuse(f"--minutes, --lr must be > 0, --episodes and --threads >= 1; got {args.minutes}, {args.lr}, "
                      f"{args.episodes}, {args.threads}")
    run, out = Path(args.run), Path(args.out)
    if out.resolve() == run.resolve():
        raise _refuse("--out must be another folder than --run (the run's teacher stays as it is)")
    cfg, stages = _load_run(run)

    import torch

    from agents.llm.generation.policy import LLMPolicy
    from agents.llm.models.local import load_pretrained
    from agents.llm.training.common import latest_checkpoint
    from agents.llm.training.sft import expert_data, train_sft
    from distill.experiment.stages import (_evaluate_both, _persistent_view_eval, _sft_config, _sft_finished,
                                          _train_draw_eval)
    from distill.stats import standard_error

    torch.set_num_threads(args.threads)
    cfg = replace(cfg, out=str(out), sft_threads=args.threads, threads=args.threads)
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / "experiment.json", (run / "experiment.json").read_text(encoding="utf-8"))
    (out / "student").mkdir(exist_ok=True)
    write_text_atomic(out / "student" / "result.json", json.dumps(stages["student"], indent=2, sort_keys=True))
    teacher_dir = out / "teacher"
    record = {"from_run": str(run), "from_teacher": stages["teacher"]["path"], "student": stages["student"]["path"],
              "minutes": args.minutes, "episodes": args.episodes, "lr": args.lr, "seed_base": RELABEL_SEED_BASE}

    data, states = relabelled_data(cfg, stages["student"]["path"], args.episodes, out / "relabel")
    record["labels"] = summarise(states)
    print("relabelled:", json.dumps(record["labels"]), flush=True)
    spec = replace(cfg.teacher, sft_minutes=args.minutes, lr=args.lr, warmup=50)
    sft_cfg = _sft_config(cfg, spec, teacher_dir, model=stages["teacher"]["path"])
    if not (teacher_dir / "result.json").is_file():
        row = _sft_finished(teacher_dir, spec)
        if row is None:  # train (or resume): the oracle's own demonstrations and the relabelled ones, mixed
            teacher_lm, tok = load_pretrained(stages["teacher"]["path"])
            oracle = expert_data(LLMPolicy(teacher_lm, tok, temperature=0.0), sft_cfg,
                                 range(sft_cfg.demo_seed_base, sft_cfg.demo_seed_base + sft_cfg.episodes))
            print(f"{len(oracle)} oracle examples + {len(data)} relabelled", flush=True)
            row = train_sft(sft_cfg, oracle + list(data))
        lm, tok = load_pretrained(latest_checkpoint(teacher_dir))
        held, seen = _evaluate_both(lm, tok, cfg, teacher_dir, "teacher")
        res: dict[str, Any] = {
            "path": str(latest_checkpoint(teacher_dir).resolve()), "steps": int(row.get("step")),
            "train_cpu_seconds": row.get("cpu_seconds"), "f1": float(held.f1.mean()), "f1_se": standard_error(held.f1),
            "seen_f1": float(seen.f1.mean()), "seen_f1_se": standard_error(seen.f1), "relabel": record}
        if cfg.env_kwargs.get("fresh_facts"):
            res.update(_train_draw_eval(lm, tok, cfg, teacher_dir))
        res.update(_persistent_view_eval(lm, tok, cfg, teacher_dir))
        write_text_atomic(teacher_dir / "result.json", json.dumps(res, indent=2, sort_keys=True, default=float))
    res = json.loads((teacher_dir / "result.json").read_text(encoding="utf-8"))
    print(json.dumps({k: v for k, v in res.items() if k != "relabel"}, indent=1), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
