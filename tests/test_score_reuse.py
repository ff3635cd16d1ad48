"""The scoring passes an update saves, exactly (PPOConfig.old_logprobs_from_first_forward, ref_logprobs_from_actor):
the first minibatch's old log-probs from its own training forward, the reference's log-probs from the actor's while
the two are the same weights. The update with them equals the update without them."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from llm_common import memqa_tokenizer, tiny_model, toy_tokenizer  # noqa: E402
from test_distill_trainer import _cfg, _teacher_model  # noqa: E402
from test_llm_ppo import ToyYes  # noqa: E402

import agents.llm.training.ppo as ppo  # noqa: E402
from agents.llm.training.lora import BaseReference  # noqa: E402
from agents.llm.training.ppo import PPOConfig, train_rl  # noqa: E402
from distill.trainer import train_memopd  # noqa: E402


def _spy(mp):
    """Counts the records each scoring pass sees (per module: actor or reference) and keeps each update's batch
    as ppo_update leaves it (old and reference log-probs of every record filled)."""
    scored, batches = [], []
    score, update = ppo.score_records, ppo.ppo_update

    def score_spy(module, records, *a, **k):
        # (the reference?, count): a frozen copy, or the base under the actor's adapters (PPOConfig.lora_rank)
        ref = isinstance(module, BaseReference) or not any(p.requires_grad for p in module.parameters())
        scored.append((ref, len(records)))
        return score(module, records, *a, **k)

    def update_spy(cfg, dist, learner, batch, *a, **k):
        out = update(cfg, dist, learner, batch, *a, **k)
        batches.append(batch)
        return out

    mp.setattr(ppo, "score_records", score_spy)
    mp.setattr(ppo, "ppo_update", update_spy)
    return scored, batches


def _run(tmp_path, reuse: bool, memopd: bool, **kw):
    with pytest.MonkeyPatch.context() as mp:
        scored, batches = _spy(mp)
        flags = dict(old_logprobs_from_first_forward=reuse, ref_logprobs_from_actor=reuse)
        if memopd:  # the arms' trainer: packed forward, fused head, one backward per packed batch
            tok = memqa_tokenizer()
            model = tiny_model(tok, seed=1)
            cfg = _cfg(tmp_path / str(reuse), updates=2, kl_coef=0.05, recompute_old_logprobs=True,
                       grpo_drop_zero_variance=False, **flags, **kw)
            row = train_memopd(cfg, model=model, tokenizer=tok, teacher=_teacher_model(tok))
        else:
            tok = toy_tokenizer()
            model = tiny_model(tok, seed=1)
            cfg = PPOConfig(algo="grpo", out_dir=str(tmp_path / str(reuse)), updates=2, episodes_per_update=8,
                            group_size=4, lr=3e-3, max_new_tokens=4, num_envs=4, eval_every=0, save_every=100,
                            progress=False, kl_coef=0.05, epochs=2, num_minibatches=2,
                            recompute_old_logprobs=True, ent_coef=0.1, grpo_drop_zero_variance=False, **flags,
                            **kw)
            row = train_rl(cfg, model=model, tokenizer=tok, env_fn=ToyYes)
    return row, scored, batches, [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("memopd", [False, True])
def test_reused_forwards_make_the_same_update(tmp_path, memopd):
    off = _run(tmp_path, False, memopd)
    on = _run(tmp_path, True, memopd)
    n = [len(b.records) for b in on[2]]  # records per update
    # without: every update scores every record with the actor and with the reference
    assert off[1] == [(False, n[0]), (True, n[0]), (False, n[1]), (True, n[1])]
    # with: update 1 scores only the records after the first minibatch, once (the actor is the reference);
    # update 2 (the actor has moved) those records with the actor and every record with the reference
    assert len(on[1]) == 3, on[1]
    (a1, k1), (a2, k2), (r2, k3) = on[1]
    assert (a1, a2, r2) == (False, False, True) and 0 < k1 < n[0] and 0 < k2 < n[1] and k3 == n[1]
    for b_off, b_on in zip(off[2], on[2]):
        assert [r.response_ids for r in b_off.records] == [r.response_ids for r in b_on.records]
        assert None not in b_on.old_logps and None not in b_on.ref_logps
        flat = lambda xs: torch.tensor([v for x in xs for v in x])  # noqa: E731
        # the old log-probs are the training forward's at the update's start policy either way, to the rounding of
        # a forward over other rows (fp32; measured 0 on the collate forward, 4.8e-7 nats packed; allowed 1e-5)
        assert (flat(b_off.old_logps) - flat(b_on.old_logps)).abs().max() <= 1e-5
        assert (flat(b_off.ref_logps) - flat(b_on.ref_logps)).abs().max() <= 1e-5
    assert on[2][0].ref_logps == on[2][0].old_logps  # update 1: the reference is the actor, bit for bit
    assert on[2][1].ref_logps != on[2][1].old_logps  # update 2: it is not
    assert on[0]["first_approx_kl"] == 0.0 and on[0]["first_clipfrac"] == 0.0  # ratio exactly 1
    moved = max(float((a - s).abs().max()) for a, s in zip(on[3], [p.detach() for p in _start(memopd)]))
    gap = max(float((a - b).abs().max()) for a, b in zip(off[3], on[3]))
    # the same update (measured: bit for bit on the collate forward; 1.0e-6 packed, after a move of 2.4e-2)
    assert moved > 1e-3 and gap <= 1e-4 * moved, (moved, gap)


def _start(memopd: bool):
    return tiny_model(memqa_tokenizer() if memopd else toy_tokenizer(), seed=1).parameters()


def test_no_reuse_with_dropout_or_after_the_actor_moved(tmp_path):
    tok = toy_tokenizer()
    model = tiny_model(tok, seed=1)
    assert not ppo.has_dropout(model)
    model.config.attention_dropout = 0.1
    assert ppo.has_dropout(model)
    with pytest.MonkeyPatch.context() as mp:
        scored, _ = _spy(mp)
        cfg = PPOConfig(algo="grpo", out_dir=str(tmp_path), updates=2, episodes_per_update=4, group_size=2, lr=0.0,
                        max_new_tokens=3, num_envs=2, eval_every=0, save_every=100, progress=False, kl_coef=0.05,
                        epochs=1, num_minibatches=2, recompute_old_logprobs=True)
        train_rl(cfg, model=model, tokenizer=tok, env_fn=ToyYes)
    # dropout: every record scored by the actor (the reference is still the actor at lr 0: no reference pass)
    assert scored == [(False, 4), (False, 4)]
