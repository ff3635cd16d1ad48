"""``memenv train``: SFT, PPO or GRPO of an LLM policy on a memenv environment.

    memenv train --algo sft  --out runs/sft  --steps 2000                      # tiny model from scratch
    memenv train --algo ppo  --model runs/sft/checkpoint-0002000 --out runs/ppo --updates 200
    memenv train --algo grpo --model PATH --env MemQA-v0 --kw objectives=1 hops=2 --out runs/grpo
    memenv train --algo grpo --out runs/grpo --resume                         # continue from runs/grpo/latest
    torchrun --nproc_per_node 2 -m memenv.cli train --algo grpo --out runs/ddp # DDP (gloo on CPU, nccl on GPU)

Without ``--model`` a tiny Qwen2 model is built from a tokenizer trained on the env's oracle text. Every field of
the trainer's config dataclass (``agents.llm.sft.SFTConfig``, ``agents.llm.ppo.PPOConfig``) can be set with
``--set KEY=VALUE``. Writes ``OUT/metrics.csv``, ``OUT/learning_curve.png``, ``OUT/config.json`` and atomic
checkpoints ``OUT/checkpoint-N`` (``OUT/latest`` names the newest).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import fields
from typing import Any


def _parse_value(text: str) -> Any:
    import ast

    if text.lower() in ("true", "false"):  # a bare string "false" would be truthy
        return text.lower() == "true"
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def apply_set(values: dict[str, Any], items: list[str] | None, cls) -> dict[str, Any]:
    """``--set KEY=VALUE`` items into ``values`` (fields of the dataclass ``cls``); ``SystemExit`` naming a bad
    item or an unknown field."""
    known = {f.name for f in fields(cls)}
    for item in items or []:
        if "=" not in item:
            raise SystemExit(f"error: --set expects KEY=VALUE, got {item!r}")
        key, value = item.split("=", 1)
        if key not in known:
            raise SystemExit(f"error: {cls.__name__} has no field {key!r}; fields: {', '.join(sorted(known))}")
        values[key] = _parse_value(value)
    return values


def build_config(args: argparse.Namespace):
    """The trainer config from parsed CLI arguments."""
    from memenv.cli import parse_kwargs

    # The trainers import torch: loaded only when `memenv train` runs, not whenever the memenv CLI starts.
    if args.algo == "sft":
        from agents.llm.sft import SFTConfig as cls
    else:
        from agents.llm.ppo import PPOConfig as cls
    values: dict[str, Any] = {"env_id": args.env, "out_dir": args.out, "seed": args.seed, "resume": args.resume,
                              "progress": not args.quiet}
    if args.kw is not None:
        values["env_kwargs"] = parse_kwargs(args.kw)
    if args.model and args.model != "tiny":
        values["model"] = args.model
    if args.algo != "sft":
        values["algo"] = args.algo
    for name in ("lr", "threads", "eval_every", "eval_episodes", "save_every", "num_envs", "max_new_tokens",
                 "max_seconds", "steps", "updates", "batch_size", "episodes", "episodes_per_update", "group_size",
                 "kl_coef", "ent_coef", "temperature"):
        value = getattr(args, name, None)
        if value is not None:
            values[name] = value
    apply_set(values, args.set, cls)
    unknown = set(values) - {f.name for f in fields(cls)}
    for key in unknown:  # e.g. --steps with --algo ppo
        raise SystemExit(f"error: --{key.replace('_', '-')} does not apply to --algo {args.algo}")
    try:
        return cls(**values)
    except (TypeError, ValueError) as exc:
        raise SystemExit(f"error: {exc}") from None


def _run(args: argparse.Namespace) -> int:
    cfg = build_config(args)
    if args.algo == "sft":
        from agents.llm.sft import train_sft

        last = train_sft(cfg)
    else:
        from agents.llm.ppo import train_rl

        last = train_rl(cfg)
    import os

    if int(os.environ.get("RANK", "0")) == 0:
        shown = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in last.items()}
        print(json.dumps(shown))
        print(f"wrote {cfg.out_dir}/metrics.csv, {cfg.out_dir}/learning_curve.png and checkpoints in {cfg.out_dir}")
    return 0


def register_cli(subparsers) -> None:
    """Adds ``memenv train`` (entry point group ``memenv.commands``)."""
    p = subparsers.add_parser("train", help="train an LLM policy (SFT, PPO, GRPO)", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--algo", choices=["sft", "ppo", "grpo"], required=True)
    p.add_argument("--model", default=None, help="local checkpoint folder (default: a fresh tiny model)")
    p.add_argument("--env", default="MemQA-v0", help="environment id (default MemQA-v0)")
    p.add_argument("--kw", nargs="*", metavar="KEY=VALUE",
                   help="env kwargs (default objectives=1 hops=2), e.g. objectives=1 hops=2")
    p.add_argument("--out", default="runs/train", help="output folder")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--resume", action="store_true", help="continue from OUT/latest")
    p.add_argument("--steps", type=int, help="SFT: optimizer steps")
    p.add_argument("--episodes", type=int, help="SFT: oracle demonstrations")
    p.add_argument("--batch-size", dest="batch_size", type=int, help="SFT: sequences per step and rank")
    p.add_argument("--updates", type=int, help="PPO/GRPO: updates")
    p.add_argument("--episodes-per-update", dest="episodes_per_update", type=int, help="PPO/GRPO, per rank")
    p.add_argument("--group-size", dest="group_size", type=int, help="GRPO: episodes per task seed")
    p.add_argument("--kl-coef", dest="kl_coef", type=float)
    p.add_argument("--ent-coef", dest="ent_coef", type=float)
    p.add_argument("--temperature", type=float, help="PPO/GRPO sampling temperature")
    p.add_argument("--lr", type=float)
    p.add_argument("--eval-every", dest="eval_every", type=int)
    p.add_argument("--eval-episodes", dest="eval_episodes", type=int)
    p.add_argument("--save-every", dest="save_every", type=int, help="checkpoint every N steps/updates")
    p.add_argument("--num-envs", dest="num_envs", type=int)
    p.add_argument("--max-new-tokens", dest="max_new_tokens", type=int)
    p.add_argument("--max-seconds", dest="max_seconds", type=float,
                   help="time budget in seconds, held-out evaluations excluded "
                        "(see --set budget_clock=cpu budget_counts_eval=true)")
    p.add_argument("--threads", type=int, help="torch threads per process")
    p.add_argument("--set", nargs="*", metavar="KEY=VALUE", help="any other config field")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_run)
