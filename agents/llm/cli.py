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
import os
from dataclasses import MISSING, fields
from typing import Any

import gymnasium as gym

import memenv  # noqa: F401 - registers the envs
from memenv.cli import (CommandError, HelpFormatter, non_negative_float, non_negative_int, parse_kwargs,
                        positive_float, positive_int, user_input)


def _parse_value(text: str) -> Any:
    import ast

    if text.lower() in ("true", "false"):  # a bare string "false" would be truthy
        return text.lower() == "true"
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def apply_set(values: dict[str, Any], items: list[str] | None, cls) -> dict[str, Any]:
    """``--set KEY=VALUE`` items into ``values`` (fields of the dataclass ``cls``); a bad item or an unknown
    field raises :class:`memenv.cli.CommandError` naming it."""
    known = {f.name for f in fields(cls)}
    for item in items or []:
        if "=" not in item:
            raise CommandError(f"--set expects KEY=VALUE, got {item!r}")
        key, value = item.split("=", 1)
        if key not in known:
            raise CommandError(f"{cls.__name__} has no field {key!r}; fields: {', '.join(sorted(known))}")
        values[key] = _parse_value(value)
    return values


def build_config(args: argparse.Namespace):
    """The trainer config from parsed CLI arguments (a user's mistake raises :class:`memenv.cli.CommandError`)."""
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
        raise CommandError(f"--{key.replace('_', '-')} does not apply to --algo {args.algo}")
    with user_input(cls.__name__):
        return cls(**values)


def check_setup(cfg) -> None:
    """Fail before any training on a user's mistake: an unknown env or kwarg, a bad value, a missing data
    file (the env is built and reset once) or a ``--model`` folder that does not exist."""
    with user_input(f"--env {cfg.env_id} with --kw {cfg.env_kwargs}"):
        env = gym.make(cfg.env_id, **cfg.env_kwargs)
        env.reset(seed=cfg.seed)
        env.close()
    if cfg.model is not None and not os.path.isdir(cfg.model):
        raise CommandError(f"--model {cfg.model!r} is not a checkpoint folder (omit --model for a fresh tiny model)")


def _run(args: argparse.Namespace) -> int:
    cfg = build_config(args)
    check_setup(cfg)
    if args.algo == "sft":
        from agents.llm.sft import train_sft

        last = train_sft(cfg)
    else:
        from agents.llm.ppo import train_rl

        last = train_rl(cfg)
    if int(os.environ.get("RANK", "0")) == 0:
        shown = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in last.items()}
        print(json.dumps(shown))
        print(f"wrote {cfg.out_dir}/metrics.csv, {cfg.out_dir}/learning_curve.png and checkpoints in {cfg.out_dir}")
    return 0


class TrainHelpFormatter(HelpFormatter):
    """Shows the trainer configs' defaults for the options whose argparse default is None (None: "use the
    config's value", which differs between SFT and PPO/GRPO). The configs import torch, so they are read only
    when the help is printed."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = super()._get_help_string(action)
        if action.default is not None or action.required or "(default" in text:
            return text
        from agents.llm.ppo import PPOConfig
        from agents.llm.sft import SFTConfig

        found = {}
        for algo, cls in (("sft", SFTConfig), ("ppo/grpo", PPOConfig)):
            field = next((f for f in fields(cls) if f.name == action.dest), None)
            if field is not None and field.default is not MISSING:
                found[algo] = field.default
        if not found:
            return text
        if len(set(map(repr, found.values()))) == 1:
            return f"{text} (default: {next(iter(found.values()))})"
        return f"{text} (default: " + ", ".join(f"{algo} {value}" for algo, value in found.items()) + ")"


def register_cli(subparsers) -> None:
    """Adds ``memenv train`` (entry point group ``memenv.commands``)."""
    p = subparsers.add_parser("train", help="train an LLM policy (SFT, PPO, GRPO)", description=__doc__,
                              formatter_class=TrainHelpFormatter)
    p.add_argument("--algo", choices=["sft", "ppo", "grpo"], required=True,
                   help="sft: imitate the oracle; ppo: value head + token GAE; grpo: group-normalised returns")
    p.add_argument("--model", default=None, help="local checkpoint folder (default: a fresh tiny model)")
    p.add_argument("--env", default="MemQA-v0", help="environment id")
    p.add_argument("--kw", nargs="*", metavar="KEY=VALUE",
                   help="env kwargs, e.g. objectives=1 hops=2 (default: objectives=1 hops=2)")
    p.add_argument("--out", default="runs/train", help="output folder (metrics.csv, checkpoints, config.json)")
    p.add_argument("--seed", type=non_negative_int, default=0, help="seed of the model, data and episodes")
    p.add_argument("--resume", action="store_true", help="continue from OUT/latest")
    p.add_argument("--steps", type=positive_int, help="SFT: optimizer steps")
    p.add_argument("--episodes", type=positive_int, help="SFT: oracle demonstrations")
    p.add_argument("--batch-size", dest="batch_size", type=positive_int, help="SFT: sequences per step and rank")
    p.add_argument("--updates", type=positive_int, help="PPO/GRPO: updates")
    p.add_argument("--episodes-per-update", dest="episodes_per_update", type=positive_int,
                   help="PPO/GRPO: episodes per update and rank")
    p.add_argument("--group-size", dest="group_size", type=positive_int, help="GRPO: episodes per task seed")
    p.add_argument("--kl-coef", dest="kl_coef", type=non_negative_float,
                   help="PPO/GRPO: weight of the KL to the frozen start policy")
    p.add_argument("--ent-coef", dest="ent_coef", type=non_negative_float, help="PPO/GRPO: entropy bonus weight")
    p.add_argument("--temperature", type=positive_float, help="PPO/GRPO: sampling temperature")
    p.add_argument("--lr", type=positive_float, help="learning rate (peak, after warm-up)")
    p.add_argument("--eval-every", dest="eval_every", type=positive_int,
                   help="held-out evaluation every N steps/updates")
    p.add_argument("--eval-episodes", dest="eval_episodes", type=positive_int, help="episodes per evaluation")
    p.add_argument("--save-every", dest="save_every", type=positive_int, help="checkpoint every N steps/updates")
    p.add_argument("--num-envs", dest="num_envs", type=positive_int, help="envs stepped together in rollouts")
    p.add_argument("--max-new-tokens", dest="max_new_tokens", type=positive_int,
                   help="sampling limit per invocation (tokens)")
    p.add_argument("--max-seconds", dest="max_seconds", type=positive_float,
                   help="time budget in seconds, held-out evaluations excluded "
                        "(see --set budget_clock=cpu budget_counts_eval=true) (default: no budget)")
    p.add_argument("--threads", type=positive_int, help="torch threads per process (default: torch's own choice)")
    p.add_argument("--set", nargs="*", metavar="KEY=VALUE",
                   help="any other config field, e.g. warmup=20 autocast=bf16 (default: none)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_run)
