"""Every ``memenv`` command in a code block of README.md and docs/*.md says what it costs, or is listed here.

A reader who copies a command should know before pressing enter whether it takes seconds or an hour. So each
``memenv ...`` line of a shell block carries a measured time in its trailing comment (``# 14 s``, ``# ~32
CPU-min ...``; how each was measured: ``benchmarks/command_times.py`` and the comment itself), unless
:data:`NO_TIME` names it with the reason. Every entry of :data:`NO_TIME` must match a documented command, so
an edit that removes or renames one cannot leave a stale exemption behind.
"""

from __future__ import annotations

import re
from pathlib import Path

from shell_text import join_continuations

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```([A-Za-z]*)\n(.*?)^```", re.DOTALL | re.MULTILINE)
SHELL_LANGS = ("", "bash", "sh", "shell", "console")
# a trailing comment: whitespace, then '#', then a space (a '#' inside a word or a URL is not one)
COMMENT = re.compile(r"\s+#\s")
# a figure of time: "14 s", "~32 CPU-min", "2.6 wall-min", "< 1 minute", "~3 CPU-hours", "16 min"
TIME = re.compile(r"\d[\d.,]*\s*(?:CPU-|wall-)?(?:s|sec|seconds?|min|minutes?|hours?)\b")

#: a command marker -> why its line carries no time (each must match at least one documented command); a marker
#: ``"PAGE: COMMAND"`` matches that exact command on that page only
NO_TIME = {
    "memenv play": "interactive: as long as the player takes",
    "memenv serve": "a server: runs until stopped",
    "memenv index build corpus.jsonl": "a one-document corpus: under a second",
    "memenv index build wiki-18.jsonl": "needs the wiki-18 dump (21M passages), not available on the dev machine",
    "openai:MODEL@": "a placeholder model on a server of the reader's",
    "openai:smollm2@http://127.0.0.1:8765 --envs \"MemQA": "needs a running vLLM server (docs/llm_agents.md)",
    "openai:smollm2@http://127.0.0.1:8765?endpoint": "needs a running vLLM server (docs/llm_agents.md)",
    "--teacher openai:smollm2": "needs a running vLLM server (docs/llm_agents.md)",
    "--out runs/memopd --resume": "continues a stopped run: the rest of the run above it",
    "--out runs/ppo --resume": "continues a stopped run: the rest of its updates",
    "memenv distill diagnose": "reads the records a run saved (save_records); its cost is theirs",
    # results.md's regenerated section: each run's cost (teacher, student, arms in CPU-min) is in its text
    "docs/results_history.md: memenv experiment memopd --world fresh --out runs/memopd_fresh": "its cost is in the text",
    "docs/results_history.md: memenv experiment memopd --out runs/memopd": "its cost is in the text beside it",
}


def exempt(marker: str, page: str, command: str) -> bool:
    if marker.startswith(("README.md: ", "docs/")):
        return marker == f"{page}: {command}"
    return marker in command


def documented_memenv_lines() -> list[tuple[str, str, str]]:
    """``(page, command, comment)`` for each ``memenv`` command of a shell block (continuations joined; a
    command after ``&&`` counts, and shares its line's comment)."""
    out = []
    for page in PAGES:
        name = page.relative_to(ROOT).as_posix()
        for lang, body in FENCE.findall(page.read_text(encoding="utf-8")):
            if lang not in SHELL_LANGS:
                continue
            for line in join_continuations(body.splitlines()):
                if line.startswith("#"):
                    continue
                parts = COMMENT.split(line, maxsplit=1)
                code, comment = parts[0], parts[1] if len(parts) > 1 else ""
                for command in (part.strip() for part in code.split("&&")):
                    if command.startswith("memenv "):
                        out.append((name, command, comment))
    return out


def test_the_extraction_finds_the_pages_commands():
    lines = documented_memenv_lines()
    assert len(lines) >= 30, f"only {len(lines)} memenv commands found: is the extraction broken?"
    pages = {page for page, _, _ in lines}
    assert {"README.md", "docs/distill.md", "docs/bench.md"} <= pages
    # a continued command is one command, and its comment is the one at the end of its last line
    sweep = [c for p, c, comment in lines if p == "docs/envs.md" and "chat_tokens=" in c]
    assert sweep and sweep[0].endswith("-n 2")


def test_every_documented_memenv_command_states_its_time_or_why_not():
    lines = documented_memenv_lines()
    unused = [marker for marker in NO_TIME if not any(exempt(marker, page, command) for page, command, _ in lines)]
    assert not unused, f"NO_TIME entries no documented command matches (remove them): {unused}"
    missing = [f"{page}: {command}" for page, command, comment in lines
               if not TIME.search(comment) and not any(exempt(marker, page, command) for marker in NO_TIME)]
    assert not missing, ("documented commands with no measured time in their comment (add one, e.g. "
                         "`# 2.1 CPU-min`, or list them in NO_TIME with the reason):\n" + "\n".join(missing))


def test_the_time_pattern_tells_a_figure_from_words():
    assert TIME.search("peak context against the horizon (14 s)")
    assert TIME.search("~32 CPU-min (1,240 steps took 20)") and TIME.search("< 1 minute")
    assert TIME.search("~3 CPU-hours") and TIME.search("2.6 wall-min")
    assert not TIME.search("a tiny LLM agent on CPU") and not TIME.search("the table's row: its checkpoint")
    assert not TIME.search("5 seeds x 4 arms x 120 updates") and not TIME.search("200 other worlds")
