"""Low-rank adapters for the actor (PPOConfig.lora_rank; agents.llm.training.lora): only the adapters train (the base is
unchanged), the reference is the base bit for bit with no second copy, the scoring levers stay exact, the records'
log-probs are the sampling policy's, a checkpoint's merged model reproduces the adapted one's log-probs and
loads with from_pretrained, a resume continues bit for bit, and bad settings are refused in one line."""

import csv
import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from llm_common import memqa_envs, memqa_tokenizer, tiny_model, toy_tokenizer  # noqa: E402
from test_score_reuse import _run  # noqa: E402

from agents.llm.training import lora  # noqa: E402
from agents.llm.training.actor import collate_forward, score_records  # noqa: E402
from agents.llm.models.local import load_pretrained, save_pretrained  # noqa: E402
from agents.llm.generation.policy import LLMPolicy  # noqa: E402
from agents.llm.training.ppo import PPOConfig, train_rl  # noqa: E402
from agents.llm.records.rollouts import records_of, rollout  # noqa: E402
from agents.llm.training.common import ActorCritic, load_trainer_state  # noqa: E402
from distill.scoring import rce  # noqa: E402

ENV = {"objectives": 1, "hops": 1, "max_turns": 2}


def _cfg(out, **kw):
    base = dict(algo="grpo", out_dir=str(out), updates=2, episodes_per_update=4, group_size=2, num_minibatches=1,
                epochs=1, lr=3e-2, max_new_tokens=8, num_envs=2, eval_every=0, save_every=1, progress=False,
                grpo_drop_zero_variance=False, ent_coef=0.05, kl_coef=0.05, env_kwargs=ENV, lora_rank=4)
    return PPOConfig(**{**base, **kw})


def _records(lm, tok, n=2):
    policy = LLMPolicy(lm, tok, temperature=1.0, max_new_tokens=8, seed=3)
    return records_of(rollout(policy, memqa_envs(2, **ENV), list(range(n)), groups=[0] * n))


def _base(lm):
    return {n.replace(".base_layer.", "."): p.detach().clone() for n, p in lm.named_parameters()
            if ".lora_" not in n}


def test_bad_lora_settings_are_refused_in_one_line():
    for kw, field in [({"lora_rank": -1}, "lora_rank"), ({"lora_rank": 2.5}, "lora_rank"),
                      ({"lora_alpha": 0}, "lora_alpha"), ({"lora_alpha": float("nan")}, "lora_alpha"),
                      ({"lora_targets": "q_proj"}, "lora_targets"), ({"lora_targets": []}, "lora_targets")]:
        with pytest.raises(ValueError, match=field) as err:
            _cfg("x", **kw)
        assert "\n" not in str(err.value)
    tok = memqa_tokenizer()
    with pytest.raises(ValueError, match="lora_targets: no linear layer named qkv") as err:
        lora.add_adapters(tiny_model(tok), 4, targets=["q_proj", "qkv"])
    assert "\n" not in str(err.value)
    assert _cfg("x", lora_rank=0).lora_rank == 0  # off (the default): nothing changes


def test_the_reference_is_the_base_bit_for_bit():
    tok = memqa_tokenizer()
    lm = tiny_model(tok, seed=1)
    records = _records(lm, tok)
    forward = collate_forward(tok.pad_token_id, "cpu")
    base_logps = score_records(ActorCritic(lm), records, forward, 1.0, values=False)[0]
    lora.add_adapters(lm, 4)
    actor, ref = ActorCritic(lm), lora.BaseReference(lm)
    # B = 0 at the start: the adapted model computes the base's forward, bit for bit
    assert lora.adapters_are_zero(lm)
    assert score_records(actor, records, forward, 1.0, values=False)[0] == base_logps
    with torch.no_grad():
        for layer in lora.adapter_layers(lm):
            layer.lora_B["default"].weight.normal_(0, 0.2)
    assert not lora.adapters_are_zero(lm)
    assert score_records(actor, records, forward, 1.0, values=False)[0] != base_logps
    assert score_records(ref, records, forward, 1.0, values=False)[0] == base_logps  # adapters off: the base
    assert all(p.requires_grad for n, p in lm.named_parameters() if ".lora_" in n)  # given back after the pass
    assert sum(p.numel() for p in ref.parameters()) == sum(p.numel() for p in actor.parameters())  # no copy


def test_adapters_train_alone_merge_exactly_and_resume_bit_for_bit(tmp_path):
    tok = memqa_tokenizer()
    save_pretrained(tiny_model(tok, seed=1), tok, tmp_path / "start")
    start = str(tmp_path / "start")
    lm, _ = load_pretrained(start)
    base = _base(lm)
    train_rl(_cfg(tmp_path / "whole", model=start), model=lm, tokenizer=tok)
    # only the adapters moved: every base weight is the start's, bit for bit; the adapters' B left zero
    assert lora.has_adapters(lm) and all(torch.equal(base[n], p) for n, p in _base(lm).items())
    assert not lora.adapters_are_zero(lm)
    rows = list(csv.DictReader(open(tmp_path / "whole" / "metrics.csv")))
    # the reference is the base: no KL while the actor still is it (update 1's first minibatch), some after
    assert float(rows[0]["kl_ref"]) == 0.0 and float(rows[1]["kl_ref"]) > 0.0
    ckpt = tmp_path / "whole" / "checkpoint-0000002"
    info = json.loads((ckpt / lora.ADAPTER_INFO).read_text())
    assert (info["rank"], info["alpha"]) == (4, 8.0)
    # records sampled by the adapted policy: their log-probs are its own (RCE), and the merged model of the
    # checkpoint (a plain from_pretrained load) reproduces them. Merging rounds each weight W + (alpha/r) B A once
    # in fp32 (relative 6e-8); through 2 layers and the head that moves a log-prob by ~1e-7 (measured below 1e-6):
    # the bound 1e-5 allows 10x that
    records = _records(lm, tok, n=4)
    assert rce(lm, records)["max_abs"] <= 1e-4
    merged, _ = load_pretrained(ckpt)
    assert not lora.has_adapters(merged)
    assert rce(merged, records)["max_abs"] <= 1e-5
    # interrupted after update 1, resumed from its checkpoint (the base rebuilt from cfg.model): the same adapters,
    # optimizer state and merged model at the end, bit for bit
    train_rl(_cfg(tmp_path / "parts", model=start, updates=1))
    train_rl(_cfg(tmp_path / "parts", model=start, resume=True))
    end = tmp_path / "parts" / "checkpoint-0000002"
    a, b = (torch.load(p / lora.ADAPTER_FILE) for p in (ckpt, end))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert (end / "model.safetensors").read_bytes() == (ckpt / "model.safetensors").read_bytes()
    sa, sb = (load_trainer_state(p, optimizer=True)["optimizer"]["state"] for p in (ckpt, end))
    assert len(sa) == len(a) and all(torch.equal(sa[k]["exp_avg"], sb[k]["exp_avg"]) for k in sa)
    # a resume with other adapters is refused, naming the setting
    with pytest.raises(ValueError, match="lora_rank: .* was trained with 4, this run has 2"):
        train_rl(_cfg(tmp_path / "parts", model=start, lora_rank=2, updates=3, resume=True))


HEAD_TOO = lora.DEFAULT_TARGETS + ("lm_head",)


def test_a_frozen_small_head_caps_what_body_adapters_can_change():
    """Why body adapters barely learn on a tiny model trained from scratch (docs/distill_speed.md): the final norm hands
    the head a vector of norm sqrt(d) x max|g|, so no change in the body moves a logit by more than
    2 x sqrt(d) x max|g| x max_j ||w_j||, nor a log-prob by more than twice that: for the toy model (d 32, head
    rows of norm <= 0.15) 3.4 nats, whatever the adapters hold, while a near-certain "yes" from the start's 7%
    needs the right log-prob up by ~2.5 nats and every other down (the body would have to align perfectly)."""
    tok = toy_tokenizer()
    lm = tiny_model(tok, seed=1)
    ids = torch.tensor([tok("say yes")["input_ids"]])
    with torch.no_grad():
        before = lm(ids).logits[0, -1].log_softmax(-1)
        head, norm = lm.get_output_embeddings().weight, lm.model.norm.weight
        cap = 4 * head.shape[1] ** 0.5 * norm.abs().max() * head.norm(dim=1).max()
        lora.add_adapters(lm, 4)
        for layer in lora.adapter_layers(lm):
            for b in layer.lora_B.values():
                b.weight.normal_(0, 1, generator=torch.Generator().manual_seed(0))
        after = lm(ids).logits[0, -1].log_softmax(-1)
    assert cap < 4.0  # the toy's cap: a few nats at most
    assert 0.05 < (after - before).abs().max() <= cap  # the adapters act, within the cap


def test_a_head_adapter_merges_into_an_untied_head_and_keeps_the_embeddings(tmp_path):
    tok = memqa_tokenizer()
    save_pretrained(tiny_model(tok, seed=1), tok, tmp_path / "start")
    start = str(tmp_path / "start")
    lm, _ = load_pretrained(start)
    assert lm.get_output_embeddings().weight is lm.get_input_embeddings().weight  # tied, as the tiny models are
    embeddings = lm.get_input_embeddings().weight.detach().clone()
    train_rl(_cfg(tmp_path / "run", model=start, lora_targets=HEAD_TOO), model=lm, tokenizer=tok)
    assert torch.equal(lm.get_input_embeddings().weight, embeddings)  # frozen, though the head adapted
    records = _records(lm, tok, n=4)
    assert rce(lm, records)["max_abs"] <= 1e-4
    merged, _ = load_pretrained(tmp_path / "run" / "checkpoint-0000002")
    assert not lora.has_adapters(merged) and not merged.config.tie_word_embeddings
    assert torch.equal(merged.get_input_embeddings().weight, embeddings)  # merging did not move the embeddings
    assert not torch.equal(merged.get_output_embeddings().weight, embeddings)  # the head did move
    assert rce(merged, records)["max_abs"] <= 1e-5
    # the actor in training is unchanged by the save (its head still tied to its embeddings under the adapter)
    assert lm.get_output_embeddings().get_base_layer().weight is lm.get_input_embeddings().weight


def test_head_adapters_learn_the_toy_task_as_the_full_weights_do(tmp_path):
    """The cap above lifted: with the head adapted too, rank-4 adapters learn the toy env of
    tests/test_llm_ppo.py as the full weights do (measured 0.07 -> 0.78 for both; body adapters alone: 0.13)."""
    from test_llm_ppo import ToyYes, _success

    tok = toy_tokenizer()
    model = tiny_model(tok, seed=1)
    before = _success(model, tok)
    cfg = PPOConfig(algo="grpo", out_dir=str(tmp_path), updates=8, episodes_per_update=32, group_size=8, lr=3e-3,
                    max_new_tokens=4, num_envs=8, eval_every=0, save_every=100, progress=False, kl_coef=0.01,
                    epochs=2, num_minibatches=2, lora_rank=4, lora_targets=HEAD_TOO)
    train_rl(cfg, model=model, tokenizer=tok, env_fn=ToyYes)
    after = _success(model, tok)
    assert before < 0.2 and after > before + 0.3, (before, after)


def test_scoring_levers_stay_exact_with_adapters(tmp_path):
    """The MemOPD path (packed forward, fused head, bf16-free fp32): the reference is the base with the adapters
    off, and the levers (first minibatch's old log-probs, no reference pass while the actor is the base) make the
    same update as without them."""
    off = _run(tmp_path, False, True, lora_rank=4)
    on = _run(tmp_path, True, True, lora_rank=4)
    n = [len(b.records) for b in on[2]]
    assert off[1] == [(False, n[0]), (True, n[0]), (False, n[1]), (True, n[1])]
    (a1, k1), (a2, k2), (r2, k3) = on[1]
    assert (a1, a2, r2) == (False, False, True) and 0 < k1 < n[0] and k3 == n[1]
    flat = lambda xs: torch.tensor([v for x in xs for v in x])  # noqa: E731
    for b_off, b_on in zip(off[2], on[2]):
        assert (flat(b_off.old_logps) - flat(b_on.old_logps)).abs().max() <= 1e-5
        assert (flat(b_off.ref_logps) - flat(b_on.ref_logps)).abs().max() <= 1e-5
    assert on[2][0].ref_logps == on[2][0].old_logps and on[2][1].ref_logps != on[2][1].old_logps
    assert on[0]["first_approx_kl"] == 0.0


def test_the_experiment_setting_reaches_every_grpo_arm_and_keeps_cached_arms():
    from dataclasses import replace

    from distill.experiment.config import ExperimentConfig
    from distill.experiment.stages import _arm_settings, _same_settings, arm_config

    cfg = ExperimentConfig(out="x")
    paths = ({"path": "s"}, {"path": "t"})
    for arm in ("rl", "memopd"):
        assert arm_config(cfg, arm, 0, *paths).lora_rank == 0  # off by default
        assert (arm_config(replace(cfg, lora_rank=8), arm, 0, *paths).lora_rank,
                arm_config(replace(cfg, lora_rank=8, lora_alpha=4.0), arm, 0, *paths).lora_alpha) == (8, 4.0)
    # an arm cached before the setting existed was trained without adapters: it matches the default, not rank 8
    now = _arm_settings(cfg, arm_config(cfg, "memopd", 0, *paths))
    cached = {k: v for k, v in now.items() if not k.startswith("lora_")}
    assert _same_settings(cached, now)
    assert not _same_settings(cached, _arm_settings(cfg, arm_config(replace(cfg, lora_rank=8), "memopd", 0, *paths)))
    for kw, field in [({"lora_rank": -1}, "lora_rank"), ({"lora_alpha": 0.0}, "lora_alpha")]:
        with pytest.raises(ValueError, match=field):
            ExperimentConfig(out="x", **kw)
