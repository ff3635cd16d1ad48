"""memenv.search.index: a build loses nothing it did not make, an index checks itself on open, BM25 parameters
are checked where they enter."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

import memenv  # noqa: F401 - registers the environments
from memenv.cli import main as cli_main
from memenv.search.bm25 import check_bm25_params
from memenv.search.index.build import build_index
from memenv.search.index.format import INDEX_FILES, BM25Params, IndexCorruptError
from memenv.search.index.search import BM25Index
from tasks.types import DataFormatError

WORDS = ["alpha", "beta", "gamma", "delta", "eps", "zeta", "eta", "theta"]


def write_corpus(path: Path, n: int = 200, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    path.write_text("".join(json.dumps({"id": f"d{i}", "title": f"T{i % 7}",
                                        "text": " ".join(rng.choice(WORDS, int(rng.integers(1, 12))))}) + "\n"
                            for i in range(n)), encoding="utf-8")
    return path


def error_line(err: str) -> str:
    """The one error line of a CLI run's stderr (progress bars aside), after checking there is no traceback."""
    lines = [line for line in err.splitlines() if "error:" in line]
    assert "Traceback" not in err and len(lines) == 1 and lines[0].startswith("memenv index: error: "), err
    return lines[0]


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (hidden ones included) with its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, Path]:
    """``(corpus, index)``: one small index, copied by each test that damages it."""
    root = tmp_path_factory.mktemp("built")
    corpus = write_corpus(root / "c.jsonl", n=300)
    build_index(corpus, root / "idx", progress=False, workers=0, range_docs=4)
    return corpus, root / "idx"


def damaged_copy(built, tmp_path: Path, legacy: bool = False) -> Path:
    """A copy of the built index; ``legacy``: its manifest without the file records (as indexes built before
    they were written)."""
    out = tmp_path / "copy"
    shutil.copytree(built[1], out)
    if legacy:
        manifest = json.loads((out / "manifest.json").read_text())
        del manifest["files"]
        (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return out


# ------------------------------------------------------------------------------------------------ build safety


def test_build_into_the_corpus_folder_refuses_and_keeps_every_file(tmp_path, capsys):
    data = tmp_path / "data"
    data.mkdir()
    write_corpus(data / "corpus.jsonl")
    (data / "notes.txt").write_text("mine\n")
    before = snapshot(tmp_path)
    assert cli_main(["index", "build", str(data / "corpus.jsonl"), str(data), "--workers", "0"]) == 2
    err = error_line(capsys.readouterr().err)
    assert "holds the corpus" in err and str(data) in err
    assert snapshot(tmp_path) == before and sorted(os.listdir(tmp_path)) == ["data"]
    # A subfolder holding the corpus, and a symlink to the folder, are refused the same way.
    (data / "sub").mkdir()
    shutil.move(data / "corpus.jsonl", data / "sub" / "corpus.jsonl")
    (tmp_path / "link").symlink_to(data)
    before = snapshot(tmp_path)
    for out in (data, tmp_path / "link"):
        with pytest.raises(ValueError, match="holds the corpus"):
            build_index(data / "sub" / "corpus.jsonl", out, progress=False, workers=0)
    assert snapshot(tmp_path) == before


def test_build_onto_the_corpus_file_refuses_and_leaves_it_unchanged(tmp_path, capsys):
    corpus = write_corpus(tmp_path / "c.jsonl")
    before = corpus.read_bytes()
    assert cli_main(["index", "build", str(corpus), str(corpus), "--workers", "0"]) == 2
    assert "is the corpus file itself" in error_line(capsys.readouterr().err)
    assert corpus.read_bytes() == before and os.listdir(tmp_path) == ["c.jsonl"]


def test_build_refuses_a_folder_or_file_that_is_not_an_index(tmp_path, capsys):
    corpus = write_corpus(tmp_path / "c.jsonl")
    other = tmp_path / "other"
    other.mkdir()
    (other / "docs.jsonl").write_text("not an index's\n")  # an index file name alone does not make an index
    (tmp_path / "plain.txt").write_text("x\n")
    foreign_manifest = tmp_path / "foreign"
    foreign_manifest.mkdir()
    (foreign_manifest / "manifest.json").write_text('{"format": "something-else"}\n')
    before = snapshot(tmp_path)
    for out, expected in ((other, "is not a memenv index (it holds 'docs.jsonl')"),
                          (tmp_path / "plain.txt", "exists and is not a folder"),
                          (foreign_manifest, "is not a memenv index")):
        assert cli_main(["index", "build", str(corpus), str(out), "--workers", "0"]) == 2
        assert expected in error_line(capsys.readouterr().err)
    assert snapshot(tmp_path) == before


def test_an_index_holding_a_file_of_the_users_is_not_replaced(tmp_path):
    corpus = write_corpus(tmp_path / "c.jsonl")
    build_index(corpus, tmp_path / "idx", progress=False, workers=0)
    (tmp_path / "idx" / "zz-notes.txt").write_text("my notes about this index\n")  # sorts after the index files
    with pytest.raises(ValueError, match=r"is not a memenv index \(it holds 'zz-notes.txt' and 15 more"):
        build_index(corpus, tmp_path / "idx", progress=False, workers=0)
    assert (tmp_path / "idx" / "zz-notes.txt").read_text() == "my notes about this index\n"


def test_replacing_an_index_and_an_empty_folder_still_works(tmp_path):
    corpus = write_corpus(tmp_path / "c.jsonl")
    (tmp_path / "idx").mkdir()  # empty: replaced
    build_index(corpus, tmp_path / "idx", progress=False, workers=0, params=BM25Params(k1=1.2))
    assert BM25Index(tmp_path / "idx").k1 == 1.2
    build_index(corpus, tmp_path / "idx", progress=False, workers=0, params=BM25Params(k1=0.9))
    assert BM25Index(tmp_path / "idx").k1 == 0.9
    # A damaged index (its manifest cut) is still recognised as one, so building again repairs it.
    manifest = tmp_path / "idx" / "manifest.json"
    manifest.write_bytes(manifest.read_bytes()[:60])
    (tmp_path / "idx" / "post_doc.npy").unlink()
    build_index(corpus, tmp_path / "idx", progress=False, workers=0)
    assert BM25Index(tmp_path / "idx").k1 == 1.5
    # Through a symlink: the index it points to is replaced, the link kept.
    (tmp_path / "link").symlink_to(tmp_path / "idx")
    build_index(corpus, tmp_path / "link", progress=False, workers=0, params=BM25Params(b=0.5))
    assert (tmp_path / "link").is_symlink() and BM25Index(tmp_path / "idx").b == 0.5
    (tmp_path / "link").unlink()
    assert sorted(os.listdir(tmp_path)) == ["c.jsonl", "idx"]  # nothing left beside it


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def fake_build_folder(parent: Path, name: str, owner: dict | None, extra: tuple[str, ...] = ()) -> Path:
    folder = parent / name
    folder.mkdir()
    (folder / "run_tid.bin").write_bytes(b"\0" * 64)
    (folder / "docs.jsonl").write_text('{"id": "a", "text": "x"}\n')
    if owner is not None:
        (folder / "build-owner.json").write_text(json.dumps(owner))
    for item in extra:
        (folder / item).write_text("mine\n")
    return folder


def test_leftovers_of_dead_builds_are_removed_and_live_ones_kept(tmp_path):
    corpus = write_corpus(tmp_path / "c.jsonl")
    host = socket.gethostname()
    dead = fake_build_folder(tmp_path, f".idx.building-{dead_pid()}-abcd1234", {"host": host, "pid": dead_pid()})
    live_proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        live = fake_build_folder(tmp_path, f".idx.building-{live_proc.pid}-efgh5678",
                                 {"host": host, "pid": live_proc.pid})
        elsewhere = fake_build_folder(tmp_path, ".idx.building-1-ijkl", {"host": host + "-other", "pid": 1})
        legacy_old = fake_build_folder(tmp_path, ".idx.building-q7x_k2ab", None)  # name without a pid
        stamp = time.time() - 2 * 3600
        for path in (legacy_old, *legacy_old.iterdir()):
            os.utime(path, (stamp, stamp))
        legacy_recent = fake_build_folder(tmp_path, ".idx.building-z9y8x7w6", None)
        users = fake_build_folder(tmp_path, f".idx.building-{dead_pid()}-mnop",
                                  {"host": host, "pid": dead_pid()}, extra=("thesis.tex",))
        # An index moved aside by a killed replacement is removed; a file moved aside (the corpus, by earlier
        # versions given the corpus as OUT_DIR) is kept, with a warning.
        build_index(corpus, tmp_path / "prev", progress=False, workers=0)
        os.replace(tmp_path / "prev", tmp_path / f".idx.old-{dead_pid()}")
        moved_corpus = tmp_path / ".idx.old-4242"
        shutil.copy(corpus, moved_corpus)
        with pytest.warns(UserWarning, match=r"\.idx\.old-4242 was left beside .* is not an index; it is kept"):
            build_index(corpus, tmp_path / "idx", progress=False, workers=0)
        left = sorted(os.listdir(tmp_path))
        assert dead.name not in left and legacy_old.name not in left
        assert not any(name.startswith(".idx.old-") and name != moved_corpus.name for name in left)
        for kept in (live, elsewhere, legacy_recent, users, moved_corpus):
            assert kept.name in left, kept
        assert (users / "thesis.tex").read_text() == "mine\n" and moved_corpus.read_bytes() == corpus.read_bytes()
        assert (live / "run_tid.bin").is_file()
        BM25Index(tmp_path / "idx")
    finally:
        live_proc.kill()
        live_proc.wait()


def test_a_killed_build_is_cleaned_by_the_next_one(tmp_path):
    """A real build killed mid-way (SIGKILL: no clean-up runs) leaves its folder; the next build removes it."""
    corpus = write_corpus(tmp_path / "c.jsonl", n=60000)
    script = ("import sys; from memenv.search.index.build import build_index; "
              "build_index(sys.argv[1], sys.argv[2], progress=False, workers=0, chunk_docs=500)")
    proc = subprocess.Popen([sys.executable, "-c", script, str(corpus), str(tmp_path / "idx")])
    try:
        deadline = time.monotonic() + 60
        leftover = None
        while time.monotonic() < deadline and proc.poll() is None:
            found = [p for p in tmp_path.iterdir() if p.name.startswith(".idx.building-")]
            if found and (found[0] / "run_tid.bin").is_file() and (found[0] / "run_tid.bin").stat().st_size:
                leftover = found[0]
                break
            time.sleep(0.01)
        assert leftover is not None, "the build ended before it could be killed"
        proc.kill()
    finally:
        proc.kill()
        proc.wait()
    assert leftover.is_dir() and not (tmp_path / "idx").exists()
    build_index(write_corpus(tmp_path / "small.jsonl"), tmp_path / "idx", progress=False, workers=0)
    assert sorted(os.listdir(tmp_path)) == ["c.jsonl", "idx", "small.jsonl"]


def test_a_build_that_fails_leaves_nothing_behind(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "text": "x"}\n{"id": "a", "text": "y"}\n')
    with pytest.raises(DataFormatError, match="duplicate document id"):
        build_index(bad, tmp_path / "idx", progress=False, workers=0)
    assert os.listdir(tmp_path) == ["bad.jsonl"]


# ------------------------------------------------------------------------------------------------ BM25 parameters


@pytest.mark.parametrize("option,value,expected", [
    ("--k1", "nan", "k1 must be a finite number > 0, got nan"),
    ("--k1", "-1", "k1 must be a finite number > 0, got -1.0"),
    ("--k1", "0", "k1 must be a finite number > 0, got 0.0"),
    ("--k1", "inf", "k1 must be a finite number > 0, got inf"),
    ("--b", "5", "b must be a finite number in [0, 1], got 5.0"),
    ("--b", "-0.1", "b must be a finite number in [0, 1], got -0.1"),
    ("--epsilon", "nan", "epsilon must be a finite number >= 0, got nan"),
])
def test_cli_refuses_bad_bm25_parameters_before_any_work(tmp_path, capsys, option, value, expected):
    corpus = write_corpus(tmp_path / "c.jsonl")
    assert cli_main(["index", "build", str(corpus), str(tmp_path / "out"), "--workers", "0", option, value]) == 2
    assert expected in error_line(capsys.readouterr().err)
    assert os.listdir(tmp_path) == ["c.jsonl"]


def test_python_api_checks_bm25_parameters():
    for kwargs, expected in ((dict(k1=float("nan")), "k1 must be"), (dict(k1=-1.0), "k1 must be"),
                             (dict(b=1.5), "b must be"), (dict(epsilon=-0.1), "epsilon must be")):
        with pytest.raises(ValueError, match=expected):
            BM25Params(**kwargs)
    with pytest.raises(TypeError, match="k1 must be a finite number > 0, got True"):
        BM25Params(k1=True)
    assert check_bm25_params(1, 0, 0) == (1.0, 0.0, 0.0) and check_bm25_params(2.0, 1.0, 0.5) == (2.0, 1.0, 0.5)


def test_an_index_whose_manifest_holds_bad_parameters_is_refused(built, tmp_path):
    out = damaged_copy(built, tmp_path)
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["params"]["k1"] = float("nan")  # json writes NaN
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(IndexCorruptError, match=r"manifest\.json: BM25 parameter k1 must be a finite number > 0"):
        BM25Index(out)


# ------------------------------------------------------------------------------------------------ verification


def test_a_sound_index_opens_and_its_manifest_records_every_file(built):
    manifest = json.loads((built[1] / "manifest.json").read_text())
    assert set(manifest["files"]) == set(INDEX_FILES)
    for name, record in manifest["files"].items():
        assert record["size"] == (built[1] / name).stat().st_size
        assert ("shape" in record) == name.endswith(".npy")
    index = BM25Index(built[1])
    assert index.search("alpha beta", 3) and len(index.vocab) == manifest["n_terms"]


def cut(fraction: float):
    def apply(path: Path) -> None:
        data = path.read_bytes()
        path.write_bytes(data[: int(len(data) * fraction)])
    return apply


def shorter_array(path: Path) -> None:
    np.save(path, np.load(path)[:-3])


def cut_mid_line(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: data.rindex(b"\n", 0, len(data) - 1) + 5])  # into the last record


@pytest.mark.parametrize("legacy", [False, True], ids=["recorded", "legacy-manifest"])
@pytest.mark.parametrize("name,damage,expected", [
    ("post_doc.npy", shorter_array, r"post_doc\.npy: (\d+ bytes, \d+ when the index was built|shape \(\d+,\), "
                                    r"expected \(\d+,\) \(one per posting: n_postings)"),
    ("terms.txt", cut(0.5), r"terms\.txt: (\d+ bytes, \d+ when the index was built|\d+ bytes not ending a line|"
                            r"\d+ terms, the manifest says n_terms)"),
    ("docs.jsonl", cut_mid_line, r"docs\.jsonl: \d+ bytes(, \d+ when the index was built|, but its offsets)"),
    ("manifest.json", cut(0.5), r"manifest\.json: not valid JSON \(.*cut or damaged\)"),
])
def test_damaged_index_is_refused_on_open_naming_the_file(built, tmp_path, legacy, name, damage, expected):
    out = damaged_copy(built, tmp_path, legacy=legacy)
    damage(out / name)
    with pytest.raises(IndexCorruptError, match=expected) as caught:
        BM25Index(out)
    message = str(caught.value)
    assert len(message.splitlines()) == 1 and str(out / name) in message and "memenv index build" in message
    assert isinstance(caught.value, DataFormatError)


@pytest.mark.parametrize("legacy", [False, True], ids=["recorded", "legacy-manifest"])
@pytest.mark.parametrize("name", [n for n in INDEX_FILES if n.endswith(".npy")])
def test_every_truncated_array_is_refused_on_open(built, tmp_path, legacy, name):
    out = damaged_copy(built, tmp_path, legacy=legacy)
    path = out / name
    path.write_bytes(path.read_bytes()[:-1])
    expected = r"\d+ bytes, \d+ when the index was built" if not legacy else r"\d+ bytes of data where its header"
    with pytest.raises(IndexCorruptError, match=rf"{name.replace('.', '[.]')}: {expected}"):
        BM25Index(out)


@pytest.mark.parametrize("name", ("manifest.json",) + INDEX_FILES)
def test_a_missing_file_is_refused_on_open(built, tmp_path, name):
    out = damaged_copy(built, tmp_path)
    (out / name).unlink()
    with pytest.raises(IndexCorruptError, match=rf"{name.replace('.', '[.]')}: missing; build the index again"):
        BM25Index(out)


def test_an_array_replaced_by_another_of_the_same_size_is_refused(built, tmp_path):
    out = damaged_copy(built, tmp_path)
    post_tf = np.load(out / "post_tf.npy")
    np.save(out / "post_tf.npy", np.zeros_like(post_tf))  # same dtype, shape and size: the checksums differ
    with pytest.raises(IndexCorruptError, match=r"post_tf\.npy: its first \d+ bytes differ"):
        BM25Index(out)
    legacy = damaged_copy(built, tmp_path / "l", legacy=True)
    np.save(legacy / "idf.npy", np.zeros(3, dtype=np.float32))
    with pytest.raises(IndexCorruptError, match=r"idf\.npy: dtype float32, expected float64"):
        BM25Index(legacy)


def test_a_legacy_index_without_file_records_still_opens_and_ranks_the_same(built, tmp_path):
    out = damaged_copy(built, tmp_path, legacy=True)
    assert BM25Index(out).search("gamma delta", 5) == BM25Index(built[1]).search("gamma delta", 5)


def test_a_damaged_index_fails_at_gym_make_not_at_step(built, tmp_path):
    questions = tmp_path / "q.jsonl"
    questions.write_text("".join(json.dumps({"id": f"q{i}", "question": f"What about {w}?", "answers": [w]}) + "\n"
                                 for i, w in enumerate(WORDS)))
    out = damaged_copy(built, tmp_path)
    shorter_array(out / "post_doc.npy")
    with pytest.raises(IndexCorruptError, match=r"post_doc\.npy"):
        gym.make("MemQA-v0", index_path=out, questions_path=questions)
    out2 = damaged_copy(built, tmp_path / "b")
    cut_mid_line(out2 / "docs.jsonl")
    with pytest.raises(IndexCorruptError, match=r"docs\.jsonl"):
        gym.make("MemQA-v0", index_path=out2, questions_path=questions)


def test_an_index_replaced_after_a_first_make_is_verified_again(built, tmp_path):
    # Envs share one opened index per path; a folder rebuilt (or swapped) since must not reuse the old one.
    questions = tmp_path / "q.jsonl"
    questions.write_text("".join(json.dumps({"id": f"q{i}", "question": f"What about {w}?", "answers": [w]}) + "\n"
                                 for i, w in enumerate(WORDS)))
    out = damaged_copy(built, tmp_path)
    gym.make("MemQA-v0", index_path=out, questions_path=questions).close()
    shutil.rmtree(out)
    out = damaged_copy(built, tmp_path)  # a fresh manifest file at the same path
    shorter_array(out / "post_doc.npy")
    with pytest.raises(IndexCorruptError, match=r"post_doc\.npy"):
        gym.make("MemQA-v0", index_path=out, questions_path=questions)


def test_a_store_damaged_after_open_names_the_record(built, tmp_path):
    out = damaged_copy(built, tmp_path)
    index = BM25Index(out)
    data = bytearray((out / "docs.jsonl").read_bytes())
    start = int(index.documents.offsets[5])
    data[start] = ord("#")  # same size: only reading the record can tell
    (out / "docs.jsonl").write_bytes(bytes(data))
    with pytest.raises(IndexCorruptError, match=r"docs\.jsonl: line 6: not a JSON record"):
        index.documents[5]


def test_open_reads_a_bounded_amount_of_each_file(tmp_path, monkeypatch):
    """The checks on open read a file's head and tail (64 KiB each) and a few bytes of the store, never a whole
    large file: opening stays cheap however large the index."""
    import builtins

    rng = np.random.default_rng(3)
    vocab = [f"w{i}" for i in range(2000)]
    corpus = tmp_path / "big.jsonl"
    corpus.write_text("".join(json.dumps({"id": str(i), "text": " ".join(rng.choice(vocab, 50))}) + "\n"
                              for i in range(4000)), encoding="utf-8")
    build_index(corpus, tmp_path / "idx", progress=False, workers=0)
    folder = tmp_path / "idx"
    read: dict[str, int] = {}
    real_open = builtins.open

    class Counting:
        def __init__(self, f, name):
            self.f, self.name = f, name

        def read(self, n=-1):
            data = self.f.read(n)
            read[self.name] = read.get(self.name, 0) + len(data)
            return data

        def __getattr__(self, attr):
            return getattr(self.f, attr)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    def counting_open(file, mode="r", *args, **kwargs):
        f = real_open(file, mode, *args, **kwargs)
        inside = isinstance(file, (str, os.PathLike)) and Path(file).parent == folder
        return Counting(f, Path(file).name) if inside and "b" in mode else f

    monkeypatch.setattr(builtins, "open", counting_open)
    index = BM25Index(folder)
    monkeypatch.undo()
    large = [p.name for p in folder.iterdir() if p.stat().st_size > 4 * (1 << 16)]
    assert {"docs.jsonl", "post_doc.npy", "impact_doc.npy"} <= set(large)
    assert read["docs.jsonl"] >= 2 * (1 << 16)  # its head and tail were read (the counting works)
    for name in large:
        assert read.get(name, 0) <= 2 * (1 << 16) + 8192, (name, read.get(name))
    assert index.search("w1 w2", 3)


# ------------------------------------------------------------------------------------------------ corpus text


def test_a_corpus_id_with_a_lone_surrogate_names_file_and_line(tmp_path, capsys):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"id": "a", "text": "x"}\n\n{"id": "b\\ud800", "text": "y"}\n', encoding="utf-8")
    with pytest.raises(DataFormatError, match=r"c\.jsonl: line 3: id 'b\\ud800' is not valid Unicode text: lone "
                                              r"surrogate '\\ud800' at character 1"):
        build_index(corpus, tmp_path / "idx", progress=False, workers=0)
    assert cli_main(["index", "build", str(corpus), str(tmp_path / "idx"), "--workers", "0"]) == 2
    assert "c.jsonl: line 3:" in error_line(capsys.readouterr().err)
    # Lone surrogates in a title or text are replaced when indexed, as in memory: the build goes on.
    corpus.write_text('{"id": "a", "title": "t\\udc00", "text": "x\\ud800 alpha"}\n{"id": "b", "text": "beta"}\n'
                      '{"id": "c", "text": "gamma"}\n', encoding="utf-8")
    build_index(corpus, tmp_path / "idx", progress=False, workers=0)
    index = BM25Index(tmp_path / "idx")
    assert index.search("alpha", 1) == [0] and index.documents[0].text == "x\ufffd alpha"
