"""Tests for the real-data loaders: HotpotQA (both layouts) and generic corpus + questions pairs."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from tasks.corpus import load_corpus_jsonl, load_qa_pair, load_questions_jsonl
from tasks.hotpot import load_hotpotqa
from tasks.types import DataFormatError, Document, QADataset

REAL_HOTPOT = Path(__file__).resolve().parents[2] / "shared" / "data" / "hotpotqa" / "hotpot_dev_distractor_1100.json"

# ----------------------------------------------------------------------------------------------------------------
# HotpotQA fixtures
# ----------------------------------------------------------------------------------------------------------------

OFFICIAL_ITEMS = [
    {
        "_id": "q1",
        "question": "Which city hosts the band's first show?",
        "answer": "Tulsa",
        "type": "bridge",
        "level": "hard",
        "supporting_facts": [["Album A", 0], ["Band B", 1], ["Album A", 1]],
        "context": [
            ["Distractor", ["Nothing  here.", " Really\tnothing."]],
            ["Album A", ["Album A is by Band B.", " It was released in 2009."]],
            ["Band B", ["Band B is a group.", " Their first show was in Tulsa."]],
        ],
    },
    {
        "_id": "q2",
        "question": "Are Band B and Band C both groups?",
        "answer": "yes",
        "type": "comparison",
        "level": "medium",
        "supporting_facts": [["Band C", 0], ["Band B", 0]],
        "context": [
            ["Band B", ["Band B is a group.", " Their first show was in Tulsa."]],  # same paragraph as in q1
            ["Band C", ["Band C is a group too."]],
            ["Distractor", ["A different paragraph under the same title."]],
        ],
    },
]


def to_hf(item: dict) -> dict:
    """The same item in the Hugging Face ``datasets`` layout."""
    return {
        "id": item["_id"],
        "question": item["question"],
        "answer": item["answer"],
        "type": item["type"],
        "level": item["level"],
        "supporting_facts": {
            "title": [t for t, _ in item["supporting_facts"]],
            "sent_id": [s for _, s in item["supporting_facts"]],
        },
        "context": {"title": [t for t, _ in item["context"]], "sentences": [s for _, s in item["context"]]},
    }


def write_json(path: Path, obj) -> Path:
    path.write_text(json.dumps(obj, indent=1), encoding="utf-8")
    return path


def write_jsonl(path: Path, records: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def dataset_view(ds: QADataset) -> tuple:
    """Everything a layout could change, meta included (``Question`` equality ignores meta)."""
    return ds.documents, [(q, q.meta) for q in ds.questions]


# ----------------------------------------------------------------------------------------------------------------
# HotpotQA: content
# ----------------------------------------------------------------------------------------------------------------


def test_hotpot_official_layout(tmp_path: Path) -> None:
    ds = load_hotpotqa(write_json(tmp_path / "hotpot.json", OFFICIAL_ITEMS))
    assert len(ds) == 2
    by_id = {d.id: d for d in ds.documents}
    # Pooled and deduplicated: the Band B paragraph appears once; the second "Distractor" text gets a suffix.
    assert [d.id for d in ds.documents] == ["Distractor", "Album A", "Band B", "Band C", "Distractor (2)"]
    assert by_id["Distractor"].text == "Nothing here. Really nothing."
    assert by_id["Distractor (2)"].title == "Distractor"
    assert by_id["Band B"].text == "Band B is a group. Their first show was in Tulsa."

    q1, q2 = ds.questions
    assert q1.id == "q1" and q1.answers == ("Tulsa",) and q1.kind == "bridge"
    assert q1.supporting_ids == ("Album A", "Band B") and q1.hops == 2
    assert q1.meta["level"] == "hard"
    assert q1.meta["supporting_facts"] == [("Album A", 0), ("Band B", 1), ("Album A", 1)]
    assert q2.kind == "comparison" and q2.supporting_ids == ("Band C", "Band B") and q2.hops == 2


def test_hotpot_layouts_agree(tmp_path: Path) -> None:
    official = load_hotpotqa(write_json(tmp_path / "official.json", OFFICIAL_ITEMS))
    hf_items = [to_hf(item) for item in OFFICIAL_ITEMS]
    hf_array = load_hotpotqa(write_json(tmp_path / "hf.json", hf_items))
    hf_lines = load_hotpotqa(write_jsonl(tmp_path / "hf.jsonl", hf_items))
    mixed = load_hotpotqa(write_jsonl(tmp_path / "mixed.jsonl", [OFFICIAL_ITEMS[0], hf_items[1]]))
    assert dataset_view(hf_array) == dataset_view(official)
    assert dataset_view(hf_lines) == dataset_view(official)
    assert dataset_view(mixed) == dataset_view(official)


def test_hotpot_limit_keeps_first_items_and_their_corpus(tmp_path: Path) -> None:
    ds = load_hotpotqa(write_json(tmp_path / "hotpot.json", OFFICIAL_ITEMS), limit=1)
    assert [q.id for q in ds.questions] == ["q1"]
    assert [d.id for d in ds.documents] == ["Distractor", "Album A", "Band B"]
    with pytest.raises(ValueError):
        load_hotpotqa(tmp_path / "hotpot.json", limit=0)


def test_hotpot_suffix_skips_real_titles(tmp_path: Path) -> None:
    items = [
        {**OFFICIAL_ITEMS[0], "_id": "a", "context": [["X", ["one"]], ["X (2)", ["real title"]]],
         "supporting_facts": [["X", 0]]},
        {**OFFICIAL_ITEMS[0], "_id": "b", "context": [["X", ["two"]]], "supporting_facts": [["X", 0]]},
    ]
    ds = load_hotpotqa(write_json(tmp_path / "h.json", items))
    assert [d.id for d in ds.documents] == ["X", "X (2)", "X (3)"]
    assert ds.questions[1].supporting_ids == ("X (3)",)  # the item's own paragraph, not the first "X"
    assert ds.questions[1].hops == 1


def test_hotpot_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.json"
    with pytest.raises(FileNotFoundError, match="nope.json"):
        load_hotpotqa(missing)


# ----------------------------------------------------------------------------------------------------------------
# HotpotQA: malformed input
# ----------------------------------------------------------------------------------------------------------------


def test_hotpot_missing_key_names_record(tmp_path: Path) -> None:
    items = [dict(item) for item in OFFICIAL_ITEMS]
    del items[1]["answer"]
    path = write_json(tmp_path / "bad_key.json", items)
    with pytest.raises(DataFormatError) as err:
        load_hotpotqa(path)
    msg = str(err.value)
    assert "bad_key.json" in msg and "record 1" in msg and "'answer'" in msg


def test_hotpot_missing_nested_key_hf(tmp_path: Path) -> None:
    items = [to_hf(item) for item in OFFICIAL_ITEMS]
    del items[1]["context"]["sentences"]
    path = write_jsonl(tmp_path / "bad_nested.jsonl", items)
    with pytest.raises(DataFormatError, match=r"bad_nested\.jsonl: line 2: context: missing key 'sentences'"):
        load_hotpotqa(path)


def test_hotpot_wrong_type(tmp_path: Path) -> None:
    items = [dict(item) for item in OFFICIAL_ITEMS]
    items[0]["context"] = [["Album A", "not a list of sentences"]]
    path = write_json(tmp_path / "bad_type.json", items)
    with pytest.raises(DataFormatError, match=r"bad_type\.json: record 0 .*context\[0\]\[1\]"):
        load_hotpotqa(path)


def test_hotpot_invalid_json_line(tmp_path: Path) -> None:
    lines = [json.dumps(to_hf(OFFICIAL_ITEMS[0])), "{not json}", json.dumps(to_hf(OFFICIAL_ITEMS[1]))]
    path = tmp_path / "bad_line.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(DataFormatError) as err:
        load_hotpotqa(path)
    msg = str(err.value)
    assert "bad_line.jsonl" in msg and "line 2" in msg and "invalid JSON" in msg


def test_hotpot_truncated_array(tmp_path: Path) -> None:
    text = json.dumps(OFFICIAL_ITEMS, indent=1)
    path = tmp_path / "cut.json"
    path.write_text(text[: len(text) * 3 // 4], encoding="utf-8")
    with pytest.raises(DataFormatError) as err:
        load_hotpotqa(path)
    msg = str(err.value)
    assert "cut.json" in msg and "record 1" in msg and "truncated" in msg


def test_hotpot_truncated_jsonl(tmp_path: Path) -> None:
    text = "".join(json.dumps(to_hf(item)) + "\n" for item in OFFICIAL_ITEMS)
    path = tmp_path / "cut.jsonl"
    path.write_text(text[:-40], encoding="utf-8")
    with pytest.raises(DataFormatError) as err:
        load_hotpotqa(path)
    msg = str(err.value)
    assert "cut.jsonl" in msg and "line 2" in msg and "truncated" in msg


def test_hotpot_array_not_closed(tmp_path: Path) -> None:
    path = tmp_path / "open.json"
    path.write_text(json.dumps(OFFICIAL_ITEMS)[:-1], encoding="utf-8")
    with pytest.raises(DataFormatError, match=r"open\.json: record 1 .*truncated"):
        load_hotpotqa(path)


def test_hotpot_unknown_supporting_title(tmp_path: Path) -> None:
    items = [dict(item) for item in OFFICIAL_ITEMS]
    items[1]["supporting_facts"] = [["Nowhere", 0]]
    path = write_json(tmp_path / "bad_sf.json", items)
    with pytest.raises(DataFormatError, match=r"bad_sf\.json: record 1 .*'Nowhere'"):
        load_hotpotqa(path)


def test_hotpot_duplicate_question_id(tmp_path: Path) -> None:
    path = write_json(tmp_path / "dup.json", [OFFICIAL_ITEMS[0], OFFICIAL_ITEMS[0]])
    with pytest.raises(DataFormatError, match=r"dup\.json: record 1 .*duplicate question id 'q1'"):
        load_hotpotqa(path)


@pytest.mark.parametrize("content", ["", "   \n", "42", "[1, 2]"])
def test_hotpot_not_records(tmp_path: Path, content: str) -> None:
    path = tmp_path / "odd.json"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(DataFormatError, match=r"odd\.json"):
        load_hotpotqa(path)


# ----------------------------------------------------------------------------------------------------------------
# Generic corpus + questions pairs
# ----------------------------------------------------------------------------------------------------------------

CORPUS_PLAIN = [
    {"id": "d1", "title": "Album A", "text": "Album A is by Band B."},
    {"id": "d2", "title": "Band B", "text": "Band B first played in Tulsa."},
    {"id": 3, "title": "Band B", "text": "A second passage of the Band B article."},
]
CORPUS_CONTENTS = [
    {"id": "d1", "contents": '"Album A"\nAlbum A is by Band B.'},
    {"id": "d2", "contents": "Band B\nBand B first played in Tulsa."},
    {"id": "3", "contents": '"Band B"\nA second passage of the Band B article.'},
]


def test_corpus_styles_agree(tmp_path: Path) -> None:
    plain = load_corpus_jsonl(write_jsonl(tmp_path / "plain.jsonl", CORPUS_PLAIN))
    contents = load_corpus_jsonl(write_jsonl(tmp_path / "contents.jsonl", CORPUS_CONTENTS))
    assert plain == contents
    assert plain[0] == Document(id="d1", title="Album A", text="Album A is by Band B.")
    assert plain[2].id == "3"


def test_corpus_skips_blank_lines(tmp_path: Path) -> None:
    path = tmp_path / "blank.jsonl"
    path.write_text("\n" + json.dumps(CORPUS_PLAIN[0]) + "\n\n   \n" + json.dumps(CORPUS_PLAIN[1]) + "\n\n")
    assert [d.id for d in load_corpus_jsonl(path)] == ["d1", "d2"]


def test_corpus_duplicate_id(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "dup_corpus.jsonl", CORPUS_PLAIN + [{"id": "d2", "title": "T", "text": "x"}])
    with pytest.raises(DataFormatError) as err:
        load_corpus_jsonl(path)
    msg = str(err.value)
    assert "dup_corpus.jsonl" in msg and "line 4" in msg and "'d2'" in msg and "line 2" in msg


def test_corpus_missing_text(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "no_text.jsonl", [CORPUS_PLAIN[0], {"id": "d9", "title": "T"}])
    with pytest.raises(DataFormatError, match=r"no_text\.jsonl: line 2: missing key"):
        load_corpus_jsonl(path)


def test_questions_answer_keys(tmp_path: Path) -> None:
    records = [
        {"id": "a", "question": "Q1?", "answers": ["Tulsa", "Tulsa, Oklahoma"]},
        {"question": "Q2?", "golden_answers": ["yes"]},
        {"id": 7, "question": "Q3?", "answers": "single"},
    ]
    qs = load_questions_jsonl(write_jsonl(tmp_path / "q.jsonl", records))
    assert [q.id for q in qs] == ["a", "q2", "7"]
    assert [q.answers for q in qs] == [("Tulsa", "Tulsa, Oklahoma"), ("yes",), ("single",)]
    assert all(q.supporting_ids == () and q.hops == 1 for q in qs)


@pytest.mark.parametrize("corpus", [CORPUS_PLAIN, CORPUS_CONTENTS], ids=["title_text", "contents"])
def test_qa_pair(tmp_path: Path, corpus: list) -> None:
    corpus_path = write_jsonl(tmp_path / "corpus.jsonl", corpus)
    questions_path = write_jsonl(
        tmp_path / "questions.jsonl",
        [
            {"id": "a", "question": "Where?", "answers": ["Tulsa"], "supporting_titles": ["Album A", "band b"]},
            {"id": "b", "question": "Who?", "golden_answers": "Band B", "supporting_ids": ["d1"], "type": "x"},
        ],
    )
    ds = load_qa_pair(corpus_path, questions_path)
    assert ds.name == "questions" and len(ds) == 2 and len(ds.documents) == 3
    a, b = ds.questions
    # A title shared by several passages maps to the first; lookup falls back to case-insensitive matching.
    assert a.supporting_ids == ("d1", "d2") and a.hops == 2 and a.kind == "bridge"
    assert a.meta["supporting_titles"] == ("Album A", "band b")
    assert b.supporting_ids == ("d1",) and b.hops == 1 and b.kind == "x" and b.answers == ("Band B",)
    assert load_qa_pair(corpus_path, questions_path, name="pair").name == "pair"


def test_qa_pair_unknown_title(tmp_path: Path) -> None:
    corpus_path = write_jsonl(tmp_path / "corpus.jsonl", CORPUS_PLAIN)
    questions_path = write_jsonl(
        tmp_path / "qs_bad_title.jsonl",
        [
            {"id": "a", "question": "Where?", "answers": ["Tulsa"], "supporting_titles": ["Album A"]},
            {"id": "b", "question": "Who?", "answers": ["x"], "supporting_titles": ["Band B", "Ghost Title"]},
        ],
    )
    with pytest.raises(DataFormatError) as err:
        load_qa_pair(corpus_path, questions_path)
    msg = str(err.value)
    assert "qs_bad_title.jsonl" in msg and "line 2" in msg and "'Ghost Title'" in msg


def test_qa_pair_unknown_supporting_id(tmp_path: Path) -> None:
    corpus_path = write_jsonl(tmp_path / "corpus.jsonl", CORPUS_PLAIN)
    questions_path = write_jsonl(
        tmp_path / "qs_bad_id.jsonl", [{"id": "a", "question": "?", "answers": ["x"], "supporting_ids": ["d404"]}]
    )
    with pytest.raises(DataFormatError, match=r"qs_bad_id\.jsonl: line 1: .*'d404'"):
        load_qa_pair(corpus_path, questions_path)


@pytest.mark.parametrize(
    ("lines", "line_no", "fragment"),
    [
        (['{"id": "a", "question": "?", "answers": ["x"]}', '{"id": "b", "question": "?", answers: []}'], 2,
         "invalid JSON"),
        (['{"id": "a", "question": "?", "answers": ["x"]}', '{"id": "b", "answers": ["x"]}'], 2, "'question'"),
        (['{"id": "a", "question": "?"}'], 1, "'answers' or 'golden_answers'"),
        (['{"id": "a", "question": "?", "answers": []}'], 1, "no non-empty gold answer"),
        (['{"id": "a", "question": "?", "answers": [{"text": "x"}]}'], 1, "answers[0]"),  # a number is its text
        (['{"id": "a", "question": "?", "answers": ["x"]}', '{"id": "a", "question": "?", "answers": ["y"]}'], 2,
         "duplicate question id 'a'"),
        (['{"id": "a", "question": "?", "answers": ["x"]}', '{"id": "b", "question": "?", "answers": ["x'], 2,
         "truncated"),
    ],
)
def test_questions_malformed(tmp_path: Path, lines: list[str], line_no: int, fragment: str) -> None:
    path = tmp_path / "bad_q.jsonl"
    path.write_text("\n".join(lines), encoding="utf-8")  # no final newline: the last case is a truncated file
    with pytest.raises(DataFormatError) as err:
        load_questions_jsonl(path)
    msg = str(err.value)
    assert "bad_q.jsonl" in msg and f"line {line_no}" in msg and fragment in msg


def test_pair_missing_files(tmp_path: Path) -> None:
    corpus_path = write_jsonl(tmp_path / "corpus.jsonl", CORPUS_PLAIN)
    with pytest.raises(FileNotFoundError, match="missing_q.jsonl"):
        load_qa_pair(corpus_path, tmp_path / "missing_q.jsonl")
    with pytest.raises(FileNotFoundError, match="missing_c.jsonl"):
        load_corpus_jsonl(tmp_path / "missing_c.jsonl")


# ----------------------------------------------------------------------------------------------------------------
# Real data (skipped when ../shared/data is absent)
# ----------------------------------------------------------------------------------------------------------------


def test_real_hotpot_dev_distractor() -> None:
    if not REAL_HOTPOT.exists():
        pytest.skip(f"real HotpotQA file not found at {REAL_HOTPOT}")
    ds = load_hotpotqa(REAL_HOTPOT)
    assert len(ds) == 1100
    assert Counter(q.kind for q in ds.questions) == {"bridge": 862, "comparison": 238}
    assert all(q.meta["level"] == "hard" for q in ds.questions)
    doc_ids = {d.id for d in ds.documents}
    assert len(doc_ids) == len(ds.documents)
    assert all(q.supporting_ids and set(q.supporting_ids) <= doc_ids for q in ds.questions)
    assert all(q.hops == len(q.supporting_ids) >= 2 for q in ds.questions)
    assert 5_000 <= len(ds.documents) <= 11_000  # ~10 paragraphs per item, a few shared
    assert all(d.text == " ".join(d.text.split()) for d in ds.documents)
    assert len({q.id for q in ds.questions}) == 1100
