"""The SB3 plug-in: MemQANumeric spaces, masks, macro-action expansion, and a brief learning check."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from memenv.protocol import parse_action
from memenv.wrappers import (
    DEFAULT_TASK,
    MemQANumeric,
    crc_bucket,
    extract_candidates,
    masked_random_action,
)


def rollout(env: MemQANumeric, seed: int, policy, max_steps: int = 200):
    """(actions, infos) of one episode of ``policy(env, rng) -> action``."""
    rng = np.random.default_rng(seed)
    env.reset(seed=seed)
    actions, infos = [], []
    for _ in range(max_steps):
        action = policy(env, rng)
        _, _, terminated, truncated, info = env.step(action)
        actions.append(action)
        infos.append(info)
        if terminated or truncated:
            return actions, infos
    raise AssertionError("episode did not end")


@pytest.mark.parametrize("kwargs", [{}, {"objectives": 2, "hops": 2}, {"hops": (1, 2), "memory_budget": 12}])
def test_sb3_check_env(kwargs):
    check_env = pytest.importorskip("stable_baselines3.common.env_checker").check_env

    env = MemQANumeric(**kwargs)
    check_env(env, warn=True)
    assert env.observation_space.shape == (len(env.feature_names()),)
    assert env.action_space.n == 2 * env.C + env.R + env.M


def test_default_task_is_small():
    env = MemQANumeric()
    base = env.unwrapped
    assert (base.objectives, base.hops, base.top_k, len(base.documents)) == (1, (1,), 3, 300)
    assert DEFAULT_TASK["objectives"] == 1


def test_observations_are_deterministic_and_bounded():
    a, b = MemQANumeric(), MemQANumeric()
    for seed in range(5):
        obs_a, _ = a.reset(seed=seed)
        obs_b, _ = b.reset(seed=seed)
        np.testing.assert_array_equal(obs_a, obs_b)
        assert obs_a.dtype == np.float32 and obs_a.min() >= 0 and obs_a.max() <= 1
        obs_a, *_ = a.step(0)
        obs_b, *_ = b.step(0)
        np.testing.assert_array_equal(obs_a, obs_b)


def test_fixed_hash_and_candidates():
    # zlib.crc32, not Python's per-process salted hash: stable across runs and worker processes
    assert crc_bucket("capital", 32, "q") == zlib.crc32(b"q\x1fcapital") % 32
    assert crc_bucket("capital", 1 << 30) == 766089526
    text = ("In 1973, a newspaper profile of North Jiagol focused on paper mills. Critics rarely mention "
            "The Last Island of Fiawain. Jiagol lies in Jeipinoora.")
    assert extract_candidates(text) == ["1973", "North Jiagol", "The Last Island of Fiawain", "Jiagol", "Jeipinoora"]


def test_masks_are_exactly_the_invalid_macro_actions():
    """At every state of a few random episodes, replay the prefix and take each macro-action: a masked one
    is rejected by the env as an invalid protocol action; an unmasked one is valid (or a draft-only edit)."""
    def editor(env, rng):
        """Random valid macro-actions, mostly edits and searches: reaches full memories and spent edit budgets."""
        mask = env.action_masks()
        edits = np.flatnonzero(mask[2 * env.C:]) + 2 * env.C
        if edits.size and rng.random() < 0.7:
            return int(rng.choice(edits))
        searches = np.flatnonzero(mask[: env.C])
        return int(rng.choice(searches)) if rng.random() < 0.9 else masked_random_action(env, rng)

    probe = MemQANumeric()
    episodes = [(seed, rollout(probe, seed, policy)[0]) for seed in range(3) for policy in (masked_random_action, editor)]
    assert max(len(p) for _, p in episodes) >= 6
    for seed, prefix in episodes:
        for t in range(len(prefix)):
            env = MemQANumeric()
            env.reset(seed=seed)
            for a in prefix[:t]:
                env.step(a)
            mask = env.action_masks()
            assert mask.dtype == bool and mask.shape == (env.action_space.n,) and mask.any()
            for action in range(env.action_space.n):
                trial = MemQANumeric()
                trial.reset(seed=seed)
                for a in prefix[:t]:
                    trial.step(a)
                _, reward, _, _, info = trial.step(action)
                assert info["macro_valid"] == mask[action]
                if not mask[action]:
                    assert info["invocation"]["valid"] is False, info["macro"]
                    assert reward == pytest.approx(-DEFAULT_TASK["invalid_penalty"])
                elif info["action_text"] is not None:
                    assert info["invocation"]["valid"] is True, info["invocation"]["error"]
                else:
                    assert "invocation" not in info and reward == 0.0


def test_expansion_is_protocol_text():
    env = MemQANumeric()
    for seed in range(10):
        env.reset(seed=seed)
        done = False
        rng = np.random.default_rng(seed)
        while not done:
            mask = env.action_masks()
            memory = env._memory_text()  # noqa: SLF001
            for action in np.flatnonzero(mask):
                text = env.expand(action)
                if action < 2 * env.C:
                    parsed = parse_action(text)
                    assert parsed.valid, (text, parsed.error)
                    assert parsed.memory == memory.strip()
                    assert parsed.tool == ("search" if action < env.C else "answer")
                    assert parsed.argument == env._candidates[action % env.C]  # noqa: SLF001
                else:
                    assert text is None  # keep/drop edit the draft; the env is not called
            for action in np.flatnonzero(~mask):
                assert not parse_action(env.expand(action)).valid
            _, _, terminated, truncated, _ = env.step(masked_random_action(env, rng))
            done = terminated or truncated


def test_keep_and_drop_edit_the_memory_the_env_sees():
    env = MemQANumeric()
    env.reset(seed=1)
    env.step(0)  # search the question's entity
    keep = 2 * env.C
    sentence = env._offered[0]  # noqa: SLF001
    _, reward, terminated, _, info = env.step(keep)
    assert info["action_text"] is None and reward == 0 and not terminated
    assert env._items == [sentence]  # noqa: SLF001
    assert not env.action_masks()[keep]  # already kept
    _, _, _, _, info = env.step(0)  # the next env call carries it
    assert sentence in info["invocation"]["memory_after"]
    drop = 2 * env.C + env.R
    _, _, _, _, info = env.step(drop)
    assert info["action_text"] is None and env._items == []  # noqa: SLF001
    _, _, _, _, info = env.step(0)
    assert info["invocation"]["memory_after"] == ""


def test_edit_budget_per_turn():
    env = MemQANumeric(max_edits=1)
    env.reset(seed=1)
    env.step(0)
    assert env.action_masks()[2 * env.C: 2 * env.C + env.R].any()
    env.step(int(2 * env.C + np.flatnonzero(env.action_masks()[2 * env.C: 2 * env.C + env.R])[0]))
    assert not env.action_masks()[2 * env.C:].any()  # no edit left before the next env turn


def test_multi_objective_answers_in_order():
    env = MemQANumeric(objectives=2, hops=1)
    _, info = env.reset(seed=3)
    questions = info["questions"]
    assert len(questions) == 2 and env.focus == 0
    env.step(0)  # search question 1's entity
    first = env._candidates[1]  # noqa: SLF001
    _, reward, terminated, _, info = env.step(env.C + 1)
    assert info["action_text"] is None and not terminated and env.focus == 1
    assert env._memory_text().startswith(f"Answer 1: {first}")  # noqa: SLF001
    second = env._candidates[0]  # noqa: SLF001 - now question 2's first entity
    assert second in questions[1] and second not in questions[0]
    _, reward, terminated, _, info = env.step(env.C)
    assert terminated
    assert parse_action(info["action_text"]).argument == f"{first}; {second}"
    assert info["summary"]["answers"] == [first, second]
    assert 0.0 <= info["f1"] <= 1.0 and reward == info["f1"]


def test_scripted_macro_policy_beats_random():
    """Search the question's entity, answer the top-ranked candidate: the signal PPO has to find."""
    env = MemQANumeric()

    def heuristic(env, rng):
        return 0 if not env._searched else env.C + 1  # noqa: SLF001

    f1 = np.mean([rollout(env, 500 + s, heuristic)[1][-1]["f1"] for s in range(100)])
    rnd = np.mean([rollout(env, 500 + s, masked_random_action)[1][-1]["f1"] for s in range(100)])
    assert f1 > rnd + 0.3


def test_maskable_ppo_learns_briefly():
    """A seeded MaskablePPO run (~6k steps, well under a minute) beats the masked-random policy on
    held-out seeds. Measured: trained F1 0.55-0.65 vs masked-random 0.09."""
    torch = pytest.importorskip("torch")
    sb3_contrib = pytest.importorskip("sb3_contrib")
    torch.set_num_threads(1)
    model = sb3_contrib.MaskablePPO(
        "MlpPolicy", MemQANumeric(), seed=0, n_steps=256, batch_size=64, n_epochs=5, learning_rate=1e-3,
        ent_coef=0.01, policy_kwargs={"net_arch": [64, 64]}, device="cpu")
    model.learn(6000)
    env = MemQANumeric()

    def trained(env, rng):
        return int(model.predict(env._features(), action_masks=env.action_masks(), deterministic=True)[0])  # noqa: SLF001

    held_out = range(900_000, 900_100)
    f1 = np.mean([rollout(env, s, trained)[1][-1]["f1"] for s in held_out])
    rnd = np.mean([rollout(env, s, masked_random_action)[1][-1]["f1"] for s in held_out])
    assert f1 >= rnd + 0.2, (f1, rnd)
