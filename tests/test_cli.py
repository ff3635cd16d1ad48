"""The ``memenv`` command line: a user's mistake is one line on stderr and exit status 2 (before any work),
a bug still raises; ``--version``; every option of ``bench`` and ``train`` shows its default; ``play`` asks
again instead of spending a turn on a typo, and echoes memory updates."""

from __future__ import annotations

import argparse
import re
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest

import memenv
from memenv.cli import build_parser, main, play_command
from memenv.cli_common import CommandError, non_negative_int, positive_float, positive_int

README = Path(__file__).resolve().parents[1] / "README.md"


def run(argv: list[str]) -> int:
    """``main(argv)``'s exit status, whether it returns it or argparse exits."""
    try:
        return main(argv)
    except SystemExit as exc:
        return int(exc.code or 0)


# (argv, a word the one-line message must contain). None of these may start real work.
USER_MISTAKES = [
    (["bench", "-n", "0"], "--episodes"),
    (["bench", "-n", "-3"], "--episodes"),
    (["bench", "-n", "many"], "--episodes"),
    (["bench", "--seed", "-1"], "--seed"),
    (["bench", "--strategies", "bogus"], "bogus"),
    (["bench", "--envs", "Nope-v0"], "Nope-v0"),
    (["bench", "--envs", "MemQA-v0:objectivs=2"], "objectivs"),
    (["bench", "--envs", "MemQA-v0:objectives"], "objectives"),
    (["bench", "--envs", "MemQA-v0:objectives=0"], "objectives"),
    (["bench", "--envs", "MemQA-Hotpot-v0"], "data_path"),
    (["bench", "--envs", "MemQA-Hotpot-v0:data_path='/no/such/file.json'"], "/no/such/file.json"),
    (["bench", "--sweep", "objectives"], "--sweep"),
    (["bench", "--sweep", "f1=1,2"], "f1"),
    (["bench", "--sweep", "objectivs=1,2"], "objectivs"),
    (["play", "Nope-v0"], "MemQA-v0"),  # lists the memenv envs
    (["play", "MemQA-v0", "--kw", "bogus=1"], "bogus"),
    (["play", "MemQA-v0", "--kw", "objectives"], "KEY=VALUE"),
    (["play", "MemQA-Hotpot-v0"], "data_path"),
    (["play", "--seed", "x"], "--seed"),
    (["train", "--algo", "sft", "--env", "Nope-v0"], "Nope-v0"),
    (["train", "--algo", "sft", "--kw", "objectives=0"], "objectives"),
    (["train", "--algo", "sft", "--kw", "objectivs=1"], "objectivs"),
    (["train", "--algo", "ppo", "--model", "/no/such/checkpoint"], "/no/such/checkpoint"),
    (["train", "--algo", "ppo", "--steps", "3"], "--steps"),
    (["train", "--algo", "sft", "--set", "no_such_field=1"], "no_such_field"),
    (["train", "--algo", "sft", "--set", "lr"], "KEY=VALUE"),
    (["train", "--algo", "sft", "--lr", "0"], "--lr"),
    (["train", "--algo", "sft", "--lr", "nan"], "--lr"),
    (["train", "--algo", "sft", "--steps", "0"], "--steps"),
    (["train", "--algo", "grpo", "--temperature", "-1"], "--temperature"),
    (["train", "--algo", "bogus"], "bogus"),
    (["index", "build", "/no/such/corpus.jsonl", "idx"], "/no/such/corpus.jsonl"),
]


@pytest.mark.parametrize("argv,word", USER_MISTAKES, ids=[" ".join(a) for a, _ in USER_MISTAKES])
def test_a_user_mistake_is_one_line_and_exit_2(argv, word, capsys, tmp_path, monkeypatch):
    if argv[0] == "train":
        pytest.importorskip("torch")
    monkeypatch.chdir(tmp_path)  # nothing may be written; if something is, it lands here
    assert run(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    message = err.strip().splitlines()[-1]
    assert message.startswith(f"memenv {argv[0]}: error:"), message
    assert word in message, message
    assert not list(tmp_path.iterdir())  # failed before any work


@pytest.mark.parametrize("argv", [["view", "{d}"], ["records", "export", "{d}", "--to", "trl", "--out", "{o}"],
                                  ["index", "build", "{d}", "{o}"]], ids=["view", "records export", "index build"])
def test_a_folder_given_for_a_file_is_named_a_folder(argv, capsys, tmp_path):
    # A run's folder where its records file was meant: the line says "folder" (not "no such file", which is false)
    # and names the JSON lines files inside, so the user sees which one to give.
    folder = tmp_path / "runs"
    (folder / "a").mkdir(parents=True)
    (folder / "a" / "records.jsonl").write_text("{}\n")
    argv = [part.format(d=folder, o=tmp_path / "out") for part in argv]
    assert run(argv) == 2
    message = capsys.readouterr().err.strip().splitlines()[-1]
    assert message.startswith(f"memenv {argv[0]}") and "is a folder, not a file" in message, message
    if argv[0] != "index":
        assert str(folder / "a" / "records.jsonl") in message, message
    assert not (tmp_path / "out").exists()


def test_a_bug_keeps_its_traceback(monkeypatch):
    """Only the set-up from arguments is a user's mistake: an error while running is raised as is."""
    import agents.scripted.bench.cli as bench_cli

    def broken(*args, **kwargs):
        raise ValueError("a bug inside the run")

    monkeypatch.setattr(bench_cli, "run_bench", broken)
    with pytest.raises(ValueError, match="a bug inside the run"):
        main(["bench", "-n", "1", "--quiet"])


def test_version(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    try:
        expected = version("memenv")
    except PackageNotFoundError:
        expected = memenv.__version__
    assert capsys.readouterr().out.strip() == f"memenv {expected}"


def test_number_types_name_the_rule():
    assert positive_int("3") == 3 and non_negative_int("0") == 0 and positive_float("1e-4") == 1e-4
    for parse, bad in ((positive_int, "0"), (positive_int, "2.5"), (non_negative_int, "-1"),
                       (positive_float, "0"), (positive_float, "inf"), (positive_float, "nan")):
        with pytest.raises(argparse.ArgumentTypeError, match=re.escape(repr(bad))):
            parse(bad)


def _subparser(name: str) -> argparse.ArgumentParser:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


@pytest.mark.parametrize("command", ["bench", "train", "play"])
def test_every_option_shows_its_default(command):
    if command == "train":
        pytest.importorskip("torch")
    parser = _subparser(command)
    formatter = parser._get_formatter()
    for action in parser._actions:
        if action.dest == "help" or action.required:
            continue
        text = formatter._get_help_string(action)
        assert action.help and "(default" in text, (command, action.option_strings, text)
    help_text = parser.format_help()
    assert "(default: 30)" in help_text if command == "bench" else True


def test_train_help_shows_each_trainers_default():
    pytest.importorskip("torch")
    from agents.llm.training.ppo import PPOConfig
    from agents.llm.training.recipes import TINY_SFT_RECIPE
    from agents.llm.training.sft import SFTConfig

    help_text = " ".join(_subparser("train").format_help().split())
    # SFT without --model trains with the tiny-model recipe; with --model, SFTConfig's defaults
    assert (f"(default: sft (tiny model) {TINY_SFT_RECIPE['lr']}, sft --model {SFTConfig.lr}, "
            f"ppo/grpo {PPOConfig.lr})") in help_text
    assert f"SFT: optimizer steps (default: {SFTConfig.steps})" in help_text
    assert f"PPO/GRPO: updates (default: {PPOConfig.updates})" in help_text


def test_bench_and_readme_state_the_same_time():
    """The default ``memenv bench`` time is stated in README and in the bench help: the same figure."""
    from agents.scripted.bench import cli as bench_cli  # its docstring is the command's help

    said = re.search(r"memenv bench +# the default below, (< \d+ minutes?) on 2 cores", bench_cli.__doc__)
    assert said, "the bench docstring no longer states its time"
    assert f"on its built-in default, {said.group(1)} on 2 cores" in README.read_text(encoding="utf-8")


# -------------------------------------------------------------------------------------------------- play
def test_play_command_sends_only_complete_actions():
    assert play_command("search Wigei", "notes") == ("<memory>notes</memory><search>Wigei</search>", None, "notes")
    assert play_command("answer Paris; 1987", "") == ("<memory></memory><answer>Paris; 1987</answer>", None, "")
    assert play_command("next", "m") == ("<memory>m</memory>", None, "m")
    raw = "<memory>x</memory><search>y</search>"
    assert play_command(raw, "m") == (raw, None, "m")
    action, message, memory = play_command("memory Q1 needs the country", "old")
    assert action is None and memory == "Q1 needs the country" and "Q1 needs the country" in message
    for line in ("search", "answer", "memory", "serch Wigei", "hello", "<memory>x</memory><search>y",
                 "<search>a</search> trailing"):
        action, message, memory = play_command(line, "kept")
        assert action is None and memory == "kept" and message, line
    assert "needs a QUERY" in play_command("search", "")[1]
    assert "unknown command 'serch'" in play_command("serch Wigei", "")[1]


def test_play_asks_again_and_echoes_the_memory(monkeypatch, capsys):
    lines = iter(["serch Wigei", "search", "<search>unclosed", "memory Q1: Wigei", "search Wigei", "quit"])
    monkeypatch.setattr("builtins.input", lambda prompt="": next(lines))
    assert main(["play", "MemQA-v0", "--kw", "objectives=1", "hops=2", "max_turns=6"]) == 0
    out = capsys.readouterr().out
    turns_left = [int(n) for n in re.findall(r"\[turns left: (\d+)\]", out)]
    assert turns_left == [6, 5]  # three bad lines cost no turn; the search cost one
    assert "unknown command 'serch'" in out and "search needs a QUERY" in out and "not sent" in out
    assert "memory draft: 'Q1: Wigei'" in out
    assert "memory updated: 'Q1: Wigei'" in out  # the env's new memory, after the step


def test_play_reports_the_end_of_an_episode(monkeypatch, capsys):
    lines = iter(["answer nobody"])
    monkeypatch.setattr("builtins.input", lambda prompt="": next(lines))
    assert main(["play", "MemQA-v0", "--kw", "objectives=1"]) == 0
    out = capsys.readouterr().out
    assert "episode over (answered)" in out and "F1 0.000" in out and "gold answers:" in out


def test_command_error_is_not_a_builtin_error():
    """CommandError must not be caught as one of the errors it stands for (they keep their tracebacks)."""
    assert not issubclass(CommandError, (ValueError, TypeError, LookupError, OSError))


@pytest.mark.parametrize("command", [["play", "MemQA-v0"], ["train", "--algo", "sft", "--out", "o"], ["distill", "--out", "o"]])
def test_repeated_kw_options_add_up(command):
    # `--kw a=1 --kw b=2` must give both (argparse's default for nargs="*" keeps only the last one, silently).
    from memenv.cli import build_parser

    args, _ = build_parser().parse_known_args(command + ["--kw", "objectives=1", "--kw", "hops=2", "top_k=1"])
    assert args.kw == ["objectives=1", "hops=2", "top_k=1"]


def test_a_finished_command_ends_with_its_cost_on_stderr(tmp_path, capsys):
    """One last line, on stderr (stdout stays the command's own): wall time and CPU seconds."""
    assert main(["bench", "--envs", "MemQA-v0:objectives=1", "--strategies", "relevance", "-n", "1", "--quiet",
                 "--out", str(tmp_path / "b")]) == 0
    captured = capsys.readouterr()
    assert re.fullmatch(r"memenv bench: done in \d+\.\d s wall, [\d,]+\.\d CPU-s", captured.err.strip().splitlines()[-1])
    assert "CPU-s" not in captured.out
    assert main(["models", "list"]) == 0 and "done in" not in capsys.readouterr().err  # instant: no cost line


def test_cost_clock_counts_this_process_and_reads_minutes_and_hours(monkeypatch):
    import memenv.cli as cli

    wall, cpu = [100.0], [5.0]
    monkeypatch.setattr(cli.time, "perf_counter", lambda: wall[0])
    monkeypatch.setattr(cli.CostClock, "_cpu", staticmethod(lambda: cpu[0]))
    clock = cli.CostClock()
    wall[0], cpu[0] = 112.25, 1250.5
    assert clock.line("memenv train") == "memenv train: done in 12.2 s wall, 1,245.5 CPU-s"
    wall[0] = 100 + 22 * 60 + 7
    assert "done in 22 min 07 s wall" in clock.line("x")
    wall[0] = 100 + 3 * 3600 + 5 * 60
    assert "done in 3 h 05 min wall" in clock.line("x")


def test_bench_takes_strategy_singular_as_an_alias():
    args = build_parser().parse_args(["bench", "--strategy", "relevance", "keep-all"])
    assert args.strategies == ["relevance", "keep-all"]


def _help_text(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit):
        build_parser().parse_args([*argv, "--help"])
    return capsys.readouterr().out


def test_every_index_build_option_has_help_text(capsys):
    text = _help_text(["index", "build"], capsys)
    blocks = re.split(r"\n  (?=-)", text.split("options:")[1])  # one block per option: flag, metavar, help
    for flag in ("--k1", "--b", "--epsilon", "--chunk-docs", "--workers", "--range-docs"):
        block = next(b for b in blocks if b.startswith(flag + " "))
        assert "default" in block and len(block.split()) > 4, block


def test_experiment_help_shows_the_memopd_options_before_the_long_description(capsys):
    text = _help_text(["experiment", "memopd"], capsys)
    assert text.index("--quick") < 2500  # the options come after a short summary, not a 50-line docstring
    assert text.index("options:") < text.index("What the experiment does")  # the whole text after them


def test_a_command_loads_only_its_own_layer_and_a_typo_still_lists_every_command(capsys):
    """``memenv train --help`` builds the train command's parser alone (before: every command's module was imported,
    bench's pandas and scipy included, ~1 CPU-s more); a mistyped command still gets argparse's list of them all."""
    import subprocess
    import sys

    probe = ("import sys\nfrom memenv.cli import main\ntry:\n    main(['train', '--help'])\nexcept SystemExit:\n    pass\n"
             "print('LOADED', 'agents.scripted.bench' in sys.modules, 'distill.cli' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120).stdout
    assert "--algo" in out and out.strip().splitlines()[-1] == "LOADED False False"
    assert set(build_parser(only="view")._subparsers._group_actions[0].choices) == {"play", "index", "serve", "view"}
    with pytest.raises(SystemExit):
        main(["trian", "--help"])
    err = capsys.readouterr().err
    assert "invalid choice: 'trian'" in err and all(f"'{name}'" in err for name in ("bench", "train", "experiment"))
