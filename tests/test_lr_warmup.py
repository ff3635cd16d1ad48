"""Learning-rate warm-up of the RL trainers (PPOConfig.warmup_updates): the lr of update u is lr * (u+1) / N for
the first N updates, logged; a run resumed inside the warm-up ends on the uninterrupted run's weights; without a
warm-up nothing changes."""

import csv

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from llm_common import memqa_tokenizer, tiny_model  # noqa: E402

from agents.llm.models.local import save_pretrained  # noqa: E402
from agents.llm.training.ppo import PPOConfig, param_checksum, train_rl  # noqa: E402


def _cfg(out, **kw):
    base = dict(algo="grpo", out_dir=str(out), updates=3, episodes_per_update=4, group_size=2, num_minibatches=1,
                epochs=1, lr=3e-3, max_new_tokens=8, num_envs=2, eval_every=0, save_every=1, progress=False,
                grpo_drop_zero_variance=False, ent_coef=0.05,  # a gradient although a random model scores 0
                env_kwargs={"objectives": 1, "hops": 1, "max_turns": 2})
    return PPOConfig(**{**base, **kw})


def _rows(out):
    return list(csv.DictReader(open(out / "metrics.csv")))


def test_lr_scale_and_validation():
    cfg = _cfg("x", warmup_updates=4)
    assert [cfg.lr_scale(u) for u in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert _cfg("x").lr_scale(0) == 1.0
    with pytest.raises(ValueError, match="warmup_updates"):
        _cfg("x", warmup_updates=-1)


def test_warmup_trains_at_the_scaled_lr_and_resumes_exactly(tmp_path):
    tok = memqa_tokenizer()
    save_pretrained(tiny_model(tok, seed=1), tok, tmp_path / "start")
    start = str(tmp_path / "start")
    train_rl(_cfg(tmp_path / "whole", model=start, warmup_updates=3))
    assert [float(r["lr"]) for r in _rows(tmp_path / "whole")] == pytest.approx([1e-3, 2e-3, 3e-3])
    # interrupted after update 1 (inside the warm-up), resumed: the same weights at the end
    train_rl(_cfg(tmp_path / "parts", model=start, warmup_updates=3, updates=1))
    train_rl(_cfg(tmp_path / "parts", model=start, warmup_updates=3, resume=True))
    assert [float(r["lr"]) for r in _rows(tmp_path / "parts")] == pytest.approx([1e-3, 2e-3, 3e-3])
    whole = (tmp_path / "whole" / "checkpoint-0000003" / "model.safetensors").read_bytes()
    assert (tmp_path / "parts" / "checkpoint-0000003" / "model.safetensors").read_bytes() == whole
    # the warm-up changes the training (a run without it ends elsewhere) and logs no lr column
    train_rl(_cfg(tmp_path / "flat", model=start))
    assert (tmp_path / "flat" / "checkpoint-0000003" / "model.safetensors").read_bytes() != whole
    assert "lr" not in _rows(tmp_path / "flat")[0]
