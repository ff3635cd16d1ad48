"""``memenv records export``: invocation records as another RL stack's training rows (docs/exchange.md).

    memenv records export records.jsonl --to tinker --out rows.jsonl
    memenv records export records.jsonl --to slime --weight episode --teacher runs/teacher --out rows.jsonl

Reads JSON lines of :class:`agents.llm.records.invocation.InvocationRecord` and writes the target's rows as JSON lines
(:mod:`agents.llm.records.exchange`), atomically: a bad input (records of another tokenizer, a cut records file, an
unknown target) prints one line and exits 2 with nothing written.
"""

from __future__ import annotations

import argparse

from memenv.cli_common import CommandError, HelpFormatter, check_out_file, positive_int, require_file

TARGETS = ("trl", "slime", "skyrl", "tinker", "verl", "prime")  # agents.llm.records.exchange.TARGETS (no import here)
WEIGHTS = ("token", "row", "episode")


def read_records(path: str, option: str = "RECORDS"):
    """The records of ``path``, or a :class:`CommandError` naming the file and what is wrong with it."""
    from agents.llm.records.invocation import load_records

    require_file(path, "JSON lines of invocation records", prefix=option)
    try:
        records = load_records(path)
    except ValueError as exc:
        raise CommandError(f"{option}: {exc}") from None
    except OSError as exc:
        raise CommandError(f"{option} {path}: cannot read it ({exc.strerror or exc})") from None
    if not records:
        raise CommandError(f"{option} {path}: no records in it")
    return records


def load_teacher(path: str, records, option: str = "--teacher"):
    """``(model, tokenizer)`` of a teacher checkpoint whose tokenizer made ``records``, else a CommandError."""
    from agents.llm.models.pretrained import check_checkpoint
    from agents.llm.records.exchange import check_tokenizer
    from agents.llm.models.local import load_pretrained
    from agents.llm.records.invocation import tokenizer_fingerprint

    check_checkpoint(path, option)
    model, tokenizer = load_pretrained(path)
    try:
        check_tokenizer(records, tokenizer_fingerprint(tokenizer))
    except ValueError as exc:
        raise CommandError(f"{option} {path}: {exc}") from None
    return model, tokenizer


def _export(args: argparse.Namespace) -> int:
    from agents.llm.records.exchange import export_records, teacher_scores, write_export

    out = check_out_file(args.out, "--out", inputs=[args.records])
    records = read_records(args.records)
    teacher = None
    if args.teacher is not None:
        model, tokenizer = load_teacher(args.teacher, records)
        teacher = teacher_scores(model, records, top_k=args.top_k, tokenizer=tokenizer)
    elif args.top_k:
        raise CommandError("--top-k needs --teacher (the model whose top-k is exported)")
    try:
        rows = export_records(records, args.to, weight=args.weight, teacher=teacher)
        write_export(out, rows)
    except ValueError as exc:
        raise CommandError(f"{args.records}: {exc}") from None
    if not args.quiet:
        print(f"{len(records)} records -> {args.out} ({args.to}, weight {args.weight}"
              f"{', teacher ' + args.teacher if args.teacher else ''})")
    return 0


def _collect(args: argparse.Namespace) -> int:
    """``memenv records collect``: a model's episodes on an env as invocation records (the input of ``records
    export`` and ``memenv view``)."""
    import time

    from agents.llm.models.pretrained import check_checkpoint
    from memenv.cli_common import parse_kwargs

    out = check_out_file(args.out, "--out")
    if args.model.startswith("openai:"):
        raise CommandError(f"--model {args.model}: a served model's replies carry no token ids and log-probs of this "
                           "tokenizer, so they make no invocation records; give a checkpoint folder or a registered "
                           "model (memenv models prepare NAME)")
    path = check_checkpoint(args.model, "--model")
    if args.episodes < 1 or args.temperature < 0:
        raise CommandError(f"-n must be >= 1 and --temperature >= 0, got {args.episodes} and {args.temperature}")
    import gymnasium as gym
    import torch

    import memenv  # noqa: F401 - registers the environments
    from agents.llm.models.local import load_pretrained
    from agents.llm.generation.policy import LLMPolicy
    from agents.llm.records.invocation import save_records
    from agents.llm.records.rollouts import records_of, rollout

    kwargs = parse_kwargs(args.kw)
    try:
        envs = [gym.make(args.env, **kwargs) for _ in range(min(args.num_envs, args.episodes))]
    except Exception as exc:  # an unknown env or a refused kwarg: one line
        raise CommandError(f"--env {args.env} --kw {' '.join(args.kw or [])}: {' '.join(str(exc).split())}") from None
    torch.set_num_threads(args.threads)
    start = time.process_time()
    model, tokenizer = load_pretrained(path)
    policy = LLMPolicy(model, tokenizer, temperature=args.temperature, max_new_tokens=args.max_new_tokens,
                       seed=args.seed)
    seeds = [args.seed + i for i in range(args.episodes)]
    episodes = rollout(policy, envs, seeds, progress=not args.quiet, desc="collect")
    records = records_of(episodes)
    save_records(out, records)
    if not args.quiet:
        f1 = sum(ep.f1 for ep in episodes) / len(episodes)
        print(f"{len(records)} records of {len(episodes)} episodes (mean F1 {f1:.3f}, temperature {args.temperature:g}) "
              f"-> {out}; {time.process_time() - start:.1f} CPU-s")
    return 0


def register_cli(subparsers) -> None:
    """Adds ``memenv records`` (entry point group ``memenv.commands``)."""
    p = subparsers.add_parser("records", help="invocation records: export them to another RL stack's rows",
                              description=__doc__, formatter_class=HelpFormatter)
    sub = p.add_subparsers(dest="records_command", required=True)
    e = sub.add_parser("export", help="convert records to TRL / slime / SkyRL / Tinker / verl / prime-rl rows",
                       description=__doc__, formatter_class=HelpFormatter)
    e.add_argument("records", help="JSON lines of invocation records (agents.llm.records.invocation.save_records)")
    e.add_argument("--to", required=True, choices=TARGETS, help="the target stack's row layout (docs/exchange.md)")
    e.add_argument("--out", required=True, help="the JSON-lines file to write (written atomically)")
    e.add_argument("--weight", choices=WEIGHTS, default="token",
                   help="row weights: token (every action token counts once), row (every invocation counts once), "
                        "episode (every episode counts once)")
    e.add_argument("--teacher", default=None,
                   help="a checkpoint folder of a teacher with the records' tokenizer: its log-probs of the sampled "
                        "tokens go into the rows (slime teacher_log_probs, verl/prime extras, Tinker, SkyRL)")
    e.add_argument("--top-k", dest="top_k", type=positive_int, default=0,
                   help="with --teacher: also its top-k ids and log-probs per position (where the target takes them)")
    e.add_argument("--quiet", action="store_true", help="print nothing on success")
    e.set_defaults(func=_export)
    c = sub.add_parser("collect", help="roll a model out on an env and write its invocation records (JSON lines)",
                       description=_collect.__doc__, formatter_class=HelpFormatter)
    c.add_argument("--model", required=True,
                   help="a checkpoint folder (memenv train --out RUN: RUN/checkpoint-N) or a registered model")
    c.add_argument("--env", default="MemQA-v0", help="the env id")
    c.add_argument("--kw", nargs="*", metavar="KEY=VALUE", help="env kwargs (e.g. objectives=1 hops=1)")
    c.add_argument("-n", "--episodes", type=int, default=8, help="episodes (task seeds --seed .. --seed + n - 1)")
    c.add_argument("--seed", type=int, default=0, help="the first task seed (also the sampler's)")
    c.add_argument("--temperature", type=float, default=0.7, help="sampling temperature (0: greedy)")
    c.add_argument("--max-new-tokens", dest="max_new_tokens", type=positive_int, default=96)
    c.add_argument("--num-envs", dest="num_envs", type=positive_int, default=8, help="episodes run side by side")
    c.add_argument("--threads", type=positive_int, default=1, help="torch threads")
    c.add_argument("--out", required=True, help="the JSON-lines file to write (written atomically)")
    c.add_argument("--quiet", action="store_true", help="no progress bar, print nothing on success")
    c.set_defaults(func=_collect)
