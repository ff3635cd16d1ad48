"""An index's document store: ``docs.jsonl`` (the corpus records, byte for byte) read one record at a time
through ``doc_offsets.npy``. Used by the search (:class:`memenv.search.index.search.BM25Index`'s ``documents``) and
by the build (to name the records of a repeated document id)."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from memenv.context import sanitize
from memenv.search.index.format import IndexCorruptError
from tasks.corpus import RecordLocation, document_from_record
from tasks.types import Document


class DocumentStore(Sequence[Document]):
    """The index's documents, read on demand (``pread`` of one record) and sanitised as MemQA shows them.

    Holds no documents in memory; safe to share across threads and forked processes.
    """

    def __init__(self, path: str | os.PathLike, offsets: np.ndarray) -> None:
        self.path = Path(path)
        self.offsets = offsets
        self._fd: int | None = None

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"document index {i} out of range for {n} documents")
        i = int(i) % n
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDONLY)
        start, stop = int(self.offsets[i]), int(self.offsets[i + 1])
        raw = os.pread(self._fd, stop - start, start)
        loc = RecordLocation(self.path, i + 1)
        try:
            rec = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:  # the store was checked on open: changed since
            raise IndexCorruptError(f"{loc}: not a JSON record ({e}): the index's document store is damaged; "
                                    f"build the index again") from None
        if not isinstance(rec, dict):
            raise IndexCorruptError(f"{loc}: not a JSON object: the index's document store is damaged; build the "
                                    "index again")
        doc = document_from_record(rec, loc)
        return Document(doc.id, sanitize(doc.title), sanitize(doc.text))

    def __del__(self) -> None:
        if self._fd is not None:
            os.close(self._fd)

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "offsets": self.offsets, "_fd": None}


__all__ = ["DocumentStore"]
