"""The commands the documentation shows are commands that run.

- Every shell command in an ``examples/*.py`` docstring, and every ``memenv ...``, ``python examples/...`` and
  ``python benchmarks/...`` command in README.md and docs/*.md (code blocks and inline code), is parsed by the
  real argument parser: ``memenv.cli.build_parser()`` for ``memenv`` (and ``torchrun ... -m memenv.cli``), and
  the script's own parser for a script (run up to its ``parse_args``, which is stopped there). A wrong flag,
  a missing required option or a bad value fails here with the page and the command.
- Commands with placeholders (``...``, ``[optional]``, ``a|b``, ``<name>``) are left out; the test counts
  what it parsed so that the extraction cannot silently find nothing.
- The cheap example commands run for real, with a smaller budget appended (argparse keeps the last value).
- A chain ``memenv train ... --out D --steps N && ... --model D/checkpoint-XXXX`` names the checkpoint folder
  the training run writes.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import functools
import io
import re
import runpy
import shlex
import sys
from pathlib import Path

import pytest
from shell_text import join_continuations

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PLACEHOLDER = re.compile(r"\.\.\.|…|\[|\||<[A-Za-z_]+>")
STARTS = ("memenv ", "python examples/", "python benchmarks/", "torchrun ", "python -m memenv.cli ")


# ------------------------------------------------------------------------------------------- extraction
def _commands_in_lines(lines: list[str]) -> list[str]:
    """Commands of shell-like ``lines``: ``\\`` continuations joined, comments dropped, ``&&`` chains split."""
    out = []
    for line in join_continuations(lines):
        if line.startswith("#"):
            continue
        for part in line.split("&&"):
            part = part.strip()
            if part.startswith(STARTS):
                out.append(part)
    return out


def docstring_commands(path: Path) -> list[str]:
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    return _commands_in_lines(doc.splitlines())


FENCE = re.compile(r"^```([A-Za-z]*)\n(.*?)^```", re.DOTALL | re.MULTILINE)
INLINE = re.compile(r"`((?:memenv|python (?:examples|benchmarks)/)[^`]*)`")


def page_commands(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    out: list[str] = []
    for lang, body in FENCE.findall(text):
        if lang in ("", "bash", "sh", "shell", "console"):
            out += _commands_in_lines(body.splitlines())
    outside = FENCE.sub("", text)
    indented = [line for line in outside.splitlines() if line.startswith("    ") and line.strip().startswith(STARTS)]
    out += _commands_in_lines(indented)
    # inline code may wrap a line; a bare name (`memenv train`) is a reference, not a command
    out += [" ".join(span.split()) for span in INLINE.findall(outside) if " -" in span or span.startswith("python")]
    return out


def _cases() -> list[tuple[str, str]]:
    cases = [(p.relative_to(ROOT).as_posix(), c) for p in EXAMPLES for c in docstring_commands(p)]
    cases += [(p.relative_to(ROOT).as_posix(), c) for p in PAGES for c in page_commands(p)]
    seen, unique = set(), []
    for case in cases:
        if case not in seen:
            seen.add(case)
            unique.append(case)
    return unique


CASES = _cases()
PARSED = [case for case in CASES if not PLACEHOLDER.search(case[1])]


# ------------------------------------------------------------------------------------------- dry parsing
class _Parsed(Exception):
    def __init__(self, namespace: argparse.Namespace) -> None:
        super().__init__("parsed")
        self.namespace = namespace


@functools.lru_cache(maxsize=1)
def _memenv_parser() -> argparse.ArgumentParser:
    from memenv.cli import build_parser

    return build_parser()


def _argv(command: str) -> tuple[str, list[str]]:
    """``(program, argv)``: ``"memenv"`` with its arguments, or a script path with its arguments."""
    words = shlex.split(command, comments=True)
    if words[0] == "memenv":
        return "memenv", words[1:]
    if "memenv.cli" in words:  # torchrun ... -m memenv.cli ARGS, python -m memenv.cli ARGS
        return "memenv", words[words.index("memenv.cli") + 1:]
    assert words[0] == "python", command
    return words[1], words[2:]


def dry_parse(command: str) -> argparse.Namespace:
    """Parse ``command`` with the parser that would parse it, running nothing after the parse. A parser error
    raises ``AssertionError`` with argparse's message."""
    program, argv = _argv(command)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            if program == "memenv":
                return _memenv_parser().parse_args(argv)
            return _run_script_until_parsed(ROOT / program, argv)
    except SystemExit as exc:
        if exc.code == 0:  # --help, --version
            return argparse.Namespace()
        raise AssertionError(f"{command!r} does not parse (exit {exc.code}): {err.getvalue().strip()}") from None


def _run_script_until_parsed(script: Path, argv: list[str]) -> argparse.Namespace:
    assert script.is_file(), f"{script.relative_to(ROOT)} does not exist"
    original = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, args=None, namespace=None):
        raise _Parsed(original(self, args, namespace))

    old_argv, old_path = sys.argv, list(sys.path)
    sys.argv = [str(script), *argv]
    sys.path.insert(0, str(script.parent))  # as `python SCRIPT` does: its folder's modules import
    argparse.ArgumentParser.parse_args = parse_then_stop
    try:
        runpy.run_path(str(script), run_name="__main__")
    except _Parsed as parsed:
        return parsed.namespace
    finally:
        argparse.ArgumentParser.parse_args = original
        sys.argv, sys.path[:] = old_argv, old_path
    raise AssertionError(f"{script.relative_to(ROOT)} ended without parsing its arguments")


# ------------------------------------------------------------------------------------------- tests
def test_every_example_docstring_shows_commands():
    for path in EXAMPLES:
        commands = docstring_commands(path)
        name = path.relative_to(ROOT).as_posix()
        assert any(c.startswith(f"python {name}") for c in commands), f"{name}: its docstring shows no command"
    assert len(PARSED) >= 40, f"only {len(PARSED)} documented commands found: is the extraction broken?"


CHECKPOINT = re.compile(r"^runs/\S*checkpoint-\d+$")


@pytest.mark.parametrize("page,command", PARSED, ids=[f"{p}: {c[:70]}" for p, c in PARSED])
def test_documented_command_parses(page, command, tmp_path, monkeypatch):
    if " examples/sb3_ppo.py" in command:
        pytest.importorskip("sb3_contrib")
    monkeypatch.chdir(tmp_path)
    if "examples/" in command:  # the commands run from the repository's root, where examples/ is
        (tmp_path / "examples").symlink_to(ROOT / "examples", target_is_directory=True)
    for word in shlex.split(command, comments=True):  # a checkpoint an earlier command of the page trains
        if CHECKPOINT.match(word):
            (tmp_path / word).mkdir(parents=True)
            (tmp_path / word / "config.json").write_text("{}")
    try:
        dry_parse(command)
    except ModuleNotFoundError as exc:  # an optional dependency of the script (torch, trl, bm25s)
        pytest.skip(f"{page}: {command}: needs {exc.name}")


def test_a_wrong_flag_fails_the_check():
    """The check itself: the command that an example's docstring once showed (``--algo`` missing) is caught,
    and so is a misspelt option of a script."""
    with pytest.raises(AssertionError, match="--algo"):
        dry_parse("memenv train sft --out runs/sft")
    with pytest.raises(AssertionError, match="unrecognized arguments: --stepz"):
        dry_parse("python examples/trl_grpo_memqa.py --stepz 3")
    with pytest.raises(AssertionError, match="invalid int value"):
        dry_parse("python benchmarks/env_speed.py --episodes many")
    assert dry_parse("memenv train --algo sft --out runs/sft --steps 300").steps == 300


def test_placeholder_commands_are_few():
    """Placeholders are for prose; most documented commands must be checkable as written."""
    skipped = [c for _, c in CASES if PLACEHOLDER.search(c)]
    assert len(skipped) <= len(PARSED) // 3, skipped


def test_training_chain_names_the_checkpoint_it_writes(tmp_path, monkeypatch):
    """``memenv train --out D --steps N && ... --model D/checkpoint-XXXX``: XXXX is the folder that
    :func:`agents.llm.training.common.save_checkpoint` writes at step N."""
    pytest.importorskip("torch")
    import agents.llm.training.common as training

    monkeypatch.setattr(training, "save_pretrained", lambda lm, tok, path, extra_files=None: Path(path))
    chains = 0
    for path in EXAMPLES:
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
        text = " ".join(doc.replace("\\\n", " ").split())
        for first, second in re.findall(r"(memenv train [^&]*?)&& *(python [^#]*)", text):
            train = dry_parse(first.strip())
            model = dry_parse(second.strip()).model
            (tmp_path / train.out).mkdir(parents=True, exist_ok=True)
            written = training.save_checkpoint(tmp_path / train.out, train.steps, None, None, {})
            assert Path(model) == Path(train.out) / written.name, (path.name, first, second)
            chains += 1
    assert chains >= 1


def test_trl_example_runs(tmp_path):
    """The docstring's first command, for real, with a one-step budget appended."""
    pytest.importorskip("trl")
    torch = pytest.importorskip("torch")
    command = next(c for c in docstring_commands(ROOT / "examples/trl_grpo_memqa.py") if not _argv(c)[1])
    argv = _argv(command)[1] + ["--steps", "1", "--max-new-tokens", "8", "--episodes-per-group", "2",
                                "--batch-tasks", "1", "--hops", "1", "--out", str(tmp_path / "trl")]
    module = runpy.run_path(str(ROOT / "examples/trl_grpo_memqa.py"), run_name="trl_example")
    threads = torch.get_num_threads()
    try:
        result = module["main"](argv)
    finally:
        torch.set_num_threads(threads)
    assert len(result["rewards"]) == 1 and all(0.0 <= r <= 2.0 for r in result["rewards"])
    assert isinstance(result["train_loss"], float)


def test_sb3_example_runs():
    """The docstring's first command, for real, with a 64-step budget and 3 evaluation episodes."""
    pytest.importorskip("sb3_contrib")
    torch = pytest.importorskip("torch")
    command = docstring_commands(ROOT / "examples/sb3_ppo.py")[0]
    argv = _argv(command)[1] + ["--timesteps", "64", "--eval-episodes", "3", "--no-progress"]
    module = runpy.run_path(str(ROOT / "examples/sb3_ppo.py"), run_name="sb3_example")
    threads = torch.get_num_threads()
    try:
        with contextlib.redirect_stdout(io.StringIO()) as out:
            result = module["main"](argv)
    finally:
        torch.set_num_threads(threads)
    for name in ("random", "masked_random", "PPO", "MaskablePPO"):
        assert 0.0 <= result[name] <= 1.0, name
    assert "MaskablePPO: F1" in out.getvalue() and result["PPO_train_s"] > 0


def test_your_own_strategy_is_benchmarked_beside_the_built_in_ones(tmp_path, capsys):
    """docs/bench.md's example (issue 65): examples/my_strategy.py:KeepLastSentences by its import path, beside
    relevance, in one bench; a strategy that raises or returns a non-string fails its episodes in one line naming it
    while the other cells are kept; one that cannot be imported or made is refused before the bench starts."""
    import pandas as pd

    from memenv.cli import main

    example = Path(__file__).resolve().parents[1] / "examples" / "my_strategy.py"
    out = tmp_path / "bench"
    assert main(["bench", "--strategies", f"{example}:KeepLastSentences", "relevance", "--envs",
                 "MemQA-v0:objectives=1,hops=1", "-n", "4", "--out", str(out), "--quiet"]) == 0
    table = pd.read_csv(out / "results.csv")
    assert list(table.strategy) == [f"{example}:KeepLastSentences", "relevance"] and (table.failed == 0).all()
    assert table.set_index("strategy").loc["relevance", "f1"] == 1.0
    mine = tmp_path / "mine.py"
    mine.write_text("class Raises:\n    def act(self, obs):\n        raise KeyError('boom')\n"
                    "class NotText:\n    def act(self, obs):\n        return 42\n"
                    "class NoAct:\n    pass\n"
                    "import threading\n"
                    "class Hangs:\n    act_timeout = 0.2\n    calls = 0\n"
                    "    def act(self, obs):\n        Hangs.calls += 1\n        threading.Event().wait()\n"
                    "class BadTimeout:\n    act_timeout = 0\n    def act(self, obs):\n        return ''\n"
                    "VALUE = 3\n")
    for name, messages in (("Raises", ["act raised KeyError"] * 3),
                           ("NotText", ["act returned a int, not the action text"] * 3),
                           ("Hangs", ["act did not return within 0.2 s"] + ["not called again"] * 2)):
        out = tmp_path / name
        main(["bench", "--strategies", f"{mine}:{name}", "relevance", "--envs", "MemQA-v0:objectives=1,hops=1", "-n",
              "3", "--out", str(out), "--quiet", "--max-failures", "5"])
        episodes = pd.read_csv(out / "episodes.csv")
        failed = episodes[episodes.strategy == f"{mine}:{name}"].sort_values("seed")
        assert len(failed) == 3 and all(m in e and name in e for m, e in zip(messages, failed.error)), list(failed.error)
        assert (pd.read_csv(out / "results.csv").set_index("strategy").loc["relevance", "f1"]) == 1.0
    capsys.readouterr()
    for spec, message in ((f"{mine}:NoAct", "has no act(observation) method"), (f"{mine}:VALUE", "not a class"),
                          (f"{mine}:BadTimeout", "act_timeout must be a positive number"),
                          (f"{mine}:Missing", "cannot import it"), ("no_such_module_xyz:Thing", "cannot import it"),
                          (f"{tmp_path / 'absent.py'}:X", "no such file")):
        try:  # refused as argparse refuses an unknown strategy name: its usage, then one error line
            code = main(["bench", "--strategies", spec, "--envs", "MemQA-v0", "-n", "1", "--out",
                         str(tmp_path / "x"), "--quiet"])
        except SystemExit as exc:
            code = exc.code
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and message in err[-1] and spec in err[-1], (spec, err)
        assert not (tmp_path / "x" / "results.csv").exists()
