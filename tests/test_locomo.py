"""LoCoMo: the loader (real file when present, corrupt and truncated files) and MemDialog-LoCoMo-v0."""

from __future__ import annotations

import json
import warnings
from collections import Counter
from pathlib import Path

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import memenv  # noqa: F401 - registers the environments
from agents.scripted.strategies.qa_strategies import make_strategy
from memenv.envs.memdialog import MemDialogEnv
from tasks.conversations import ABSTENTION_ANSWER
from tasks.locomo import CATEGORY_TYPES, load_locomo
from tasks.types import DataFormatError

REAL_LOCOMO = Path(__file__).resolve().parents[2] / "shared" / "data" / "locomo" / "locomo10.json"


def _sample(sample_id: str) -> dict:
    return {
        "sample_id": sample_id,
        "conversation": {
            "speaker_a": "Ana",
            "speaker_b": "Bo",
            "session_1_date_time": "1:56 pm on 8 May, 2023",
            "session_1": [
                {"speaker": "Ana", "dia_id": "D1:1", "text": "I adopted a puppy named Pip yesterday."},
                {"speaker": "Bo", "dia_id": "D1:2", "text": "Lovely! Look at this.", "blip_caption": "a photo of a cake",
                 "img_url": ["http://x"]},
            ],
            "session_2_date_time": "9:00 am on 20 May, 2023",
            "session_2": [
                {"speaker": "Bo", "dia_id": "D2:1", "text": "I started a pottery class."},
                {"speaker": "Ana", "dia_id": "D2:2", "text": "Pip chewed my shoes."},
            ],
            "session_3_date_time": "2:00 pm on 1 June, 2023",  # a date without its session: ignored
        },
        "qa": [
            {"question": "What is the name of Ana's puppy?", "answer": "Pip", "evidence": ["D1:1"], "category": 4},
            {"question": "When did Ana adopt a puppy?", "answer": "7 May 2023", "evidence": ["D1:1"], "category": 2},
            {"question": "What class did Bo start?", "answer": "pottery", "evidence": ["D2:1"], "category": 1},
            {"question": "How many puppies?", "answer": 1, "evidence": ["D1:1"], "category": 3},
            {"question": "What did Bo's puppy chew?", "adversarial_answer": "shoes", "evidence": ["D2:2"], "category": 5},
            {"question": "Is Pip Bo's dog?", "adversarial_answer": "Yes", "answer": "No", "evidence": ["D1:1"],
             "category": 5},
        ],
        "event_summary": {}, "observation": {}, "session_summary": {},
    }


@pytest.fixture
def tiny_locomo(tmp_path) -> Path:
    path = tmp_path / "tiny_locomo.json"
    path.write_text(json.dumps([_sample("c1"), _sample("c2")], indent=1), encoding="utf-8")
    return path


def write(tmp_path, data, name="bad.json") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data, indent=1), encoding="utf-8")
    return path


def test_tiny_file_maps_onto_conversations(tiny_locomo):
    convs = load_locomo(tiny_locomo)
    assert [c.id for c in convs] == ["c1", "c2"]
    conv = convs[0]
    assert conv.speakers == ("Ana", "Bo") and [s.index for s in conv.sessions] == [1, 2]
    assert conv.sessions[0].date == "1:56 pm on 8 May, 2023"
    assert conv.sessions[0].turns[1].render() == "Bo: Lovely! Look at this. [shares a photo of a cake]"
    kinds = [q.kind for q in conv.questions]
    assert kinds == ["single-hop", "temporal", "multi-hop", "open-domain", "adversarial", "adversarial"]
    assert conv.questions[3].answers == ("1",)
    adversarial = conv.questions[4]
    assert adversarial.answers == (ABSTENTION_ANSWER,) and adversarial.meta["abstention"]
    assert adversarial.meta["adversarial_answer"] == "shoes" and adversarial.supporting_ids == ("D2:2",)
    assert conv.questions[5].answers == (ABSTENTION_ANSWER, "No")
    assert len(conv.first_sessions(1).questions) == 4  # evidence in session 1 only


def test_real_locomo_file():
    if not REAL_LOCOMO.exists():
        pytest.skip(f"LoCoMo file absent: {REAL_LOCOMO}")
    convs = load_locomo(REAL_LOCOMO)
    assert len(convs) == 10
    assert sum(len(c.sessions) for c in convs) == 272
    assert sum(c.n_turns for c in convs) == 5882
    questions = [q for c in convs for q in c.questions]
    assert len(questions) == 1986
    categories = Counter(q.meta["category"] for q in questions)
    assert categories == {4: 841, 5: 446, 2: 321, 1: 282, 3: 96}
    assert all(q.kind == CATEGORY_TYPES[q.meta["category"]] for q in questions)
    adversarial = [q for q in questions if q.meta["category"] == 5]
    assert all(q.answers[0] == ABSTENTION_ANSWER and q.meta["abstention"] for q in adversarial)
    assert sum(len(q.answers) == 2 for q in adversarial) == 2  # the two items that carry an "answer"
    assert all(not q.meta["abstention"] and ABSTENTION_ANSWER not in q.answers for q in questions
               if q.meta["category"] != 5)
    for conv in convs:
        assert [s.index for s in conv.sessions] == list(range(1, len(conv.sessions) + 1))
        assert all(s.date and s.turns for s in conv.sessions)


def test_missing_file():
    with pytest.raises(FileNotFoundError, match="nowhere.json"):
        load_locomo("/nonexistent/nowhere.json")


def test_truncated_file_names_file_and_record(tmp_path, tiny_locomo):
    text = tiny_locomo.read_text(encoding="utf-8")
    cut = write(tmp_path, text[: int(len(text) * 0.75)], "cut.json")
    with pytest.raises(DataFormatError, match=r"cut\.json: record 1 .*truncated"):
        load_locomo(cut)


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda s: s["conversation"].pop("session_2_date_time"), r"session_2 has no session_2_date_time"),
        (lambda s: s["conversation"]["session_1"][1].pop("text"), r"session_1\[1\]: missing key 'text'"),
        (lambda s: s["conversation"].update(session_2="oops"), r"session_2: expected a list"),
        (lambda s: s["qa"][2].update(category=7), r"qa\[2\]\.category: expected an integer 1\.\.5"),
        (lambda s: s["qa"][0].pop("answer"), r"qa\[0\]: missing key 'answer'"),
        (lambda s: s["qa"][1].update(answer=None), r"qa\[1\]\.answer: empty answer"),
        (lambda s: s.pop("conversation"), r"missing key 'conversation'"),
        (lambda s: s["conversation"].pop("speaker_b"), r"conversation: missing key 'speaker_b'"),
    ],
)
def test_corrupt_record_names_file_record_and_field(tmp_path, mutate, message):
    second = _sample("c2")
    mutate(second)
    path = write(tmp_path, [_sample("c1"), second])
    with pytest.raises(DataFormatError, match=r"bad\.json: record 1 \(line \d+\): .*" + message):
        load_locomo(path)


def test_invalid_json_and_duplicates(tmp_path):
    with pytest.raises(DataFormatError, match=r"bad\.json: record 0"):
        load_locomo(write(tmp_path, '[{"sample_id": "a", "conversation": {,}}]'))
    with pytest.raises(DataFormatError, match="duplicate sample_id 'c1'"):
        load_locomo(write(tmp_path, [_sample("c1"), _sample("c1")], "dup.json"))


def test_env_on_tiny_file(tiny_locomo):
    with pytest.raises(ValueError, match="data_path"):
        gym.make("MemDialog-LoCoMo-v0")
    with pytest.raises(ValueError, match="questions=10 .* at most 6"):  # the registered 10 > 6 per conversation
        gym.make("MemDialog-LoCoMo-v0", data_path=str(tiny_locomo))
    env = gym.make("MemDialog-LoCoMo-v0", data_path=str(tiny_locomo), questions=6)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(env.unwrapped)
    env = MemDialogEnv(data_path=tiny_locomo, questions=None, conversation=1)
    obs, info = env.reset(seed=0)
    assert info["conversation_id"] == "c2" and info["sessions"] == 2 and len(info["questions"]) == 6
    assert "[session 1/2, 1:56 pm on 8 May, 2023]" in obs and "Ana: I adopted a puppy named Pip yesterday." in obs
    policy = make_strategy("oracle", "MemDialog-LoCoMo-v0")
    policy.reset(env)
    while True:
        obs, reward, terminated, truncated, step = env.step(policy.act(obs))
        if terminated or truncated:
            break
    episode = step["summary"]
    assert terminated and episode["f1"] == 1.0 and reward == 1.0
    assert episode["f1_by_type"]["adversarial"] == 1.0 and episode["count_by_type"]["adversarial"] == 2
    assert episode["answers"][4] == ABSTENTION_ANSWER


def test_env_samples_conversations_with_np_random(tiny_locomo):
    env = MemDialogEnv(data_path=tiny_locomo, questions=2)
    seen = {env.reset(seed=seed)[1]["conversation_id"] for seed in range(12)}
    assert seen == {"c1", "c2"}
    assert env.reset(seed=3)[1] == MemDialogEnv(data_path=tiny_locomo, questions=2).reset(seed=3)[1]
    env = MemDialogEnv(data_path=tiny_locomo, questions=None, sessions=1)
    _, info = env.reset(seed=0)
    assert info["sessions"] == 1 and len(info["questions"]) == 4


def test_env_on_real_file():
    if not REAL_LOCOMO.exists():
        pytest.skip(f"LoCoMo file absent: {REAL_LOCOMO}")
    env = gym.make("MemDialog-LoCoMo-v0", data_path=str(REAL_LOCOMO), sessions=3).unwrapped
    policy = make_strategy("oracle", "MemDialog-LoCoMo-v0")
    obs, info = env.reset(seed=0)
    assert info["sessions"] == 3 and len(info["questions"]) == 10
    policy.reset(env)
    while True:
        obs, reward, terminated, truncated, step = env.step(policy.act(obs))
        if terminated or truncated:
            break
    assert terminated and step["summary"]["f1"] == 1.0
    assert set(step["summary"]["f1_by_type"]) <= set(CATEGORY_TYPES.values())
