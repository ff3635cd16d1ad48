"""Virtual environments of their own for the hubs whose pins memenv's test environment cannot share (verifiers
0.4 pins ``mcp==2.0.0``, which breaks the openenv extra; gem-llm 0.1 pins ``nltk==3.9.1`` and builds pycosat):
``$MEMENV_CACHE/NAME-VERSION``, memenv's base dependencies plus the hub, built once under a file lock and reused by
every later run that names the same ``MEMENV_CACHE`` (CI does, and builds them in the background at its start)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from memenv.files import write_text_atomic
from agents.llm.models.pretrained import _locked, cache_root

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]


def base_dependencies() -> list[str]:
    """memenv's own dependencies (no extra), from its pyproject."""
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["dependencies"]


def _ready(folder: Path, name: str, version: str) -> bool:
    try:
        marker = json.loads((folder / f"memenv_{name}.json").read_text())
    except (OSError, ValueError):
        return False
    return marker.get(name) == version and (folder / "bin" / "python").exists()


def ensure_hub_env(name: str, version: str, packages: list[str]) -> Path:
    """The python of ``$MEMENV_CACHE/NAME-VERSION`` with ``packages`` installed, built first when absent (in a
    temporary sibling folder, renamed into place under a file lock once its marker is written, so a half-built one
    is never used). A failed install raises a ``RuntimeError`` with pip's last lines (the tests skip on it)."""
    folder = cache_root() / f"{name}-{version}"
    if _ready(folder, name, version):
        return folder / "bin" / "python"
    with _locked(folder.parent / f".{folder.name}.lock"):
        if _ready(folder, name, version):
            return folder / "bin" / "python"
        tmp = folder.parent / f".{folder.name}.partial-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        start = time.perf_counter()
        try:
            python = tmp / "bin" / "python"
            for cmd in ([sys.executable, "-m", "venv", str(tmp)], [str(python), "-m", "pip", "install", *packages]):
                out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                if out.returncode != 0:
                    tail = " | ".join(out.stdout.strip().splitlines()[-5:])
                    raise RuntimeError(f"`{' '.join(cmd[:4])} ...` failed (exit {out.returncode}): {tail}")
            write_text_atomic(tmp / f"memenv_{name}.json",
                              json.dumps({name: version, "install_s": round(time.perf_counter() - start, 1)}))
            shutil.rmtree(folder, ignore_errors=True)
            tmp.rename(folder)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return folder / "bin" / "python"


VERIFIERS_VERSION = "0.4.0"
GEM_VERSION = "0.1.0"


def ensure_verifiers_env() -> Path:
    """verifiers' environment (wheel: pip builds the environment package's wheel from its pyproject without build
    isolation)."""
    return ensure_hub_env("verifiers", VERIFIERS_VERSION,
                          [f"verifiers=={VERIFIERS_VERSION}", *base_dependencies(), "wheel"])


def ensure_gem_env() -> Path:
    """GEM's environment: gem-llm, the requests its wrapper factory imports without declaring it, and pytest (GEM's
    tests run inside it)."""
    return ensure_hub_env("gem", GEM_VERSION, [f"gem-llm=={GEM_VERSION}", "requests", "pytest", *base_dependencies()])


if __name__ == "__main__":  # CI builds both in the background at its start: `cd tests && python hub_venvs.py`
    for build in (ensure_verifiers_env, ensure_gem_env):
        try:
            print(build.__name__, build(), flush=True)
        except RuntimeError as exc:  # the other may still build; its tests skip, saying why
            print(build.__name__, "failed:", exc, flush=True)
