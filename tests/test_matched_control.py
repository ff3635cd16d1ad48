"""The matched control: the teacher's reconstruction apart from the actor's. With lambda 0 the teacher-persistent
arm's student update is MemOPD's to the byte; the flattening arm's PPO ratio starts at 1; under a chat template
the persistent transcript closes and opens turns as the template does."""

import copy

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
import gymnasium as gym  # noqa: E402

from llm_common import ENV_KW, memqa_tokenizer, tiny_model  # noqa: E402

from agents.llm.generation.policy import LLMPolicy  # noqa: E402
from agents.llm.training.ppo import param_checksum  # noqa: E402
from agents.llm.records.rollouts import records_of, rollout  # noqa: E402
from distill.reconstruct import chat_turn_frame, persistent  # noqa: E402
from distill.trainer import MemOPDConfig, train_memopd  # noqa: E402

ENV = {**ENV_KW, "max_turns": 2}
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _env():
    import memenv  # noqa: F401

    return gym.make("MemQA-v0", **ENV)


def _cfg(tmp_path, **kw):
    base = dict(env_id="MemQA-v0", env_kwargs=ENV, out_dir=str(tmp_path), algo="grpo", updates=2,
                episodes_per_update=4, group_size=2, epochs=2, num_minibatches=2, lr=3e-3, max_new_tokens=10,
                num_envs=2, eval_every=0, save_every=100, progress=False, chunk=16, token_budget=512,
                grpo_drop_zero_variance=False)  # a random model's groups all score 0: keep their tokens
    base.update(kw)
    return MemOPDConfig(**base)


def _run(tmp_path, name, student_kw=None, **kw):
    tok = memqa_tokenizer()
    student = tiny_model(tok, seed=1, **(student_kw or {}))
    row = train_memopd(_cfg(tmp_path / name, **kw), model=student, tokenizer=tok,
                       teacher=tiny_model(tok, seed=2, initializer_range=0.3))
    return row, param_checksum(student)


@pytest.fixture
def spread_returns(monkeypatch):
    """Every episode a return of its own (a random model's answers all score 0, and with every return equal the
    policy term is 0: the student's weights could not show a difference in the actor's reconstruction)."""
    import agents.llm.training.ppo as ppo

    sample = ppo.rollout

    def rollout_with_returns(*args, **kwargs):
        episodes = sample(*args, **kwargs)
        for i, ep in enumerate(episodes):
            ep.records[-1].reward = 0.25 * (i % 4)
        return episodes

    monkeypatch.setattr(ppo, "rollout", rollout_with_returns)


def test_teacher_persistent_student_update_is_memopds_when_lambda_is_0(tmp_path, spread_returns):
    memopd = _run(tmp_path, "memopd", distill_coef=0.0)
    control = _run(tmp_path, "control", distill_coef=0.0, teacher_reconstruction="persistent")
    assert memopd[0]["pg_loss"] != 0.0  # the policy term acts: the actor's sequences reach the weights
    assert control[1] == memopd[1]  # the same weights after two updates: the same loss and gradients
    for key in ("pg_loss", "loss", "approx_kl", "grad_norm", "kl_ref"):
        assert control[0].get(key) == memopd[0].get(key), key
    # only the teacher's scoring state differs: the distillation term it reports is another number
    assert control[0]["distill_loss"] != memopd[0]["distill_loss"]
    # with lambda > 0 the teacher's layout reaches the student's update
    one = {"updates": 1, "epochs": 1}
    assert _run(tmp_path, "control1", teacher_reconstruction="persistent", **one)[1] != _run(tmp_path, "memopd1",
                                                                                          **one)[1]


def test_teacher_layout_defaults_to_the_actors_and_is_validated(tmp_path):
    assert _cfg(tmp_path, reconstruction="persistent").teacher_layout().reconstruction == "persistent"
    cfg = _cfg(tmp_path, teacher_reconstruction="persistent")
    assert (cfg.layout().reconstruction, cfg.teacher_layout().reconstruction) == ("aligned", "persistent")
    assert cfg.minibatch_unit == "invocation"  # the actor's minibatches are MemOPD's
    with pytest.raises(ValueError, match="teacher_reconstruction"):
        _cfg(tmp_path, teacher_reconstruction="flat")


def test_flattening_arm_ratio_starts_at_one(tmp_path):
    kw = dict(reconstruction="persistent", teacher_reconstruction="persistent", updates=1, epochs=1,
              num_minibatches=1, packing="padded", student_kw={"initializer_range": 0.3})  # context matters
    # one minibatch, before any step: the ratio is exactly the flattened forward against itself
    row, _ = _run(tmp_path, "flat", recompute_old_logprobs=True, **kw)
    assert abs(row["approx_kl"]) < 1e-9 and row["clipfrac"] == 0.0
    # against the behaviour log-probs of the aligned sampling, the flattened transcript moves the ratio
    row, _ = _run(tmp_path, "broken", recompute_old_logprobs=False, **kw)
    assert row["approx_kl"] > 1e-3 and row["clipfrac"] > 0


@pytest.fixture(scope="module")
def chat_tokenizer():
    tok = copy.deepcopy(memqa_tokenizer())
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.chat_template = CHATML
    return tok


def test_chat_turn_frame_of_chatml(chat_tokenizer):
    assert chat_turn_frame(chat_tokenizer) == ("<|im_end|>\n<|im_start|>user\n", "<|im_end|>\n<|im_start|>assistant\n")
    assert chat_turn_frame(memqa_tokenizer()) is None


def test_persistent_layout_under_a_chat_template_has_the_templates_turns(chat_tokenizer):
    tok = chat_tokenizer
    model = tiny_model(tok, seed=1)
    policy = LLMPolicy(model, tok, temperature=1.0, max_new_tokens=10, seed=0)
    assert policy.use_chat
    records = records_of(rollout(policy, [_env(), _env()], [0, 1]))
    sequences = persistent(records, tok)
    checked = 0
    for seq in sequences:
        recs = [records[s.record] for s in seq.segments]
        users = [str(recs[0].snapshot["observation"])] + [_info(r) for r in recs[1:]]  # what each turn adds
        for k in range(1, len(recs)):
            # the transcript up to turn k's response is the chat template's rendering of the episode so far
            messages = []
            for j in range(k):
                messages += [{"role": "user", "content": users[j]},
                             {"role": "assistant", "content": tok.decode(recs[j].response_ids)}]
            messages.append({"role": "user", "content": users[k]})
            want = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            got = tok.decode(seq.input_ids[:seq.segments[k].start], skip_special_tokens=False)
            assert got == want
            assert "</information><|im_end|>\n<|im_start|>assistant\n" in got
            checked += 1
    assert checked >= 2
    # the plain template keeps the raw layout: the sampled prompt's user turn, then no other
    plain = [tok.decode(s.input_ids, skip_special_tokens=False) for s in persistent(records, tok, template="plain")]
    assert all(text.count("<|im_start|>user") == 1 for text in plain)


def _info(record):
    obs = str(record.snapshot["observation"])
    start = obs.rfind("<information>")
    return obs[start:obs.find("</information>", start) + len("</information>")]


def test_distill_cli_sets_the_teachers_reconstruction(tmp_path):
    import argparse

    from distill.cli import build_config, register_cli
    from agents.llm.models.local import save_pretrained

    teacher = save_pretrained(tiny_model(memqa_tokenizer(), seed=2), memqa_tokenizer(), tmp_path / "teacher")
    parser = argparse.ArgumentParser()
    register_cli(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["distill", "--teacher", str(teacher), "--out", str(tmp_path / "o"),
                              "--teacher-reconstruction", "persistent"])
    cfg = build_config(args)
    assert (cfg.reconstruction, cfg.teacher_layout().reconstruction, cfg.minibatch_unit) == \
        ("aligned", "persistent", "invocation")
