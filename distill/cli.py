"""``memenv distill``: MemOPD (PPO/GRPO + on-policy distillation from a teacher), and ``memenv distill diagnose``.

    memenv distill --teacher runs/sft/checkpoint-0002000 --out runs/memopd --updates 50      # tiny student
    memenv distill --teacher T --student S --algo ppo --loss jsd --beta 0.5 --lambda 0.5 --out runs/memopd
    memenv distill --teacher T --student S --teacher-reconstruction persistent --out runs/control   # matched control
    memenv distill --teacher T --student S --reconstruction persistent --recompute-old-logprobs --out runs/flat
    memenv distill --teacher T --student S --credit himpo --out runs/himpo
    memenv distill --teacher T --out runs/memopd --resume                                   # continue
    memenv distill --teacher openai:smollm2@http://127.0.0.1:8765 --student S --out runs/served  # served teacher
    memenv distill diagnose --records records.jsonl --model S                               # RCE table

Without ``--student`` a tiny Qwen2 model is built (as ``memenv train``:
``agents.llm.training.recipes.TINY_MODEL_FIELDS``), with the tokenizer of the env's oracle text: a teacher trained by
``memenv train`` from scratch shares it. Every field of :class:`distill.trainer.MemOPDConfig` (and of ``PPOConfig``) can
be set with ``--set KEY=VALUE``. Writes ``OUT/metrics.csv``, ``OUT/learning_curve.png``, ``OUT/config.json`` and atomic
checkpoints ``OUT/checkpoint-N`` (``OUT/latest`` names the newest); nothing is written when an argument, a checkpoint or
the vocabulary check is bad.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from agents.llm.models.pretrained import check_checkpoint
from agents.llm.training.cli import (DTYPE_CHOICES, add_model_options, apply_set, check_model_options, check_run_out,
                                     interrupted_note)
from agents.llm.adapters.served import ServedSpec, is_served
from distill import DIAGNOSE_METHODS
from memenv.cli_common import (CommandError, CommandInterrupted, finite_float, non_negative_float, non_negative_int,
                               open_unit_float, parse_kwargs, positive_float, positive_int, prepare_out_dir)
from tasks.types import DataFormatError

LOSSES = ("reverse_kl", "forward_kl", "jsd")
RECONSTRUCTIONS = ("aligned", "persistent")
PACKINGS = ("padded", "padding_free", "shared_prefix", "sorted_padded", "prefix_tree")
CREDITS = ("none", "mempo", "himpo")
# options copied as they are into the MemOPDConfig field of the same name (when given)
_FIELDS = ("algo", "lr", "updates", "episodes_per_update", "group_size", "kl_coef", "temperature", "eval_every",
           "eval_episodes", "save_every", "num_envs", "max_new_tokens", "max_seconds", "threads", "distill_coef",
           "loss", "beta", "top_k", "top_k_mode", "chunk", "reconstruction", "teacher_reconstruction", "packing",
           "teacher_packing",
           "token_budget", "credit", "credit_coef", "dtype", "attn_implementation", "teacher_dtype")


def _fail(message: str) -> CommandError:
    """A user's mistake: ``memenv`` prints ``memenv distill: error: MESSAGE`` and exits 2."""
    return CommandError(message)


def _checkpoint(path: str, option: str) -> str:
    """``path`` if it is a whole model checkpoint folder (config, weights, tokenizer), else a one-line error."""
    return check_checkpoint(path, option)


def build_config(args: argparse.Namespace):
    """The :class:`distill.trainer.MemOPDConfig` of parsed ``memenv distill`` arguments (a :class:`CommandError`
    naming the bad argument otherwise)."""
    from distill.trainer import MemOPDConfig

    if not args.teacher:
        raise _fail("memenv distill needs --teacher PATH (a local checkpoint that shares the student's tokenizer) "
                    "or --teacher openai:NAME@URL (a served teacher)")
    values: dict[str, Any] = {"env_id": args.env, "out_dir": args.out, "seed": args.seed, "resume": args.resume,
                              "progress": not args.quiet, "teacher": _teacher(args.teacher),
                              "recompute_old_logprobs": args.recompute_old_logprobs}
    if args.student and args.student != "tiny":
        values["model"] = _checkpoint(args.student, "--student")
        if not is_served(values["teacher"]):
            check_same_system_prompt(values["teacher"], values["model"])
    else:  # a tiny student: the tokenizer and model of `memenv train --algo sft`'s tiny model (--set overrides)
        from agents.llm.training.recipes import tiny_model_fields

        values = {**tiny_model_fields(), **values}
    if args.kw is not None:
        values["env_kwargs"] = parse_kwargs(args.kw)
    for name in _FIELDS:
        value = getattr(args, name, None)
        if value is not None:
            values[name] = value
    apply_set(values, args.set, MemOPDConfig)
    try:
        cfg = MemOPDConfig(**values)
        if is_served(cfg.teacher):
            from distill.served_teacher import check_served_options

            check_served_options(cfg.loss_config(), cfg.teacher_reconstruction, cfg.reconstruction)
        return cfg
    except (TypeError, ValueError) as exc:
        raise _fail(str(exc)) from None


def check_same_system_prompt(teacher: str, student: str) -> None:
    """Refuse, in one line naming both folders, a teacher and a student whose saved system prompts
    (``memenv_prompt.json``) differ: the teacher would score the student's actions under another prompt than the
    one the student acts in. A folder without the file counts as no system prompt."""
    from agents.llm.models.prompt_settings import PROMPT_FILE, read_prompt_settings

    try:
        prompts = [read_prompt_settings(folder).get("system_prompt") for folder in (teacher, student)]
    except ValueError as exc:
        raise _fail(str(exc)) from None
    if prompts[0] != prompts[1]:
        def said(prompt):
            return "none" if prompt is None else f"{len(prompt):,} characters, {prompt[:24]!r}..."
        raise _fail(f"--teacher {teacher} and --student {student} have different system prompts ({PROMPT_FILE}: "
                    f"{said(prompts[0])} vs {said(prompts[1])}): make the student from the teacher's folder with "
                    f"`memenv models shrink TEACHER --layers N --out DIR`, or copy the teacher's {PROMPT_FILE}")


def _teacher(value: str) -> str:
    """``--teacher``: a served model ``openai:NAME@URL`` (checked for its form here, for its tokenizer when the run
    starts) or a checkpoint folder."""
    if not is_served(value):
        return _checkpoint(value, "--teacher")
    try:
        ServedSpec.parse(value)
    except ValueError as exc:
        raise _fail(f"--teacher: {exc}") from None
    return value


def _run(args: argparse.Namespace) -> int:
    if args.teacher:  # the checks that need no torch first: a bad --out or checkpoint fails at once
        check_run_out(args.out, args.resume)
    cfg = build_config(args)
    check_model_options(cfg, (("dtype", "attn_implementation"), ("teacher_dtype", "teacher_attn_implementation")))
    from agents.llm.models.local import NonFiniteWeightsError
    from distill.teacher import VocabularyMismatchError
    from distill.trainer import train_memopd

    prepare_out_dir(cfg.out_dir, keep=False)
    try:
        last = train_memopd(cfg)
    except VocabularyMismatchError as exc:
        raise _fail(str(exc)) from None
    except KeyboardInterrupt:
        raise CommandInterrupted(interrupted_note(cfg.out_dir)) from None
    except DataFormatError as exc:  # a data file of the user's, damaged past what the set-up check reads
        raise _fail(f"{exc}; {interrupted_note(cfg.out_dir)}") from exc
    except NonFiniteWeightsError as exc:  # a diverged run: stopped before any non-finite checkpoint
        raise _fail(f"{exc}; {interrupted_note(cfg.out_dir)}") from None
    shown = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in last.items()}
    print(json.dumps(shown))
    print(f"wrote {cfg.out_dir}/metrics.csv, {cfg.out_dir}/learning_curve.png and checkpoints in {cfg.out_dir}")
    return 0


def _diagnose(args: argparse.Namespace) -> int:
    records_path = Path(args.records)
    if not records_path.is_file():
        raise _fail(f"--records {args.records}: no such file (JSON lines of invocation records)")
    _checkpoint(args.model, "--model")
    if args.csv:
        _check_csv(args.csv)
    from agents.llm.models.local import load_pretrained
    from agents.llm.records.invocation import load_records
    from distill.diagnose import diagnose
    from distill.scoring import check_records

    try:
        records = load_records(records_path)
    except ValueError as exc:  # names the file and the line
        raise _fail(f"--records: {exc}") from None
    except OSError as exc:
        raise _fail(f"--records {args.records}: cannot read it ({exc.strerror or exc})") from None
    model, tokenizer = load_pretrained(args.model, dtype=args.dtype)
    try:
        check_records(records, model, tokenizer)
        table = diagnose(records, model, tokenizer, clip=args.clip, methods=args.methods, progress=not args.quiet,
                         token_budget=args.token_budget)
    except ValueError as exc:
        raise _fail(f"--records {args.records}: {exc}") from None
    print(f"{len(records)} records, {int(table['action_tokens'].iloc[0])} action tokens; model {args.model}; "
          f"clip {args.clip}")
    print(table.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    if args.csv:
        from memenv.files import write_atomic

        write_atomic(Path(args.csv), lambda tmp: table.to_csv(tmp, index=False))
        print(f"wrote {args.csv}")
    return 0


def _check_csv(path: str) -> None:
    """``--csv`` can be written: not a folder, and its folder exists or can be made (checked before the work)."""
    from memenv.cli_common import check_out_dir

    target = Path(path)
    if target.is_dir():
        raise _fail(f"--csv {path}: is a folder, not a file")
    check_out_dir(target.parent if str(target.parent) else ".", f"--csv {path}: its folder")


def register_cli(subparsers) -> None:
    """Adds ``memenv distill`` and ``memenv distill diagnose`` (entry point group ``memenv.commands``)."""
    p = subparsers.add_parser("distill", help="MemOPD: PPO/GRPO + on-policy distillation from a teacher",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--teacher", help="teacher checkpoint folder (must share the student's tokenizer), or "
                                      "openai:NAME@URL: a served teacher (vLLM) that scores the records' token ids "
                                      "with prompt_logprobs (sampled-token reverse KL; top-k with --top-k K)")
    p.add_argument("--student", default=None, help="student checkpoint folder (default: a fresh tiny model)")
    p.add_argument("--algo", choices=["ppo", "grpo"], default=None, help="RL objective (default ppo)")
    p.add_argument("--env", default="MemQA-v0", help="environment id (default MemQA-v0)")
    p.add_argument("--kw", nargs="*", action="extend", metavar="KEY=VALUE", help="env kwargs (default objectives=1 hops=2)")
    p.add_argument("--out", default="runs/distill", help="output folder")
    p.add_argument("--seed", type=non_negative_int, default=0)
    p.add_argument("--resume", action="store_true", help="continue from OUT/latest")
    g = p.add_argument_group("distillation")
    g.add_argument("--lambda", dest="distill_coef", type=non_negative_float, help="weight of the distillation loss (default 1)")
    g.add_argument("--loss", choices=LOSSES, help="divergence (default reverse_kl: KL(student || teacher))")
    g.add_argument("--beta", type=finite_float, help="JSD(beta) teacher weight in [0, 1] (default 0.5)")
    g.add_argument("--top-k", dest="top_k", type=positive_int, help="keep only the teacher's top-k tokens (default: exact)")
    g.add_argument("--top-k-mode", dest="top_k_mode", choices=["tail", "renorm"],
                   help="close the top-k support with a tail bucket (default) or renormalise on it")
    g.add_argument("--chunk", type=positive_int, help="action positions per LM-head application (default 1024)")
    g.add_argument("--reconstruction", choices=RECONSTRUCTIONS,
                   help="the actor's: aligned (as sampled, default) or persistent (the flattened transcript)")
    g.add_argument("--teacher-reconstruction", dest="teacher_reconstruction", choices=RECONSTRUCTIONS,
                   help="the teacher's scoring (default: --reconstruction); persistent with an aligned actor is the "
                        "matched control: the student's update is MemOPD's, only the teacher's state differs")
    g.add_argument("--packing", choices=PACKINGS, help="default shared_prefix")
    g.add_argument("--teacher-packing", dest="teacher_packing", choices=PACKINGS,
                   help="packing of the teacher's scoring (default: --packing); prefix_tree runs each shared prefix "
                        "of an episode or GRPO group once")
    g.add_argument("--token-budget", dest="token_budget", type=positive_int, help="tokens per packed forward (default 4096)")
    g.add_argument("--credit", choices=CREDITS, help="memory credit on memory tokens (default none)")
    g.add_argument("--credit-coef", dest="credit_coef", type=non_negative_float, help="weight of the memory advantage")
    g.add_argument("--recompute-old-logprobs", dest="recompute_old_logprobs", action="store_true",
                   help="PPO ratio against log-probs recomputed by the training forward (not the sampled ones)")
    r = p.add_argument_group("reinforcement learning")
    r.add_argument("--updates", type=positive_int)
    r.add_argument("--episodes-per-update", dest="episodes_per_update", type=positive_int)
    r.add_argument("--group-size", dest="group_size", type=positive_int, help="GRPO: episodes per task seed")
    r.add_argument("--lr", type=positive_float)
    r.add_argument("--kl-coef", dest="kl_coef", type=non_negative_float, help="KL to the starting student")
    r.add_argument("--temperature", type=positive_float, help="sampling temperature")
    r.add_argument("--eval-every", dest="eval_every", type=non_negative_int, help="held-out evaluation every N updates (0: none)")
    r.add_argument("--eval-episodes", dest="eval_episodes", type=positive_int)
    r.add_argument("--save-every", dest="save_every", type=positive_int, help="checkpoint every N updates")
    r.add_argument("--num-envs", dest="num_envs", type=positive_int)
    r.add_argument("--max-new-tokens", dest="max_new_tokens", type=positive_int)
    r.add_argument("--max-seconds", dest="max_seconds", type=positive_float, help="time budget (evaluations excluded)")
    r.add_argument("--threads", type=positive_int, help="torch threads")
    m = p.add_argument_group("precision")
    add_model_options(m, "student")
    m.add_argument("--teacher-dtype", dest="teacher_dtype", choices=DTYPE_CHOICES,
                   help="the teacher's weights (default: --dtype); a frozen teacher in bfloat16 keeps no fp32 state")
    p.add_argument("--set", nargs="*", metavar="KEY=VALUE", help="any other MemOPDConfig field")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_run)

    sub = p.add_subparsers(dest="distill_command", metavar="{diagnose}")
    d = sub.add_parser("diagnose", help="log-prob reconstruction error of each packing and the persistent control",
                       description="For aligned, each packing and the persistent control: max and p99 |d log-prob| "
                                   "of the sampled tokens against the records, top-1 flips at action positions, and "
                                   "the share of action tokens whose PPO ratio would leave the clip range.")
    d.add_argument("--records", required=True, help="JSON lines of invocation records (agents.llm.records.invocation)")
    d.add_argument("--model", required=True, help="checkpoint folder (the policy that sampled the records)")
    d.add_argument("--methods", nargs="+", choices=DIAGNOSE_METHODS, default=list(DIAGNOSE_METHODS))
    d.add_argument("--clip", type=open_unit_float, default=0.2, help="PPO clip range (default 0.2)")
    d.add_argument("--token-budget", dest="token_budget", type=positive_int, default=4096,
                   help="tokens per packed forward (default 4096)")
    d.add_argument("--csv", help="also write the table here")
    d.add_argument("--dtype", choices=DTYPE_CHOICES, default=None,
                   help="the model's weights (default float32: the records' log-probs are fp32 references)")
    d.add_argument("--quiet", action="store_true")
    d.set_defaults(func=_diagnose)


def main(argv: list[str] | None = None) -> int:
    """``memenv distill ARGS`` (``argv`` = ARGS): a user's mistake prints one line and returns 2."""
    from memenv import cli

    return cli.main(["distill", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
