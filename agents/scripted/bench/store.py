"""The finished cells of a bench on disk (:class:`BenchStore`: ``OUT/bench.json`` and ``OUT/cells/``) and the
settings a resume must match (:func:`bench_settings`)."""

from __future__ import annotations

import hashlib
import json
import uuid
from pathlib import Path
from typing import Any, Iterable

from memenv.files import write_text_atomic
from agents.scripted.bench.episodes import one_line
from agents.scripted.bench.specs import EnvSpec, is_model_path
from memenv.cli_common import CommandError, check_out_dir, prepare_out_dir


MANIFEST = "bench.json"  # OUT/bench.json: the settings of the bench whose cells are in OUT/cells
CELLS = "cells"
BENCH_FORMAT = "memenv-bench/1"
#: Files the bench writes into OUT (an OUT that holds one of them without a bench.json is not ours to replace).
RESULT_FILES = ("results.csv", "episodes.csv", "f1_vs_peak_context.png", "sweep.csv", "sweep_episodes.csv",
                "sweep.png")

def _json_default(value: Any) -> Any:
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    raise TypeError(f"cannot store {type(value).__name__} in a bench cell")


class BenchStore:
    """The finished cells of a bench in ``OUT``: ``OUT/bench.json`` (format, settings, run id) and one JSON file
    per finished cell in ``OUT/cells/`` (its summary row and episode rows), each written atomically.

    :meth:`check` reads only (call it before any work); :meth:`start` makes the folder and the manifest."""

    def __init__(self, out: str | Path, settings: dict[str, Any], fresh: bool = False) -> None:
        self.out, self.settings, self.fresh = Path(out), settings, fresh
        self.run_id: str | None = None

    @property
    def manifest_path(self) -> Path:
        return self.out / MANIFEST

    def _manifest(self) -> dict[str, Any] | None:
        """The manifest of an earlier bench in OUT (None when there is none), or a CommandError when OUT holds
        results that are not a resumable bench's."""
        path = self.manifest_path
        if not path.exists():
            theirs = [name for name in RESULT_FILES if (self.out / name).exists()]
            if theirs or (self.out / CELLS).exists():
                found = theirs[0] if theirs else CELLS
                raise CommandError(f"--out {self.out}: holds {found}, not written by a resumable memenv bench "
                                   f"(no {MANIFEST}); choose another --out, or move it away")
            return None
        try:
            manifest = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise CommandError(f"--out {self.out}: {path} is not a bench manifest ({one_line(exc)}); choose "
                               "another --out, or move it away") from None
        if not isinstance(manifest, dict) or manifest.get("format") != BENCH_FORMAT \
                or not isinstance(manifest.get("settings"), dict) or not isinstance(manifest.get("run"), str):
            raise CommandError(f"--out {self.out}: {path} is not a {BENCH_FORMAT} manifest; choose another --out, "
                               "or move it away")
        return manifest

    def check(self) -> None:
        """Refuse, as a one-line CommandError, an OUT that cannot hold this bench: a file, an unwritable place,
        result files of something else, or (without ``fresh``) a bench of other settings."""
        check_out_dir(self.out)
        manifest = self._manifest()
        if manifest is None or self.fresh:
            return
        theirs = manifest["settings"]
        for key in dict.fromkeys([*self.settings, *theirs]):
            if theirs.get(key) != self.settings.get(key):
                raise CommandError(
                    f"--out {self.out}: holds a bench of other settings ({key}: {_shown(theirs.get(key))} there, "
                    f"{_shown(self.settings.get(key))} here); rerun with the settings in {self.manifest_path} to "
                    "continue it, add --fresh to replace it, or choose another --out")

    def start(self) -> dict[tuple[str, str], dict[str, Any]]:
        """Make OUT, write the manifest (a new one with ``fresh``: the earlier cells are removed) and return
        the finished cells of this bench, by ``(env label, strategy)``."""
        self.check()
        prepare_out_dir(self.out)
        manifest = self._manifest()
        cells_dir = self.out / CELLS
        if manifest is not None and not self.fresh:
            self.run_id = manifest["run"]
        else:
            self.run_id = uuid.uuid4().hex
            if cells_dir.is_dir():  # this bench's own earlier cells (checked: the manifest is ours)
                for old in cells_dir.glob("cell-*.json"):
                    old.unlink()
            write_text_atomic(self.manifest_path, json.dumps(
                {"format": BENCH_FORMAT, "run": self.run_id, "settings": self.settings}, indent=2) + "\n")
        cells_dir.mkdir(exist_ok=True)
        done = {}
        for path in sorted(cells_dir.glob("cell-*.json")):
            try:
                cell = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, ValueError):
                continue  # not a finished cell (never happens with atomic writes): it runs again
            if isinstance(cell, dict) and cell.get("run") == self.run_id:
                done[(cell["env"], cell["strategy"])] = cell
        return done

    def save(self, cell: dict[str, Any]) -> None:
        cell = {"run": self.run_id, **cell}
        write_text_atomic(self.out / CELLS / _cell_file(cell["env"], cell["strategy"]),
                          json.dumps(cell, default=_json_default) + "\n")


def _cell_file(env_label: str, strategy: str) -> str:
    return "cell-" + hashlib.sha1(f"{env_label}\0{strategy}".encode()).hexdigest()[:16] + ".json"


def _shown(value: Any) -> str:
    text = " ".join(map(str, value)) if isinstance(value, list) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def bench_settings(strategies: Iterable[str], specs: Iterable[EnvSpec], episodes: int, seed: int,
                   sweep: str | None = None) -> dict[str, Any]:
    """What the results of a bench depend on (the manifest's ``settings``: a resume needs the same)."""
    strategies = list(strategies)
    settings = {"strategies": strategies, "envs": [spec.label for spec in specs], "episodes": int(episodes),
                "seed": int(seed), "sweep": sweep}
    models = {name: _weights_stamp(name) for name in strategies if is_model_path(name)}
    if models:  # a checkpoint retrained in place is another strategy: its old cells are not reused
        settings["checkpoints"] = models
    return settings


def _weights_stamp(folder: str) -> str:
    """A short digest of the size and modification time of a checkpoint folder's weight files."""
    from agents.llm.models.pretrained import resolve

    stamp = sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in resolve(folder).iterdir()
                   if p.is_file() and p.suffix in (".safetensors", ".bin"))
    return hashlib.sha1(json.dumps(stamp).encode()).hexdigest()[:12]
