"""``memenv index build CORPUS OUT_DIR`` (built into the ``memenv`` command: :mod:`memenv.cli`)."""

from __future__ import annotations

import json

from memenv.search.index.build import build_index
from memenv.search.index.format import MANIFEST, BM25Params


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
    build.add_argument("--k1", type=float, default=BM25Params.k1,
                       help=f"BM25 term-frequency saturation, > 0 (default {BM25Params.k1})")
    build.add_argument("--b", type=float, default=BM25Params.b,
                       help=f"BM25 document-length normalisation, in [0, 1] (default {BM25Params.b})")
    build.add_argument("--epsilon", type=float, default=BM25Params.epsilon,
                       help="BM25 Okapi's floor for negative IDF, as a fraction of the mean IDF, >= 0 "
                            f"(default {BM25Params.epsilon})")
    build.add_argument("--chunk-docs", type=int, default=32768,
                       help="documents per chunk (bounds memory; default 32768)")
    build.add_argument("--workers", type=int, default=None, help="tokenising processes (default 2)")
    build.add_argument("--range-docs", type=int, default=8,
                       help="documents per range of the block-max bounds that prune queries (default 8)")
    build.set_defaults(func=run)


__all__ = ["build_command", "register_cli"]
