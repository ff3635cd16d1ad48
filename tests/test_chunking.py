"""Long-document chunking (tasks/documents.py): a split paragraph is scanned once, piece by piece, and gives the
same chunks as splitting the whole paragraph per chunk did."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import memenv  # noqa: F401 - registers the envs
import tasks.documents as documents
from tasks.documents import DocumentPlan, paragraph_header, plan_long_document, skip_words
from tasks.types import Document, QADataset, Question


def _old_chunk_text(plan: DocumentPlan, c: int, docs) -> str:
    """The chunk text as it was rendered before (the whole paragraph split for every piece)."""
    start, end, piece = int(plan.chunk_start[c]), int(plan.chunk_end[c]), int(plan.chunk_piece[c])
    if piece >= 0:
        doc = docs[int(plan.paragraphs[start])]
        width = int(plan.piece_words[c])
        words = doc.text.split()[piece * width:(piece + 1) * width]
        return f"{paragraph_header(start + 1, doc.title)} {' '.join(words)}"
    paragraphs = [docs[int(plan.paragraphs[p])] for p in range(start, end)]
    return "\n".join(f"{paragraph_header(start + 1 + i, d.title)} {d.text}" for i, d in enumerate(paragraphs))


def _odd_whitespace_source() -> QADataset:
    """Paragraphs with every kind of whitespace str.split() knows, at the ends and between words."""
    seps = [" ", "  ", "\n", "\t", "\u00a0", "\u2003", "\u3000 ", "\x1c", " \r\n "]
    docs = []
    for i in range(30):
        words = [f"w{i}x{k}" for k in range(7 + 13 * i)]
        body = "".join(w + seps[(k + i) % len(seps)] for k, w in enumerate(words))
        docs.append(Document(f"d{i}", f"Doc title {i}", seps[i % len(seps)] + body))
    questions = [Question(f"q{i}", f"What about w{i}x0?", (f"w{i}x0",), (f"d{i}",)) for i in range(30)]
    return QADataset(docs, questions, name="odd-whitespace")


@pytest.mark.parametrize("chunk_tokens", [16, 37, 512])
@pytest.mark.parametrize("case", ["synthetic", "hotpotqa", "odd-whitespace"])
def test_chunks_identical_to_splitting_the_whole_paragraph(case: str, chunk_tokens: int, hotpot_path: str) -> None:
    kwargs = {"synthetic": {}, "hotpotqa": {"data_path": hotpot_path},
              "odd-whitespace": {"source": _odd_whitespace_source()}}[case]
    env = gym.make("MemRead-v0", doc_tokens=3000, chunk_tokens=chunk_tokens, **kwargs).unwrapped
    split_chunks = 0
    for seed in range(3):
        env.reset(seed=seed)
        plan, docs = env.plan, env.documents
        expected = [_old_chunk_text(plan, c, docs) for c in range(plan.n_chunks)]
        assert list(env.iter_chunks()) == expected
        assert [env.chunk(c) for c in reversed(range(plan.n_chunks))] == expected[::-1]  # random access too
        split_chunks += int((plan.chunk_piece >= 0).sum())
    assert split_chunks > 0 or chunk_tokens > 16  # at 16 tokens every generator has paragraphs to split


class _NoWholeSplit(str):
    """A paragraph text that fails the test if anything splits it whole."""

    def split(self, *args, **kwargs):
        raise AssertionError("the whole paragraph was split")


def test_huge_single_paragraph_is_scanned_once(monkeypatch: pytest.MonkeyPatch) -> None:
    n_words, chunk_tokens = 2_000_000, 512
    seps = [" ", "  ", "\n", " \t"]
    text = _NoWholeSplit("".join(f"w{i}{seps[i % 4]}" for i in range(n_words)))
    docs = [Document("big", "Big", text)]
    header = len(paragraph_header(1, "Big").split())
    plan = plan_long_document(np.random.default_rng(0), np.array([header], np.int32), np.array([n_words], np.int32),
                              [0], n_words + header, chunk_tokens)
    width = chunk_tokens - header
    assert plan.n_chunks == -(-n_words // width) and (plan.chunk_piece == np.arange(plan.n_chunks)).all()

    spans: list[tuple[int, int, int]] = []  # (chunk being read, start, end) of every scan

    def counting_skip(text: str, start: int, n: int) -> int:
        end = skip_words(text, start, n)
        spans.append((reading, start, end))
        return end

    monkeypatch.setattr(documents, "skip_words", counting_skip)
    for reading in range(plan.n_chunks):
        chunk = plan.chunk_text(reading, docs)
        if reading in (0, plan.n_chunks // 2, plan.n_chunks - 1):
            first = reading * width
            assert chunk.startswith(f"Doc 1 (Title: Big) w{first} w{first + 1} ")
            assert chunk.endswith(f" w{min(first + width, n_words) - 1}")
    # One scan per chunk, each over that chunk's own words only, contiguous: the paragraph is scanned once.
    assert [r for r, _, _ in spans] == list(range(plan.n_chunks))
    assert spans[0][1] == 0 and not str.strip(text[spans[-1][2]:])
    assert all(prev[2] == cur[1] for prev, cur in zip(spans, spans[1:]))
    assert max(len(str.split(text[s:e])) for _, s, e in spans) == width
    # Going back to an earlier piece costs no new scan.
    plan.chunk_text(3, docs)
    assert len(spans) == plan.n_chunks


def test_skip_words_counts_words_like_str_split() -> None:
    text = "  alpha\u00a0beta\t\tgamma\n delta  "
    for n in range(1, 6):
        end = skip_words(text, 0, n)
        assert text[:end].split() == text.split()[:n]
        assert text[end:].split() == text.split()[n:]
    assert skip_words(text, len(text), 3) == len(text)
    assert skip_words("   ", 0, 2) == 3
