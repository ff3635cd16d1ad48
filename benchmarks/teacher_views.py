"""Where each reconstruction points the student: the teacher's greedy next action under the aligned view (the
student's memory state, as sampled) and under the persistent view (the episode flattened into one transcript, the
teacher-persistent control's) of the same invocations, on one GRPO-shaped batch of the start student's episodes
at the training temperature (what the arms' first update sees). Prints the counts of each kind of action (search,
answer, invalid) per view, for the invocations after each episode's first (turn 0's two views are one prompt;
``--min-turn 0`` takes them too), then, in the aligned view, the student's own sampled action against the
teacher's there (what the distillation term pushes the student toward), the same counts split by whether every gold
answer is in the view's text (answering possible: only there does a search say the teacher will not answer), and
the host line; ``--csv`` writes every row (the texts too).

    python benchmarks/teacher_views.py --run runs/memopd_smol [--episodes 32] [--min-turn 0] [--csv views.csv]

``--run`` is a ``memenv experiment memopd`` output folder with its teacher and weak start built (``--until
student``). 1 torch thread; greedy decoding, so the figures depend only on the run's models and the episodes.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path


def _refuse(message: str, prog: str = "teacher_views.py") -> SystemExit:
    """One line on stderr, exit status 2 (as ``memenv`` commands refuse a user's input)."""
    print(f"{prog}: error: {message}", file=sys.stderr)
    return SystemExit(2)


def check_inputs(run: Path, csv: str | None, stages: tuple[str, ...] = ("teacher", "student"),
                 out_flag: str = "--csv", prog: str = "teacher_views.py") -> tuple[dict[str, str], dict]:
    """Everything the benchmark reads and writes, checked before any model is loaded (as ``memenv distill
    diagnose`` does): the run folder, each of ``stages``' ``result.json`` and the checkpoint it names
    (re-resolved under the run folder if the folder was moved), ``experiment.json``, and that the output file
    (``csv``, given as ``out_flag``) can be written; ``prog`` names the script in a refusal. Returns the
    checkpoints' paths and the saved settings; a :class:`SystemExit` (status 2) naming the first problem
    otherwise."""
    from agents.llm.models.pretrained import check_checkpoint
    from distill.experiment.stages import StageFileError, read_stage_json, relocated
    from memenv.cli_common import CommandError, check_out_dir

    if not run.is_dir():
        raise _refuse(f"--run {run}: no such folder (a memenv experiment memopd --out folder)", prog)
    if csv is not None:
        target = Path(csv)
        if target.is_dir():
            raise _refuse(f"{out_flag} {csv}: is a folder, not a file", prog)
        try:
            check_out_dir(target.parent if str(target.parent) else ".", f"{out_flag} {csv}: its folder")
        except CommandError as err:
            raise _refuse(str(err), prog) from None
    paths = {}
    try:
        for stage in stages:
            result = run / stage / "result.json"
            if not result.exists():
                raise _refuse(f"{result} is missing: run the experiment with --until {stages[-1]} first", prog)
            saved = read_stage_json(result, "that stage's result")
            if not isinstance(saved, dict) or not isinstance(saved.get("path"), str):
                raise _refuse(f"{result}: no checkpoint path in it (not a stage result of memenv experiment)", prog)
            paths[stage] = relocated(saved, run / stage)["path"]
            check_checkpoint(paths[stage], f"the {stage} checkpoint named by {result}")
        settings = run / "experiment.json"
        if not settings.exists():
            raise _refuse(f"{settings} is missing: not a memenv experiment memopd folder", prog)
        saved = read_stage_json(settings, "nothing (it is the run's settings: restore it)")
    except (StageFileError, CommandError) as err:
        raise _refuse(str(err), prog) from None
    if not isinstance(saved, dict) or not all(isinstance(saved.get(k), dict) for k in ("teacher", "student")):
        raise _refuse(f"{settings}: not the settings of a memenv experiment (no teacher and student specs)", prog)
    return paths, saved


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", required=True, help="the experiment's --out folder (teacher and student built)")
    parser.add_argument("--episodes", type=int, default=32, help="episodes sampled (groups of the run's group size)")
    parser.add_argument("--min-turn", type=int, default=1,
                        help="the first turn read (0-based; default 1: turn 0's two views are one prompt)")
    parser.add_argument("--csv", default=None, help="write every row here (atomically)")
    args = parser.parse_args(argv)
    if args.episodes < 1:
        raise _refuse(f"--episodes must be >= 1, got {args.episodes}")
    if args.min_turn < 0:
        raise _refuse(f"--min-turn must be >= 0, got {args.min_turn}")
    run = Path(args.run)
    paths, saved = check_inputs(run, args.csv)

    import pandas as pd
    import torch

    from memenv.files import write_atomic
    from agents.llm.models.local import load_pretrained
    from agents.llm.models.precision import host_line
    from distill.diagnose import teacher_next_actions
    from distill.experiment.config import ExperimentConfig, ModelSpec
    from distill.experiment.stages import _sample_records  # the arms' batch shape, seeds and temperature
    from distill.teacher import VocabularyMismatchError, check_vocabulary

    torch.set_num_threads(1)
    try:
        specs = {k: ModelSpec(**saved.pop(k)) for k in ("teacher", "student")}
        cfg = replace(ExperimentConfig(**{**saved, **specs}), out=str(run))
    except (TypeError, ValueError) as err:  # a setting this version does not know, or out of its range
        raise _refuse(f"{run / 'experiment.json'}: {err}") from None
    print(host_line(), f"| {args.episodes} episodes of the start student at temperature {cfg.temperature}, "
          f"teacher greedy, {cfg.max_new_tokens}-token cap", flush=True)
    student, tok = load_pretrained(paths["student"])
    records = _sample_records(student, tok, cfg, args.episodes)
    del student
    teacher, teacher_tok = load_pretrained(paths["teacher"])
    try:  # the views are the student's ids: the teacher must read them as the same tokens
        check_vocabulary(teacher_tok, tok, teacher)
    except VocabularyMismatchError as err:
        raise _refuse(str(err)) from None
    table = teacher_next_actions(teacher, tok, records, max_new_tokens=cfg.max_new_tokens, min_turn=args.min_turn,
                                 progress=True)
    counts = pd.crosstab(table["view"], table["kind"])
    print(f"{len(table) // 2} invocations from turn {args.min_turn} on, in {len(records)} records")
    print(counts.to_string())
    # searching where the view holds no answer is right: whether a teacher answers when it can shows only on the
    # states where every answer is in its view
    print("where every gold answer is in the view (answering possible) / where not:")
    print(pd.crosstab([table["view"], table["answerable"].map({True: "answerable", False: "not answerable"})],
                      table["kind"]).to_string())
    aligned = table[table["view"] == "aligned"]
    print("the student's sampled action (rows) against the teacher's greedy one in the student's state (columns):")
    print(pd.crosstab(aligned["student_kind"], aligned["kind"], margins=True).to_string())
    if args.csv:
        write_atomic(Path(args.csv), lambda tmp: table.to_csv(tmp, index=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
