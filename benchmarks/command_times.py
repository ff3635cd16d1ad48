"""Wall and CPU time of the cheap commands the README and docs/ show, each run as written in a fresh folder.

    python benchmarks/command_times.py                 # every command below, in order
    python benchmarks/command_times.py --only sweep    # those whose text contains "sweep"
    python benchmarks/command_times.py --list          # print the commands, run nothing

This is how the times written beside the documented commands (`# 14 s ...`) are reproduced. Each command runs
in a temporary folder of its own (what it writes goes there; caches other than the prepared models are sent
there too), with this interpreter: ``memenv ARGS`` runs as ``python -m memenv.cli ARGS`` and ``python SCRIPT``
with ``sys.executable``. Data paths the pages give relative to the checkout (``tests/fixtures/...``,
``../shared/data/...``) are resolved against the checkout; a command whose data is absent is reported, not run.

CPU seconds are the user + system time of the command and the processes it waited for (``RUSAGE_CHILDREN``),
so they hold on a busy machine; wall seconds do not. The load average before and after each command is printed
beside it: a figure is an idle machine's only where the load stayed under its number of cores. The commands
that take longer (training, the experiment, a real model) are timed by hand; the pages say how, beside each.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: The documented commands that take under ~2 minutes on 2 cores, as the pages write them. A line with ``&&``
#: runs its parts in one folder, in order (a file the next part reads).
COMMANDS = [
    "memenv bench",
    "memenv bench --sweep objectives=1,2,4,8,16 -n 20",
    "memenv bench --envs MemRead-v0 MemDialog-v0 -n 30",
    "printf '{\"id\": \"1\", \"contents\": \"Paris is the capital of France.\"}\\n' > corpus.jsonl "
    "&& memenv index build corpus.jsonl corpus-index",
    "memenv bench --envs MemDialog-BEAM-v0:keep_snapshots=False --strategies oracle relevance rag recency -n 5",
    "memenv bench --envs MemDialog-BEAM-v0:keep_snapshots=False --sweep chat_tokens=128000,1000000,10000000 "
    "--strategies oracle relevance rag recency -n 2",
    "memenv bench --strategies oracle rag relevance recency full-context recency-window bm25 "
    "--envs 'MemDialog-BEAM-v0:data_path=\"tests/fixtures/beam_release\"' -n 3",
    "memenv bench --strategies oracle keep-all relevance last-observation history full-context recency-window bm25 "
    "--envs 'MemDialog-LoCoMo-v0:data_path=\"../shared/data/locomo/locomo10.json\"' -n 20",
    "memenv bench --strategies oracle rag relevance recency full-context recency-window bm25 "
    "--envs 'MemDialog-LongMemEval-v0:data_path=\"../shared/data/longmemeval/longmemeval_dev.json\"' -n 120",
    "python benchmarks/beam_rss.py",
]

#: Data paths the pages write relative to the checkout (up to a quote or a space).
RELATIVE_DATA = re.compile(r"(?<![\w/.])(?:tests/fixtures/|\.\./shared/)[^\"' ]*")


def resolve(command: str, data_root: Path) -> tuple[str, list[Path]]:
    """``command`` as a shell line for this interpreter, data paths made absolute; and the data paths it reads."""
    parts = []
    needed: list[Path] = []
    for part in command.split("&&"):
        part = part.strip()
        if part.startswith("memenv "):
            part = f"{shlex.quote(sys.executable)} -m memenv.cli {part[len('memenv '):]}"
        elif part.startswith("python "):
            part = f"{shlex.quote(sys.executable)} {shlex.quote(str(ROOT / part.split()[1]))} " \
                   f"{' '.join(part.split()[2:])}"
        parts.append(part)
    line = " && ".join(parts)
    def absolute(match: re.Match) -> str:
        rel = match.group(0)
        path = data_root / rel[len("../shared/"):] if rel.startswith("../shared/") else ROOT / rel
        needed.append(path)
        return str(path)

    line = RELATIVE_DATA.sub(absolute, line)
    return line, needed


def run(command: str, data_root: Path, timeout: float) -> dict:
    line, needed = resolve(command, data_root)
    missing = [str(p) for p in needed if not p.exists()]
    if missing:
        return {"command": command, "status": f"skipped: no {missing[0]}"}
    with tempfile.TemporaryDirectory(prefix="memenv-command-") as folder:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        for variable in ("HF_HOME", "MPLCONFIGDIR", "SB3_LOGDIR"):  # caches of the run, not the user's
            env[variable] = str(Path(folder) / ".cache" / variable.lower())
        load_before = os.getloadavg()[0]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        # a session of its own: on a timeout the whole command (the shell and what it started) is stopped and
        # waited for, so that nothing runs on unseen and its CPU time is counted
        process = subprocess.Popen(line, shell=True, cwd=folder, env=env, start_new_session=True,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            _, stderr = process.communicate(timeout=timeout)
            status = "ok" if process.returncode == 0 else \
                f"exit {process.returncode}: {(stderr.strip().splitlines() or [''])[-1][:120]}"
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGTERM)
            process.communicate()
            status = f"timed out after {timeout:.0f} s"
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"command": command, "status": status, "wall": wall, "cpu": cpu,
            "load": f"{load_before:.1f}->{os.getloadavg()[0]:.1f}"}


def host() -> str:
    try:
        from agents.llm.models.precision import host_line
    except ImportError:  # the envs need no torch; the host line does
        return f"host: {os.cpu_count()} cores (torch not installed: no capability line)"
    import torch

    return f"{host_line()}; {os.cpu_count()} cores, torch {torch.__version__}"


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="*", default=[], help="run the commands containing any of these strings")
    parser.add_argument("--list", action="store_true", help="print the commands and run nothing")
    parser.add_argument("--data-root", type=Path, default=ROOT.parent / "shared",
                        help="the folder the pages' ../shared/ stands for (default: beside the checkout)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds before a command is stopped")
    args = parser.parse_args(argv)
    commands = [c for c in COMMANDS if not args.only or any(s in c for s in args.only)]
    if not commands:
        parser.error(f"--only {' '.join(args.only)}: no documented command contains it")
    if args.list:
        print("\n".join(commands))
        return []
    print(host(), flush=True)
    print(f"{'wall s':>8} {'CPU s':>8}  {'load':>9}  command", flush=True)
    rows = []
    for command in commands:
        row = run(command, args.data_root, args.timeout)
        rows.append(row)
        if row["status"].startswith("skipped"):
            print(f"{'-':>8} {'-':>8}  {'':>9}  {command}  [{row['status']}]", flush=True)
            continue
        note = "" if row["status"] == "ok" else f"  [{row['status']}]"
        print(f"{row['wall']:8.1f} {row['cpu']:8.1f}  {row['load']:>9}  {command}{note}", flush=True)
    return rows


if __name__ == "__main__":
    main()
