"""What opening a disk index checks (:class:`memenv.search.index.search.BM25Index` runs it): the manifest
(:func:`_read_manifest`: the keys and values an index needs, its format and version) and every file against it
(:class:`_IndexFiles`: size and head/tail CRC-32s, each array's header against its size and the manifest's
counts, the arrays against each other, the document store against its offsets), each failure an
:class:`~memenv.search.index.format.IndexCorruptError` naming the file and what is wrong; a few hundred KiB read,
whatever the index's size."""

from __future__ import annotations

import io
import json
import math
import os
import zlib
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

from memenv.search.bm25 import check_bm25_params
from memenv.search.index.format import (_CHECK_BYTES, FORMAT, FORMAT_VERSION, INDEX_FILES, MANIFEST, IndexCorruptError,
                                        IndexMismatchError, _npy_header)


def _rebuild_hint(folder: Path, manifest: dict[str, Any] | None) -> str:
    corpus = None
    if isinstance(manifest, dict) and isinstance(manifest.get("corpus"), dict):
        corpus = manifest["corpus"].get("path")
    return f"build the index again: memenv index build {corpus if isinstance(corpus, str) else 'CORPUS'} {folder}"


def _read_manifest(folder: Path) -> dict[str, Any]:
    """The index's manifest, checked for the keys and values an index needs (:class:`IndexCorruptError`
    otherwise; :class:`IndexMismatchError` for another format or version)."""
    manifest_path = folder / MANIFEST
    if not manifest_path.is_file():
        if folder.is_dir() and any((folder / name).is_file() for name in INDEX_FILES):
            raise IndexCorruptError(f"{manifest_path}: missing; {_rebuild_hint(folder, None)}")
        raise FileNotFoundError(f"not a memenv index (no {MANIFEST}): {folder}")
    try:
        manifest = json.loads(manifest_path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as e:
        raise IndexCorruptError(f"{manifest_path}: not UTF-8 text at byte {e.start} (damaged); "
                                f"{_rebuild_hint(folder, None)}") from None
    except json.JSONDecodeError as e:
        raise IndexCorruptError(f"{manifest_path}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno}: "
                                f"cut or damaged); {_rebuild_hint(folder, None)}") from None
    if not isinstance(manifest, dict):
        raise IndexCorruptError(f"{manifest_path}: expected a JSON object, got {type(manifest).__name__}; "
                                f"{_rebuild_hint(folder, None)}")
    if manifest.get("format") != FORMAT or manifest.get("format_version") != FORMAT_VERSION:
        raise IndexMismatchError(f"{folder}: index format {manifest.get('format')!r} version "
                                 f"{manifest.get('format_version')!r}; expected {FORMAT!r} version "
                                 f"{FORMAT_VERSION} (rebuild it with `memenv index build`)")

    def bad(what: str) -> IndexCorruptError:
        return IndexCorruptError(f"{manifest_path}: {what}; {_rebuild_hint(folder, manifest)}")

    def count(key: str, minimum: int) -> None:
        value = manifest.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            raise bad(f"{key} must be an int >= {minimum}, got {value!r}")

    for key, minimum in (("n_docs", 1), ("n_terms", 0), ("n_postings", 0)):
        count(key, minimum)
    if "range_docs" in manifest:
        count("range_docs", 0)
    for key in ("avgdl", "average_idf"):
        value = manifest.get(key)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
            raise bad(f"{key} must be a finite number, got {value!r}")
    params = manifest.get("params")
    if not isinstance(params, dict) or not {"k1", "b", "epsilon"} <= set(params):
        raise bad(f"params must hold k1, b and epsilon, got {params!r}")
    try:
        check_bm25_params(params["k1"], params["b"], params["epsilon"])
    except ValueError as e:
        raise bad(str(e)) from None
    files = manifest.get("files")
    if files is not None and not (isinstance(files, dict) and all(
            isinstance(r, dict) and isinstance(r.get("size"), int) for r in files.values())):
        raise bad("files must map each file name to its size and checksums")
    corpus = manifest.get("corpus")
    if not (isinstance(corpus, dict) and isinstance(corpus.get("path"), str)
            and isinstance(corpus.get("fingerprint"), dict)):
        raise bad(f"corpus must hold the corpus path and fingerprint, got {corpus!r}")
    return manifest


class _IndexFiles:
    """The checks of an index directory's files on open (see :mod:`memenv.search.index`): each raises
    :class:`IndexCorruptError` naming the file and what is wrong."""

    #: Store records whose line end is checked on open (evenly spaced; a pread of one byte each).
    store_samples = 64

    def __init__(self, folder: Path, manifest: dict[str, Any]) -> None:
        self.folder, self.manifest = folder, manifest
        self.records: dict[str, dict[str, Any]] = manifest.get("files") or {}
        self.sizes: dict[str, int] = {}
        self.heads: dict[str, bytes] = {}
        self.tails: dict[str, bytes] = {}
        if self.records:
            for name in self.records:
                self.check_file(name)

    def fail(self, name: str, what: str) -> NoReturn:
        raise IndexCorruptError(f"{self.folder / name}: {what}; {_rebuild_hint(self.folder, self.manifest)}")

    def check_file(self, name: str) -> int:
        """The file's size, after checking it (and its head and tail CRC-32s) against the manifest's record;
        its first and last 64 KiB are kept for the other checks."""
        if name in self.sizes:
            return self.sizes[name]
        path = self.folder / name
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                head = f.read(_CHECK_BYTES)
                tail = head
                if size > _CHECK_BYTES:
                    f.seek(size - _CHECK_BYTES)
                    tail = f.read(_CHECK_BYTES)
        except FileNotFoundError:
            self.fail(name, "missing")
        except IsADirectoryError:
            self.fail(name, "a folder, not a file")
        record = self.records.get(name)
        if record is not None:
            if size != record["size"]:
                self.fail(name, f"{size} bytes, {record['size']} when the index was built (cut, extended or "
                                "replaced)")
            for part, data, key in (("first", head, "head_crc32"), ("last", tail, "tail_crc32")):
                if zlib.crc32(data) != record.get(key):
                    self.fail(name, f"its {part} {len(data)} bytes differ from those written when the index was "
                                    "built (checksum mismatch: changed or damaged)")
        self.sizes[name], self.heads[name], self.tails[name] = size, head, tail
        return size

    def header_dtype(self, name: str) -> str:
        return self.header(name, None, None, "")[0].name

    def header(self, name: str, dtype: Any, shape: tuple[int | None, ...] | None, why: str,
               required: bool = True) -> tuple[np.dtype, tuple[int, ...], int]:
        """``(dtype, shape, data offset)`` of an array file, after checking its header against its size, the
        manifest's record, and ``dtype`` and ``shape`` (``None``: any extent on that axis) when given."""
        if not required and name not in self.records and not (self.folder / name).is_file():
            return np.dtype(dtype), (), 0
        size = self.check_file(name)
        try:
            found_dtype, found_shape, offset = _npy_header(io.BytesIO(self.heads[name]))
        except (ValueError, OSError, SyntaxError) as e:  # SyntaxError: numpy's literal_eval of a mangled header
            self.fail(name, f"not a readable .npy array ({e})")
        data = math.prod(found_shape) * found_dtype.itemsize
        if size != offset + data:
            self.fail(name, f"{size - offset} bytes of data where its header ({found_dtype.name}, shape "
                            f"{found_shape}) needs {data} (cut or damaged)")
        record = self.records.get(name)
        if record is not None and "shape" in record and (
                found_dtype.str != record.get("dtype") or list(found_shape) != record["shape"]):
            self.fail(name, f"{found_dtype.name} of shape {found_shape}, {np.dtype(record.get('dtype')).name} "
                            f"of shape {tuple(record['shape'])} when the index was built (replaced)")
        if dtype is not None and found_dtype != np.dtype(dtype):
            self.fail(name, f"dtype {found_dtype.name}, expected {np.dtype(dtype).name}")
        if shape is not None and (len(found_shape) != len(shape) or any(
                want is not None and got != want for got, want in zip(found_shape, shape))):
            expected = tuple("any" if want is None else want for want in shape)
            self.fail(name, f"shape {found_shape}, expected {expected} ({why} in {MANIFEST})".replace("'", ""))
        return found_dtype, found_shape, offset

    def array(self, name: str, dtype: Any, shape: tuple[int | None, ...], why: str) -> np.ndarray:
        """The checked array, memory-mapped read-only, as a plain ndarray view (an empty one in memory: there is
        nothing to map)."""
        found_dtype, found_shape, offset = self.header(name, dtype, shape, why)
        if not math.prod(found_shape):
            empty = np.zeros(found_shape, dtype=found_dtype)
            empty.flags.writeable = False
            return empty
        return np.memmap(self.folder / name, dtype=found_dtype, mode="r", offset=offset,
                         shape=found_shape).view(np.ndarray)

    def check_postings(self, indptr: np.ndarray, n_postings: int) -> None:
        if int(indptr[0]) != 0 or int(indptr[-1]) != n_postings:
            self.fail("indptr.npy", f"runs from {int(indptr[0])} to {int(indptr[-1])}, expected 0 to n_postings = "
                                    f"{n_postings}")

    def check_terms(self, n_terms: int) -> None:
        """The vocabulary's size against the manifest's record and its last line end; without a record (an
        index built before they were written), its line count (a pass over the file; with a record, the count
        is checked when the vocabulary is first read)."""
        size = self.check_file("terms.txt")
        if (size == 0) != (n_terms == 0) or (size and self.tails["terms.txt"][-1:] != b"\n"):
            self.fail("terms.txt", f"{size} bytes not ending a line, for n_terms = {n_terms} (cut or damaged)")
        if "terms.txt" not in self.records:
            lines = 0
            with open(self.folder / "terms.txt", "rb") as f:
                while block := f.read(1 << 22):
                    lines += block.count(b"\n")
            if lines != n_terms:
                self.fail("terms.txt", f"{lines} terms, the manifest says n_terms = {n_terms} (cut or damaged)")

    def check_store(self, offsets: np.ndarray) -> None:
        """The document store against its offsets: same size, and a line end before sampled offsets."""
        size = self.check_file("docs.jsonl")
        end = int(offsets[-1])
        if int(offsets[0]) != 0 or size != end:
            self.fail("docs.jsonl", f"{size} bytes, but its offsets (doc_offsets.npy) run from {int(offsets[0])} "
                                    f"to {end} (cut or changed)")
        n = len(offsets) - 1
        picks = np.unique(np.linspace(1, n, min(n, self.store_samples)).astype(np.int64))
        at = offsets[picks]
        if np.any(np.diff(at) <= 0) or at[0] <= 0:
            self.fail("doc_offsets.npy", "offsets not increasing (damaged)")
        fd = os.open(self.folder / "docs.jsonl", os.O_RDONLY)
        try:
            ends = [os.pread(fd, 1, int(position) - 1) for position in at]  # unbuffered: one byte each
        finally:
            os.close(fd)
        for i, position, byte in zip(picks, at, ends):
            if byte != b"\n":
                self.fail("docs.jsonl", f"record {int(i)} does not end where doc_offsets.npy says (byte "
                                        f"{int(position)}): damaged, or the offsets belong to another store")
