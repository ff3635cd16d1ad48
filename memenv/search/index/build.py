"""Building a disk index (:func:`build_index`): the corpus streamed in chunks of ``chunk_docs`` documents,
tokenised in worker processes, counted into temporary runs and merged ``merge_postings`` at a time into the
posting lists, the block-max bounds and the document store, under a temporary folder beside ``out_dir`` that is
renamed into place. What the build refuses, and what it cleans up, is in :mod:`memenv.search.index`."""

from __future__ import annotations

import hashlib
import json
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
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from memenv.context import sanitize
from memenv.search.bm25 import STOPWORDS, check_bm25_params, okapi_doc_norm, okapi_idf, okapi_weights, word_tokens
from memenv.search.index.format import (_CHECK_BYTES, FORMAT, FORMAT_VERSION, INDEX_FILES, INDEXED_TEXT, MANIFEST,
                                        TOKENIZER, BM25Params, IndexMismatchError, _npy_header, _range_peaks,
                                        corpus_fingerprint)
from memenv.search.index.store import DocumentStore
from tasks.corpus import RecordLocation, document_from_record
from tasks.types import DataFormatError

#: What a build's temporary folder holds besides index files.
_BUILD_FILES = ("run_tid.bin", "run_did.bin", "run_tf.bin", "build-owner.json")
_OWNER = "build-owner.json"
#: A leftover build folder without a live owner on this host is removed once nothing in it changed for this long.
_STALE_SECONDS = 3600.0


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
    if corpus_path.is_dir():
        raise IsADirectoryError(f"corpus {corpus_path} is a folder, not a file (JSON lines of documents)")
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
    """What the manifest records of an index file (checked on open by
    :meth:`memenv.search.index.verify._IndexFiles.check_file`): its size, CRC-32s of its first and last 64 KiB, and
    an array's dtype and shape."""
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
    """Write ``term_max``, ``range_row`` and ``range_max`` (see :mod:`memenv.search.index`) from the finished lists.

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


__all__ = ["build_index"]
