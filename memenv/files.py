"""File helpers of every layer above: results, records and checkpoints are written atomically (``agents`` and
``distill`` use them; here, below both, so that no room of ``agents`` imports from the floor above it).

A reader (another process, a resumed run, a crash) sees either the old file or folder or the new one, never
half of one: everything is written into a temporary sibling, then renamed into place.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable


def write_atomic(path: str | os.PathLike, write: Callable[[str], object]) -> None:
    """``write(tmp)`` fills a temporary file in the same folder, which is then renamed to ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=path.suffix)
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~current_umask())  # mkstemp creates 0600; results are meant to be shared like any file
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def current_umask() -> int:
    """The process's umask (read by setting it and putting it back)."""
    umask = os.umask(0)
    os.umask(umask)
    return umask


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    write_atomic(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def write_directory_atomic(path: str | os.PathLike, fill: Callable[[Path], object]) -> Path:
    """``fill(tmp_dir)`` writes a folder's contents into a temporary sibling folder, which then replaces
    ``path`` (an existing folder ``path`` is moved aside first and removed after the swap; if the swap is
    interrupted, the earlier folder is put back). A ``path`` that is a file is not replaced: ``FileExistsError``.
    The folder gets the mode a folder made by ``mkdir`` would (the umask's), not ``mkdtemp``'s 0700. A process
    killed mid-fill leaves its temporary sibling (``.NAME.tmp-*``); :func:`remove_stale_temporaries` removes
    such siblings where the caller knows no other writer is at work (under a lock)."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise FileExistsError(f"{path} is a file, not a folder: not replaced")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.tmp-"))
    old: Path | None = None
    try:
        os.chmod(tmp, 0o777 & ~current_umask())  # mkdtemp makes it 0700; a checkpoint is shared like any folder
        fill(tmp)
        # and its files like any file: some writers (transformers' safetensors shards) leave 0600 whatever the umask
        for item in tmp.rglob("*"):
            if item.is_file() and not item.is_symlink() and not item.stat().st_mode & 0o111:
                os.chmod(item, 0o666 & ~current_umask())
        if path.exists():
            old = path.with_name(f".{path.name}.old-{os.getpid()}")
            os.replace(path, old)
        os.replace(tmp, path)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
            old = None
    finally:
        if old is not None and old.exists() and not path.exists():
            os.replace(old, path)  # the swap did not happen (Ctrl-C, a full disk): the earlier folder stays
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return path


def remove_stale_temporaries(path: str | os.PathLike) -> list[Path]:
    """Remove the temporary siblings a killed :func:`write_directory_atomic` of ``path`` left behind
    (``.NAME.tmp-*``, ``.NAME.old-*``). Only call it while no other process can be writing ``path`` (a lock):
    a live writer's temporary folder has the same name. Returns what was removed."""
    path = Path(path)
    removed = []
    for pattern in (f".{path.name}.tmp-*", f".{path.name}.old-*"):
        for stale in path.parent.glob(pattern):
            if stale.is_dir() and not stale.is_symlink():
                shutil.rmtree(stale, ignore_errors=True)
                removed.append(stale)
    return removed
