"""One source for each documented time (memenv.costs): the README, docs/experiment.md and the --help texts state
the same figure."""

from __future__ import annotations

from pathlib import Path

import pytest

from memenv.costs import COSTS

ROOT = Path(__file__).resolve().parents[1]


def _help(argv, capsys) -> str:
    from memenv.cli import main

    with pytest.raises(SystemExit):
        main([*argv, "--help"])
    return " ".join(capsys.readouterr().out.split())  # argparse re-wraps: compare with single spaces


@pytest.mark.parametrize("command, readme_line, argv", [
    ("bench", "memenv bench    # the bench:", ["bench"]),
    ("prepare", "memenv models prepare smollm2-135m-instruct", ["models", "prepare"]),
    ("quick", "memenv experiment memopd --out runs/memopd_quick --quick", ["experiment", "memopd"]),
    ("tiny_sft", "memenv train --algo sft --out runs/sft --steps 2000", ["train"]),
])
def test_the_readme_and_the_help_state_the_one_documented_cost(command, readme_line, argv, capsys):
    lines = [line for line in (ROOT / "README.md").read_text().splitlines() if readme_line in line]
    assert lines and all(COSTS[command] in line for line in lines), (command, lines)
    assert COSTS[command] in _help(argv, capsys)


def test_docs_quick_line_states_the_same_cost():
    lines = [line for line in (ROOT / "docs" / "experiment.md").read_text().splitlines() if line.startswith("memenv experiment memopd --out runs/memopd --quick ")]
    assert lines and all(COSTS["quick"] in line for line in lines)
