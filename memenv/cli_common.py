"""What every ``memenv`` command is written with: :class:`CommandError` (a user's mistake: one line, exit 2) and
:func:`user_input`, the argparse number types, the ``--out`` checks, :class:`HelpFormatter` and ``--kw`` parsing.

Here, below :mod:`memenv.cli` (which builds the ``memenv`` parser and runs a command) and every module that
registers a command (:mod:`memenv.serve`, and through the ``memenv.commands`` entry points those of ``agents``
and ``distill``), so that none of them imports the command line that imports them.
"""

from __future__ import annotations

import argparse
import ast
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Sequence

import gymnasium as gym

from memenv.registration import ENVIRONMENTS

# What a user's bad input raises while a command sets up (unknown env or kwarg, bad value, missing or
# malformed file, unknown strategy): printed as one line, exit status 2. Later, they are bugs (tracebacks).
USER_ERRORS = (ValueError, TypeError, LookupError, OSError, gym.error.Error)


class CommandError(Exception):
    """A user's mistake on the command line: :func:`main` prints ``memenv CMD: error: MESSAGE`` and returns
    ``status`` (2; a run that stopped on failures it counted, such as ``memenv bench --max-failures``, uses 1)."""

    def __init__(self, message: str, status: int = 2) -> None:
        super().__init__(message)
        self.status = status


class NotInstalledError(RuntimeError):
    """Something a command was asked to use is not installed (a registered model's weights package, its
    reader): wherever it is raised, :func:`memenv.cli.main` prints ``memenv CMD: error: MESSAGE`` (the message says
    what to install) and returns 2, as for a user's mistake, never a traceback."""


class CommandInterrupted(KeyboardInterrupt):
    """Ctrl-C, with what the command kept (e.g. ``"2 of 6 cells kept in bench_out"``): :func:`main` prints
    ``memenv CMD: interrupted: NOTE`` and returns 130. A plain ``KeyboardInterrupt`` prints ``interrupted``."""


#: Exit status of a command ended by Ctrl-C (128 + SIGINT, as shells report it).
INTERRUPTED_STATUS = 130


@contextmanager
def user_input(what: str = "") -> Iterator[None]:
    """Turn :data:`USER_ERRORS` raised inside the block (the set-up from command-line arguments) into a
    :class:`CommandError`; ``what`` (e.g. ``"--envs MemQA-v0:objectives=0"``) prefixes the message."""
    try:
        yield
    except USER_ERRORS as exc:
        message = exc.args[0] if isinstance(exc, LookupError) and exc.args else str(exc)
        if isinstance(exc, gym.error.UnregisteredEnv):
            message += " memenv environments: " + ", ".join(ENVIRONMENTS)
        raise CommandError(f"{what}: {message}" if what else str(message)) from exc


def require_file(path: str | os.PathLike, what: str, prefix: str = "") -> Path:
    """``path`` as a :class:`Path` when it is a file, else a :class:`CommandError` saying what is there instead: nothing
    (``no such file``) or a folder (``is a folder, not a file``, naming up to three ``.jsonl`` files inside it so the
    user sees which one was meant). ``what`` says what the file holds; ``prefix`` (an option's name) starts the line."""
    path = Path(path)
    lead = f"{prefix} {path}" if prefix else str(path)
    if path.is_file():
        return path
    if path.is_dir():
        inside = sorted(str(p) for p in path.rglob("*.jsonl"))
        hint = f"; JSON lines files in it: {', '.join(inside[:3])}{' ...' if len(inside) > 3 else ''}" if inside else ""
        raise CommandError(f"{lead}: is a folder, not a file ({what}){hint}")
    raise CommandError(f"{lead}: no such file ({what})")


def positive_int(text: str) -> int:
    """argparse type: an int >= 1."""
    return _checked_number(text, int, 1, ">= 1")


def non_negative_int(text: str) -> int:
    """argparse type: an int >= 0 (seeds)."""
    return _checked_number(text, int, 0, ">= 0")


def positive_float(text: str) -> float:
    """argparse type: a finite float > 0."""
    return _checked_number(text, float, 0.0, "> 0", strict=True)


def non_negative_float(text: str) -> float:
    """argparse type: a finite float >= 0."""
    return _checked_number(text, float, 0.0, ">= 0")


def finite_float(text: str) -> float:
    """argparse type: a finite float (its range is checked by the config it goes to)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def unit_float(text: str) -> float:
    """argparse type: a finite float in [0, 1] (weights, shares)."""
    value = non_negative_float(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"expected a finite value in [0, 1], got {text!r}")
    return value


def open_unit_float(text: str) -> float:
    """argparse type: a finite float strictly between 0 and 1 (a PPO clip range)."""
    value = positive_float(text)
    if value >= 1:
        raise argparse.ArgumentTypeError(f"expected a finite value in (0, 1), got {text!r}")
    return value


def _checked_number(text: str, kind: type, low: float, rule: str, strict: bool = False) -> Any:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {'an integer' if kind is int else 'a number'} {rule}, "
                                         f"got {text!r}") from None
    if value != value or value in (float("inf"), float("-inf")) or value < low or (strict and value == low):
        raise argparse.ArgumentTypeError(f"expected a {'' if kind is int else 'finite '}value {rule}, got {text!r}")
    return value


# ---------------------------------------------------------------------------------------------- --out
def _same_place(a: Path, b: Path) -> bool:
    """Whether ``a`` and ``b`` name one file or folder (through links and ``..`` too); False where either is
    missing."""
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def _output_path(path: str | os.PathLike, option: str, inputs: Sequence[str | os.PathLike], kind: str) -> Path:
    """``path`` as a Path, refused where it is empty or one of the command's ``inputs`` (``kind``: "file" or
    "folder", for the message)."""
    text = os.fspath(path)
    if not str(text).strip():
        raise CommandError(f"{option}: expected a {'file name' if kind == 'file' else kind}, got an empty path")
    for source in inputs:
        if _same_place(Path(text), Path(source)):
            raise CommandError(f"{option} {text}: is the input {os.fspath(source)}; writing "
                               + ("it would replace the input: choose another file" if kind == "file" else
                                  "there would change what the command reads: choose another folder"))
    return Path(text)


def _writable_above(start: Path, option: str, text: str, what: str) -> None:
    """The nearest existing folder at or above ``start`` is a writable folder (``what``: what cannot be made under
    a file), else a :class:`CommandError`."""
    above = start
    while not above.exists():
        above = above.parent
    if not above.is_dir():
        made = "written" if what == "file" else "made"
        raise CommandError(f"{option} {text}: {above} is a file, so no {what} can be {made} under it")
    if not os.access(above, os.W_OK | os.X_OK):
        raise CommandError(f"{option} {text}: {above} is not writable")


def check_out_file(path: str | os.PathLike, option: str = "--out",
                   inputs: Sequence[str | os.PathLike] = ()) -> Path:
    """Check, before any work and creating nothing, that ``path`` can be the output file of a command that writes it
    atomically (a temporary file renamed over it): not empty, not a folder, not a symbolic link (the rename would
    replace the link, not what it points to: a device, stdout, another file), not a device, pipe or socket, not one
    of the command's ``inputs`` (its only copy would be replaced by the output), and in a folder that exists or can
    be made, writable. A :class:`CommandError` naming ``option`` otherwise."""
    out = _output_path(path, option, inputs, "file")
    text = os.fspath(path)
    if out.is_symlink():
        raise CommandError(f"{option} {text}: is a symbolic link (to {os.readlink(out)}); the output would replace "
                           "the link: name a regular file")
    if out.is_dir():
        raise CommandError(f"{option} {text}: is a folder (expected a file name)")
    if out.exists() and not out.is_file():
        raise CommandError(f"{option} {text}: is not a regular file (a device, pipe or socket): name a regular file")
    _writable_above(out.absolute().parent, option, text, "file")
    return out


def check_out_dir(path: str | os.PathLike, option: str = "--out",
                  inputs: Sequence[str | os.PathLike] = ()) -> Path:
    """Check, creating nothing, that ``path`` can be the output folder of a command: it is a folder or does not
    exist yet, is none of the command's ``inputs`` (a folder it reads), and the nearest folder that exists above
    it is writable. A :class:`CommandError` naming ``option`` otherwise. Call it before any work;
    :func:`prepare_out_dir` then makes the folder."""
    out = _output_path(path, option, inputs, "folder")
    text = os.fspath(path)
    if out.is_symlink() and not out.exists():  # mkdir would fail on the link itself (FileExistsError)
        raise CommandError(f"{option} {text}: is a symbolic link to {os.readlink(out)}, which does not exist: make "
                           "that folder first, or remove the link")
    if out.exists() and not out.is_dir():
        raise CommandError(f"{option} {text}: is a file, not a folder (choose a folder, new or of an earlier run)")
    _writable_above(out.absolute(), option, text, "folder")
    return out


def prepare_out_dir(path: str | os.PathLike, option: str = "--out", keep: bool = True) -> Path:
    """Make the output folder ``path`` (:func:`check_out_dir` first) and write a probe file in it, so that a
    folder that cannot be written (read-only file system, permissions the access check cannot see) fails now,
    as a :class:`CommandError`, rather than after the work. ``keep=False``: the folders made for the probe are
    removed again (the command makes them when it writes its first file)."""
    out = check_out_dir(path, option)
    made = [folder for folder in [out.absolute(), *out.absolute().parents] if not folder.exists()]
    try:
        out.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=out, prefix=".memenv-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise CommandError(f"{option} {os.fspath(path)}: cannot write there ({exc.strerror or exc})") from None
    finally:
        if not keep:
            for folder in made:  # deepest first; only the empty folders made here
                try:
                    folder.rmdir()
                except OSError:
                    break
    return out


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the description's layout and shows every option's default: ``(default: X)`` is appended to a
    help text that does not already say its default (options whose default is None say it in words)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "(default" in text or "%(default)" in text or action.default in (None, argparse.SUPPRESS):
            return text
        if not action.option_strings and action.nargs not in (argparse.OPTIONAL, argparse.ZERO_OR_MORE):
            return text
        default = action.default
        shown = " ".join(map(str, default)) if isinstance(default, (list, tuple)) else default
        return f"{text} (default: {shown})".strip()


def parse_kwargs(items: list[str] | None) -> dict[str, Any]:
    """``["objectives=16", "context=history"]`` -> ``{"objectives": 16, "context": "history"}``."""
    kwargs: dict[str, Any] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise CommandError(f"--kw expects KEY=VALUE, got {item!r}")
        try:
            kwargs[key.strip()] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            kwargs[key.strip()] = value
    return kwargs
