"""Held-out questions: the experiment's evaluation questions never appear in an SFT demonstration, a weak-start
probe or a GRPO training episode; the split is by entity, fixed before training, and the task is unchanged."""

import gymnasium as gym
import pytest

import memenv  # noqa: F401
from agents.llm.training.ppo import task_seeds
from agents.llm.training.common import eval_seeds, make_envs
from distill.experiment.config import ExperimentConfig, pool_env_kwargs
from distill.experiment.evaluation import PROBE_SEED_BASE, make_env_fn
from distill.experiment.stages import _sft_config

KW = {"objectives": 2, "hops": 1, "comparison_rate": 0.0, "top_k": 1}


def _questions(env, seeds):
    ids, texts, subjects = set(), set(), set()
    for seed in seeds:
        _, info = env.reset(seed=int(seed))
        ids |= set(info["question_ids"])
        texts |= set(info["questions"])
        subjects |= {q.supporting_ids[0] for q in env.unwrapped.questions}
    return ids, texts, subjects


def test_experiment_evaluates_questions_it_never_trained_on(tmp_path):
    pytest.importorskip("torch")
    from distill.experiment.stages import arm_config

    cfg = ExperimentConfig(out=str(tmp_path))
    # what the SFT stage builds its demonstrations on (the env of its config, seeds 0..episodes-1)
    sft = _sft_config(cfg, cfg.teacher, tmp_path / "teacher")
    train = _questions(make_envs(sft, 1)[0], range(cfg.teacher.sft_episodes))
    probe = _questions(make_env_fn(cfg, "train")(), range(PROBE_SEED_BASE, PROBE_SEED_BASE + cfg.probe_episodes))
    # every GRPO episode of every arm and training seed (their env and task seeds)
    student = {"path": "student"}
    grpo = [set(), set(), set()]
    for seed in range(cfg.seeds):
        run = arm_config(cfg, "memopd", seed, student, {"path": "teacher"})
        env = make_envs(run, 1)[0]
        seeds = {s for u in range(run.updates) for s in task_seeds(run, u, 0)[0]}
        for part, found in zip(grpo, _questions(env, seeds)):
            part |= found
    held = _questions(make_env_fn(cfg, "heldout")(), eval_seeds(cfg.eval_episodes))
    seen = _questions(make_env_fn(cfg, "train")(), eval_seeds(cfg.seen_eval_episodes))
    for trained in (train, probe, tuple(grpo)):
        for k in range(3):  # question ids, question texts, subject entities: all disjoint
            assert not (held[k] & trained[k]), k
    assert len(held[0]) > 300  # 400 episodes x 2 objectives over a pool of ~300 entities
    # the "seen" evaluation asks questions of the training pool: most of them were demonstrated
    assert len(seen[0] & train[0]) > 0.5 * len(seen[0])


def test_split_by_entity_keeps_the_task():
    held = gym.make("MemQA-v0", **KW, question_split="heldout")
    train = gym.make("MemQA-v0", **KW, question_split="train")
    whole = gym.make("MemQA-v0", **KW)
    h, t, w = (_questions(e, range(300)) for e in (held, train, whole))
    assert not (h[2] & t[2]) and h[2] | t[2] <= set(d.id for d in whole.unwrapped.documents)
    # a quarter of the entities: roughly that share of a whole-world draw lands in the held-out pool
    share = len(w[2] & h[2]) / len(w[2])
    assert 0.15 < share < 0.35, share
    # same corpus, same instructions, same question forms: only which questions are drawn changes
    obs_h, _ = held.reset(seed=1)
    obs_w, _ = whole.reset(seed=1)
    assert obs_h.split("Question 1:")[0] == obs_w.split("Question 1:")[0]
    assert held.unwrapped.documents == whole.unwrapped.documents
    assert pool_env_kwargs(ExperimentConfig(), "heldout")["question_split"] == "heldout"


def test_split_options_are_checked():
    with pytest.raises(ValueError, match="question_split"):
        gym.make("MemQA-v0", question_split="test")
    with pytest.raises(ValueError, match="heldout_fraction"):
        gym.make("MemQA-v0", question_split="heldout", heldout_fraction=1.5)
    with pytest.raises(ValueError, match="heldout"):  # too small a pool for the objectives
        gym.make("MemQA-v0", objectives=40, corpus_size=1200, hops=1, comparison_rate=0.0,
                 question_split="heldout", heldout_fraction=0.05)
