"""``memenv experiment memopd`` (entry point ``memenv.commands``): the options, the configuration they make
(:mod:`distill.experiment.config`) and the run (:func:`distill.experiment.run.run_experiment`)."""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from distill import experiment
from distill.experiment.config import (ARMS, DEFAULT_ARMS, PRETRAINED_QUICK, ExperimentConfig, SettingsMismatchError,
                                       WORLDS, FAIR_ARMS, check_settings, fair_config, pretrained_config, quick_config,
                                       plateau_config, powered_config, real_fair_config, world_config)
from distill.experiment.run import LINKED_STAGES, STAGES, link_stages, run_experiment
from memenv.cli_common import (CommandError, HelpFormatter, check_out_dir, non_negative_float, non_negative_int,
                               positive_float, positive_int, unit_float, user_input)
from memenv.costs import cost


def _run(args: argparse.Namespace) -> int:
    for option, value in (("--stages-from", args.stages_from), ("--teacher-from", args.teacher_from)):
        if value is not None and not value.strip():
            raise CommandError(f"{option}: expected a run's folder, got an empty path")
    # a file, a folder that cannot be made, or one this run reads from: one line, before any work
    check_out_dir(args.out, inputs=[p for p in (args.stages_from, args.teacher_from, args.model) if p])
    overrides: dict[str, Any] = {k: getattr(args, k) for k in ("seeds", "updates", "eval_episodes", "threads",
                                                               "workers", "sft_threads", "student_start_f1", "student_max_steps",
                                                               "lr", "distill_coef", "seen_eval_episodes",
                                                               "curve_every", "curve_episodes")
                                 if getattr(args, k) is not None}
    overrides["progress"] = not args.quiet
    if args.arms:
        overrides["arms"] = tuple(dict.fromkeys(args.arms))
    with user_input():
        if args.fair and (args.quick or args.world == "fixed"):
            raise CommandError("--fair is the fresh world's fair-evidence preset (tiny models; with --model, the "
                               "real-model pair of issue 47): it takes neither --quick nor --world fixed")
        if args.powered and (args.fair or args.quick or args.model or args.world):
            raise CommandError("--powered is issue 61's preset (fresh world, tiny models): it takes none of --fair, "
                               "--quick, --model and --world")
        if (args.plateau or args.pilot) and not args.powered:
            raise CommandError(f"{'--plateau' if args.plateau else '--pilot'} is a variant of --powered (its regime and "
                               "teacher): add --powered")
        if args.plateau and args.pilot:
            raise CommandError("--pilot sizes the powered run, --plateau is its second question: give one of them")
        if args.stages_from and args.teacher_from:
            raise CommandError("--stages-from links the teacher and the student, --teacher-from the teacher only: "
                               "give one of them")
        if args.powered and args.plateau:
            cfg = plateau_config(args.out, **overrides)
        elif args.powered and args.pilot:
            from distill.experiment.pilot import pilot_config

            cfg = pilot_config(args.out, **overrides)
        elif args.powered:
            cfg = powered_config(args.out, **overrides)
        elif args.fair and args.model:
            cfg = real_fair_config(args.out, args.model, **overrides)
        elif args.fair:
            cfg = fair_config(args.out, **overrides)
        elif args.model:
            cfg = pretrained_config(args.out, args.model, **{**(PRETRAINED_QUICK if args.quick else {}), **overrides})
        else:
            cfg = quick_config(args.out, **overrides) if args.quick else ExperimentConfig(out=args.out, **overrides)
        if not (args.fair or args.powered):
            cfg = world_config(cfg, args.world or "fixed", quick=args.quick)
        if args.teacher_minutes is not None or args.teacher_clock is not None:
            cfg.teacher = replace(cfg.teacher, **({"sft_minutes": args.teacher_minutes}
                                                  if args.teacher_minutes is not None else {}),
                                  **({"sft_clock": args.teacher_clock} if args.teacher_clock else {}))
        if args.student_steps is not None:
            cfg.student = replace(cfg.student, sft_steps=args.student_steps)
        if args.sft_worlds is not None:
            cfg.teacher = replace(cfg.teacher, sft_worlds=args.sft_worlds)
            cfg.student = replace(cfg.student, sft_worlds=args.sft_worlds)
        cfg.__post_init__()
        if cfg.model:  # a missing or damaged folder, or a registered model not installed: one line, before any work
            from agents.llm.models.pretrained import check_checkpoint

            check_checkpoint(cfg.model, "--model")
        if args.extend_teacher:
            if args.stages_from or args.teacher_from:
                raise CommandError("--extend-teacher continues this run's own teacher: it takes neither "
                                   "--stages-from nor --teacher-from")
            from distill.experiment.extend import extend_teacher, format_extension

            try:
                print(format_extension(extend_teacher(cfg)), flush=True)
            except SettingsMismatchError as err:
                raise CommandError(str(err)) from None
        if args.stages_from or args.teacher_from:
            try:
                link_stages(cfg, args.stages_from or args.teacher_from,
                            LINKED_STAGES if args.stages_from else ("teacher",))
            except SettingsMismatchError as err:
                raise CommandError(str(err)) from None
        try:
            check_settings(cfg)
        except SettingsMismatchError as err:
            from distill.experiment.extend import budget_grew_only

            hint = ("; or, to continue its teacher's SFT from its checkpoint to the larger budget, add "
                    "--extend-teacher") if budget_grew_only(cfg) else ""
            raise CommandError(f"{err}{hint}") from None
    if cfg.smoke:
        from distill.experiment.report import SMOKE_NOTE

        print(f"{SMOKE_NOTE} Cost: {cost('quick')}.", flush=True)
    elif cfg.model:  # a real model's run takes hours: its expected CPU time before any of it is spent
        from distill.experiment.estimate import estimate_cpu, format_estimate

        print(format_estimate(estimate_cpu(cfg)), flush=True)
    t0 = time.perf_counter()
    try:
        table = run_experiment(cfg, until=args.until)
    except SettingsMismatchError as err:  # a cached arm of another configuration
        raise CommandError(str(err)) from None
    if args.until:
        print(table.drop(columns=["path"]).to_string(index=False, float_format=lambda v: f"{v:.3f}"))
        print(f"stopped after the {args.until} stage, cached under {cfg.out} (a run without --until resumes "
              f"from it; {(time.perf_counter() - t0) / 60:.1f} wall-min this call)")
        return 0
    print((Path(cfg.out) / "results.md").read_text())
    if args.pilot:  # what the pilot is for: the headline run's length and seeds (OUT/pilot_plan.json)
        from distill.experiment.pilot import format_plan, pilot_plan

        print(format_plan(pilot_plan(cfg.out)))
    print(f"wrote {Path(cfg.out) / 'results.csv'}, comparisons.csv, results.md, learning_curves.png "
          f"({(time.perf_counter() - t0) / 60:.1f} wall-min this call)")
    return 0 if len(table) else 1


def register_cli(subparsers) -> None:
    """Adds ``memenv experiment memopd`` (entry point ``memenv.commands``)."""
    # the summary and examples first, the options next, the whole text after them (not 50 lines before the options)
    summary = "\n\n".join(experiment.__doc__.strip().split("\n\n")[:2])
    details = "What the experiment does (distill.experiment):\n\n" + experiment.__doc__.strip()
    p = subparsers.add_parser("experiment", help="reproducible experiments (memopd)", description=summary,
                              epilog="memenv experiment memopd --help: its options, then what it does",
                              formatter_class=HelpFormatter)
    sub = p.add_subparsers(dest="experiment", metavar="{memopd}", required=True)
    m = sub.add_parser("memopd", help="teacher, weak student, arms x training seeds, seed-level held-out statistics",
                       description=summary, epilog=details, formatter_class=HelpFormatter)
    m.add_argument("--out", required=True, help="output folder (stages cached there; a rerun resumes)")
    m.add_argument("--quick", action="store_true",
                   help=f"smoke run, {cost('quick')}: small models, few updates; checks that the pipeline "
                        "runs, not the claims (F1 near 0 expected; targets not judged)")
    m.add_argument("--model", default=None,
                   help="a pretrained base (registered name, e.g. smollm2-135m-instruct, or a checkpoint folder): "
                        "teacher = its SFT, student = its first layers (sizes: "
                        "distill.experiment.config.pretrained_config; with --quick: 4- and 2-layer cuts, a few steps)")
    m.add_argument("--seeds", type=positive_int, default=None, help="training seeds per arm (default 5; quick 2)")
    m.add_argument("--updates", type=positive_int, default=None, help="GRPO updates per arm (default 120; quick 4)")
    m.add_argument("--eval-episodes", dest="eval_episodes", type=positive_int, default=None,
                   help="held-out episodes, the same at start and end (default 400; quick 100)")
    m.add_argument("--seen-eval-episodes", dest="seen_eval_episodes", type=positive_int, default=None,
                   help="train-pool (seen) question episodes at start and end (default 200; quick 50)")
    m.add_argument("--curve-every", dest="curve_every", type=positive_int, default=None,
                   help="held-out learning-curve point every this many updates (default 40; quick 2)")
    m.add_argument("--curve-episodes", dest="curve_episodes", type=positive_int, default=None,
                   help="held-out episodes per learning-curve point (default 200; quick 50)")
    m.add_argument("--arms", nargs="+", choices=list(ARMS), default=None,
                   help=f"default: {' '.join(DEFAULT_ARMS)} (quick: every GRPO-trained arm; --fair: {' '.join(FAIR_ARMS)})")
    m.add_argument("--threads", type=positive_int, default=None, help="torch threads per process (default 1)")
    m.add_argument("--sft-threads", dest="sft_threads", type=positive_int, default=None,
                   help="torch threads of the teacher's and student's SFT (default: one per core; a CPU-minute budget "
                        "buys more steps at 1 thread)")
    m.add_argument("--workers", type=positive_int, default=None,
                   help="arm runs in parallel processes (default: one per core)")
    m.add_argument("--teacher-minutes", dest="teacher_minutes", type=positive_float, default=None,
                   help="teacher SFT budget in minutes (default 70; quick 3)")
    m.add_argument("--extend-teacher", dest="extend_teacher", action="store_true",
                   help="continue the teacher of the run in --out from its latest checkpoint to a larger "
                        "--teacher-minutes (the learning-rate cosine re-laid over the new budget: a warm restart); "
                        "refused once its student start or any arm exists (distill.experiment.extend)")
    m.add_argument("--teacher-clock", dest="teacher_clock", choices=["cpu", "wall"], default=None,
                   help="clock of that budget (default cpu: process CPU time, all threads)")
    m.add_argument("--student-steps", dest="student_steps", type=positive_int, default=None,
                   help="student SFT steps per weak-start round (default 150; quick 200)")
    m.add_argument("--student-max-steps", dest="student_max_steps", type=positive_int, default=None,
                   help="at most this many student SFT steps in all (default 3000; quick 400)")
    m.add_argument("--student-start-f1", dest="student_start_f1", type=unit_float, default=None,
                   help="probe F1 that ends the student's weak-start SFT rounds (default 0.15)")
    m.add_argument("--sft-worlds", dest="sft_worlds", type=non_negative_int, default=None,
                   help="teacher and student SFT demonstrations spread over this many other worlds of the "
                        "generator, not world 0 (default 0: world 0's train-pool questions)")
    m.add_argument("--lr", type=positive_float, default=None, help="learning rate of every arm (default 3e-4)")
    m.add_argument("--distill-coef", dest="distill_coef", type=non_negative_float, default=None,
                   help="lambda of the distillation loss in the OPD arms (default 1.0)")
    m.add_argument("--fair", action="store_true",
                   help="the fair-evidence preset (fresh world): a teacher trained on both views, measured acting in "
                        "each before any arm; lr warm-up; GRPO alone's lr from a sweep; equal-CPU SFT arms; 10 seeds "
                        "(distill.experiment.config.fair_config); with --model, the real-model pair of issue 47: the "
                        "whole base as teacher, 15 of its layers (first 5, last 10) as student, 4 arms x 5 seeds x "
                        "12 updates, its expected CPU time printed first (distill.experiment.config.real_fair_config)")
    m.add_argument("--powered", action="store_true",
                   help="issue 61's preset: a regime where the teacher's two views differ (a 4-word memory budget, "
                        "3 objectives, 10 turns; a teacher trained on compact-notes demonstrations), a stronger start, the "
                        "teacher-free control beside the matched one, 16 seeds (distill.experiment.config."
                        "powered_config)")
    m.add_argument("--plateau", action="store_true",
                   help="with --powered: issue 61's second question: from a start SFT'd to its plateau, MemOPD against "
                        "continued SFT at equal CPU (distill.experiment.config.plateau_config); link the powered run's "
                        "teacher with --teacher-from")
    m.add_argument("--pilot", action="store_true",
                   help="with --powered: the pilot that fixes the powered run's length and seeds (4 seeds, 240 "
                        "updates, probe curves, provisional rates; link the powered run's stages with --stages-from); "
                        "writes OUT/pilot_plan.json (distill.experiment.pilot)")
    m.add_argument("--world", choices=list(WORLDS), default=None,
                   help="fixed: one world whose facts can be learnt by heart (default); fresh: every episode draws "
                        "its facts afresh over one inventory of names and values, so only reading answers")
    m.add_argument("--until", choices=list(STAGES), default=None,
                   help="stop after this stage (cached; a later run without --until resumes): measure the "
                        "teacher or the weak start before paying for the arms")
    m.add_argument("--stages-from", dest="stages_from", default=None, metavar="RUN",
                   help="link the teacher and student stages of the run in folder RUN (finished there, with the same "
                        "settings but the arms'): a sensitivity run (another --lr, --distill-coef, --updates) in its "
                        "own --out, without paying for either SFT again")
    m.add_argument("--teacher-from", dest="teacher_from", default=None, metavar="RUN",
                   help="link only the teacher stage of the run in folder RUN (finished there, with the same settings "
                        "but the arms' and the student's): this run builds its own start from it")
    m.add_argument("--quiet", action="store_true", help="no progress bars")
    m.set_defaults(func=_run)


__all__ = ["register_cli"]
