"""The loaders read full official files: HotpotQA's dev file size (7,405 items, beyond our 1,100 slice) and the
2WikiMultihopQA layout (HotpotQA's plus ``evidences``), both through ``tasks.hotpot.load_hotpotqa``."""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym

import memenv  # noqa: F401
from tasks.hotpot import load_hotpotqa


def _item(i: int, **extra) -> dict:
    return {"_id": f"id{i}", "question": f"Who founded label {i}?", "answer": f"Person {i}", "type": "bridge",
            "supporting_facts": [[f"Label {i}", 0]],
            "context": [[f"Label {i}", [f"Label {i} was founded by Person {i}."]], [f"Other {i}", ["Filler."]]],
            **extra}


def test_a_full_size_hotpotqa_dev_file_loads_every_item(tmp_path: Path) -> None:
    path = tmp_path / "hotpot_dev_distractor_v1.json"
    path.write_text(json.dumps([_item(i, level="hard") for i in range(7405)]), encoding="utf-8")
    assert len(load_hotpotqa(path).questions) == 7405


def test_2wikimultihopqa_layout_loads_and_plays(tmp_path: Path) -> None:
    item = {"_id": "2w1", "type": "compositional", "question": "Who is the father of the director of Film X?",
            "context": [["Film X", ["Film X is a 1990 film directed by Ann Lee."]],
                        ["Ann Lee", ["Ann Lee is the daughter of Bo Lee."]], ["Film Y", ["Film Y is a comedy."]]],
            "supporting_facts": [["Film X", 0], ["Ann Lee", 0]],
            "evidences": [["Film X", "director", "Ann Lee"], ["Ann Lee", "father", "Bo Lee"]], "answer": "Bo Lee"}
    path = tmp_path / "dev.json"
    path.write_text(json.dumps([item]), encoding="utf-8")
    (q,) = load_hotpotqa(path).questions
    assert (q.kind, q.answers, len(q.supporting_ids)) == ("compositional", ("Bo Lee",), 2)
    env = gym.make("MemQA-Hotpot-v0", data_path=str(path))
    obs, _ = env.reset(seed=0)
    assert "Who is the father of the director of Film X?" in obs
