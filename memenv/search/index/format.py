"""The disk index's on-disk format, shared by its build (:mod:`memenv.search.index.build`) and its readers
(:mod:`memenv.search.index.verify`, :mod:`memenv.search.index.search`): the files and the manifest's format
name, the BM25 parameters, the errors, the corpus fingerprint, the ``.npy`` header reader and the block-max
range peaks (what the build writes into ``range_max.npy`` and a query recomputes for terms without a row)."""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from memenv.search.bm25 import check_bm25_params
from tasks.types import DataFormatError

FORMAT = "memenv-bm25-index"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
TOKENIZER = "memenv.search.tokenize"
INDEXED_TEXT = "sanitize(title) + '\\n' + sanitize(text)"
_FINGERPRINT_BYTES = 1 << 20  # hash this much of the head and of the tail of the corpus
_CHECK_BYTES = 1 << 16  # an index file's CRC-32s cover this much of its head and of its tail
#: The files of a finished index (those of indexes built before block-max bounds lack the last three).
INDEX_FILES = ("terms.txt", "docs.jsonl", "idf.npy", "indptr.npy", "post_doc.npy", "post_tf.npy", "impact_doc.npy",
               "impact_tf.npy", "doc_norm.npy", "doc_len.npy", "doc_offsets.npy", "term_max.npy", "range_row.npy",
               "range_max.npy")
_BLOCK_MAX_FILES = ("term_max.npy", "range_row.npy", "range_max.npy")


@dataclass(frozen=True)
class BM25Params:
    """BM25 Okapi parameters (``rank_bm25.BM25Okapi``'s defaults), checked by :func:`check_bm25_params`."""

    k1: float = 1.5
    b: float = 0.75
    epsilon: float = 0.25

    def __post_init__(self) -> None:
        check_bm25_params(self.k1, self.b, self.epsilon)


class IndexMismatchError(ValueError):
    """An index does not belong to the corpus it is used with (or is not an index of this format)."""


class IndexCorruptError(DataFormatError):
    """An index directory is damaged: a file missing, cut, replaced, or not matching the manifest written when it
    was built. The message names the file and what is wrong; building the index again repairs it."""


def corpus_fingerprint(path: str | os.PathLike) -> dict[str, Any]:
    """A cheap identity of a corpus file: size, mtime (ns) and a BLAKE2b of its first and last MiB.

    Any append, truncation or rewrite changes the size or mtime; an in-place edit that restores the mtime is
    still caught when it touches the head or the tail.
    """
    path = Path(path)
    st = path.stat()
    digest = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        digest.update(f.read(_FINGERPRINT_BYTES))
        if st.st_size > _FINGERPRINT_BYTES:
            f.seek(max(_FINGERPRINT_BYTES, st.st_size - _FINGERPRINT_BYTES))
            digest.update(f.read(_FINGERPRINT_BYTES))
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "head_tail_blake2b": digest.hexdigest()}


def _npy_header(source: Path | io.BufferedIOBase) -> tuple[np.dtype, tuple[int, ...], int]:
    """``(dtype, shape, data offset)`` from a ``.npy`` file's header, read from the file or from a file-like of
    its first bytes (``ValueError`` if it has none, or a Fortran-ordered array, which the index never writes)."""
    with (open(source, "rb") if isinstance(source, Path) else contextlib.nullcontext(source)) as f:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
        elif version == (2, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
        else:
            raise ValueError(f"unsupported .npy format version {version}")
        if fortran:
            raise ValueError("a Fortran-ordered array")
        return dtype, tuple(shape), f.tell()


def _range_peaks(docs: np.ndarray, weights: np.ndarray, range_docs: int) -> tuple[np.ndarray, np.ndarray]:
    """The ranges (``doc // range_docs``) holding ``docs`` (ascending) and each one's largest weight, >= 0."""
    ranges = docs // range_docs
    starts = np.flatnonzero(np.concatenate([[True], ranges[1:] != ranges[:-1]]))
    return ranges[starts], np.maximum(np.maximum.reduceat(weights, starts), 0.0)


__all__ = ["FORMAT", "FORMAT_VERSION", "MANIFEST", "INDEX_FILES", "BM25Params", "IndexMismatchError",
           "IndexCorruptError", "corpus_fingerprint"]
