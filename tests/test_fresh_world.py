"""MemQA's fresh world (``fresh_facts=True``): every episode draws the world's facts afresh over one inventory of
names and values, so the same question has another answer in another episode and only reading answers it."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import memenv  # noqa: F401 - registers the envs
from agents.scripted.strategies.qa_strategies import make_strategy
from tasks.world import build_world, support_known

SMALL = dict(corpus_size=400)  # a smaller inventory: every reset re-renders and re-indexes the whole corpus


def _play_oracle(env, seed: int) -> float:
    oracle = make_strategy("oracle", "MemQA-v0", env.unwrapped.memory_mode)
    obs, _ = env.reset(seed=seed)
    oracle.reset(env.unwrapped)
    while True:
        obs, reward, terminated, truncated, _ = env.step(oracle.act(obs))
        if terminated or truncated:
            return reward


def test_a_seed_gives_one_draw_and_reset_replays_it():
    a = gym.make("MemQA-v0", fresh_facts=True, **SMALL)
    b = gym.make("MemQA-v0", fresh_facts=True, **SMALL)
    obs_a, info_a = a.reset(seed=7)
    docs_a = [d.text for d in a.unwrapped.documents]
    obs_b, info_b = b.reset(seed=7)
    assert obs_a == obs_b and info_a["world_draw"] == info_b["world_draw"]
    assert docs_a == [d.text for d in b.unwrapped.documents]
    b.reset(seed=8)
    obs_again, info_again = b.reset(seed=7)
    assert obs_again == obs_a and info_again["world_draw"] == info_a["world_draw"]
    # The same search finds the same document text in both
    action = f"<memory></memory><search>{a.unwrapped.questions[0].meta['start']}</search>"
    assert a.step(action)[0] == b.step(action)[0]


def test_facts_and_answers_change_across_episodes_over_one_inventory():
    env = gym.make("MemQA-v0", fresh_facts=True, **SMALL).unwrapped
    draws, birthplaces, names = set(), set(), None
    for seed in range(12):
        _, info = env.reset(seed=seed)
        draws.add(info["world_draw"])
        world = env.source
        inventory = sorted((e.id, e.kind, e.name) for e in world.entities.values())
        assert names is None or inventory == names  # the names never change...
        names = inventory
        birthplaces.add(world.entities["per00000"].facts["born_in"])  # ...who is born where does
    assert len(draws) == 12
    assert len(birthplaces) >= 6
    # The same question (subject and relation) has another answer in another draw, and documents state the draw's
    world = build_world(400)
    answers = set()
    for seed in range(10):
        draw = world.with_fresh_facts(np.random.default_rng(seed))
        city = draw.entities[draw.entities["per00000"].facts["born_in"]].name
        doc = draw.documents[draw.doc_index["per00000"]].text
        assert city in doc
        answers.add(city)
    assert len(answers) >= 5
    # Values come from the inventory: populations are the base world's, years from its ranges
    assert {c.facts["population"] for c in draw._by_kind["city"]} <= set(world.population_inventory)


def test_the_default_world_is_unchanged_and_has_no_draw():
    env = gym.make("MemQA-v0", **SMALL)
    _, info = env.reset(seed=3)
    assert "world_draw" not in info
    assert env.unwrapped.source is build_world(400, 0.3, 3, 0)  # the one cached world, every episode
    env.reset(seed=4)
    assert env.unwrapped.source is build_world(400, 0.3, 3, 0)


@pytest.mark.parametrize("kwargs", [dict(), dict(objectives=3, hops=(1, 2, 3), comparison_rate=0.25),
                                    dict(memory_mode="tools")])
def test_the_oracle_scores_one_in_the_fresh_world(kwargs):
    env = gym.make("MemQA-v0", fresh_facts=True, **SMALL, **kwargs)
    assert [_play_oracle(env, seed) for seed in range(12)] == [1.0] * 12


def test_check_env_passes_on_the_fresh_world():
    check_env(gym.make("MemQA-v0", fresh_facts=True, **SMALL).unwrapped, skip_render_check=True)


def test_fresh_facts_needs_the_synthetic_world_and_a_bool(tmp_path):
    corpus, questions = tmp_path / "c.jsonl", tmp_path / "q.jsonl"
    corpus.write_text('{"id": "d1", "title": "A", "text": "A is B."}\n{"id": "d2", "title": "C", "text": "C is D."}\n')
    questions.write_text('{"id": "q1", "question": "What is A?", "answers": ["B"], "supporting_ids": ["d1"]}\n')
    with pytest.raises(ValueError, match="fresh_facts"):
        gym.make("MemQA-v0", fresh_facts=True, objectives=1, corpus_path=corpus, questions_path=questions)
    with pytest.raises(TypeError, match="fresh_facts"):
        gym.make("MemQA-v0", fresh_facts="yes")


def test_heldout_draws_never_occur_in_any_training_episode(tmp_path):
    """The experiment's evaluation seeds are disjoint from every seed it trains or probes on (SFT demonstrations of
    teacher and student, the tokenizer's text, the weak-start probe, every GRPO update of every arm and seed), and a
    draw is a function of its seed, so no held-out draw was ever trained on; the draws' fingerprints are checked
    distinct too, on a sample of each set."""
    from agents.llm.training.ppo import task_seeds
    from agents.llm.training.common import eval_seeds
    from dataclasses import replace

    from distill.experiment.baselines import (SEQKD_BATCH, SFT_ARM_DEMOS, SFT_ARM_SEED_BASE, SFT_ARM_SEED_STRIDE,
                                              sweep_jobs)
    from distill.experiment.config import ARMS, SFT_ARMS, fair_config
    from distill.experiment.evaluation import PROBE_SEED_BASE
    from distill.experiment.stages import arm_config

    cfg = fair_config(str(tmp_path))  # the fresh world with every kind of training run: 10 seeds, sweep, SFT arms
    assert cfg.env_kwargs["fresh_facts"] is True
    for seed in range(cfg.seeds):  # the teacher-free control's constant is read from MemOPD's finished run
        (tmp_path / "arms" / "memopd" / f"seed{seed}").mkdir(parents=True)
        (tmp_path / "arms" / "memopd" / f"seed{seed}" / "result.json").write_text('{"distill_loss": 0.5}')
    evaluation = set(eval_seeds(max(cfg.eval_episodes, cfg.seen_eval_episodes)))
    training = {
        "teacher SFT": set(range(cfg.teacher.sft_episodes)),
        "student SFT": set(range(cfg.student.sft_episodes)),
        "tokenizer": set(range(10**6, 10**6 + cfg.tokenizer_episodes)),
        "probe": {PROBE_SEED_BASE + i for i in range(cfg.probe_episodes)},
        "grpo": set(),
        "lr sweep": set(),
        # the SFT arms: the oracle's demonstrations, and the teacher's episodes (at most a stride of them)
        "sft arms": {SFT_ARM_SEED_BASE[source] + s * SFT_ARM_SEED_STRIDE + i for source in SFT_ARM_SEED_BASE
                     for s in range(cfg.seeds) for i in range(0, SFT_ARM_SEED_STRIDE, 97)}
                    | {SFT_ARM_SEED_BASE["oracle"] + s * SFT_ARM_SEED_STRIDE + SFT_ARM_DEMOS - 1
                       for s in range(cfg.seeds)},
    }
    assert SFT_ARM_DEMOS <= SFT_ARM_SEED_STRIDE and SEQKD_BATCH <= SFT_ARM_SEED_STRIDE
    for arm in ARMS:
        if arm in SFT_ARMS:
            continue
        for seed in range(cfg.seeds):
            run = arm_config(cfg, arm, seed, {"path": "student"}, {"path": "teacher"})
            for update in range(cfg.updates):
                training["grpo"].update(task_seeds(run, update, 0)[0])
    for arm, lr, seed in sweep_jobs(cfg):
        run = arm_config(replace(cfg, rl_lr=lr), arm, seed, {"path": "student"}, {})
        for update in range(cfg.updates):
            training["lr sweep"].update(task_seeds(run, update, 0)[0])
    for name, seeds in training.items():
        assert seeds and evaluation.isdisjoint(seeds), name
    # A draw is its seed's: the env's fingerprint equals a draw made from the same seed directly
    env = gym.make("MemQA-v0", fresh_facts=True, corpus_size=cfg.env_kwargs["corpus_size"])
    inventory = env.unwrapped._inventory
    for seed in (0, 10**7):
        _, info = env.reset(seed=seed)
        assert info["world_draw"] == inventory.with_fresh_facts(np.random.default_rng(seed)).fingerprint()
    sample = [s for seeds in training.values() for s in sorted(seeds)[:20]] + sorted(evaluation)[:20]
    fingerprints = {inventory.with_fresh_facts(np.random.default_rng(s)).fingerprint() for s in sample}
    assert len(fingerprints) == len(set(sample))


def test_multi_hop_heldout_questions_cannot_be_recalled_in_the_fresh_world():
    """At hops=2 in the fixed world, many held-out questions (entity split) have every supporting fact inside
    some training question, so recall answers them; in the fresh world facts are the draw's, and none does."""
    counts = {}
    for fresh in (False, True):
        kw = dict(objectives=2, hops=2, fresh_facts=fresh, **SMALL)
        train = gym.make("MemQA-v0", question_split="train", **kw).unwrapped
        heldout = gym.make("MemQA-v0", question_split="heldout", **kw).unwrapped
        known = set()
        for seed in range(80):
            train.reset(seed=seed)
            for q in train.questions:
                known.update(map(tuple, q.meta["facts"]))
        covered = total = 0
        for seed in range(40):
            heldout.reset(seed=10**7 + seed)
            for q in heldout.questions:
                total += 1
                covered += support_known(q, known)
        counts[fresh] = (covered, total)
    assert counts[False][0] >= 0.1 * counts[False][1]  # the fixed world's leak, measured (~40% at 300 episodes)
    assert counts[True][0] == 0


# ---------------------------------------------------------------- fresh names (issue 45: copy names, not know them)
def test_fresh_names_rename_every_entity_apart_from_the_inventory():
    inventory = build_world(400)
    draw = inventory.with_fresh_facts(np.random.default_rng(3), fresh_names=True)
    assert [(e.id, e.kind) for e in draw.entities.values()] == [(e.id, e.kind) for e in inventory.entities.values()]
    names = [e.name for e in draw.entities.values()]
    assert len(set(names)) == len(names)  # unique among themselves
    assert not set(names) & {e.name for e in inventory.entities.values()}  # none of the inventory's
    again = inventory.with_fresh_facts(np.random.default_rng(3), fresh_names=True)
    assert [e.name for e in again.entities.values()] == names  # one rng, one draw
    assert draw.documents[0].title == names[0] and names[0] in draw.documents[0].text  # documents use them
    # the inventory is untouched (a later plain draw has its names)
    plain = inventory.with_fresh_facts(np.random.default_rng(3))
    assert [e.name for e in plain.entities.values()] == [e.name for e in inventory.entities.values()]


@pytest.mark.parametrize("rate", [0.0, 1.0, 0.5])
def test_fresh_name_rate_renames_that_share_of_episodes_and_the_oracle_still_scores_one(rate):
    env = gym.make("MemQA-v0", fresh_facts=True, fresh_name_rate=rate, question_split="train", **SMALL)
    inventory = {e.name for e in env.unwrapped._inventory.entities.values()}
    renamed = []
    for seed in range(12):
        _, info = env.reset(seed=seed)
        names = {e.name for e in env.unwrapped.source.entities.values()}
        renamed.append(info["world_renamed"])
        assert (names == inventory) is not info["world_renamed"]
        assert (not names & inventory) is info["world_renamed"]
        for q in env.unwrapped.questions:  # the question names the draw's subject
            assert env.unwrapped.source.entities[q.supporting_ids[0]].name in q.question
    assert {0.0: not any(renamed), 1.0: all(renamed), 0.5: 0 < sum(renamed) < 12}[rate]
    assert _play_oracle(env, seed=5) == pytest.approx(1.0)


def test_fresh_name_rate_zero_keeps_the_episodes_of_a_seed():
    # the fair run's cached demonstrations and evaluations were drawn before the option existed
    a = gym.make("MemQA-v0", fresh_facts=True, **SMALL)
    b = gym.make("MemQA-v0", fresh_facts=True, fresh_name_rate=0.0, **SMALL)
    for seed in (0, 9):
        obs_a, info_a = a.reset(seed=seed)
        obs_b, info_b = b.reset(seed=seed)
        assert obs_a == obs_b and info_a["world_draw"] == info_b["world_draw"]


@pytest.mark.parametrize("kwargs, match", [(dict(fresh_name_rate=0.5), "needs fresh_facts=True"),
                                           (dict(fresh_facts=True, fresh_name_rate=1.5), "fresh_name_rate"),
                                           (dict(fresh_facts=True, fresh_name_rate="half"), "fresh_name_rate")])
def test_fresh_name_rate_refuses_bad_settings_in_one_line(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        gym.make("MemQA-v0", **SMALL, **kwargs)
