"""Issue 51: the README's real-model commands say what they need. Each ``memenv`` command of the "Real models"
block states a peak memory and a disk figure in its comment, and ``benchmarks/smol_sft_memory.py`` (which measured
the SFT line's) runs exactly the README's SFT command."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from shell_text import join_continuations

ROOT = Path(__file__).resolve().parents[1]
MEMORY = re.compile(r"\d[\d.,]*\s*[GM]B\b")


def real_model_commands() -> list[tuple[str, str]]:
    """``(command, comment)`` of each ``memenv`` line in the README's "Real models" shell block."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Real models", 1)[1].split("\n## ", 1)[0]
    body = section.split("```bash\n", 1)[1].split("```", 1)[0]
    out = []
    for line in join_continuations(body.splitlines()):
        code, _, comment = line.partition("  # ")
        for command in (part.strip() for part in code.split("&&")):
            if command.startswith("memenv "):
                out.append((" ".join(command.split()), comment))
    return out


def test_every_real_model_command_states_its_peak_memory_and_disk():
    commands = real_model_commands()
    assert len(commands) >= 6, commands  # prepare, bench, train, bench of the checkpoint, shrink, distill
    missing = [c for c, comment in commands if not ("peak" in comment and MEMORY.search(comment))]
    assert not missing, f"no peak memory stated: {missing}"
    writers = [(c, comment) for c, comment in commands if "--out" in c or " prepare " in c]
    no_disk = [c for c, comment in writers if "disk" not in comment]
    assert writers and not no_disk, f"no disk figure stated: {no_disk}"


def test_the_memory_benchmark_runs_the_readmes_sft_command():
    spec = importlib.util.spec_from_file_location("smol_sft_memory", ROOT / "benchmarks" / "smol_sft_memory.py")
    module = importlib.util.module_from_spec(spec)
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))  # it imports its sibling sft_memory
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    sft = [c for c, _ in real_model_commands() if c.startswith("memenv train --algo sft --model smollm2")]
    assert sft == ["memenv " + " ".join(module.README_ARGS)]
