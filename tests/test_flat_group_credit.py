"""GRPO groups whose rewards are all equal: only the trajectory part of the policy gradient is dropped; an
advantage a hook adds there (memory credit) still trains its tokens, and the minibatch still steps."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from llm_common import tiny_model, toy_tokenizer  # noqa: E402

from agents.llm.training.ppo import PPOConfig, ppo_loss, train_rl  # noqa: E402
from test_llm_ppo import ToyNever  # noqa: E402


def test_pg_mask_keeps_credited_tokens_of_a_dropped_group_hand_case():
    old = torch.log(torch.tensor([0.5, 0.5, 0.5, 0.5]))
    logp = (old + torch.log(torch.tensor([1.1, 0.9, 1.0, 1.05]))).requires_grad_(True)
    # tokens 0,1: a group with signal; 2,3: a zero-variance group, token 3 a memory token with credit 0.4
    adv = torch.tensor([1.0, -1.0, 0.0, 0.4])
    ent, ref = torch.tensor([0.3, 0.2, 0.1, 0.5]), old.clone()
    mask = torch.tensor([True, True, False, False])
    pg_mask = mask | (adv != 0)
    out = ppo_loss(logp, old, adv, mask=mask, pg_mask=pg_mask, entropy=ent, ent_coef=0.1, ref_logp=ref,
                   kl_coef=0.0)
    # pg over tokens 0, 1, 3: -1.1 (unclipped), 0.9, -0.4 * 1.05, token-mean over 3
    assert out["pg_loss"].item() == pytest.approx((-1.1 + 0.9 - 0.4 * 1.05) / 3, abs=1e-6)
    assert out["entropy"].item() == pytest.approx((0.3 + 0.2) / 2, abs=1e-6)  # entropy/KL: mask only
    out["pg_loss"].backward()
    assert logp.grad.tolist() == pytest.approx([-1.1 / 3, 0.9 / 3, 0.0, -0.4 * 1.05 / 3], abs=1e-6)
    # the old behaviour (pg over the mask) would have thrown the credited token away
    assert ppo_loss(logp, old, adv, mask=mask)["pg_loss"].item() == pytest.approx((-1.1 + 0.9) / 2, abs=1e-6)
    # nothing kept at all: a zero loss that backward still runs through
    none = ppo_loss(logp, old, torch.zeros(4), mask=torch.zeros(4, dtype=torch.bool))
    assert none["loss"].item() == 0.0 and none["loss"].requires_grad


class Credit:
    """A hook that adds ``credit`` to every action token after GRPO's advantages are set (as memory credit
    does at memory tokens) and adds no loss term of its own."""

    def __init__(self, credit):
        self.credit, self.seen = credit, []

    def on_update(self, episodes, records, module):
        self.seen.append([a for r in records for a in r.token_advantages])
        for r in records:
            r.token_advantages = [a + self.credit for a in r.token_advantages]
        return {}

    def __call__(self, records, actor):
        return actor.logp.sum() * 0.0, {}


@pytest.mark.parametrize("credit", [0.0, 0.5])
def test_credit_trains_tokens_of_zero_variance_groups(tmp_path, credit):
    tok = toy_tokenizer()
    model = tiny_model(tok, seed=2)
    before = [p.detach().clone() for p in model.parameters()]
    cfg = PPOConfig(algo="grpo", out_dir=str(tmp_path), updates=1, episodes_per_update=8, group_size=4, lr=1e-2,
                    max_new_tokens=3, num_envs=4, eval_every=0, save_every=100, progress=False, epochs=1,
                    num_minibatches=2)
    hook = Credit(credit)
    row = train_rl(cfg, model=model, tokenizer=tok, env_fn=ToyNever, extra_loss=hook)
    assert row["zero_variance_groups"] == 2  # every group: reward 0 whatever the action
    assert all(a == 0.0 for a in hook.seen[0])  # the trajectory advantage of a flat group is exactly 0
    moved = any(not torch.equal(a, b.detach()) for a, b in zip(before, model.parameters()))
    assert moved is (credit != 0)
    assert (row["flat_credited_tokens"] > 0) is (credit != 0)
