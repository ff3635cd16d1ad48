"""TRL adapter: GRPO steps on a tiny model move the weights with per-episode advantages; padding rows and env
tokens carry no loss; history rows are token-exact; misconfigurations fail clearly."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
trl = pytest.importorskip("trl")

from llm_common import ENV_KW, memqa_tokenizer, tiny_model  # noqa: E402

from agents.llm.generation.policy import sequence_logprobs  # noqa: E402
from agents.llm.adapters.trl import MemenvRollout, episode_return_reward, seed_of, task_prompt  # noqa: E402

ROWS = 3  # rows_per_episode (= the env's turn limit) in memory mode


def protocol_prior(model, tokenizer, strength: float = 8.0):
    """Makes a random tiny model follow the action protocol now and then: a fixed bigram bias on the logits
    (``\\n`` -> ``<memory>`` -> ``</memory>`` -> ``<answer>``/``<search>`` -> closing tag), so episodes end at
    different turns with different returns. A buffer-free forward hook, seen by sampling and by TRL alike."""
    ids = tokenizer.convert_tokens_to_ids
    vocab = model.get_output_embeddings().weight.shape[0]
    table = torch.zeros(vocab, vocab)
    newline = tokenizer.encode("\n", add_special_tokens=False)[-1]
    for prev, nxt in [(newline, "<memory>"), ("<memory>", "</memory>"), ("</memory>", "<answer>"),
                      ("</memory>", "<search>"), ("<answer>", "</answer>"), ("<search>", "</search>")]:
        prev_id = prev if isinstance(prev, int) else ids(prev)
        table[prev_id, ids(nxt)] = strength
    state = {}

    def keep_ids(module, args, kwargs):
        state["ids"] = kwargs.get("input_ids", args[0] if args else None)

    def add_bias(module, args, output):
        ids_now = state["ids"][:, -output.shape[1]:]
        return output + table[ids_now].to(output.dtype)

    model.register_forward_pre_hook(keep_ids, with_kwargs=True)
    model.get_output_embeddings().register_forward_hook(add_bias)
    return model


class CapturingGRPOTrainer(trl.GRPOTrainer):
    """Keeps what ``_generate_and_score_completions`` hands to the loss (rows in rollout order)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.captured = []

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        self.captured.append({"batch": output, "rows": dict(self.rollout_func.last_rows)})
        return output


def _config(tmp_path, **overrides):
    kw = dict(output_dir=str(tmp_path), num_generations=2 * ROWS, per_device_train_batch_size=4 * ROWS, max_steps=2,
              learning_rate=5e-3, logging_steps=1, report_to=[], bf16=False, max_completion_length=8,
              save_strategy="no", beta=0.0, seed=3, disable_tqdm=True)
    kw.update(overrides)
    return trl.GRPOConfig(**kw)


def _trainer(tmp_path, rollout, model=None, **overrides):
    tok = memqa_tokenizer()
    model = model if model is not None else protocol_prior(tiny_model(tok), tok)
    return CapturingGRPOTrainer(model=model, reward_funcs=episode_return_reward, args=_config(tmp_path, **overrides),
                                train_dataset=rollout.dataset(16), processing_class=tok, rollout_func=rollout)


@pytest.fixture(scope="module")
def memory_run(tmp_path_factory):
    """Two GRPO steps in memory mode: 4 episodes (2 task seeds x 2) of up to 3 invocations per step."""
    rollout = MemenvRollout("MemQA-v0", {**ENV_KW, "invalid_penalty": 0.25}, rows_per_episode=ROWS)
    trainer = _trainer(tmp_path_factory.mktemp("grpo"), rollout)
    before = {k: v.detach().clone() for k, v in trainer.model.named_parameters()}
    trainer.train()
    return trainer, before


def test_two_grpo_steps_change_the_weights_with_one_advantage_per_episode(memory_run):
    trainer, before = memory_run
    assert len(trainer.captured) == 2
    moved = sum((before[k] - v.detach()).abs().sum().item() for k, v in trainer.model.named_parameters())
    assert moved > 0
    spreads = 0
    for step in trainer.captured:
        rows, adv = step["rows"], step["batch"]["advantages"].tolist()
        assert len(adv) == 4 * ROWS
        returns = rows["episode_return"]
        for start in range(0, len(adv), ROWS):  # one episode per block of ROWS rows
            assert len(set(rows["episode_id"][start:start + ROWS])) == 1
            assert adv[start:start + ROWS] == pytest.approx([adv[start]] * ROWS, abs=1e-6)
        for group in range(0, len(adv), 2 * ROWS):  # the two episodes of a task seed form the GRPO group
            a, b = returns[group], returns[group + ROWS]
            if a != b:
                spreads += 1
                assert (adv[group] > adv[group + ROWS]) == (a > b)
    assert spreads > 0, "no group had episodes with different returns: the test could not see an advantage"


def test_rows_are_the_sampled_invocation_records(memory_run):
    trainer, _ = memory_run
    rollout = trainer.rollout_func
    rows = rollout.last_rows
    real = [i for i, pad in enumerate(rows["padding"]) if not pad]
    records = [r for ep in rollout.last_episodes for r in ep.records]
    assert len(real) == len(records)
    for i, record in zip(real, records):
        assert rows["prompt_ids"][i] == record.prompt_ids and rows["completion_ids"][i] == record.response_ids
        assert rows["logprobs"][i] == record.response_logprobs and rows["env_mask"][i] == [1] * len(record.response_ids)
    # The memory-mode prompt of each invocation is that turn's observation, not a growing chat.
    for ep in rollout.last_episodes:
        for record in ep.records:
            assert rollout._policy.encode_prompt(record.snapshot["observation"]) == record.prompt_ids


def test_padding_rows_carry_no_loss(memory_run):
    trainer, _ = memory_run
    step = trainer.captured[-1]
    batch, rows = step["batch"], step["rows"]
    padding = [i for i, pad in enumerate(rows["padding"]) if pad]
    real = [i for i, pad in enumerate(rows["padding"]) if not pad]
    assert padding, "no episode ended early: nothing to check"
    loss_mask = batch["completion_mask"] * batch["tool_mask"]  # TRL's loss mask
    assert loss_mask[padding].sum().item() == 0 and loss_mask[real].sum().item() > 0
    model = trainer.model

    def loss(change):
        inputs = {k: (v.clone() if torch.is_tensor(v) else v) for k, v in batch.items()}
        inputs["completion_ids"][change, 0] = (inputs["completion_ids"][change, 0] + 7) % 500
        inputs["advantages"][change] = inputs["advantages"][change] + 3.0
        with torch.no_grad():
            return trainer._compute_loss(model, inputs).item()

    base = loss([])
    assert loss(padding) == pytest.approx(base, abs=1e-7)
    assert loss(real[:1]) != pytest.approx(base, abs=1e-7)  # the same edit on a real row does change it


def test_history_rows_mask_environment_tokens(tmp_path):
    tok = memqa_tokenizer()
    rollout = MemenvRollout("MemQA-v0", {**ENV_KW, "context": "history", "max_turns": 3})
    assert rollout.history_rows and rollout.rows_per_episode == 1
    trainer = _trainer(tmp_path, rollout, num_generations=2, per_device_train_batch_size=4, max_steps=1)
    trainer.train()
    rows = rollout.last_rows
    multi = [ep for ep in rollout.last_episodes if len(ep.info["generations"]) > 1]
    assert multi, "every episode ended after one action: no env text to mask"
    for i, ep in enumerate(rollout.last_episodes):
        mask, completion = rows["env_mask"][i], rows["completion_ids"][i]
        gens = ep.info["generations"]
        # the model tokens are exactly the sampled actions, in order; everything between them is env text
        assert [t for t, m in zip(completion, mask) if m] == [t for g in gens for t in g.response_ids]
        assert sum(1 - m for m in mask) > 0 if len(gens) > 1 else sum(mask) == len(mask)
        env_text = tok.decode([t for t, m in zip(completion, mask) if not m])
        assert ("<information>" in env_text) == (len(gens) > 1)
    batch = trainer.captured[-1]["batch"]
    loss_mask = batch["completion_mask"] * batch["tool_mask"]
    for i in range(len(rows["env_mask"])):
        n = len(rows["env_mask"][i])
        assert loss_mask[i, :n].tolist() == rows["env_mask"][i]


def test_history_row_logprobs_are_the_sampled_ones():
    """Without training in between, re-scoring a history row gives the sampled log-probs at action tokens."""
    tok = memqa_tokenizer()
    model = protocol_prior(tiny_model(tok, seed=1), tok)
    rollout = MemenvRollout("MemQA-v0", {**ENV_KW, "context": "history", "max_turns": 3})
    rows = rollout(["MemQA-v0 seed=5"] * 4, _FakeTrainer(model, tok))
    checked = 0
    for prompt, completion, logps, mask in zip(rows["prompt_ids"], rows["completion_ids"], rows["logprobs"],
                                              rows["env_mask"]):
        scored = sequence_logprobs(model, prompt, completion)
        action = torch.tensor(mask, dtype=torch.bool)
        assert torch.allclose(scored[action], torch.tensor(logps)[action], atol=1e-4)
        checked += int((~action).any())
    assert checked > 0


class _Args:
    def __init__(self, **kw):
        self.temperature, self.top_p, self.top_k, self.min_p, self.repetition_penalty = 1.0, 1.0, 0, None, 1.0
        self.max_completion_length, self.seed, self.mask_truncated_completions = 8, 0, False
        self.generation_kwargs, self.vllm_mode, self.vllm_tensor_parallel_size = None, "colocate", 1
        self.__dict__.update(kw)


class _Accelerator:
    num_processes, process_index = 1, 0

    @staticmethod
    def unwrap_model(model):
        return model


class _FakeTrainer:
    """The attributes of a GRPOTrainer the rollout reads (for checks without building a trainer)."""

    def __init__(self, model, tokenizer, num_generations=4, use_vllm=False, **args):
        self.model, self.processing_class, self.num_generations, self.use_vllm = model, tokenizer, num_generations, use_vllm
        self.args, self.accelerator = _Args(**args), _Accelerator()
        self.temperature = self.args.temperature


def test_misconfigurations_fail_clearly():
    tok = memqa_tokenizer()
    model = tiny_model(tok)
    rollout = MemenvRollout("MemQA-v0", ENV_KW, rows_per_episode=ROWS)
    with pytest.raises(ValueError, match=r"num_generations=4 must be episodes_per_group x rows_per_episode"):
        rollout.check(_FakeTrainer(model, tok, num_generations=4))
    with pytest.raises(ValueError, match="episodes_per_group >= 2"):
        rollout.check(_FakeTrainer(model, tok, num_generations=ROWS))
    with pytest.raises(ValueError, match="mask_truncated_completions"):
        rollout.check(_FakeTrainer(model, tok, num_generations=2 * ROWS, mask_truncated_completions=True))
    hot = MemenvRollout("MemQA-v0", ENV_KW, rows_per_episode=ROWS, temperature=0.7)
    with pytest.raises(ValueError, match=r"temperature=0.7\) differs from GRPOConfig.temperature=1.0"):
        hot.check(_FakeTrainer(model, tok, num_generations=2 * ROWS))
    with pytest.raises(ValueError, match="top_k"):
        rollout.check(_FakeTrainer(model, tok, num_generations=2 * ROWS, top_k=20))
    with pytest.raises(ValueError, match="generation_kwargs=vllm_generation_kwargs"):
        rollout.check(_FakeTrainer(model, tok, num_generations=2 * ROWS, use_vllm=True))
    with pytest.raises(ValueError, match="not a multiple of rows_per_episode=3"):
        rollout(["MemQA-v0 seed=1"] * 4, _FakeTrainer(model, tok, num_generations=2 * ROWS))
    with pytest.raises(ValueError, match="carries no task seed"):
        rollout(["what is the capital?"] * 6, _FakeTrainer(model, tok, num_generations=2 * ROWS))
    with pytest.raises(ValueError, match="history_rows=True needs context='history'"):
        MemenvRollout("MemQA-v0", ENV_KW, history_rows=True)
    with pytest.raises(ValueError, match="exceeds rows_per_episode"):
        MemenvRollout("MemQA-v0", {**ENV_KW, "max_turns": 5}, rows_per_episode=ROWS)
    with pytest.raises(ValueError, match="unknown environment 'MemQA-v9'"):
        MemenvRollout("MemQA-v9")


def test_python_version_is_checked(monkeypatch):
    import sys

    from agents.llm.adapters import trl as adapter

    monkeypatch.setattr(sys, "version_info", (3, 10, 14, "final", 0))
    with pytest.raises(RuntimeError, match=r"Python >= 3.11"):
        adapter.require_trl()
    with pytest.raises(RuntimeError, match=r"Python >= 3.11"):
        MemenvRollout("MemQA-v0", ENV_KW)


@pytest.mark.parametrize("env_id", ["MemQA-v0", "MemRead-v0", "MemDialog-v0"])
def test_every_synthetic_env_gives_fixed_row_blocks(env_id):
    tok = memqa_tokenizer()
    model = tiny_model(tok, max_positions=4096)  # MemRead/MemDialog prompts reach ~2k tokens of this tokenizer
    rollout = MemenvRollout(env_id, rows_per_episode=2)
    rows = rollout([task_prompt(env_id, 4)] * 4, _FakeTrainer(model, tok, num_generations=4))
    assert len(rows["prompt_ids"]) == 4 and rows["episode_id"][0] == rows["episode_id"][1] != rows["episode_id"][2]
    assert all(len(c) == len(m) == len(lp) for c, m, lp in zip(rows["completion_ids"], rows["env_mask"], rows["logprobs"]))
    assert seed_of(task_prompt(env_id, 4)) == 4
    # the rows re-score to the sampled log-probs (what TRL recomputes from logits / temperature)
    for prompt, completion, logps, pad in zip(rows["prompt_ids"], rows["completion_ids"], rows["logprobs"],
                                              rows["padding"]):
        if not pad:
            assert torch.allclose(sequence_logprobs(model, prompt, completion), torch.tensor(logps), atol=1e-4)
