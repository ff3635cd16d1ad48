"""A disk-backed BM25 index: built in bounded memory, memory-mapped back, shared read-only by every process.

:func:`~memenv.search.index.build.build_index` streams a corpus JSON Lines file (``{"id", "title", "text"}`` or
Search-R1/FlashRAG ``{"id", "contents"}``, the rules of :func:`tasks.corpus.load_corpus_jsonl`) into a directory::

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
block-max pruning over fixed document ranges instead (see :meth:`~memenv.search.index.search.BM25Index.search`),
which also bounds the queries made only of common terms that the threshold algorithm cannot prune.

What is indexed is ``sanitize(title) + "\\n" + sanitize(text)`` (:func:`memenv.envs.base.sanitize`), exactly the
text MemQA indexes in memory, so an env over an index ranks as one over the loaded corpus.
"""

# Where each part lives:
# - format.py: the on-disk format (file names, manifest constants, BM25Params, the errors, the corpus fingerprint,
#   the .npy header reader and the block-max range peaks that the build writes and the search reads);
# - build.py: build_index (bounded-memory build, atomic swap, stale build folders);
# - verify.py: what opening an index checks (the manifest, each file against it, the arrays against each other);
# - search.py: BM25Index (opened and verified through verify.py; exact top-k by block-max or threshold pruning)
#   and QuestionPool;
# - store.py: DocumentStore, the documents read on demand (the search's, and the build's duplicate-id check);
# - cli.py: `memenv index build CORPUS OUT_DIR`.
