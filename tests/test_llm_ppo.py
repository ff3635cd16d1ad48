"""PPO/GRPO: advantage and loss math on hand-computed cases; batching masks; a short toy run moves toward reward."""

import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from llm_common import ToyYes, memqa_tokenizer, tiny_model, toy_tokenizer  # noqa: E402

from agents.llm.generation.policy import LLMPolicy  # noqa: E402
from agents.llm.training.ppo import (PartClock, PPOConfig, clip_gradients, episode_gae, gae,  # noqa: E402
                                     group_advantages, grpo_assign, ppo_loss, train_rl, zero_variance_groups)
from agents.llm.records.invocation import InvocationRecord  # noqa: E402
from agents.llm.records.rollouts import Episode, rollout  # noqa: E402
from agents.llm.training.common import ActorCritic, collate  # noqa: E402


def _rec(turn, n, reward=0.0, episode="e"):
    return InvocationRecord(episode, turn, [5, 6], list(range(10, 10 + n)), [0.0] * n, [1] * n, [0] * n,
                            reward=reward)


def test_gae_hand_computed():
    adv, ret = gae([0, 0, 1], [0.5, 0.4, 0.2], gamma=0.9, lam=0.5)
    # delta = (-0.14, -0.22, 0.8); A2 = 0.8, A1 = -0.22 + 0.45 * 0.8, A0 = -0.14 + 0.45 * A1
    assert adv == pytest.approx([-0.077, 0.14, 0.8])
    assert ret == pytest.approx([0.423, 0.54, 1.0])
    adv, ret = gae([0, 0, 1], [0.5, 0.5, 0.5], gamma=1.0, lam=1.0)
    assert adv == pytest.approx([0.5, 0.5, 0.5]) and ret == pytest.approx([1, 1, 1])


def test_episode_gae_carries_terminal_reward_to_earlier_invocations():
    first, second = _rec(1, 3), _rec(2, 2, reward=1.0)
    episode_gae([first, second], [[0.1, 0.2, 0.3], [0.4, 0.6]], gamma=1.0, lam=1.0)
    assert first.token_advantages == pytest.approx([0.9, 0.8, 0.7])  # Monte Carlo: 1 - V
    assert second.token_advantages == pytest.approx([0.6, 0.4])
    assert first.token_returns == pytest.approx([1, 1, 1])
    # lam = 0: one-step TD; the last token of invocation 1 bootstraps from invocation 2's first value
    episode_gae([first, second], [[0.1, 0.2, 0.3], [0.4, 0.6]], gamma=1.0, lam=0.0)
    assert first.token_advantages == pytest.approx([0.1, 0.1, 0.1])
    assert second.token_advantages == pytest.approx([0.2, 0.4])
    # non-action tokens get no advantage
    masked = _rec(1, 3, reward=1.0)
    masked.action_mask = [1, 0, 1]
    episode_gae([masked], [[0.0, 0.5]], gamma=1.0, lam=1.0)
    assert masked.token_advantages == pytest.approx([1.0, 0.0, 0.5])


def test_group_advantages_and_broadcast():
    adv = group_advantages([1, 0, 0, 1, 0.5, 0.5], ["a"] * 4 + ["b"] * 2)
    assert adv == pytest.approx([1, -1, -1, 1, 0, 0], abs=1e-5)
    assert group_advantages([1, 0, 0, 1, 0.5, 0.5], ["a"] * 4 + ["b"] * 2, std_norm=False) == \
        pytest.approx([0.5, -0.5, -0.5, 0.5, 0, 0])
    eps = [Episode("x", 0, [_rec(1, 2, 0.0, "x"), _rec(2, 3, 1.0, "x")], group=0),
           Episode("y", 0, [_rec(1, 4, 0.0, "y")], group=0)]
    grpo_assign(eps)
    assert [r.token_advantages for r in eps[0].records] == [pytest.approx([1.0] * 2, abs=1e-5),
                                                            pytest.approx([1.0] * 3, abs=1e-5)]
    assert eps[1].records[0].token_advantages == pytest.approx([-1.0] * 4, abs=1e-5)
    assert eps[1].records[0].advantage == pytest.approx(-1.0, abs=1e-5)


def test_std_floor_bounds_advantages_of_near_equal_groups():
    returns, groups = [0.5, 0.5, 0.5, 0.6], ["a"] * 4
    std = 0.0433012702  # population std of the group
    plain = group_advantages(returns, groups, eps=0.0)
    assert plain == pytest.approx([-0.025 / std] * 3 + [0.075 / std])  # |A| up to 1.73 for a 0.1 reward gap
    floored = group_advantages(returns, groups, eps=0.0, std_floor=0.1)
    assert floored == pytest.approx([-0.25, -0.25, -0.25, 0.75])
    # a floor below the std changes nothing
    assert group_advantages(returns, groups, eps=0.0, std_floor=0.01) == pytest.approx(plain)
    with pytest.raises(ValueError, match="adv_std_floor"):
        PPOConfig(algo="grpo", adv_std_floor=-1.0)


def test_zero_variance_groups_found():
    assert zero_variance_groups([1, 1, 0, 1, 0.3, 0.3, 0, 0], [0, 0, 1, 1, 2, 2, 3, 3]) == {0, 2, 3}
    assert zero_variance_groups([1, 0], ["g", "g"]) == set()


def test_masked_tokens_leave_loss_and_normaliser():
    torch.manual_seed(0)
    logp, old, adv = torch.randn(6), torch.randn(6), torch.randn(6)
    ent, ref = torch.rand(6), torch.randn(6)
    mask = torch.tensor([True, False, True, True, False, False])
    masked = ppo_loss(logp, old, adv, entropy=ent, ent_coef=0.1, ref_logp=ref, kl_coef=0.2, mask=mask)
    subset = ppo_loss(logp[mask], old[mask], adv[mask], entropy=ent[mask], ent_coef=0.1, ref_logp=ref[mask],
                      kl_coef=0.2)
    for key in ("loss", "pg_loss", "entropy", "kl_ref"):
        assert masked[key].item() == pytest.approx(subset[key].item(), abs=1e-6), key
    full = ppo_loss(logp, old, adv)
    for key in ("approx_kl", "clipfrac"):  # diagnostics of the policy's move: every token
        assert masked[key].item() == pytest.approx(full[key].item(), abs=1e-6), key
    # the plain token mean over all six differs (the dropped tokens would dilute it)
    assert ppo_loss(logp, old, adv)["pg_loss"].item() != pytest.approx(subset["pg_loss"].item(), abs=1e-4)
    none = ppo_loss(logp, old, adv, mask=torch.zeros(6, dtype=torch.bool))
    assert none["loss"].item() == 0.0


@pytest.mark.parametrize("drop", [True, False])
def test_grpo_update_skips_zero_variance_groups(tmp_path, drop):
    tok = toy_tokenizer()
    model = tiny_model(tok, seed=2)
    before = [p.detach().clone() for p in model.parameters()]
    cfg = PPOConfig(algo="grpo", out_dir=str(tmp_path), updates=1, episodes_per_update=8, group_size=4, lr=1e-2,
                    max_new_tokens=3, num_envs=4, eval_every=0, save_every=100, progress=False, epochs=1,
                    num_minibatches=2, ent_coef=0.1, grpo_drop_zero_variance=drop)
    steps = []
    original = torch.optim.AdamW.step
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch.optim.AdamW, "step", lambda self, *a, **k: steps.append(1) or original(self, *a, **k))
        row = train_rl(cfg, model=model, tokenizer=tok, env_fn=ToyNever)
    assert row["zero_variance_groups"] == 2
    moved = any(not torch.equal(a, b.detach()) for a, b in zip(before, model.parameters()))
    # dropped: a zero loss (its first Adam step moves nothing); kept: the entropy bonus alone moves the weights
    assert moved is (not drop)
    # every minibatch steps, also one with every token dropped (torchrun ranks must take the same steps)
    assert len(steps) == cfg.epochs * cfg.num_minibatches


def test_part_clock_adds_cpu_seconds_by_part_and_names_a_bad_part():
    ticks = iter([0.0, 2.0, 5.0, 5.5, 10.0, 13.0])
    clock = PartClock(clock=lambda: next(ticks))
    with clock("rollout"):
        pass
    with clock("actor"):
        pass
    with clock("rollout"):
        pass
    cols = clock.columns()
    assert cols["rollout_cpu_s"] == 5.0 and cols["actor_cpu_s"] == 0.5 and cols["optimizer_cpu_s"] == 0.0
    with pytest.raises(ValueError, match="CPU part must be one of"):
        with clock("teacher"):
            pass


def test_generation_setting_is_checked_and_reaches_the_sampler(tmp_path):
    with pytest.raises(ValueError, match="generation must be one of"):
        PPOConfig(generation="beam")
    tok = toy_tokenizer()
    seen = []
    original = LLMPolicy.__init__

    def spy(self, *a, **k):
        seen.append(k.get("generation"))
        original(self, *a, **k)

    cfg = PPOConfig(algo="grpo", out_dir=str(tmp_path), updates=1, episodes_per_update=4, group_size=2,
                    max_new_tokens=3, num_envs=2, eval_every=0, save_every=100, progress=False, epochs=1,
                    num_minibatches=1, generation="padded")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(LLMPolicy, "__init__", spy)
        row = train_rl(cfg, model=tiny_model(tok, seed=2), tokenizer=tok, env_fn=ToyNever)
    assert seen and set(seen) == {"padded"}
    # the update's CPU seconds by part, and the first minibatch's ratio diagnostics (sampling reproduced: ~0)
    assert row["rollout_cpu_s"] > 0 and row["actor_cpu_s"] > 0 and row["optimizer_cpu_s"] > 0
    assert abs(row["first_approx_kl"]) < 1e-6 and row["first_clipfrac"] == 0.0


@pytest.mark.parametrize("autocast", ["none", "bf16"])
def test_train_autocast_runs_only_the_training_passes_in_bf16(tmp_path, autocast):
    """train_autocast="bf16": every forward with gradients, the reference's and the recomputed old log-probs'
    run under bf16 autocast, the sampler's never (the records stay fp32-exact); the old log-probs come from that
    same forward, so the first minibatch's ratio is 1. "none" (the default): no forward under autocast."""
    with pytest.raises(ValueError, match="train_autocast must be one of"):
        PPOConfig(train_autocast="fp8")
    tok = toy_tokenizer()
    model = tiny_model(tok, seed=2)
    seen = []  # (gradients enabled, autocast on) at every body forward
    model.model.register_forward_hook(lambda m, a, o: seen.append((torch.is_grad_enabled(),
                                                                   torch.is_autocast_enabled("cpu"))))
    cfg = PPOConfig(algo="grpo", out_dir=str(tmp_path), updates=1, episodes_per_update=4, group_size=2, lr=1e-2,
                    max_new_tokens=3, num_envs=2, eval_every=0, save_every=100, progress=False, epochs=1,
                    num_minibatches=2, ent_coef=0.1, grpo_drop_zero_variance=False, train_autocast=autocast)
    row = train_rl(cfg, model=model, tokenizer=tok, env_fn=ToyNever)
    with_grad = [on for grad, on in seen if grad]
    no_grad = [on for grad, on in seen if not grad]
    assert with_grad and all(on is (autocast == "bf16") for on in with_grad)
    if autocast == "bf16":
        # sampling (fp32), and (no kl_coef, so no reference) the old log-probs recomputed by a bf16 forward
        assert False in no_grad and True in no_grad
    else:
        assert not any(no_grad)
    assert abs(row["first_approx_kl"]) < 1e-6 and row["first_clipfrac"] == 0.0


def test_ppo_loss_hand_computed():
    old = torch.log(torch.tensor([0.2, 0.4, 0.3]))
    logp = (old + torch.log(torch.tensor([1.5, 0.5, 1.0]))).requires_grad_(True)
    adv = torch.tensor([1.0, 1.0, -2.0])
    out = ppo_loss(logp, old, adv, clip=0.2)
    # token 0: max(-1.5, -1.2) = -1.2 (clipped); token 1: max(-0.5, -0.8) = -0.5; token 2: 2
    assert out["pg_loss"].item() == pytest.approx((-1.2 - 0.5 + 2.0) / 3)
    assert out["clipfrac"].item() == pytest.approx(2 / 3)
    out["loss"].backward()
    # the clipped token gets no gradient; the others -A * ratio / n
    assert logp.grad.tolist() == pytest.approx([0.0, -0.5 / 3, 2.0 / 3])
    v = ppo_loss(old[:2], old[:2], torch.zeros(2), values=torch.tensor([1.0, 0.0]), old_values=torch.tensor([0.5, 0.5]),
                 returns=torch.tensor([0.0, 1.0]), clip_vf=0.2, vf_coef=0.5)
    assert v["v_loss"].item() == pytest.approx(0.5) and v["loss"].item() == pytest.approx(0.25)
    k = ppo_loss(torch.zeros(1), torch.zeros(1), torch.zeros(1), ref_logp=torch.tensor([math.log(2)]), kl_coef=0.1,
                 entropy=torch.tensor([2.0]), ent_coef=0.01)
    assert k["kl_ref"].item() == pytest.approx(2 - math.log(2) - 1)
    assert k["loss"].item() == pytest.approx(0.1 * (1 - math.log(2)) - 0.02)


def test_policy_and_value_gradients_are_clipped_apart():
    policy = [torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(4))]
    value = [torch.nn.Parameter(torch.zeros(5))]
    policy[0].grad, policy[1].grad = torch.tensor([0.3, 0.0, 0.0]), torch.tensor([0.4, 0.0, 0.0, 0.0])
    value[0].grad = torch.full((5,), 10.0)
    norms = clip_gradients(policy, value, max_norm=1.0)
    assert norms == (pytest.approx(0.5), pytest.approx(10.0 * 5 ** 0.5))
    assert torch.allclose(policy[0].grad, torch.tensor([0.3, 0.0, 0.0]))  # a large value gradient leaves it be
    assert float(value[0].grad.norm()) == pytest.approx(1.0, rel=1e-4)
    policy[0].grad = torch.tensor([3.0, 0.0, 0.0])  # a large policy gradient is clipped on its own
    assert clip_gradients(policy, [], max_norm=1.0)[1] is None
    assert float(torch.cat([p.grad for p in policy]).norm()) == pytest.approx(1.0, rel=1e-4)


def test_batches_put_loss_on_action_tokens_only_and_reproduce_behaviour_logprobs():
    b = collate([([7, 8, 9], [20, 21]), ([7], [22, 23, 24])], pad_id=0, memory_masks=[[0, 1], [1, 1, 0]])
    assert b.rows.tolist() == [0, 0, 1, 1, 1]
    assert b.cols.tolist() == [2, 3, 0, 1, 2]  # the states that predict each response token
    assert b.targets.tolist() == [20, 21, 22, 23, 24]
    assert b.memory.tolist() == [False, True, True, True, False]
    assert not b.prompt.any()
    lm = collate([([7, 8, 9], [20, 21])], pad_id=0, include_prompt=True)  # SFT's optional LM loss on task text
    assert lm.targets.tolist() == [8, 9, 20, 21] and lm.cols.tolist() == [0, 1, 2, 3]
    assert lm.prompt.tolist() == [True, True, False, False]
    tok = memqa_tokenizer()
    model = tiny_model(tok)
    policy = LLMPolicy(model, tok, temperature=0.8, max_new_tokens=10, seed=0)
    gens = policy.generate(["<task>a</task>", "<task>a longer question about Wigei</task>", "b"])
    ac = ActorCritic(model, value_head=True)
    batch = collate([(g.prompt_ids, g.response_ids) for g in gens], tok.pad_token_id)
    logp, ent, values = ac(**batch.inputs(), temperature=0.8, entropy=True)
    behaviour = torch.tensor([x for g in gens for x in g.response_logprobs])
    assert (logp - behaviour).abs().max().item() <= 1e-4  # PPO ratio is exactly 1 before the first step
    assert values.shape == logp.shape == ent.shape


class ToyNever(ToyYes):
    """One turn, reward 0 whatever the action: every GRPO group has zero variance."""

    def step(self, action):
        return "say yes", 0.0, True, False, {}


def _success(model, tok, n=128):
    policy = LLMPolicy(model, tok, temperature=1.0, max_new_tokens=4, seed=123)
    return sum(ep.reward for ep in rollout(policy, [ToyYes()], [None] * n)) / n


@pytest.mark.parametrize("algo", ["grpo", "ppo"])
def test_short_run_on_toy_env_moves_toward_reward(tmp_path, algo):
    tok = toy_tokenizer()
    model = tiny_model(tok, seed=1)
    before = _success(model, tok)
    cfg = PPOConfig(algo=algo, out_dir=str(tmp_path), updates=8, episodes_per_update=32, group_size=8, lr=3e-3,
                    max_new_tokens=4, num_envs=8, eval_every=0, save_every=100, progress=False, kl_coef=0.01,
                    epochs=2, num_minibatches=2)
    row = train_rl(cfg, model=model, tokenizer=tok, env_fn=ToyYes)
    after = _success(model, tok)
    assert before < 0.2 and after > before + 0.3, (before, after)
    assert row["update"] == 8 and (tmp_path / "metrics.csv").exists() and (tmp_path / "learning_curve.png").exists()
