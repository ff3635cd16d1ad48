"""A benchmark's committed record (``--record FILE``): the command that made it, the host (CPU, its capability,
native bf16, threads, load: ``benchmarks.limits.host_info``) and the figures, as one JSON file written atomically
(a stopped run leaves the earlier record whole). ``tests/test_published_figures.py`` reads such records under
``results/`` and checks the figures the README and docs print against them."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as ``python benchmarks/x.py``: the package and ``benchmarks.limits`` import
    sys.path.insert(0, str(ROOT))


def add_record_option(parser) -> None:
    parser.add_argument("--record", metavar="FILE", default=None,
                        help="also write the figures, the command and the host to FILE as JSON (atomic)")


def command_line(script: str, argv=None) -> str:
    """The command as typed from the repository root (``argv``: the script's arguments, default sys.argv's)."""
    args = sys.argv[1:] if argv is None else list(argv)
    return " ".join(["python", f"benchmarks/{Path(script).name}", *map(str, args)])


def write_record(path, script: str, argv, figures: dict, host: dict | None = None) -> dict:
    """Write ``{"command", "host", **figures}`` to ``path`` atomically and return it; ``host`` defaults to this
    process's ``host_info()`` now (call it while the measured threads are set)."""
    from memenv.files import write_text_atomic
    from benchmarks.limits import host_info

    record = {"command": command_line(script, argv), "host": host if host is not None else host_info(), **figures}
    write_text_atomic(path, json.dumps(record, indent=1, default=float) + "\n")
    print(f"wrote {path}", flush=True)
    return record
