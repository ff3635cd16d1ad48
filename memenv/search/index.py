"""A disk-backed BM25 index: built in bounded memory, memory-mapped back, shared read-only by every process.

:func:`build_index` streams a corpus JSON Lines file (``{"id", "title", "text"}`` or Search-R1/FlashRAG
``{"id", "contents"}``, the rules of :func:`tasks.corpus.load_corpus_jsonl`) into a directory::

    manifest.json      format, BM25 parameters, sizes, the corpus path and fingerprint, build figures
    terms.txt          the vocabulary, one term per line, in term-id order (order of first appearance)
    idf.npy            float64 per term (BM25Okapi's idf, epsilon floor applied)
    indptr.npy         int64, terms + 1: term t's postings are [indptr[t], indptr[t + 1]) in both orders below
    post_doc.npy       int32 document ids, ascending within each term (random access by binary search)
    post_tf.npy        term frequencies beside post_doc (uint16, or uint32 when a count exceeds 65535)
    impact_doc.npy     the same postings per term in impact order: BM25 weight descending, then document id
    impact_tf.npy      term frequencies beside impact_doc
    doc_norm.npy       float64 per document: k1 * (1 - b + b * |d| / avgdl)
    term_max.npy       float64 per term: its largest BM25 weight (0.0 if none is positive)
    range_row.npy      int32 per term: its row in range_max, or -1 (bounds computed from its postings at query time)
    range_max.npy      uint8 (rows, ranges): per common term and per range of ``range_docs`` consecutive documents,
                       an upper bound on the term's weight in that range, in 255ths of term_max (rounded up)
    docs.jsonl         the corpus records, byte for byte, one per line (the document store)
    doc_offsets.npy    int64, documents + 1: byte offsets of the records in docs.jsonl
    doc_len.npy        int32 per document: its number of terms

The manifest also records every file's size, a CRC-32 of its first and last 64 KiB, and each array's dtype and
shape: :class:`BM25Index` checks them all when it opens a directory (a few hundred KiB read, whatever the index's
size), with the arrays' shapes against each other and the document store's size and line ends against its
offsets, and raises :class:`IndexCorruptError` naming the file and what is wrong. Indexes built before those
records were written open with the checks that need no record (each array's header against its file's size
and the manifest's counts, the store against its offsets; the vocabulary's line count when it is first read).

Memory during the build is bounded by ``chunk_docs`` (documents tokenised and counted per chunk, written to
temporary runs) and ``merge_postings`` (postings merged at a time), plus the vocabulary dict and a few bytes
per document; the directory is built under a temporary name beside ``out_dir`` (``.NAME.building-PID-*``) and
renamed into place. The build never deletes what it did not make: it refuses an ``out_dir`` that exists and is
neither empty nor an index, that is the corpus file or that holds it; it removes the temporary folders of
builds whose process has died (on this host), and leaves those of live builds alone.

:class:`BM25Index` opens such a directory with ``np.load(mmap_mode="r")`` (the page cache is shared by every
process that opens it; nothing is rebuilt) and answers top-k queries *exactly* as :class:`memenv.search.BM25Sparse`
and ``rank_bm25.BM25Okapi`` rank them (same tokeniser, same k1/b/epsilon arithmetic, scores bit-identical;
ties go to the lower document index) while reading only the heads of the query terms' impact-ordered
posting lists: a threshold algorithm (Fagin's TA, with random access by binary search in the doc-ordered
lists) stops as soon as the k-th best exact score among the documents seen beats the best score any unseen
document could still reach. Indexes with ``range_max.npy`` (written since it was added) answer through
block-max pruning over fixed document ranges instead (see :meth:`BM25Index.search`), which also bounds the
queries made only of common terms that the threshold algorithm cannot prune.

What is indexed is ``sanitize(title) + "\\n" + sanitize(text)`` (:func:`memenv.envs.base.sanitize`), exactly the
text MemQA indexes in memory, so an env over an index ranks as one over the loaded corpus.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import math
import multiprocessing
import os
import secrets
import shutil
import socket
import tempfile
import time
import warnings
import zlib
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
from tqdm.auto import tqdm

from memenv.context import sanitize
from memenv.search.bm25 import (STOPWORDS, SearchBackend, check_bm25_params, okapi_doc_norm, okapi_idf, okapi_weights,
                                 tokenize, word_tokens)
from tasks.corpus import RecordLocation, document_from_record
from tasks.types import DataFormatError, Document, QADataset, Question

__all__ = [
    "BM25Index",
    "BM25Params",
    "DocumentStore",
    "IndexCorruptError",
    "IndexMismatchError",
    "QuestionPool",
    "build_index",
    "corpus_fingerprint",
    "register_cli",
]

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
#: What a build's temporary folder holds besides index files.
_BUILD_FILES = ("run_tid.bin", "run_did.bin", "run_tf.bin", "build-owner.json")
_OWNER = "build-owner.json"
#: A leftover build folder without a live owner on this host is removed once nothing in it changed for this long.
_STALE_SECONDS = 3600.0


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


# ----------------------------------------------------------------------------------------------------------------
# Corpus fingerprint
# ----------------------------------------------------------------------------------------------------------------


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


# ----------------------------------------------------------------------------------------------------------------
# Build
# ----------------------------------------------------------------------------------------------------------------


def _iter_line_chunks(f, path: Path, chunk_docs: int, bar: tqdm) -> Iterator[tuple[list[int], list[bytes]]]:
    """``(line numbers, raw record lines)`` for chunks of ``chunk_docs`` records of a JSON Lines file.

    Blank lines are skipped (as :func:`tasks.corpus.iter_json_records` does); a JSON array file is refused,
    since it cannot be streamed line by line.
    """
    numbers: list[int] = []
    lines: list[bytes] = []
    seen_record = False
    read = 0
    for number, raw in enumerate(f, start=1):
        read += len(raw)
        if number == 1 and raw.startswith(b"\xef\xbb\xbf"):
            raw = raw[3:]
        line = raw.rstrip(b"\r\n")
        if not line.strip():
            continue
        if not seen_record and line.lstrip().startswith(b"["):
            raise DataFormatError(f"{path}: line {number}: a JSON array; the index needs JSON Lines "
                                  "(one document object per line)")
        seen_record = True
        numbers.append(number)
        lines.append(line)
        if len(lines) >= chunk_docs:
            bar.update(read)  # per chunk: a bar update per line costs a second per million lines
            read = 0
            yield numbers, lines
            numbers, lines = [], []
    bar.update(read)
    if lines:
        yield numbers, lines


def _tokenize_chunk(job: tuple[str, list[int], list[bytes]]) -> dict[str, Any]:
    """Parse and tokenise one chunk of records (runs in a worker process).

    Returns the chunk's terms in order of first appearance, the unique (local term, document) pairs sorted by
    term then document with their counts, document lengths and 64-bit hashes of the document ids.
    """
    path_text, numbers, lines = job
    path = Path(path_text)
    tokens: list[str] = []  # the chunk's tokens, document after document
    lengths = np.zeros(len(lines), dtype=np.int64)
    id_hash = np.zeros(len(lines), dtype=np.uint64)
    for i, raw in enumerate(lines):
        loc = RecordLocation(path, numbers[i])
        try:
            rec = json.loads(raw.decode("utf-8"))  # decoded here: json would sniff the encoding of bytes
        except json.JSONDecodeError as e:
            loc.fail(f"invalid JSON: {e.msg} at column {e.colno}")
        except UnicodeDecodeError as e:
            loc.fail(f"not UTF-8 text ({e.reason})")
        if not isinstance(rec, dict):
            loc.fail(f"expected a JSON object, got {type(rec).__name__}")
        doc = document_from_record(rec, loc)
        text = f"{doc.title}\n{doc.text}"
        # sanitize() only swaps characters outside the env's charset for U+FFFD; on ASCII text those are
        # control characters, which split tokens either way, so only non-ASCII text needs it.
        doc_tokens = word_tokens(text if text.isascii() else f"{sanitize(doc.title)}\n{sanitize(doc.text)}")
        lengths[i] = len(doc_tokens)
        tokens += doc_tokens
        try:
            id_bytes = doc.id.encode("utf-8")
        except UnicodeEncodeError as e:  # a lone surrogate (JSON allows the escape "\ud800"; UTF-8 does not)
            loc.fail(f"id {doc.id!r} is not valid Unicode text: lone surrogate {doc.id[e.start]!r} at character "
                     f"{e.start}")
        id_hash[i] = int.from_bytes(hashlib.blake2b(id_bytes, digest_size=8).digest(), "little")
    # Local term ids in order of first appearance, mapped in C (dict.fromkeys keeps first-seen order; the
    # bound __getitem__ in map() avoids a Python frame per token). Stopwords are dropped after mapping, by
    # term: what tokenize() drops, without a Python test per token.
    words = list(dict.fromkeys(tokens))
    local_id = {t: i for i, t in enumerate(words)}
    word_ids = np.fromiter(map(local_id.__getitem__, tokens), dtype=np.int64, count=len(tokens))
    is_term = np.fromiter((w not in STOPWORDS for w in words), dtype=bool, count=len(words))
    term_of_word = np.cumsum(is_term) - 1  # first-seen order among the kept words
    terms = [w for w, keep in zip(words, is_term) if keep]
    word_doc = np.repeat(np.arange(len(lines), dtype=np.int64), lengths)
    kept = is_term[word_ids]
    tids, dids = term_of_word[word_ids[kept]], word_doc[kept]
    lengths = np.bincount(dids, minlength=len(lines))
    # Unique (term, document) pairs with counts: a sort and run boundaries (np.unique costs ~3x a sort).
    keys = np.sort(tids * len(lines) + dids)
    first = np.flatnonzero(np.concatenate([[True], keys[1:] != keys[:-1]])) if len(keys) else np.zeros(0, np.int64)
    tf = np.diff(np.append(first, len(keys)))
    ltid, did = np.divmod(keys[first], len(lines))
    return {"terms": terms, "ltid": ltid.astype(np.int32), "did": did.astype(np.int32),
            "tf": tf.astype(np.uint32), "lengths": lengths.astype(np.int32), "id_hash": id_hash}


def _bounded_imap(pool, func, jobs: Iterator, ahead: int) -> Iterator:
    """``map(func, jobs)`` in order, on ``pool`` (or here when ``None``), with at most ``ahead`` jobs in flight:
    ``Pool.imap`` would read the whole corpus into its task queue."""
    if pool is None:
        yield from map(func, jobs)
        return
    pending: deque = deque()
    for job in jobs:
        pending.append(pool.apply_async(func, (job,)))
        if len(pending) >= ahead:
            yield pending.popleft().get()
    while pending:
        yield pending.popleft().get()


def _write_npy_header(f, dtype: np.dtype, length: int) -> None:
    """Start a 1-D ``.npy`` file of ``length`` items whose data is then appended with ``ndarray.tofile``."""
    np.lib.format.write_array_header_1_0(
        f, {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False, "shape": (length,)})


def build_index(
    corpus_path: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    params: BM25Params = BM25Params(),
    chunk_docs: int = 32768,
    merge_postings: int = 4_000_000,
    workers: int | None = None,
    range_docs: int = 8,
    progress: bool = True,
) -> Path:
    """Index the corpus JSON Lines file ``corpus_path`` into the directory ``out_dir`` (replaced atomically).

    ``out_dir`` must not exist, or be an empty folder, or hold an index (a damaged one too) and nothing else;
    anything else (the corpus file, a folder holding the corpus, any other file or folder) raises ``ValueError``
    before any work, and nothing is written. Temporary folders left beside ``out_dir`` by builds whose process
    has died are removed first.

    Args:
        params: BM25 parameters (stored in the manifest; queries use them).
        chunk_docs: documents tokenised per chunk (bounds the build's memory with ``merge_postings``).
        merge_postings: postings held at once while merging the chunks into the final lists.
        workers: tokenising processes (default: ``min(2, os.cpu_count())``; ``0`` or ``1``: this process).
        range_docs: documents per range of the block-max bounds (smaller: tighter bounds, larger
            ``range_max.npy``: one byte per range for each term found in at least an eighth as many documents as
            there are ranges).
        progress: show tqdm bars (bytes read, then postings merged).

    Returns the index directory. Raises :class:`~tasks.types.DataFormatError` naming the file and line of a
    malformed record (an id that is not valid Unicode included), or the records of a repeated document id;
    ``ValueError`` for parameters out of range (:func:`check_bm25_params`).
    """
    corpus_path, out_dir = Path(corpus_path), Path(out_dir)
    if chunk_docs < 1 or merge_postings < 1 or range_docs < 1:
        raise ValueError(f"chunk_docs, merge_postings and range_docs must be >= 1, got {chunk_docs}, "
                         f"{merge_postings}, {range_docs}")
    check_bm25_params(params.k1, params.b, params.epsilon)
    if not corpus_path.is_file():
        raise FileNotFoundError(f"corpus file not found: {corpus_path}")
    workers = min(2, os.cpu_count() or 1) if workers is None else int(workers)
    target = Path(os.path.realpath(out_dir))  # a symlinked out_dir: the index goes where it points
    _check_out_dir(corpus_path, out_dir, target)
    fingerprint = corpus_fingerprint(corpus_path)
    target.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_builds(target)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.building-{os.getpid()}-"))
    try:
        (tmp / _OWNER).write_text(json.dumps({"host": socket.gethostname(), "pid": os.getpid()}) + "\n",
                                  encoding="utf-8")
        manifest = _build_into(tmp, corpus_path, params, chunk_docs, merge_postings, workers, range_docs,
                               progress)
        if corpus_fingerprint(corpus_path) != fingerprint:
            raise IndexMismatchError(f"corpus file {corpus_path} changed while it was being indexed; build again")
        manifest["corpus"] = {"path": str(corpus_path.resolve()), "fingerprint": fingerprint}
        manifest["files"] = {name: _file_record(tmp / name) for name in INDEX_FILES}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; an index is meant to be shared
        _check_out_dir(corpus_path, out_dir, target)  # again: out_dir may have changed during the build
        (tmp / _OWNER).unlink()
        _swap_into_place(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def _check_out_dir(corpus_path: Path, out_dir: Path, target: Path) -> None:
    """Refuse (``ValueError``, nothing written) an ``out_dir`` whose replacement would lose something: the
    corpus file itself, a folder holding the corpus, a file, or a folder that is neither empty nor an index."""
    corpus = Path(os.path.realpath(corpus_path))
    if not target.name:
        raise ValueError(f"index folder {out_dir}: give a folder to create or replace, not the file-system root")
    if target == corpus:
        raise ValueError(f"index folder {out_dir} is the corpus file itself; give a new folder for the index")
    if corpus.is_relative_to(target):
        raise ValueError(f"index folder {out_dir} holds the corpus {corpus_path}, and building would replace "
                         "the folder; write the index to another folder")
    if not os.path.lexists(target):
        return
    if not target.is_dir():
        raise ValueError(f"index folder {out_dir} exists and is not a folder; give a new folder for the index")
    entries = sorted(os.listdir(target))
    if entries and not _is_index_dir(target, entries):
        foreign = [e for e in entries if e not in (MANIFEST, *INDEX_FILES)] or entries
        raise ValueError(f"index folder {out_dir} exists and is not a memenv index (it holds {foreign[0]!r}"
                         f"{f' and {len(entries) - 1} more' if len(entries) > 1 else ''}); refusing to replace "
                         "it: give a new or empty folder")


def _is_index_dir(folder: Path, entries: list[str] | None = None) -> bool:
    """Whether ``folder`` holds an index (possibly a damaged one) and nothing else: a manifest naming this format
    (a cut one too) and only files an index is made of."""
    entries = sorted(os.listdir(folder)) if entries is None else entries
    if MANIFEST not in entries or not set(entries) <= {MANIFEST, *INDEX_FILES}:
        return False
    try:
        with open(folder / MANIFEST, "rb") as f:
            head = f.read(4096)
    except OSError:
        return False
    return f'"format": "{FORMAT}"'.encode() in head and all((folder / name).is_file() for name in entries)


def _file_record(path: Path) -> dict[str, Any]:
    """What the manifest records of an index file (checked by :meth:`_IndexFiles.check_file` on open): its
    size, CRC-32s of its first and last 64 KiB, and an array's dtype and shape."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(_CHECK_BYTES)
        f.seek(max(0, size - _CHECK_BYTES))
        tail = f.read(_CHECK_BYTES)
    record: dict[str, Any] = {"size": size, "head_crc32": zlib.crc32(head), "tail_crc32": zlib.crc32(tail)}
    if path.suffix == ".npy":
        dtype, shape, _ = _npy_header(path)
        record.update(dtype=dtype.str, shape=list(shape))
    return record


def _owner_is_gone(folder: Path) -> bool:
    """Whether the build that made ``folder`` is surely over: its owner file names this host and a process that
    no longer exists; or, without an owner file on this host (a build of an earlier version, one of another host
    on a shared disk, or one killed before it wrote the file), nothing in it changed for an hour."""
    try:
        owner = json.loads((folder / _OWNER).read_text(encoding="utf-8"))
        host, pid = owner["host"], int(owner["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        host, pid = None, None
    if host == socket.gethostname() and pid is not None:
        if pid == os.getpid():
            return False  # another build in this process
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:  # alive, another user's
            return False
        return False
    try:
        newest = max([folder.stat().st_mtime] + [e.stat().st_mtime for e in os.scandir(folder)])
    except OSError:
        return False
    return time.time() - newest > _STALE_SECONDS


def _remove_stale_builds(target: Path) -> None:
    """Remove what killed builds of ``target`` left beside it: ``.NAME.building-*`` folders whose build is over
    (:func:`_owner_is_gone`) and ``.NAME.old-*`` folders (an index moved aside for its replacement).
    Only folders holding nothing but build and index files are removed; anything else is left, with a warning
    for an ``.old-`` entry that is not an index (earlier versions could move a corpus file there)."""
    building, old = f".{target.name}.building-", f".{target.name}.old-"
    try:
        names = os.listdir(target.parent)
    except OSError:
        return
    for name in names:
        path = target.parent / name
        if name.startswith(building):
            if not path.is_dir() or path.is_symlink():
                continue
            try:
                entries = set(os.listdir(path))
            except OSError:
                continue
            if entries <= {MANIFEST, *INDEX_FILES, *_BUILD_FILES} and _owner_is_gone(path):
                shutil.rmtree(path, ignore_errors=True)
        elif name.startswith(old):
            if path.is_dir() and not path.is_symlink() and _is_index_dir(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                warnings.warn(f"{path} was left beside {target} by an earlier build and is not an index; it is "
                              "kept (look inside: it may be a file of yours)", stacklevel=3)


def _swap_into_place(tmp: Path, out_dir: Path) -> None:
    """Rename the finished ``tmp`` to ``out_dir``; an existing ``out_dir`` (an index or an empty folder, see
    :func:`_check_out_dir`) is moved aside, then removed."""
    old = None
    if os.path.lexists(out_dir):
        old = out_dir.with_name(f".{out_dir.name}.old-{os.getpid()}-{secrets.token_hex(4)}")
        os.replace(out_dir, old)
    os.replace(tmp, out_dir)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _build_into(tmp: Path, corpus_path: Path, params: BM25Params, chunk_docs: int, merge_postings: int,
                workers: int, range_docs: int, progress: bool) -> dict[str, Any]:
    started = time.perf_counter()
    vocab: dict[str, int] = {}
    df = np.zeros(1024, dtype=np.int64)
    run_sizes: list[int] = []
    doc_lengths: list[np.ndarray] = []
    id_hashes: list[np.ndarray] = []
    offsets: list[np.ndarray] = [np.zeros(1, dtype=np.int64)]
    n_docs = 0
    max_tf = 0
    store_bytes = 0
    runs = {name: open(tmp / f"run_{name}.bin", "wb") for name in ("tid", "did", "tf")}
    bar = tqdm(total=corpus_path.stat().st_size, unit="B", unit_scale=True, desc="index: tokenise",
               disable=not progress)
    # fork where there is one: workers start at once, and scripts need no ``if __name__ == "__main__"`` guard.
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    pool = multiprocessing.get_context(method).Pool(workers) if workers > 1 else None
    try:
        with open(corpus_path, "rb") as f, open(tmp / "docs.jsonl", "wb") as store:

            def jobs() -> Iterator[tuple[str, list[int], list[bytes]]]:
                # The document store is written here, in corpus order, as the chunks go out to the workers.
                nonlocal store_bytes
                for numbers, lines in _iter_line_chunks(f, corpus_path, chunk_docs, bar):
                    sizes = np.fromiter(map(len, lines), dtype=np.int64, count=len(lines)) + 1
                    offsets.append(store_bytes + np.cumsum(sizes))
                    store_bytes += int(sizes.sum())
                    store.write(b"\n".join(lines) + b"\n")
                    yield str(corpus_path), numbers, lines

            results = _bounded_imap(pool, _tokenize_chunk, jobs(), ahead=workers + 1)
            for chunk in results:
                # Global term ids in order of first appearance over the whole corpus (BM25Okapi's dict order,
                # which its average idf sums in): a chunk's new terms come in the chunk's own first-seen order.
                mapping = np.fromiter((vocab.setdefault(t, len(vocab)) for t in chunk["terms"]), dtype=np.int32,
                                      count=len(chunk["terms"]))
                tid = mapping[chunk["ltid"]] if len(mapping) else chunk["ltid"]
                order = np.argsort(tid, kind="stable")  # (term, doc) order: docs were ascending per local term
                tid, did, tf = tid[order], chunk["did"][order] + np.int32(n_docs), chunk["tf"][order]
                tid.tofile(runs["tid"])
                did.tofile(runs["did"])
                tf.tofile(runs["tf"])
                run_sizes.append(len(tid))
                if len(vocab) > len(df):
                    df = np.concatenate([df, np.zeros(max(len(vocab) - len(df), len(df)), dtype=np.int64)])
                df[: len(vocab)] += np.bincount(tid, minlength=len(vocab))
                max_tf = max(max_tf, int(tf.max(initial=0)))
                doc_lengths.append(chunk["lengths"])
                id_hashes.append(chunk["id_hash"])
                n_docs += len(chunk["lengths"])
                bar.set_postfix(docs=n_docs, terms=len(vocab), refresh=False)
    finally:
        if pool is not None:
            pool.terminate()
        bar.close()
        for handle in runs.values():
            handle.close()
    tokenise_seconds = time.perf_counter() - started
    if n_docs == 0:
        raise DataFormatError(f"{corpus_path}: no documents")
    if n_docs >= 2**31:
        raise ValueError(f"{corpus_path}: {n_docs} documents; the index stores document ids as int32 (< 2**31)")
    doc_len = np.concatenate(doc_lengths)
    del doc_lengths
    doc_offsets = np.concatenate(offsets)
    _check_unique_ids(np.concatenate(id_hashes), tmp / "docs.jsonl", doc_offsets, corpus_path)
    del id_hashes

    n_terms = len(vocab)
    df = df[:n_terms]
    avgdl = float(doc_len.sum()) / n_docs
    idf, average_idf = okapi_idf(df, n_docs, params.epsilon)
    doc_norm = (okapi_doc_norm(doc_len, avgdl, params.k1, params.b) if n_terms
                else np.zeros(n_docs, dtype=np.float64))
    indptr = np.zeros(n_terms + 1, dtype=np.int64)
    np.cumsum(df, out=indptr[1:])
    (tmp / "terms.txt").write_text("".join(f"{t}\n" for t in vocab), encoding="utf-8")
    del vocab
    np.save(tmp / "idf.npy", idf)
    np.save(tmp / "indptr.npy", indptr)
    np.save(tmp / "doc_norm.npy", doc_norm)
    np.save(tmp / "doc_len.npy", doc_len)
    np.save(tmp / "doc_offsets.npy", doc_offsets)
    tf_dtype = np.dtype(np.uint16 if max_tf < 2**16 else np.uint32)
    _merge_runs(tmp, run_sizes, indptr, idf, doc_norm, params.k1, tf_dtype, merge_postings, progress)
    merged_seconds = time.perf_counter() - started
    _write_range_bounds(tmp, indptr, idf, doc_norm, params.k1, range_docs, progress)
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "tokenizer": TOKENIZER,
        "indexed_text": INDEXED_TEXT,
        "params": asdict(params),
        "n_docs": n_docs,
        "n_terms": n_terms,
        "n_postings": int(indptr[-1]),
        "avgdl": avgdl,
        "average_idf": average_idf,
        "tf_dtype": tf_dtype.name,
        "range_docs": range_docs,
        "build_seconds": {"tokenise": round(tokenise_seconds, 2),
                          "range_bounds": round(time.perf_counter() - started - merged_seconds, 2),
                          "total": round(time.perf_counter() - started, 2)},
    }


def _check_unique_ids(id_hash: np.ndarray, store: Path, doc_offsets: np.ndarray, corpus_path: Path) -> None:
    """Raise naming both records when two documents share an id (found through 64-bit id hashes)."""
    order = np.argsort(id_hash, kind="stable")
    same = np.flatnonzero(id_hash[order][1:] == id_hash[order][:-1])
    if not len(same):
        return
    docs = DocumentStore(store, doc_offsets)
    for j in same:
        first, second = int(order[j]), int(order[j + 1])
        if docs[first].id == docs[second].id:
            raise DataFormatError(f"{corpus_path}: duplicate document id {docs[first].id!r} (records {first} and "
                                  f"{second}, 0-based, blank lines not counted)")


def _merge_runs(tmp: Path, run_sizes: list[int], indptr: np.ndarray, idf: np.ndarray, doc_norm: np.ndarray,
                k1: float, tf_dtype: np.dtype, merge_postings: int, progress: bool) -> None:
    """Merge the per-chunk runs into the doc-ordered and impact-ordered posting lists, a term range at a time.

    Each run is sorted by (term, document) and the runs are in document order, so a term's doc-ordered list is
    the concatenation of its slices from run 0, 1, ...: a stable sort by term of the concatenated slices.
    """
    n_postings = int(indptr[-1])
    run_starts = np.concatenate([[0], np.cumsum(run_sizes)]).astype(np.int64)
    run_tid = np.memmap(tmp / "run_tid.bin", dtype=np.int32, mode="r") if n_postings else np.zeros(0, np.int32)
    cursors = run_starts[:-1].copy()
    # Term ranges of at most merge_postings postings (a longer list is a range of its own).
    bounds = [0]
    while bounds[-1] < len(indptr) - 1:
        t0 = bounds[-1]
        t1 = int(np.searchsorted(indptr, indptr[t0] + merge_postings, side="right")) - 1
        bounds.append(max(t1, t0 + 1))
    outputs = {name: open(tmp / f"{name}.npy", "wb") for name in ("post_doc", "post_tf", "impact_doc", "impact_tf")}
    sources = {name: open(tmp / f"run_{name}.bin", "rb") for name in ("tid", "did", "tf")}
    bar = tqdm(total=n_postings, unit="posting", unit_scale=True, desc="index: merge", disable=not progress)
    try:
        for name, handle in outputs.items():
            _write_npy_header(handle, np.int32 if name.endswith("doc") else tf_dtype, n_postings)
        for t0, t1 in zip(bounds[:-1], bounds[1:]):
            parts: dict[str, list[np.ndarray]] = {"tid": [], "did": [], "tf": []}
            for r in range(len(run_sizes)):
                lo = int(cursors[r])
                hi = int(run_starts[r] + np.searchsorted(run_tid[run_starts[r]: run_starts[r + 1]], t1))
                cursors[r] = hi
                if hi > lo:
                    for name, width in (("tid", 4), ("did", 4), ("tf", 4)):
                        sources[name].seek(lo * width)
                        dtype = np.uint32 if name == "tf" else np.int32
                        parts[name].append(np.fromfile(sources[name], dtype=dtype, count=hi - lo))
            if not parts["tid"]:
                continue
            tid = np.concatenate(parts["tid"])
            order = np.argsort(tid, kind="stable")
            tid, did = tid[order], np.concatenate(parts["did"])[order]
            tf = np.concatenate(parts["tf"])[order].astype(tf_dtype)
            del parts, order
            did.tofile(outputs["post_doc"])
            tf.tofile(outputs["post_tf"])
            weight = okapi_weights(idf[tid], tf, doc_norm[did], k1)
            # lexsort is stable: within a term, equal weights keep document order (the ranking's tie rule).
            impact = np.lexsort((-weight, tid))
            did[impact].tofile(outputs["impact_doc"])
            tf[impact].tofile(outputs["impact_tf"])
            bar.update(len(tid))
    finally:
        bar.close()
        for handle in (*outputs.values(), *sources.values()):
            handle.close()
        del run_tid
        for name in ("tid", "did", "tf"):
            (tmp / f"run_{name}.bin").unlink(missing_ok=True)


def _write_range_bounds(tmp: Path, indptr: np.ndarray, idf: np.ndarray, doc_norm: np.ndarray, k1: float,
                        range_docs: int, progress: bool) -> None:
    """Write ``term_max``, ``range_row`` and ``range_max`` (see the module docstring) from the finished lists.

    Only terms found in at least ``n_ranges // 8`` documents get a row (at most eight bytes per posting of theirs);
    a rarer term's range bounds are cheaper to compute from its few postings at query time. Bounds are rounded
    up (and widened by a relative 1e-9 against rounding), so they never fall below a real weight.
    """
    n_terms, n_docs = len(indptr) - 1, len(doc_norm)
    n_ranges = -(-n_docs // range_docs)
    df = np.diff(indptr)
    post_doc = np.load(tmp / "post_doc.npy", mmap_mode="r")
    post_tf = np.load(tmp / "post_tf.npy", mmap_mode="r")
    impact_doc = np.load(tmp / "impact_doc.npy", mmap_mode="r")
    impact_tf = np.load(tmp / "impact_tf.npy", mmap_mode="r")
    term_max = np.zeros(n_terms, dtype=np.float64)
    has = np.flatnonzero(df > 0)
    heads = indptr[has]
    term_max[has] = np.maximum(okapi_weights(idf[has], impact_tf[heads], doc_norm[impact_doc[heads]], k1), 0.0)
    common = np.flatnonzero((df >= max(1, n_ranges // 8)) & (term_max > 0))
    range_row = np.full(n_terms, -1, dtype=np.int32)
    range_row[common] = np.arange(len(common), dtype=np.int32)
    np.save(tmp / "term_max.npy", term_max)
    np.save(tmp / "range_row.npy", range_row)
    if not len(common):  # np.memmap cannot map an empty file
        np.save(tmp / "range_max.npy", np.zeros((0, n_ranges), dtype=np.uint8))
        return
    rows = np.lib.format.open_memmap(tmp / "range_max.npy", mode="w+", dtype=np.uint8,
                                     shape=(len(common), n_ranges))
    padded = np.zeros(n_ranges, dtype=np.uint8)
    for t in tqdm(common, desc="index: range bounds", unit="term", disable=not progress):
        lo, hi = int(indptr[t]), int(indptr[t + 1])
        ranges, peak = _range_peaks(post_doc[lo:hi], okapi_weights(idf[t], post_tf[lo:hi], doc_norm[post_doc[lo:hi]],
                                                                     k1), range_docs)
        padded[:] = 0
        padded[ranges] = np.clip(np.ceil(peak / term_max[t] * 255.0 * (1 + 1e-9)), 0, 255)
        rows[range_row[t]] = padded
    rows.flush()
    del rows


def _best_bounded(bound: np.ndarray, n: int) -> np.ndarray:
    """The indices of the ``n`` largest values of ``bound``, found among those within 10%, 20%, 40% of the best
    one first (an argpartition of all of them costs more than most queries' whole remaining work). ``bound``
    must hold more than ``n`` positive values."""
    top = float(bound.max())
    for share in (0.9, 0.8, 0.6):
        near = np.flatnonzero(bound >= top * share)
        if len(near) >= n:
            break
    else:
        near = np.flatnonzero(bound > 0.0)
    if len(near) > n:
        near = near[np.argpartition(-bound[near], n - 1)[:n]]
    return near


def _range_peaks(docs: np.ndarray, weights: np.ndarray, range_docs: int) -> tuple[np.ndarray, np.ndarray]:
    """The ranges (``doc // range_docs``) holding ``docs`` (ascending) and each one's largest weight, >= 0."""
    ranges = docs // range_docs
    starts = np.flatnonzero(np.concatenate([[True], ranges[1:] != ranges[:-1]]))
    return ranges[starts], np.maximum(np.maximum.reduceat(weights, starts), 0.0)


# ----------------------------------------------------------------------------------------------------------------
# Reading
# ----------------------------------------------------------------------------------------------------------------


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


class _IndexFiles:
    """The checks of an index directory's files on open (see the module docstring): each raises
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


class BM25Index(SearchBackend):
    """Exact BM25 (Okapi) top-k over an index directory written by :func:`build_index`, memory-mapped.

    ``search(query, k)`` returns what :class:`memenv.search.BM25Sparse` over the same corpus returns (document
    indices by score descending, ties to the lower index, only scores > 0), reading only the heads of the
    query terms' impact-ordered lists (see the module docstring); ``scores(query)`` is the exhaustive score
    vector (for checks). ``corpus_path``, when given, must be the file the index was built from (checked by
    its fingerprint; :class:`IndexMismatchError` names both otherwise). ``documents`` is the document store.
    """

    #: Postings read per term before the first threshold test (the lists double from there).
    initial_depth = 64

    def __init__(self, path: str | os.PathLike, *, corpus_path: str | os.PathLike | None = None) -> None:
        self.path = Path(path)
        self.manifest = _read_manifest(self.path)
        if corpus_path is not None:
            self.check_corpus(corpus_path)
        self.tokenizer = tokenize
        params = self.manifest["params"]
        self.k1, self.b, self.epsilon = params["k1"], params["b"], params["epsilon"]
        self.avgdl, self.average_idf = self.manifest["avgdl"], self.manifest["average_idf"]
        self._n_docs = int(self.manifest["n_docs"])
        # Block-max bounds (absent from indexes built before they were added: those use the threshold algorithm).
        self.range_docs = int(self.manifest.get("range_docs", 0))
        files = _IndexFiles(self.path, self.manifest)
        # Plain ndarray views of the read-only maps: slicing an np.memmap costs microseconds of subclass
        # bookkeeping per slice, a query takes hundreds of slices. The views keep the maps alive.
        n_docs, n_terms, n_postings = self._n_docs, self.manifest["n_terms"], self.manifest["n_postings"]
        tf_dtype = np.dtype(self.manifest.get("tf_dtype", files.header_dtype("post_tf.npy")))
        if tf_dtype not in (np.dtype(np.uint16), np.dtype(np.uint32)):
            files.fail(MANIFEST, f"tf_dtype {tf_dtype.name!r} is not uint16 or uint32")
        per_term, per_posting = (n_terms,), (n_postings,)
        self.idf = files.array("idf.npy", np.float64, per_term, "one per term: n_terms")
        self.indptr = files.array("indptr.npy", np.int64, (n_terms + 1,), "n_terms + 1")
        self.doc_norm = files.array("doc_norm.npy", np.float64, (n_docs,), "one per document: n_docs")
        self.post_doc = files.array("post_doc.npy", np.int32, per_posting, "one per posting: n_postings")
        self.post_tf = files.array("post_tf.npy", tf_dtype, per_posting, "one per posting: n_postings")
        self.impact_doc = files.array("impact_doc.npy", np.int32, per_posting, "one per posting: n_postings")
        self.impact_tf = files.array("impact_tf.npy", tf_dtype, per_posting, "one per posting: n_postings")
        files.header("doc_len.npy", np.int32, (n_docs,), "one per document: n_docs", required=False)
        doc_offsets = files.array("doc_offsets.npy", np.int64, (n_docs + 1,), "n_docs + 1")
        if self.range_docs and (self.path / "range_max.npy").is_file():
            self.term_max = files.array("term_max.npy", np.float64, per_term, "one per term: n_terms")
            self.range_row = files.array("range_row.npy", np.int32, per_term, "one per term: n_terms")
            n_ranges = -(-n_docs // self.range_docs)
            self.range_max = files.array("range_max.npy", np.uint8, (None, n_ranges),
                                         f"one column per range of {self.range_docs} documents: ceil(n_docs / "
                                         "range_docs) columns")
        else:
            if self.range_docs and "range_max.npy" in files.records:
                files.fail("range_max.npy", "missing")
            self.range_docs, self.term_max, self.range_row, self.range_max = 0, None, None, None
        files.check_postings(self.indptr, n_postings)
        files.check_terms(n_terms)
        files.check_store(doc_offsets)
        self.documents = DocumentStore(self.path / "docs.jsonl", doc_offsets)
        self._vocab: dict[str, int] | None = None

    def _build(self, corpus: list[list[str]]) -> None:
        raise TypeError("a BM25Index is built by memenv.search.index.build_index and opened from its directory")

    def __reduce__(self):
        return (_open_index, (str(self.path),))

    @property
    def vocab(self) -> dict[str, int]:
        """Term -> term id (read from terms.txt on first use)."""
        if self._vocab is None:
            path = self.path / "terms.txt"
            try:
                terms = path.read_text(encoding="utf-8").split("\n")[:-1]
            except UnicodeDecodeError as e:
                raise IndexCorruptError(f"{path}: not UTF-8 text at byte {e.start} (damaged); "
                                        f"{_rebuild_hint(self.path, self.manifest)}") from None
            if len(terms) != self.manifest["n_terms"]:
                raise IndexCorruptError(f"{path}: {len(terms)} terms, the manifest says n_terms = "
                                        f"{self.manifest['n_terms']} (cut or damaged); "
                                        f"{_rebuild_hint(self.path, self.manifest)}")
            self._vocab = {t: i for i, t in enumerate(terms)}
        return self._vocab

    def check_corpus(self, corpus_path: str | os.PathLike) -> None:
        """Raise :class:`IndexMismatchError` unless ``corpus_path`` is the file this index was built from."""
        stored = self.manifest["corpus"]["fingerprint"]
        current = corpus_fingerprint(corpus_path)
        if current != stored:
            changed = ", ".join(f"{key} {stored[key]} -> {current[key]}" for key in stored
                                if stored[key] != current[key])
            raise IndexMismatchError(
                f"corpus file {corpus_path} does not match the index {self.path} (built from "
                f"{self.manifest['corpus']['path']}): {changed}; rebuild with `memenv index build {corpus_path} "
                f"{self.path}`")

    # ------------------------------------------------------------------ scoring
    def _query_terms(self, query: str) -> list[int]:
        vocab = self.vocab
        return [vocab[t] for t in self.tokenizer(query) if t in vocab]

    def _query_slots(self, query: str) -> tuple[list[int], list[int], np.ndarray]:
        """The query's distinct known terms, each occurrence's index among them (query order), and each
        one's multiplicity."""
        query_terms = self._query_terms(query)
        terms = list(dict.fromkeys(query_terms))
        slots = [terms.index(t) for t in query_terms]
        return terms, slots, np.bincount(slots, minlength=len(terms))

    def _weights(self, term: int, docs: np.ndarray, tf: np.ndarray) -> np.ndarray:
        return okapi_weights(self.idf[term], tf, self.doc_norm[docs], self.k1)

    def scores(self, query: str) -> np.ndarray:
        """Exhaustive scores of every document (query terms added in query order, as BM25Okapi)."""
        out = np.zeros(len(self), dtype=np.float64)
        for term in self._query_terms(query):
            lo, hi = int(self.indptr[term]), int(self.indptr[term + 1])
            docs = np.asarray(self.post_doc[lo:hi])
            out[docs] += self._weights(term, docs, self.post_tf[lo:hi])  # docs are unique within a term
        return out

    def _term_weights(self, term: int, cand: np.ndarray) -> np.ndarray:
        """Term's weight in each of the sorted documents ``cand`` (0.0 where absent): binary search in its
        doc-ordered list."""
        lo, hi = int(self.indptr[term]), int(self.indptr[term + 1])
        docs = self.post_doc[lo:hi]
        pos = np.minimum(np.searchsorted(docs, cand), hi - lo - 1)
        hit = docs[pos] == cand
        w = np.zeros(len(cand), dtype=np.float64)
        w[hit] = self._weights(term, cand[hit], self.post_tf[lo + pos[hit]])
        return w

    def _weight_at(self, term: int, depth: int) -> float:
        """The weight of term's ``depth``-th posting in impact order (0.0 past the end): a bound on every
        posting not yet read."""
        lo, hi = int(self.indptr[term]), int(self.indptr[term + 1])
        if depth >= hi - lo:
            return 0.0
        doc = self.impact_doc[lo + depth: lo + depth + 1]
        return float(self._weights(term, doc, self.impact_tf[lo + depth: lo + depth + 1])[0])

    #: Block-max search: ranges scored in the first chunk (chunks double from there), and how few ranges left in
    #: reach are sorted by bound rather than selected chunk by chunk.
    first_chunk = 16
    sort_ranges = 2048
    #: Relative slack on the block-max bounds (float32 sums; a bound is widened by it and a range is still
    #: scored when its bound is within it of the k-th best score).
    _slack = 1e-5

    def search(self, query: str, k: int) -> list[int]:
        """The at most ``k`` best documents for ``query``, best first (exact; see the class docstring).

        With block-max bounds (indexes built with ``range_max.npy``): every range of ``range_docs`` consecutive
        documents gets an upper bound on any of its documents' scores (the sum over the query terms of the
        term's largest weight in that range: stored, quantised upward, for common terms; computed from the
        postings for rare ones), in one vectorised pass over the ranges. Ranges are then scored exactly (binary
        search of each range in the terms' doc-ordered lists, weights summed in query order, so scores are
        bit-identical to :meth:`scores`), best bound first, in doubling chunks, until no range left can reach
        the k-th best exact score found (ties included: a range whose bound equals it is still scored, since a
        lower document index wins a tie). This is block-max pruning over fixed document ranges, as in Mallia
        et al.'s block-max pruning (BMP, SIGIR 2024), with exact rather than quantised scores. Without the
        bounds, :meth:`search_threshold`.
        """
        self.rank(np.zeros(0), k)  # validates k
        if self.range_max is None:
            return self.search_threshold(query, k)
        terms, slots, mult = self._query_slots(query)
        if k == 0 or not terms:
            return []
        bound = self._range_bounds(terms, mult)
        # Chunks of the best-bounded ranges (doubling) are scored exactly, raising the k-th best exact score
        # theta, until no range left has a bound reaching it. Only when few ranges are left in reach are they
        # sorted by bound; before that each chunk is selected from them in linear time.
        chunk = self.first_chunk
        best_docs, best_scores = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float64)
        theta, rest, rest_bound = 0.0, None, None
        while True:
            # Relative slack: bounds are summed in float32 (and in another order than the exact scores).
            cut = theta - self._slack * abs(theta)
            if rest is not None:  # sorted by bound: the ranges still in reach are a prefix
                keep = np.count_nonzero(rest_bound >= cut)
                pick, rest, rest_bound = rest[:min(chunk, keep)], rest[chunk:keep], rest_bound[chunk:keep]
            else:
                # A range whose bound is <= 0 holds no positive score.
                in_reach = bound >= cut if theta > 0.0 else bound > 0.0
                if np.count_nonzero(in_reach) <= self.sort_ranges:
                    reach = np.flatnonzero(in_reach)
                    rest = reach[np.argsort(-bound[reach], kind="stable")]
                    rest_bound = bound[rest]
                    pick, rest, rest_bound = rest[:chunk], rest[chunk:], rest_bound[chunk:]
                else:  # more than `chunk` in reach: the best bounds are all in reach
                    pick = _best_bounded(bound, chunk)
            if not len(pick):
                return [int(d) for d in best_docs]
            docs, scores = self._score_ranges(np.sort(pick), terms, slots)
            docs, scores = np.concatenate([best_docs, docs]), np.concatenate([best_scores, scores])
            order = np.lexsort((docs, -scores))[:k]  # score descending, ties to the lower index
            best_docs, best_scores = docs[order], scores[order]
            theta = best_scores[k - 1] if len(best_scores) >= k else 0.0
            bound[pick] = -np.inf  # scored
            chunk *= 2


    def _range_bounds(self, terms: list[int], mult: np.ndarray) -> np.ndarray:
        """Per range of ``range_docs`` documents, an upper bound (float32) on the score of any of its documents."""
        bound = np.zeros(self.range_max.shape[1], dtype=np.float32)
        scaled = np.empty_like(bound)  # one buffer for every common term's row (no temporary per term)
        for j, t in enumerate(terms):
            top = float(self.term_max[t]) * int(mult[j])
            if top <= 0.0:
                continue
            row = int(self.range_row[t])
            if row >= 0:
                bound += np.multiply(self.range_max[row], np.float32(top / 255.0 * (1 + self._slack)), out=scaled)
            else:  # a rare term: bounds from its few postings
                lo, hi = int(self.indptr[t]), int(self.indptr[t + 1])
                docs = self.post_doc[lo:hi]
                ranges, peak = _range_peaks(docs, self._weights(t, docs, self.post_tf[lo:hi]), self.range_docs)
                bound[ranges] += (peak * (int(mult[j]) * (1 + self._slack))).astype(np.float32)  # ranges are unique
        return bound

    def _score_ranges(self, ranges: np.ndarray, terms: list[int], slots: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """Exact scores of the documents in ``ranges`` (ascending): ``(docs, scores)`` of those scoring > 0.

        Each term's postings in those ranges are found by one binary search of the ranges' edges in its
        doc-ordered list; then every term's postings are weighted and summed into a dense ``[term, document]``
        block at once (a fixed number of numpy calls per chunk, not per term), and the terms' rows are added in
        query order, as :meth:`scores` sums them (so the scores are bit-identical).
        """
        width, n = self.range_docs, len(ranges)
        first = ranges * width
        # Needles of the lists' dtype (searchsorted would otherwise cast the whole int32 list to int64), the
        # ranges' starts and ends interleaved: ascending, so one call finds both.
        edges = np.empty(2 * n, dtype=self.post_doc.dtype)
        edges[0::2], edges[1::2] = first, first + width
        starts, counts = [], []
        for t in terms:
            lo, hi = int(self.indptr[t]), int(self.indptr[t + 1])
            found = np.searchsorted(self.post_doc[lo:hi], edges)
            starts.append(found[0::2] + lo)
            counts.append(found[1::2] - found[0::2])
        start, count = np.concatenate(starts), np.concatenate(counts)
        term_totals = [int(c.sum()) for c in counts]
        total = sum(term_totals)
        if not total:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float64)
        # Global positions start[i] .. start[i] + count[i] - 1 of every (term, range) pair, in one array.
        pos = np.arange(total) + np.repeat(start - np.cumsum(count) + count, count)
        docs = self.post_doc[pos]
        per_term = np.repeat(np.arange(len(terms)), term_totals)
        weights = okapi_weights(self.idf[np.asarray(terms)][per_term], self.post_tf[pos], self.doc_norm[docs],
                                self.k1)
        # Cell of each posting: its term's row, then its document's place among the ranges' documents.
        local = docs - np.repeat(np.tile(first - np.arange(n) * width, len(terms)), count)
        block = np.bincount(per_term * (n * width) + local, weights,  # one posting per cell
                            minlength=len(terms) * n * width).reshape(len(terms), n * width)
        out = np.zeros(n * width, dtype=np.float64)
        for slot in slots:  # query order, as BM25Okapi sums (adding 0.0 for absent documents is exact)
            out += block[slot]
        hit = np.flatnonzero(out > 0.0)
        return (np.repeat(first, width) + np.tile(np.arange(width), n))[hit], out[hit]

    def search_threshold(self, query: str, k: int) -> list[int]:
        """:meth:`search` without block-max bounds (the only way for an index built before they were added).

        Threshold algorithm with MaxScore's split: the heads of every impact-ordered list give real documents,
        whose exact scores give a lower bound ``theta`` on the k-th best score; the terms whose maximum weights
        sum (with their query multiplicity) below ``theta`` are *non-essential* (a document holding only those
        cannot make the top k), so only the essential lists are read further, head first, until the k-th best
        exact score beats the best score an unread document could reach. When that would read about as many
        postings as scoring every document, every document is scored instead.
        """
        self.rank(np.zeros(0), k)  # validates k
        terms, slots, mult = self._query_slots(query)
        if k == 0 or not terms:
            return []
        lo = np.array([int(self.indptr[t]) for t in terms], dtype=np.int64)
        length = np.array([int(self.indptr[t + 1]) for t in terms], dtype=np.int64) - lo
        total = int(length.sum())
        if total <= 8 * self.initial_depth:
            return self._score_all_postings(terms, slots, lo, length, k)
        top = [self._weight_at(t, 0) for t in terms]
        depth = np.minimum(length, max(self.initial_depth, 2 * k))
        cand = np.zeros(0, dtype=np.int32)
        scores = np.zeros(0, dtype=np.float64)
        essential = np.ones(len(terms), dtype=bool)
        while True:
            heads = [self.impact_doc[lo[j]: lo[j] + depth[j]] for j in range(len(terms)) if depth[j]]
            new = np.setdiff1d(np.concatenate(heads), cand)  # sorted, unique
            if len(new):
                cand, scores = self._add_candidates(cand, scores, new, terms, slots)
            nxt = [self._weight_at(t, int(d)) if essential[j] else top[j]
                   for j, (t, d) in enumerate(zip(terms, depth))]
            bound = 0.0  # the best score of a document in none of the heads, summed as a score is
            for slot in slots:
                bound += nxt[slot]
            positive = int(np.count_nonzero(scores > 0))
            theta = -np.partition(-scores, k - 1)[k - 1] if positive >= k else 0.0
            if bound <= 0.0 or theta > bound:
                order = np.lexsort((cand, -scores))[: min(k, positive)]
                return [int(d) for d in cand[order]]
            # Non-essential terms: the smallest maxima whose sum stays below theta.
            essential[:] = True
            by_max = sorted(range(len(terms)), key=lambda j: mult[j] * top[j])
            partial = 0.0
            for j in by_max:
                partial += mult[j] * top[j]
                if partial >= theta:
                    break
                essential[j] = False
            todo = essential & (depth < length)
            # Cost guard: reading the rest of the essential lists with random access into every list costs
            # about len(terms) binary searches per posting; scoring every posting costs one pass.
            remaining = int((length - depth)[todo].sum())
            if not todo.any():  # every essential list is read: a document outside cand scores at most
                bound = 0.0     # the non-essential maxima, summed as a score is
                for slot in slots:
                    bound += 0.0 if essential[slot] else top[slot]
                if theta > bound:
                    order = np.lexsort((cand, -scores))[: min(k, positive)]
                    return [int(d) for d in cand[order]]
            if remaining * len(terms) >= total or not todo.any():
                return self._score_all_postings(terms, slots, lo, length, k, theta)
            depth = self._deepen(terms, mult, depth, length, nxt, todo)

    def _add_candidates(self, cand, scores, new, terms, slots):
        per_term = [self._term_weights(t, new) for t in terms]
        new_scores = np.zeros(len(new), dtype=np.float64)
        for slot in slots:  # query order, repeated terms once per occurrence: BM25Okapi's summation
            new_scores += per_term[slot]
        return np.concatenate([cand, new]), np.concatenate([scores, new_scores])

    def _score_all_postings(self, terms, slots, lo, length, k, theta: float = 0.0) -> list[int]:
        """Exact top-k by scoring every posting of the query terms into a dense score vector.

        ``theta`` is a lower bound on the k-th best score (the k-th best of documents already scored, 0.0 if
        none): only the documents reaching it are ranked, instead of selecting among all ``len(self)``.
        """
        dense: dict[int, np.ndarray] = {}
        out = np.zeros(len(self), dtype=np.float64)
        for slot in slots:  # query order: BM25Okapi's summation (adding 0.0 for absent documents is exact)
            if slot not in dense:
                docs = self.post_doc[lo[slot]: lo[slot] + length[slot]]
                weights = self._weights(terms[slot], docs, self.post_tf[lo[slot]: lo[slot] + length[slot]])
                # bincount sums one weight per bin here (documents are unique within a list): exact.
                dense[slot] = np.bincount(docs, weights, minlength=len(self))
            out += dense[slot]
        if theta > 0.0:
            cand = np.flatnonzero(out >= theta)
            return [int(cand[i]) for i in self.rank(out[cand], k)]
        return self.rank(out, k)

    def _deepen(self, terms: list[int], mult: np.ndarray, depth: np.ndarray, length: np.ndarray,
                nxt: list[float], todo: np.ndarray) -> np.ndarray:
        """Double the essential heads that lower the bound most per posting read (all of them on flat
        stretches, where no head lowers it)."""
        new = np.where(todo, np.minimum(2 * np.maximum(depth, 1), length), depth)
        gain = np.zeros(len(terms))
        for j in np.flatnonzero(todo):
            gain[j] = mult[j] * (nxt[j] - self._weight_at(terms[j], int(new[j]))) / (new[j] - depth[j])
        if gain.max() <= 0.0:
            return np.where(todo, np.minimum(4 * np.maximum(depth, 1), length), depth)
        return np.where(gain >= 0.5 * gain.max(), new, depth)


class QuestionPool(QADataset):
    """Questions over a corpus that stays out of memory (an index's document store, or a retrieval server).

    Unlike :class:`~tasks.types.QADataset` it runs no checks over the documents (that would read them all);
    questions' supporting titles are kept unresolved in ``meta``.
    """

    def __init__(self, documents: Sequence[Document], questions: list[Question], name: str) -> None:
        if not questions:
            raise ValueError(f"{name}: no questions")
        self.documents, self.questions, self.name = documents, questions, name


def _open_index(path: str) -> BM25Index:
    return BM25Index(path)


# ----------------------------------------------------------------------------------------------------------------
# CLI: memenv index build CORPUS OUT_DIR
# ----------------------------------------------------------------------------------------------------------------


def build_command(args) -> int:
    """``memenv index build``: build the index of ``args.corpus`` into ``args.out_dir`` and print a summary."""
    params = BM25Params(k1=args.k1, b=args.b, epsilon=args.epsilon)
    out = build_index(args.corpus, args.out_dir, params=params, chunk_docs=args.chunk_docs, workers=args.workers,
                      range_docs=args.range_docs)
    manifest = json.loads((out / MANIFEST).read_text(encoding="utf-8"))
    print(f"indexed {manifest['n_docs']} documents, {manifest['n_terms']} terms, {manifest['n_postings']} "
          f"postings in {manifest['build_seconds']['total']}s -> {out}")
    return 0


def register_cli(sub, run=build_command) -> None:
    """Add ``memenv index build CORPUS OUT_DIR`` to the ``memenv`` command's subparsers (``run`` executes it)."""
    index = sub.add_parser("index", help="build a disk-backed BM25 index of a corpus JSONL file")
    actions = index.add_subparsers(dest="index_command", required=True)
    build = actions.add_parser("build", help="index CORPUS (JSON Lines) into OUT_DIR")
    build.add_argument("corpus", help="corpus JSONL: {id, title, text} or {id, contents} per line")
    build.add_argument("out_dir", help="index folder to create, or an index to replace (atomically); any other "
                                       "existing folder or file is refused")
    build.add_argument("--k1", type=float, default=BM25Params.k1)
    build.add_argument("--b", type=float, default=BM25Params.b)
    build.add_argument("--epsilon", type=float, default=BM25Params.epsilon)
    build.add_argument("--chunk-docs", type=int, default=32768, help="documents per chunk (bounds memory)")
    build.add_argument("--workers", type=int, default=None, help="tokenising processes (default 2)")
    build.add_argument("--range-docs", type=int, default=8,
                       help="documents per range of the block-max bounds that prune queries (default 8)")
    build.set_defaults(func=run)
