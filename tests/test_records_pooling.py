"""Records fit for pooling across rollout calls: rollout id, gold answers, tokenizer fingerprint; old records load."""

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from llm_common import memqa_envs, memqa_tokenizer, tiny_model, toy_tokenizer  # noqa: E402

from agents.llm.generation.policy import LLMPolicy  # noqa: E402
from agents.llm.records.invocation import (InvocationRecord, load_records, save_records,  # noqa: E402
                                           tokenizer_fingerprint)
from agents.llm.records.rollouts import records_of, rollout  # noqa: E402


def test_rollout_records_carry_rollout_id_gold_and_fingerprint(tmp_path):
    tok = memqa_tokenizer()
    policy = LLMPolicy(tiny_model(tok), tok, max_new_tokens=12, seed=0)
    envs = memqa_envs(2, max_turns=2)
    first = rollout(policy, envs, [3, 4])
    second = rollout(policy, envs, [3, 4], rollout_id="update-2")
    a, b = records_of(first), records_of(second)
    ids_a = {r.rollout_id for r in a}
    assert len(ids_a) == 1 and len(next(iter(ids_a))) == 32  # one fresh uuid4 hex per call
    assert {r.rollout_id for r in b} == {"update-2"}
    # same seeds give the same (episode_id, turn) keys; the rollout id keeps pooled records apart
    assert {r.key for r in a} == {r.key for r in b}
    pooled = a + b
    assert len({r.uid for r in pooled}) == len(pooled)
    for ep in first + second:
        gold = [list(g) for g in ep.info["gold"]]
        assert gold and all(r.gold == gold for r in ep.records)
    fp = tokenizer_fingerprint(tok)
    assert all(r.tokenizer_fingerprint == fp for r in pooled)
    path = tmp_path / "records.jsonl"
    save_records(path, pooled)
    loaded = load_records(path)
    assert [(r.uid, r.gold, r.tokenizer_fingerprint) for r in loaded] == [
        (r.uid, r.gold, r.tokenizer_fingerprint) for r in pooled]


def test_fingerprint_is_stable_and_tells_vocabularies_apart():
    tok = memqa_tokenizer()
    fp = tokenizer_fingerprint(tok)
    assert len(fp) == 16 and int(fp, 16) >= 0
    clone = type(tok)(tokenizer_object=tok.backend_tokenizer, pad_token="<pad>", eos_token="<eos>")
    assert tokenizer_fingerprint(clone) == fp  # same vocabulary, computed afresh
    assert tokenizer_fingerprint(toy_tokenizer()) != fp
    clone.add_tokens(["<extra_tool>"])
    clone._memenv_fingerprint = None  # the cache is per object: drop it after changing the vocabulary
    assert tokenizer_fingerprint(clone) != fp


def test_records_written_before_the_pooling_fields_still_load(tmp_path):
    old = {"episode_id": "e1", "turn": 1, "prompt_ids": [1, 2], "response_ids": [3], "response_logprobs": [-0.5],
           "action_mask": [1], "memory_mask": [0], "reward": 1.0, "snapshot": {"observation": "o"}}
    path = tmp_path / "old.jsonl"
    path.write_text(json.dumps(old) + "\n", encoding="utf-8")
    (r,) = load_records(path)
    assert (r.rollout_id, r.gold, r.tokenizer_fingerprint) == ("", None, "")
    assert r.uid == ("", "e1", 1) and r.reward == 1.0
    assert "rollout_id=''" in r.describe() and "episode_id='e1'" in r.describe()
    assert InvocationRecord.from_dict(old).input_ids == [1, 2, 3]
