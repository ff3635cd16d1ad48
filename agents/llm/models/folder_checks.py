"""Checks of a model folder's files that read no weights and import no model code: ``config.json`` with a
``model_type``, whole ``.safetensors`` files, a tokenizer whose JSON parses (:func:`check_model_folder`). Used by
every command that takes a checkpoint (``agents.llm.models.pretrained.check_checkpoint``, ``memenv models shrink``)
before it loads anything, so a cut or damaged file is one line naming it rather than a traceback from deep in a
loader."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from memenv.cli_common import CommandError

#: A checkpoint folder holds one of these weight files.
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")


def _json_file(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise CommandError(f"{what}: {path.name} is not UTF-8 text (byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise CommandError(f"{what}: {path.name} is not valid JSON (line {exc.lineno} column {exc.colno}: "
                           f"{exc.msg}; a cut or damaged file?)") from None
    except OSError as exc:
        raise CommandError(f"{what}: cannot read {path.name} ({exc.strerror or exc})") from None


def _check_safetensors(path: Path, what: str) -> None:
    """The header of a ``.safetensors`` file parses and the file is as long as its tensors say (a cut copy
    would otherwise fail deep inside the model loader)."""
    size = path.stat().st_size
    try:
        with open(path, "rb") as fh:
            head = fh.read(8)
            length = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
            header = json.loads(fh.read(length)) if 0 < length <= size - 8 else None
    except (OSError, ValueError, UnicodeDecodeError):
        header = None
    if not isinstance(header, dict):
        raise CommandError(f"{what}: {path.name} is not a safetensors file (unreadable header; a cut or damaged "
                           "file?)")
    ends = [entry["data_offsets"][1] for name, entry in header.items() if name != "__metadata__"
            and isinstance(entry, dict) and isinstance(entry.get("data_offsets"), list)
            and len(entry["data_offsets"]) == 2 and isinstance(entry["data_offsets"][1], int)]
    needed = 8 + length + max(ends, default=0)
    if size < needed:
        raise CommandError(f"{what}: {path.name} is cut ({size} bytes; its tensors need {needed})")


def check_model_folder(folder: Path, what: str) -> None:
    """``folder`` is a model checkpoint: ``config.json`` (valid JSON with a ``model_type``), weights (whole
    ``.safetensors`` files) and a tokenizer whose JSON files parse; else a :class:`CommandError` starting with
    ``what`` and naming the file."""
    if not folder.is_dir():
        raise CommandError(f"{what}: no model checkpoint there (no such folder)")
    if not (folder / "config.json").is_file():
        raise CommandError(f"{what}: no model checkpoint there (config.json missing)")
    config = _json_file(folder / "config.json", what)
    if not isinstance(config, dict) or not isinstance(config.get("model_type"), str):
        raise CommandError(f"{what}: config.json is not a model config (no model_type)")
    if not any((folder / name).is_file() for name in WEIGHT_FILES):
        raise CommandError(f"{what}: no weights there (none of {', '.join(WEIGHT_FILES)})")
    for weights in sorted(folder.glob("*.safetensors")):
        _check_safetensors(weights, what)
    if not any((folder / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json")):
        raise CommandError(f"{what}: no tokenizer there (tokenizer.json or tokenizer_config.json)")
    for name in ("tokenizer_config.json", "tokenizer.json", "generation_config.json"):
        if (folder / name).is_file():
            _json_file(folder / name, what)


__all__ = ["WEIGHT_FILES", "check_model_folder"]
