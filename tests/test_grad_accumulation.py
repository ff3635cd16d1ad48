"""Bounded memory per update: a backward per micro-batch (MemOPD: per packed batch) and activation checkpointing
give the gradient of one backward over the whole minibatch."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from llm_common import memqa_tokenizer, tiny_model  # noqa: E402

from agents.llm.training.ppo import PPOConfig, train_rl  # noqa: E402
from distill.trainer import MemOPDConfig, train_memopd  # noqa: E402

ENV = {"objectives": 1, "hops": 1, "max_turns": 2}


def _grads(run):
    """The gradients at the first optimizer step of ``run()`` (and the row it returns)."""
    seen = []
    original = torch.optim.AdamW.step

    def step(self, *a, **k):
        if not seen:
            seen.append({id(p): p.grad.detach().clone() for g in self.param_groups for p in g["params"]
                         if p.grad is not None})
        return original(self, *a, **k)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch.optim.AdamW, "step", step)
        row = run()
    return list(seen[0].values()), row


def _max_diff(a, b):
    assert len(a) == len(b) and a
    return max(float((x - y).abs().max()) for x, y in zip(a, b))


def _memopd(tmp_path, name, **kw):
    tok = memqa_tokenizer()
    cfg = MemOPDConfig(out_dir=str(tmp_path / name), env_kwargs=ENV, algo="grpo", updates=1, episodes_per_update=4,
                       group_size=2, epochs=1, num_minibatches=1, lr=1e-3, max_new_tokens=10, num_envs=2,
                       eval_every=0, save_every=100, progress=False, chunk=16, token_budget=96,
                       grpo_drop_zero_variance=False, ent_coef=0.01, **kw)
    return _grads(lambda: train_memopd(cfg, model=tiny_model(tok, seed=1), tokenizer=tok,
                                       teacher=tiny_model(tok, seed=2, initializer_range=0.3)))


def test_memopd_backward_per_packed_batch_equals_one_backward(tmp_path):
    one, row_one = _memopd(tmp_path, "one", grad_accumulation=False)
    acc, row_acc = _memopd(tmp_path, "acc", grad_accumulation=True)
    ckpt, row_ckpt = _memopd(tmp_path, "ckpt", grad_accumulation=True, gradient_checkpointing=True)
    assert row_one["micro_batches"] == 1 and row_acc["micro_batches"] > 1  # the budget splits the minibatch
    assert max(float(g.abs().max()) for g in one) > 1e-3  # a real gradient (distillation + entropy)
    assert _max_diff(one, acc) <= 1e-5
    assert _max_diff(one, ckpt) <= 1e-5
    assert row_acc["distill_loss"] == pytest.approx(row_one["distill_loss"], abs=1e-5)  # the minibatch mean


def test_ppo_micro_batches_equal_one_backward(tmp_path):
    tok = memqa_tokenizer()

    def run(name, **kw):
        cfg = PPOConfig(out_dir=str(tmp_path / name), env_kwargs=ENV, algo="ppo", updates=1, episodes_per_update=4,
                        epochs=1, num_minibatches=1, lr=1e-3, max_new_tokens=8, num_envs=2, eval_every=0,
                        save_every=100, progress=False, kl_coef=0.1, ent_coef=0.01, **kw)
        return _grads(lambda: train_rl(cfg, model=tiny_model(tok, seed=1), tokenizer=tok))

    one, _ = run("one")
    acc, row = run("acc", grad_accumulation=True, micro_batch_size=1)
    assert row["micro_batches"] > 1
    assert _max_diff(one, acc) <= 1e-5


def test_micro_batch_size_is_checked():
    with pytest.raises(ValueError, match="micro_batch_size"):
        PPOConfig(micro_batch_size=0)
