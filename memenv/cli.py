"""The ``memenv`` command line.

``memenv play ENV`` and ``memenv index build CORPUS OUT_DIR`` are built in. Other commands come from the layers above through the entry-point group
``memenv.commands`` (``agents`` provides ``bench``), so that this package never imports upward.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from importlib.metadata import PackageNotFoundError, entry_points, version
from typing import Any, Callable

import gymnasium as gym

from memenv.cli_common import (INTERRUPTED_STATUS, CommandError, CommandInterrupted, HelpFormatter, NotInstalledError,
                               non_negative_int, parse_kwargs, user_input)
from memenv.search.http import ServiceError
from memenv.search.index.cli import build_command as index_build_command
from memenv.search.index.cli import register_cli as register_index
from memenv.serve import register_cli as register_serve
from memenv.protocol import TOOLS, parse_action

# Commands of the upper layers, used when the package is run from a source tree without its metadata.
_FALLBACK_COMMANDS = {"bench": "agents.scripted.bench:register_cli", "train": "agents.llm.training.cli:register_cli",
                      "distill": "distill.cli:register_cli", "experiment": "distill.experiment.cli:register_cli",
                      "models": "agents.llm.models.pretrained:register_cli",
                      "records": "agents.llm.records.cli:register_cli",
                      "view": "agents.llm.records.viewer:register_cli"}

# Optional dependencies -> the extra that installs them (a command that needs a missing one says so).
OPTIONAL_MODULES = {"torch": "llm", "transformers": "llm", "tokenizers": "llm", "trl": "trl", "openenv": "openenv",
                    "stable_baselines3": "sb3", "sb3_contrib": "sb3", "bm25s": "bench"}


def package_version() -> str:
    """The installed distribution's version, or the source tree's ``memenv.__version__``."""
    try:
        return version("memenv")
    except PackageNotFoundError:
        from memenv import __version__

        return __version__


# ---------------------------------------------------------------------------------------------------- play
PLAY_HELP = """Type an action in the protocol, e.g. <memory>notes</memory><search>query</search>, or a shortcut:
  memory TEXT     set the memory draft (sent with your next action)
  search QUERY    search, sending the memory draft        answer A1; A2   answer, sending the memory draft
  next            send the memory draft alone (reading envs: move on to the next chunk or session)
  help | quit"""


def play_command(line: str, memory: str) -> tuple[str | None, str | None, str]:
    """One line typed in ``memenv play`` -> ``(action text to send or None, message to show or None, memory
    draft)``. A shortcut without its argument, an unknown word or malformed protocol text sends nothing (the
    turn is not used) and comes back with a hint."""
    word, _, rest = line.partition(" ")
    rest = rest.strip()
    if line.startswith("<"):
        parsed = parse_action(line, require_memory=False, tools=TOOLS, allow_memory_only=True)
        if not parsed.valid:
            return None, f"not sent ({parsed.error}); try again, or type help", memory
        return line, None, memory
    if word == "memory":
        if not rest:
            hint = f"memory needs TEXT, e.g.  memory Q1 asks for the country of X  (draft now: {memory!r})"
            return None, hint, memory
        return None, f"memory draft: {rest!r} (sent with your next action)", rest
    if word in ("search", "answer"):
        if not rest:
            example = "search Wigei" if word == "search" else "answer Paris; 1987"
            return None, f"{word} needs {'a QUERY' if word == 'search' else 'answers'}, e.g.  {example}", memory
        return f"<memory>{memory}</memory><{word}>{rest}</{word}>", None, memory
    if word == "next" and not rest:
        return f"<memory>{memory}</memory>", None, memory
    if word == "help":
        return None, PLAY_HELP, memory
    return None, f"unknown command {word!r}: not sent. " + PLAY_HELP, memory


def _play(args: argparse.Namespace) -> int:
    import memenv  # noqa: F401 - registers the envs

    kwargs = parse_kwargs(args.kw)
    with user_input(args.env):
        env = gym.make(args.env, **kwargs)
        obs, info = env.reset(seed=args.seed)
    print(PLAY_HELP)
    memory = ""
    print("\n" + obs)
    while True:
        try:
            line = input("action> ").strip()
        except EOFError:
            print()
            return 0
        if line in ("quit", "exit"):
            return 0
        action, message, memory = play_command(line, memory)
        if message:
            print(message)
        if action is None:
            continue
        obs, reward, terminated, truncated, info = env.step(action)
        snapshot = info["invocation"]
        if not snapshot["valid"]:
            print(f"!! invalid action (turn used): {snapshot['error']}")
        elif snapshot["memory_after"] != snapshot["memory_before"]:
            print(f"memory updated: {snapshot['memory_after']!r}")
        if terminated or truncated:
            summary = info["summary"]
            print(f"\nepisode over ({'answered' if terminated else 'out of turns'}): reward {reward:.3f}, "
                  f"F1 {summary['f1']:.3f}, EM {summary['em']:.3f}")
            print("gold answers:", "; ".join(g[0] for g in summary["gold"]))
            return 0
        print("\n" + obs)


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


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command; with ``only`` (a command of the upper layers, the one being run), that command's
    alone besides the built-in ones, so that ``memenv train --help`` does not import what ``bench`` needs."""
    parser = argparse.ArgumentParser(prog="memenv", description="Environments for agents that rewrite their own memory.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    play = sub.add_parser("play", help="play an episode in the terminal", description=PLAY_HELP,
                          formatter_class=HelpFormatter)
    play.add_argument("env", nargs="?", default="MemQA-v0", help="environment id")
    play.add_argument("--seed", type=non_negative_int, default=0, help="episode seed")
    play.add_argument("--kw", nargs="*", action="extend", metavar="KEY=VALUE",
                      help="env kwargs, e.g. objectives=4 context=history (default: the env's own)")
    play.set_defaults(func=_play)
    register_index(sub, run=_index_build)  # `memenv index build`: part of memenv itself, no entry point needed
    register_serve(sub)  # `memenv serve`: OpenEnv server (memenv.openenv, imported when the command runs)
    from memenv import PackageClashError, _check_agents_package
    try:  # another distribution's top-level `agents` (openai-agents) hiding memenv's: one line, exit 2
        _check_agents_package()
    except PackageClashError as exc:
        parser.exit(2, f"memenv: error: {exc}\n")
    commands = _commands()
    if only in commands:
        commands = {only: commands[only]}
    for name, loader in commands.items():
        try:
            loader()(sub)
        except ImportError as exc:  # an optional layer (torch, transformers) that is not installed
            if name not in sub.choices:
                sub.add_parser(name, help=f"(unavailable: {exc})")
    return parser


def _index_build(args: argparse.Namespace) -> int:
    """Every error of an index build comes from its input (a missing or malformed corpus, a bad parameter, an
    unwritable folder): one line, exit 2."""
    with user_input(f"index build {args.corpus}"):
        return index_build_command(args)


def main(argv: list[str] | None = None) -> int:
    """The ``memenv`` command. A user's mistake prints one line to stderr and returns 2; a remote service that
    fails mid-run (:class:`~memenv.search.http.ServiceError`) one line and 1; Ctrl-C prints one line (what the
    command kept, when it says) and returns 130; bugs raise."""
    command = "memenv"
    try:
        words = sys.argv[1:] if argv is None else argv
        named = words[0] if words and not words[0].startswith("-") else None
        parser = build_parser(only=named)
        if named is not None and named not in parser._subparsers._group_actions[0].choices:
            parser = build_parser()  # a mistyped command: argparse lists every command in its error
        args = parser.parse_args(argv)
        command = f"memenv {args.command}"
        if not hasattr(args, "func"):
            parser.error(f"command {args.command!r} is not available in this installation")
        status = _run_command(args, command)
        sys.stdout.flush()  # a reader that went away is seen here, not in the interpreter's exit
        return status
    except BrokenPipeError:  # the reader of stdout went away (memenv bench | head): nothing more to print
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, as a shell reports a pipe's writer that was cut off
    except KeyboardInterrupt as exc:
        note = str(exc) if isinstance(exc, CommandInterrupted) else ""
        print(f"{command}: interrupted" + (f": {note}" if note else ""), file=sys.stderr)
        return INTERRUPTED_STATUS


# Commands that end on their own after work worth timing: each prints its cost as its last line (stderr, so that
# what it prints on stdout stays the same): `play` waits on a person, `serve` on clients, `models list` is instant.
TIMED_COMMANDS = ("bench", "train", "distill", "experiment", "index", "models")


class CostClock:
    """Wall seconds and CPU seconds (this process's threads and its waited-for children: torchrun ranks,
    workers) since it was made."""

    def __init__(self) -> None:
        self.wall, self.cpu = time.perf_counter(), self._cpu()

    @staticmethod
    def _cpu() -> float:
        import resource

        return sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF),
                                                       resource.getrusage(resource.RUSAGE_CHILDREN)))

    def line(self, command: str) -> str:
        wall, cpu = time.perf_counter() - self.wall, self._cpu() - self.cpu
        return f"{command}: done in {_duration(wall)} wall, {cpu:,.1f} CPU-s"


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes} min {secs:02d} s" if minutes < 60 else f"{minutes // 60} h {minutes % 60:02d} min"


def _run_command(args: argparse.Namespace, command: str) -> int:
    clock = CostClock()
    try:
        status = int(args.func(args) or 0)
        if status == 0 and args.command in TIMED_COMMANDS and getattr(args, "models_command", "prepare") in ("prepare", "shrink"):
            print(clock.line(command), file=sys.stderr)
        return status
    except CommandError as exc:
        print(f"{command}: error: {exc}", file=sys.stderr)
        return exc.status
    except NotInstalledError as exc:
        print(f"{command}: error: {exc}", file=sys.stderr)
        return 2
    except ServiceError as exc:
        # A retrieval server, served model or judge that failed mid-run: not the user's typing (exit 1, as the
        # bench's --max-failures stop), but one line naming the URL and what came back, not a traceback.
        print(f"{command}: error: {exc}", file=sys.stderr)
        return 1
    except ModuleNotFoundError as exc:
        extra = OPTIONAL_MODULES.get((exc.name or "").split(".")[0])
        if extra is None:  # not an optional dependency: a bug
            raise
        print(f"{command}: error: needs {exc.name}, which is not installed: "
              f"pip install -e '.[{extra}]'", file=sys.stderr)
        return 2


if __name__ == "__main__":
    # `python -m memenv.cli` runs this file as __main__, a second copy of the module: run the imported one,
    # whose CommandError is the class the subcommands raise.
    from memenv import cli

    sys.exit(cli.main())
