"""MemOPD on TRL: ``MemOPDTrainer`` (GRPOTrainer + the teacher's distillation term) under
``accelerate launch --num_processes 2`` on CPU: two steps move the weights, the ranks agree, ``distill_loss`` is
logged, and it is the teacher's reverse KL at the trained completion tokens, the token mean over both ranks (each
row scored on its own by both models; a row with ``env_mask`` 0, as MemenvRollout's padding rows, gets none).
Then: TRL's gradient is the native one however TRL cuts the batch (benchmarks/memopd_trl_vs_native.py's cases)."""

import json
import os
import subprocess
import sys
import textwrap
from types import SimpleNamespace
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("trl")
pytest.importorskip("accelerate")

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = textwrap.dedent('''
    import json, os, sys
    import torch
    torch.set_num_threads(1)
    sys.path.insert(0, {tests!r})
    import trl
    from llm_common import ENV_KW, memqa_tokenizer, tiny_model
    from agents.llm.training.ppo import param_checksum
    from agents.llm.adapters.trl import MemenvRollout, episode_return_reward
    from distill.losses import reverse_kl
    from distill.trl import MemOPDTrainer

    out = {out!r}
    rank = int(os.environ.get("RANK", "0"))
    tok = memqa_tokenizer()
    rollout = MemenvRollout("MemQA-v0", ENV_KW, rows_per_episode=2)
    args = trl.GRPOConfig(output_dir=out, num_generations=4, per_device_train_batch_size=4, max_steps=2,
                          learning_rate=5e-3, logging_steps=1, report_to=[], bf16=False, max_completion_length=8,
                          save_strategy="no", beta=0.0, seed=3, disable_tqdm=True, use_cpu=True)
    model = tiny_model(tok, seed=rank)  # different on purpose: DDP starts every rank from rank 0's weights
    reference = []

    class Checked(MemOPDTrainer):
        def _compute_loss(self, model, inputs):
            if not reference:  # the first step: the term recomputed by hand, before the weights move
                reference.append(by_hand(self.accelerator.unwrap_model(model), self.teacher.model, inputs))
            return super()._compute_loss(model, inputs)

    def first_row_masked(prompts, trainer):
        out = rollout(prompts, trainer)
        out["env_mask"][0] = [0] * len(out["env_mask"][0])  # as a padding row: no loss, no distillation there
        return out

    first_row_masked.rows_per_episode = rollout.rows_per_episode  # MemOPDTrainer groups advantages by episode

    def by_hand(student, teacher, inputs):
        mask = inputs["completion_mask"] * inputs["tool_mask"]
        assert (mask.sum(1) == 0).sum() == 1 and mask.sum() > 0
        values = []
        with torch.no_grad():
            for b in range(mask.shape[0]):
                p = inputs["prompt_ids"][b][inputs["prompt_mask"][b].bool()]
                c = inputs["completion_ids"][b][inputs["completion_mask"][b].bool()]
                ids = torch.cat([p, c])[None]
                s = torch.log_softmax(student(ids).logits[0].float(), -1)
                t = torch.log_softmax(teacher(ids).logits[0].float(), -1)
                for j in mask[b].nonzero()[:, 0].tolist():
                    values.append(reverse_kl(s[len(p) + j - 1][None], t[len(p) + j - 1][None])[0])
        return [float(torch.stack(values).sum()), len(values)]

    trainer = Checked(model=model, teacher=os.path.join(out, "teacher"), distill_coef=1.0,
                      reward_funcs=episode_return_reward, args=args, train_dataset=rollout.dataset(16),
                      processing_class=tok, rollout_func=first_row_masked)
    start = param_checksum(trainer.accelerator.unwrap_model(trainer.model))
    trainer.train()
    end = param_checksum(trainer.accelerator.unwrap_model(trainer.model))
    with open(os.path.join(out, f"rank{{rank}}.json"), "w") as fh:
        json.dump({{"start": start, "end": end, "world": trainer.accelerator.num_processes,
                   "log": trainer.state.log_history, "reference": reference[0]}}, fh)
''')


@pytest.mark.slow  # accelerate launch, 2 processes: ~35 s loaded
def test_accelerate_two_processes_two_steps(tmp_path):
    from llm_common import memqa_tokenizer, tiny_model

    from agents.llm.models.local import save_pretrained

    tok = memqa_tokenizer()
    save_pretrained(tiny_model(tok, seed=2, initializer_range=0.3), tok, tmp_path / "teacher")
    script = tmp_path / "run.py"
    script.write_text(SCRIPT.format(tests=str(ROOT / "tests"), out=str(tmp_path)))
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "ACCELERATE_USE_CPU": "1"}
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "2", "--num_machines", "1",
           "--mixed_precision", "no", "--dynamo_backend", "no", "--multi_gpu",  # torchrun-style; gloo on CPU
           "--main_process_port", str(29700 + os.getpid() % 1000), str(script)]
    proc = subprocess.Popen(cmd, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        log = proc.communicate(timeout=120)[0]
    finally:  # bounded: a hang fails the test instead of stalling the suite
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, log[-4000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["world"] == 2
    assert ranks[0]["start"] != ranks[1]["start"]  # different on purpose (DDP broadcasts rank 0's at train())
    assert ranks[0]["end"] == ranks[1]["end"]  # the ranks agree after the steps
    assert ranks[0]["end"] != ranks[0]["start"]  # and the weights moved
    steps = [row for row in ranks[0]["log"] if "distill_loss" in row]
    assert [row["step"] for row in steps] == [1, 2]
    assert all(row["distill_loss"] > 0 for row in steps)
    # step 1 logs the token mean over both ranks' trained tokens: the by-hand reverse KL
    (s0, n0), (s1, n1) = ranks[0]["reference"], ranks[1]["reference"]
    assert steps[0]["distill_loss"] == pytest.approx((s0 + s1) / (n0 + n1), rel=1e-4)


# ---------------------------------------------------------------------- TRL's gradient is the native one
sys.path.insert(0, str(ROOT / "benchmarks"))
import memopd_trl_vs_native as bench  # noqa: E402


@pytest.fixture(scope="module")
def native_reference(tmp_path_factory):
    """``train_memopd`` for 3 updates on shaped episodes (3 + 2 + 3 + 1 invocations of 3 rows, responses of
    different lengths), once with a spread of returns in every group and once with every return 0."""
    tok = bench.tokenizer()
    out = {}
    for returns in ("spread", "zero"):
        setup = bench.Setup(returns=returns)
        run, episodes = bench.native_run(setup, tok, str(tmp_path_factory.mktemp(f"native_{returns}")))
        out[returns] = (setup, run, episodes)
    return tok, out


def test_the_shaped_episodes_have_every_hazard(native_reference):
    _, runs = native_reference
    _, run, episodes = runs["spread"]
    first = episodes[0]
    assert [len(ep.records) for ep in first] == [3, 2, 3, 1]  # 3 padding rows of 12 on TRL
    assert len({len(r.response_ids) for ep in first for r in ep.records}) > 2  # completions of different lengths
    for g in range(0, len(first), bench.GROUP):  # a spread of returns inside every group: the GRPO term acts
        assert len({ep.reward for ep in first[g:g + bench.GROUP]}) == bench.GROUP
    assert len(run.grads) == len(run.distill) == 3


@pytest.mark.parametrize("returns,accumulation", [("spread", 1), ("spread", 4), ("spread", 12), ("zero", 4),
                                                  ("zero", 12)])
def test_trl_gradient_is_the_native_one_however_trl_cuts_the_batch(native_reference, tmp_path, returns,
                                                                    accumulation):
    """12 rows per update (3 of them padding rows) in 1, 4 or 12 micro-batches: the first update's gradient
    (GRPO + lambda x distillation, or the distillation alone) and the 3-update distillation loss are the native
    ones."""
    tok, runs = native_reference
    setup, native, episodes = runs[returns]
    trl_side = bench.trl_run(setup, tok, episodes, accumulation, str(tmp_path))
    row = bench.compare(native, trl_side)
    assert row["cosine"] >= 0.99999, row
    assert abs(row["norm_ratio"] - 1) <= 1e-4, row
    assert row["updates"] == 3 and row["trajectory_gap"] <= 0.01, row


@pytest.mark.parametrize("loss_type", ["bnpo", "grpo", "dr_grpo", "cispo", "sapo", "luspo", "vespo"])
def test_the_distillation_term_is_the_native_token_mean_under_every_supported_loss_type(native_reference, tmp_path,
                                                                                         loss_type):
    """Returns 0: TRL's policy term is 0 under every loss type, so what is left is the distillation term, whose
    normalisation does not depend on the loss type (4 micro-batches; padding rows skipped or not). With returns,
    the policy term is TRL's own under each loss type (the slow test below)."""
    tok, runs = native_reference
    setup, native, episodes = runs["zero"]
    row = bench.compare(native, bench.trl_run(setup, tok, episodes, 4, str(tmp_path), loss_type=loss_type))
    assert row["cosine"] >= 0.99999 and abs(row["norm_ratio"] - 1) <= 1e-4, row
    assert row["trajectory_gap"] <= 0.01, row


@pytest.mark.slow  # four TRL runs of one update: a few minutes on 2 loaded cores
def test_with_returns_the_distillation_term_is_natives_and_the_policy_term_the_loss_types(native_reference,
                                                                                          tmp_path):
    """Returns spread in every group, so both terms act. The gradient is linear in lambda at the first step, so
    TRL's gradient minus its gradient at lambda 0 is its distillation term: under ``grpo`` (a mean over rows) it
    is the one under ``dapo`` (where the whole gradient is the native one, tested above), while the policy term
    (lambda 0) is not: what differs from native under another loss type is the policy term's normalisation, and
    so the distillation term's weight relative to it."""
    import dataclasses

    tok, runs = native_reference
    setup, _, episodes = runs["spread"]

    def first_grad(coef, loss_type):
        run_setup = dataclasses.replace(setup, updates=1, distill_coef=coef)
        return bench.trl_run(run_setup, tok, episodes[:1], 4, str(tmp_path / f"{loss_type}-{coef}"),
                             loss_type=loss_type).grads[0]

    dapo_policy, dapo_both = first_grad(0.0, "dapo"), first_grad(1.0, "dapo")
    grpo_policy, grpo_both = first_grad(0.0, "grpo"), first_grad(1.0, "grpo")
    dapo_distill, grpo_distill = dapo_both - dapo_policy, grpo_both - grpo_policy
    assert float(torch.nn.functional.cosine_similarity(grpo_distill, dapo_distill, dim=0)) >= 0.99999
    assert abs(float(grpo_distill.norm() / dapo_distill.norm()) - 1) <= 1e-4
    assert dapo_policy.norm() > 0  # the policy term acts
    assert abs(float(grpo_policy.norm() / dapo_policy.norm()) - 1) > 1e-3  # and is normalised another way


def test_grpo_advantages_are_per_episode():
    from distill.trl import episode_advantages

    # returns [1, 0], 3 rows per episode: native GRPO gives +-1 (population std over the 2 episodes); trl's own
    # normalisation over the 6 rows (unbiased std) would give +-0.913
    assert episode_advantages([1, 1, 1, 0, 0, 0], 6, 3) == pytest.approx([1, 1, 1, -1, -1, -1], abs=1e-5)
    assert episode_advantages([1, 1, 1, 0, 0, 0], 6, 3, std_norm=False) == pytest.approx([.5] * 3 + [-.5] * 3)
    # two groups; the second has equal returns: exactly 0
    assert episode_advantages([2, 2, 0, 0, 3, 3, 3, 3], 4, 2)[4:] == [0.0] * 4
    # an unscorable episode (NaN) is left out of its group's statistics and gets 0
    adv = episode_advantages([1, 1, float("nan"), float("nan"), 0, 0], 6, 2)
    assert adv[2:4] == [0.0, 0.0] and adv[0] == pytest.approx(1.0, abs=1e-5)
    with pytest.raises(ValueError, match=r"rows 3..5 \(one episode\) got different rewards"):
        episode_advantages([1, 1, 1, 0, 0.5, 0], 6, 3)
    with pytest.raises(ValueError, match="num_generations=4 is not a multiple of rows_per_episode=3"):
        episode_advantages([0] * 12, 4, 3)


def test_unsupported_settings_are_refused_by_name(tmp_path):
    import trl

    from distill.trl import check_grpo_config

    with pytest.raises(ValueError, match=r"loss_type in dapo, bnpo, .* not 'made_up'"):
        check_grpo_config(SimpleNamespace(loss_type="made_up"))
    base = dict(output_dir=str(tmp_path), report_to=[], use_cpu=True)
    with pytest.raises(ValueError, match="scale_rewards must be 'group' or 'none', not 'batch'"):
        check_grpo_config(trl.GRPOConfig(scale_rewards="batch", **base))
    with pytest.raises(ValueError, match="multi_objective_aggregation must be 'sum_then_normalize'"):
        check_grpo_config(trl.GRPOConfig(multi_objective_aggregation="normalize_then_sum", **base))
    check_grpo_config(trl.GRPOConfig(scale_rewards=False, loss_type="bnpo", **base))  # "none" is the native no-std


@pytest.mark.parametrize("loss_type,rows", [("dapo", 9), ("grpo", 12)])
def test_padding_rows_skip_the_training_forward_where_the_loss_allows(native_reference, tmp_path, loss_type, rows):
    """9 of each update's 12 rows have trained tokens: under dapo (a token sum over a global count) the 3 padding
    rows are not run; under grpo (a mean over rows) they count, so they are. The teacher runs on the 9 alone."""
    tok, runs = native_reference
    setup, _, episodes = runs["zero"]
    assert all(sum(len(ep.records) for ep in batch) == 9 for batch in episodes)
    run = bench.trl_run(setup, tok, episodes, 1, str(tmp_path), loss_type=loss_type)
    assert run.forward_rows == [rows] * 3 and run.teacher_rows == [9] * 3
