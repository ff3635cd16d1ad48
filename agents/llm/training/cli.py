"""``memenv train``: SFT, PPO or GRPO of an LLM policy on a memenv environment.

    memenv train --algo sft  --out runs/sft  --steps 2000 --threads 1          # tiny model from scratch (README)
    memenv train --algo ppo  --model runs/sft/checkpoint-0002000 --out runs/ppo --updates 200
    memenv train --algo grpo --model PATH --env MemQA-v0 --kw objectives=1 hops=2 --out runs/grpo
    memenv train --algo grpo --out runs/grpo --resume                         # continue from runs/grpo/latest
    torchrun --nproc_per_node 2 -m memenv.cli train --algo grpo --out runs/ddp # DDP (gloo on CPU, nccl on GPU)

Without ``--model`` a tiny Qwen2 model is built from a tokenizer trained on the env's oracle text, and SFT of it
starts from the tiny-model recipe (``agents.llm.training.recipes.TINY_SFT_RECIPE``: the "suffix" tokenizer of up to 8192
tokens, 8 heads, lr 3e-3 with 100 warm-up steps and a cosine, an LM loss on 30% of the observation tokens, 3,000
demonstrations; the flags below override it); with ``--model`` the config's own defaults apply. Every field of
the trainer's config dataclass (``agents.llm.training.sft.SFTConfig``, ``agents.llm.training.ppo.PPOConfig``) can be set
with ``--set KEY=VALUE``. Writes ``OUT/metrics.csv``, ``OUT/learning_curve.png``, ``OUT/config.json`` and atomic
checkpoints ``OUT/checkpoint-N`` (``OUT/latest`` names the newest).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any

import gymnasium as gym

import memenv  # noqa: F401 - registers the envs
from memenv.cli_common import (CommandError, CommandInterrupted, HelpFormatter, check_out_dir, non_negative_float,
                               non_negative_int, parse_kwargs, positive_float, positive_int, prepare_out_dir,
                               user_input)
from agents.llm.models.folder_checks import WEIGHT_FILES, _json_file, check_model_folder  # noqa: F401 - its API
from agents.llm.models.pretrained import check_checkpoint
from tasks.types import DataFormatError

#: Files a training run writes into its ``--out`` folder besides its ``checkpoint-N`` folders.
RUN_FILES = ("config.json", "metrics.csv", "learning_curve.png", "latest")
#: ``--dtype`` / ``--attn-implementation`` choices (agents.llm.models.precision's, here so the CLI loads no torch).
DTYPE_CHOICES = ("auto", "float32", "bfloat16", "float16", "native", "fp32", "bf16", "fp16")
ATTN_CHOICES = ("sdpa", "eager", "flex_attention", "flash_attention_2")


def add_model_options(parser, what: str = "model") -> None:
    """``--dtype`` and ``--attn-implementation`` of the loaded ``what``."""
    parser.add_argument("--dtype", choices=DTYPE_CHOICES, default=None,
                        help=f"the {what}'s weights: float32 (default, token-exact), bfloat16, float16, or auto "
                             "(bfloat16 on a CUDA device that supports it, else float32)")
    parser.add_argument("--attn-implementation", dest="attn_implementation", choices=ATTN_CHOICES, default=None,
                        help=f"the {what}'s attention (default sdpa; flash_attention_2 needs CUDA, bf16/fp16 and "
                             "the flash_attn package)")


def _parse_value(text: str) -> Any:
    import ast

    if text.lower() in ("true", "false"):  # a bare string "false" would be truthy
        return text.lower() == "true"
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


#: The words a boolean ``--set`` value may be (any case).
_BOOL_WORDS = {"true": True, "yes": True, "on": True, "1": True, "false": False, "no": False, "off": False, "0": False}


def apply_set(values: dict[str, Any], items: list[str] | None, cls) -> dict[str, Any]:
    """``--set KEY=VALUE`` items into ``values`` (fields of the dataclass ``cls``); a bad item or an unknown
    field raises :class:`memenv.cli_common.CommandError` naming it."""
    known = {f.name: f for f in fields(cls)}
    for item in items or []:
        if "=" not in item:
            raise CommandError(f"--set expects KEY=VALUE, got {item!r}")
        key, value = item.split("=", 1)
        if key not in known:
            raise CommandError(f"{cls.__name__} has no field {key!r}; fields: {', '.join(sorted(known))}")
        parsed = _parse_value(value)
        kind = str(known[key].type).replace(" ", "")
        if kind in ("bool", "bool|None"):  # "no" or "off" as a string would be truthy: parse to the declared type
            word = value.strip().lower()
            if kind == "bool|None" and word == "none":
                values[key] = None
                continue
            if word not in _BOOL_WORDS:
                raise CommandError(f"--set {item}: {key} takes true or false (also yes/no, on/off, 1/0)"
                                   + (" or none" if kind == "bool|None" else ""))
            values[key] = _BOOL_WORDS[word]
            continue
        if kind == "bool|str" and value.strip().lower() in ("true", "false", "yes", "no", "on", "off"):
            values[key] = _BOOL_WORDS[value.strip().lower()]  # a word that means a boolean is one
            continue
        if kind in ("int", "int|None") and not (parsed is None and kind == "int|None"):
            if isinstance(parsed, bool) or not isinstance(parsed, (int, float)) or parsed != int(parsed):
                raise CommandError(f"--set {item}: {key} takes a whole number")
            values[key] = int(parsed)
            continue
        numeric = ("float" in kind or "int" in kind) and "str" not in kind
        if numeric and isinstance(parsed, str):
            try:
                parsed = float(value)
            except ValueError:
                raise CommandError(f"--set {item}: {key} takes a number") from None
        if isinstance(parsed, float) and not math.isfinite(parsed):
            raise CommandError(f"--set {item}: {key} takes a finite number")
        values[key] = parsed
    return values


def check_run_out(out: str | os.PathLike, resume: bool, option: str = "--out") -> Path:
    """Check ``--out`` of a training run before any work (see :func:`memenv.cli_common.check_out_dir`): a folder or
    nothing yet; its ``config.json``, if any, a training run's (not a model checkpoint's); without ``resume``, no
    earlier run in it (its checkpoints would be deleted and its metrics replaced). Only rank 0 looks for an
    earlier run (the other ranks of a ``torchrun`` could see rank 0's first files)."""
    folder = check_out_dir(out, option)
    if not folder.is_dir():
        return folder
    config = folder / "config.json"
    if config.is_file():
        data = _json_file(config, f"{option} {os.fspath(out)}")
        if not isinstance(data, dict) or "out_dir" not in data:
            raise CommandError(f"{option} {os.fspath(out)}: holds a config.json that is not a memenv training "
                               "run's (a model checkpoint?); choose another --out")
    if resume:
        _check_resume_point(folder, option)
        return folder
    if int(os.environ.get("RANK", "0")) != 0:
        return folder
    found = [name for name in RUN_FILES if (folder / name).exists()]
    found += sorted(p.name for p in folder.glob("checkpoint-*"))
    if found:
        raise CommandError(f"{option} {os.fspath(out)}: holds an earlier run ({', '.join(found[:3])}"
                           f"{', ...' if len(found) > 3 else ''}); --resume continues it, or choose another --out")
    return folder


def _check_resume_point(folder: Path, option: str) -> None:
    """With ``--resume``: the checkpoint ``OUT/latest`` names is whole (a damaged one fails here, in one line,
    rather than deep in the loader). No ``latest``: the run starts from the start, as the trainers do."""
    pointer = folder / "latest"
    if not pointer.is_file():
        return
    try:
        name = pointer.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise CommandError(f"--resume: cannot read {pointer} ({exc})") from None
    checkpoint = folder / name
    if not name or not checkpoint.is_dir():
        return  # the trainers fall back to the newest whole checkpoint-N folder
    if (checkpoint / "trainer_state.pt").is_file():  # else the trainers fall back to an older whole one
        check_checkpoint(checkpoint, f"--resume: {option}")


def interrupted_note(out: str | os.PathLike) -> str:
    """What a training run kept when Ctrl-C ended it (its newest checkpoint)."""
    from agents.llm.training.common import latest_checkpoint

    last = latest_checkpoint(out)
    if last is None:
        return f"no checkpoint written yet in {out}"
    return f"checkpoints kept in {out}, the newest {last.name} (--resume continues from it)"


def uses_tiny_recipe(args: argparse.Namespace) -> bool:
    """SFT of a fresh tiny model (no ``--model``, or ``--model tiny``): its defaults are
    :data:`agents.llm.training.recipes.TINY_SFT_RECIPE`, not the SFT config's (those serve a pretrained ``--model``)."""
    return args.algo == "sft" and (not args.model or args.model == "tiny")


def build_config(args: argparse.Namespace):
    """The trainer config from parsed CLI arguments (a user's mistake raises
    :class:`memenv.cli_common.CommandError`)."""
    # The trainers import torch: loaded only when `memenv train` runs, not whenever the memenv CLI starts.
    if args.algo == "sft":
        from agents.llm.training.sft import SFTConfig as cls
    else:
        from agents.llm.training.ppo import PPOConfig as cls
    values: dict[str, Any] = {"env_id": args.env, "out_dir": args.out, "seed": args.seed, "resume": args.resume,
                              "progress": not args.quiet}
    if uses_tiny_recipe(args):  # a tiny model from scratch: the recipe that learns; the flags below override it
        from agents.llm.training.recipes import TINY_SFT_RECIPE

        values = {**TINY_SFT_RECIPE, **values}
    if args.kw is not None:
        values["env_kwargs"] = parse_kwargs(args.kw)
    if args.model and args.model != "tiny":
        values["model"] = args.model
    if args.algo != "sft":
        values["algo"] = args.algo
    for name in ("lr", "threads", "eval_every", "eval_episodes", "save_every", "num_envs", "max_new_tokens",
                 "max_seconds", "steps", "updates", "batch_size", "episodes", "episodes_per_update", "group_size",
                 "kl_coef", "ent_coef", "temperature", "dtype", "attn_implementation"):
        value = getattr(args, name, None)
        if value is not None:
            values[name] = value
    apply_set(values, args.set, cls)
    unknown = set(values) - {f.name for f in fields(cls)}
    for key in unknown:  # e.g. --steps with --algo ppo
        raise CommandError(f"--{key.replace('_', '-')} does not apply to --algo {args.algo}")
    with user_input(cls.__name__):
        return cls(**values)


def check_model_options(cfg, fields_: tuple[tuple[str, str], ...] = (("dtype", "attn_implementation"),)) -> None:
    """``--dtype`` / ``--attn-implementation`` (and ``--set`` ones) can load on this host's training device (a
    CUDA device where one is visible, as the trainers pick), else a :class:`memenv.cli_common.CommandError` naming the
    option: e.g. flash_attention_2 on a CPU-only host, in float32, or without the flash_attn package."""
    import torch

    from agents.llm.models.precision import check_attn_implementation, resolve_dtype

    device = "cuda" if torch.cuda.is_available() else "cpu"
    for dtype_field, attn_field in fields_:
        dtype_value = getattr(cfg, dtype_field, None)
        impl = getattr(cfg, attn_field, None) or getattr(cfg, "attn_implementation", None) or "sdpa"
        try:
            dtype = resolve_dtype(dtype_value if dtype_value is not None else getattr(cfg, "dtype", None), device,
                                  f"--{dtype_field.replace('_', '-')}")
            check_attn_implementation(impl, dtype, device, f"--{attn_field.replace('_', '-')}")
        except ValueError as exc:
            raise CommandError(str(exc)) from None


def check_setup(cfg) -> None:
    """Fail before any training on a user's mistake: an unknown env or kwarg, a bad value, a missing data
    file (the env is built and reset once) or a ``--model`` folder that does not exist."""
    with user_input(f"--env {cfg.env_id} with --kw {cfg.env_kwargs}"):
        env = gym.make(cfg.env_id, **cfg.env_kwargs)
        env.reset(seed=cfg.seed)
        env.close()
    if cfg.model is not None:
        cfg.model = check_checkpoint(cfg.model, "--model")  # a registered name becomes its prepared folder
        if not os.path.isdir(cfg.model):
            raise CommandError(f"--model {cfg.model!r} is not a checkpoint folder (omit --model for a fresh tiny "
                               "model)")
        check_checkpoint(cfg.model, "--model")
    check_model_options(cfg)


def _run(args: argparse.Namespace) -> int:
    cfg = build_config(args)
    check_run_out(cfg.out_dir, cfg.resume)
    check_setup(cfg)
    from agents.llm.models.local import NonFiniteWeightsError

    prepare_out_dir(cfg.out_dir, keep=False)
    try:
        if args.algo == "sft":
            from agents.llm.training.sft import train_sft

            last = train_sft(cfg)
        else:
            from agents.llm.training.ppo import train_rl

            last = train_rl(cfg)
    except KeyboardInterrupt:
        raise CommandInterrupted(interrupted_note(cfg.out_dir)) from None
    except DataFormatError as exc:  # a data file of the user's, damaged past what the set-up check reads
        raise CommandError(f"{exc}; {interrupted_note(cfg.out_dir)}") from exc
    except NonFiniteWeightsError as exc:  # a diverged run: stopped before any non-finite checkpoint
        raise CommandError(f"{exc}; {interrupted_note(cfg.out_dir)}") from None
    if int(os.environ.get("RANK", "0")) == 0:
        shown = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in last.items()}
        print(json.dumps(shown))
        print(f"wrote {cfg.out_dir}/metrics.csv, {cfg.out_dir}/learning_curve.png and checkpoints in {cfg.out_dir}")
    return 0


#: Where the trainer configs are defined: (module file beside this one in agents/llm/training, base class or None).
_CONFIG_SOURCES = {"RunConfig": ("common.py", None), "SFTConfig": ("sft.py", "RunConfig"),
                   "PPOConfig": ("ppo.py", "RunConfig")}


def config_defaults(name: str) -> dict[str, Any]:
    """The literal defaults of the trainer config ``name`` (``SFTConfig``, ``PPOConfig``) and of its base, read from
    their source files without importing them: the configs' modules import torch, which takes seconds, and
    ``memenv train --help`` needs only the defaults. Fields whose default is not a literal are left out."""
    return dict(_parsed_defaults(name))


@functools.lru_cache(maxsize=None)
def _parsed_defaults(name: str) -> dict[str, Any]:
    """:func:`config_defaults`, parsed once per process (the help asks for every option: ~30 parses otherwise)."""
    import ast

    file, base = _CONFIG_SOURCES[name]
    out = config_defaults(base) if base else {}
    tree = ast.parse((Path(__file__).parent / file).read_text(encoding="utf-8"))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name)
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            try:
                out[node.target.id] = ast.literal_eval(node.value)
            except ValueError:  # field(default_factory=...), an expression: not shown
                out.pop(node.target.id, None)
    return out


class TrainHelpFormatter(HelpFormatter):
    """Shows the trainer configs' defaults for the options whose argparse default is None (None: "use the
    config's value", which differs between SFT and PPO/GRPO), read from the configs' source
    (:func:`config_defaults`), so the help imports no torch."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = super()._get_help_string(action)
        if action.default is not None or action.required or "(default" in text:
            return text
        from agents.llm.training.recipes import TINY_SFT_RECIPE

        found = {}
        for algo, name in (("sft", "SFTConfig"), ("ppo/grpo", "PPOConfig")):
            defaults = config_defaults(name)
            if action.dest in defaults:
                found[algo] = defaults[action.dest]
        if action.dest in TINY_SFT_RECIPE and "sft" in found:  # the tiny model's SFT differs from a --model's
            tiny = TINY_SFT_RECIPE[action.dest]
            found = {"sft (tiny model)": tiny, "sft --model": found.pop("sft"), **found}
        if not found:
            return text
        if len(set(map(repr, found.values()))) == 1:
            return f"{text} (default: {next(iter(found.values()))})"
        return f"{text} (default: " + ", ".join(f"{algo} {value}" for algo, value in found.items()) + ")"


def register_cli(subparsers) -> None:
    """Adds ``memenv train`` (entry point group ``memenv.commands``)."""
    from memenv.costs import cost

    description = (f"{__doc__}\nThe README's tiny-agent command (the first line above) costs {cost('tiny_sft')}; "
                   "its peak RSS is 1.9 GB and each checkpoint 20 MB (docs/llm_agents.md).")
    p = subparsers.add_parser("train", help="train an LLM policy (SFT, PPO, GRPO)", description=description,
                              formatter_class=TrainHelpFormatter)
    p.add_argument("--algo", choices=["sft", "ppo", "grpo"], required=True,
                   help="sft: imitate the oracle; ppo: value head + token GAE; grpo: group-normalised returns")
    p.add_argument("--model", default=None,
                   help="local checkpoint folder or registered model (default: a fresh tiny model; its SFT uses the "
                        "tiny-model recipe, agents.llm.training.recipes)")
    p.add_argument("--env", default="MemQA-v0", help="environment id")
    p.add_argument("--kw", nargs="*", action="extend", metavar="KEY=VALUE",
                   help="env kwargs, e.g. objectives=1 hops=2 (default: objectives=1 hops=2)")
    p.add_argument("--out", default="runs/train",
                   help="output folder (metrics.csv, checkpoints, config.json): new, or an earlier run's with --resume")
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
    add_model_options(p)
    p.add_argument("--set", nargs="*", metavar="KEY=VALUE",
                   help="any other config field, e.g. warmup=20 autocast=bf16 (default: none)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_run)
