"""The ``memenv`` command line.

``memenv play ENV`` and ``memenv index build CORPUS OUT_DIR`` are built in. Other commands come from the layers above through the entry-point group
``memenv.commands`` (``agents`` provides ``bench``), so that this package never imports upward.
"""

from __future__ import annotations

import argparse
import ast
import sys
from importlib.metadata import entry_points
from typing import Any, Callable

import gymnasium as gym

from memenv.index import register_cli as register_index

# Commands of the upper layers, used when the package is run from a source tree without its metadata.
_FALLBACK_COMMANDS = {"bench": "agents.scripted.bench:register_cli", "train": "agents.llm.cli:register_cli"}


def parse_kwargs(items: list[str] | None) -> dict[str, Any]:
    """``["objectives=16", "context=history"]`` -> ``{"objectives": 16, "context": "history"}``."""
    kwargs: dict[str, Any] = {}
    for item in items or []:
        if "=" not in item:
            raise SystemExit(f"error: --kw expects KEY=VALUE, got {item!r}")
        key, value = item.split("=", 1)
        try:
            kwargs[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            kwargs[key] = value
    return kwargs


def _play(args: argparse.Namespace) -> int:
    import memenv  # noqa: F401 - registers the envs

    env = gym.make(args.env, **parse_kwargs(args.kw))
    obs, info = env.reset(seed=args.seed)
    print(__doc_play__)
    memory = ""
    while True:
        print("\n" + obs)
        try:
            line = input("action> ").strip()
        except EOFError:
            print()
            return 0
        if line in ("quit", "exit"):
            return 0
        if line.startswith("memory "):
            memory = line[len("memory "):]
            print(f"(memory draft set; it is sent with your next search or answer)")
            continue
        if line.startswith("search ") or line.startswith("answer "):
            tool, argument = line.split(" ", 1)
            line = f"<memory>{memory}</memory><{tool}>{argument}</{tool}>"
        obs, reward, terminated, truncated, info = env.step(line)
        snapshot = info["invocation"]
        if not snapshot["valid"]:
            print(f"!! invalid action: {snapshot['error']}")
        if terminated or truncated:
            episode = info["summary"]
            print(f"\nepisode over ({'answered' if terminated else 'out of turns'}): reward {reward:.3f}, "
                  f"F1 {episode['f1']:.3f}, EM {episode['em']:.3f}")
            print("gold answers:", "; ".join(g[0] for g in episode["gold"]))
            return 0


__doc_play__ = """Type an action in the protocol, e.g. <memory>notes</memory><search>query</search>,
or the shortcuts:  memory TEXT  (draft memory)  |  search QUERY  |  answer A1; A2  |  quit"""


def _commands() -> dict[str, Callable[[Any], None]]:
    found = {ep.name: ep for ep in entry_points(group="memenv.commands")}
    commands: dict[str, Callable[[Any], None]] = {}
    for name, target in _FALLBACK_COMMANDS.items():
        if name in found:
            commands[name] = found.pop(name).load
        else:
            module, attr = target.split(":")
            commands[name] = lambda m=module, a=attr: getattr(__import__(m, fromlist=[a]), a)
    for name, ep in found.items():
        commands[name] = ep.load
    return commands


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="memenv", description="Environments for agents that rewrite their own memory.")
    sub = parser.add_subparsers(dest="command", required=True)
    play = sub.add_parser("play", help="play an episode in the terminal")
    play.add_argument("env", nargs="?", default="MemQA-v0", help="environment id (default MemQA-v0)")
    play.add_argument("--seed", type=int, default=0)
    play.add_argument("--kw", nargs="*", metavar="KEY=VALUE", help="env kwargs, e.g. objectives=4 context=history")
    play.set_defaults(func=_play)
    register_index(sub)  # `memenv index build`: part of memenv itself, no entry point needed
    for name, loader in _commands().items():
        try:
            register = loader()
        except ImportError as exc:  # an optional layer that is not installed
            sub.add_parser(name, help=f"(unavailable: {exc})")
            continue
        register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "func"):
        parser.error(f"command {args.command!r} is not available in this installation")
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
