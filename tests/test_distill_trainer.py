"""MemOPD trainer: the packed actor forward, the PPO loss hook, recomputed old log-probs, short runs that lower the
distillation loss in both reconstruction modes, resume, and the `memenv distill` CLI."""

import csv

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
import gymnasium as gym  # noqa: E402

from llm_common import ENV_KW, memqa_tokenizer, tiny_model  # noqa: E402

from agents.llm.generation.policy import LLMPolicy  # noqa: E402
from agents.llm.training.ppo import PPOConfig, collate_forward, train_rl  # noqa: E402
from agents.llm.records.rollouts import records_of, rollout  # noqa: E402
from agents.llm.training.common import ActorCritic  # noqa: E402
from distill.losses import DistillLossConfig  # noqa: E402
from distill.teacher import ScoringLayout, Teacher  # noqa: E402
from distill.trainer import MemOPDConfig, PackedActorForward, distillation_loss, train_memopd  # noqa: E402

ENV = {**ENV_KW, "max_turns": 2}


def _env():
    import memenv  # noqa: F401

    return gym.make("MemQA-v0", **ENV)


def _teacher_model(tok):
    return tiny_model(tok, seed=2, initializer_range=0.3)  # a sharper, different distribution than the student's


def _records(model, tok, n=3, seed=0):
    policy = LLMPolicy(model, tok, temperature=1.0, max_new_tokens=10, seed=seed)
    return records_of(rollout(policy, [_env(), _env()], list(range(n)), groups=[0] * n))


def _cfg(tmp_path, **kw):
    base = dict(env_id="MemQA-v0", env_kwargs=ENV, out_dir=str(tmp_path), algo="grpo", updates=3,
                episodes_per_update=4, group_size=2, epochs=2, num_minibatches=2, lr=3e-3, max_new_tokens=10,
                num_envs=2, eval_every=0, save_every=100, progress=False, distill_coef=1.0, chunk=16,
                token_budget=512)
    base.update(kw)
    return MemOPDConfig(**base)


@pytest.mark.parametrize("packing,backend", [("padded", "auto"), ("padding_free", "auto"),
                                             ("shared_prefix", "auto"), ("shared_prefix", "sdpa_blocks")])
def test_packed_forward_reproduces_sampling_and_the_collate_forward(packing, backend):
    tok = memqa_tokenizer()
    model = tiny_model(tok, seed=1)
    records = _records(model, tok)
    ac = ActorCritic(model, value_head=True)
    fwd = PackedActorForward(ScoringLayout("aligned", packing, token_budget=300, backend=backend), tok, chunk=7)
    out = fwd(ac, records, temperature=1.0, entropy=True)
    ref = collate_forward(tok.pad_token_id, "cpu")(ac, records, temperature=1.0, entropy=True)
    behaviour = torch.tensor([x for r in records for x in r.response_logprobs])
    assert (out.logp - behaviour).abs().max() < 1e-4  # the PPO ratio is 1 before the first step
    assert torch.allclose(out.entropy, ref.entropy, atol=1e-4) and torch.allclose(out.values, ref.values, atol=1e-4)
    assert out.hidden.shape == (len(behaviour), model.config.hidden_size) and out.hidden.requires_grad


def test_persistent_forward_scores_later_turns_after_the_transcript():
    tok = memqa_tokenizer()
    model = tiny_model(tok, seed=1)
    records = _records(model, tok)
    out = PackedActorForward(ScoringLayout("persistent", "padded"), tok)(ActorCritic(model), records)
    behaviour = torch.tensor([x for r in records for x in r.response_logprobs])
    turn = torch.tensor([r.turn for r in records for _ in r.response_ids])
    diff = (out.logp - behaviour).abs()
    assert diff[turn == 1].max() < 1e-4  # the first invocation is its own transcript
    assert (turn > 1).any() and diff[turn > 1].max() > 1e-4  # later ones see text they were not sampled with


class Short(gym.Env):
    """Two turns; reward 1 when the last action contains "yes"."""

    observation_space = gym.spaces.Text(100)
    action_space = gym.spaces.Text(100)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return "say yes", {}

    def step(self, action):
        self.t += 1
        return "say yes", float(self.t == 2 and "yes" in action), self.t == 2, False, {}


def test_loss_hook_runs_per_minibatch_after_on_update(tmp_path):
    from llm_common import toy_tokenizer

    tok = toy_tokenizer()
    calls = []

    class Hook:
        plot_keys = ("hook_term",)

        def on_update(self, episodes, records, module):
            calls.append(("update", len(records)))
            for r in records:  # an advantage written here reaches the PPO loss of the minibatches
                r.token_advantages = [a + 0.0 for a in r.token_advantages]
            return {"hook_update": 1.0}

        def __call__(self, records, actor):
            calls.append(("minibatch", len(records)))
            assert actor.hidden.shape[0] == actor.logp.shape[0] and actor.hidden.requires_grad
            term = actor.head(actor.hidden).float().pow(2).mean()
            return 1e-3 * term, {"hook_term": float(term.detach())}

    cfg = PPOConfig(algo="grpo", out_dir=str(tmp_path), updates=2, episodes_per_update=4, group_size=2, epochs=2,
                    num_minibatches=2, max_new_tokens=3, num_envs=2, eval_every=0, save_every=100, progress=False)
    row = train_rl(cfg, model=tiny_model(tok, seed=1), tokenizer=tok, env_fn=Short, extra_loss=Hook())
    assert [c[0] for c in calls] == (["update"] + ["minibatch"] * 4) * 2
    assert sum(n for kind, n in calls[1:5]) == 2 * calls[0][1]  # two epochs over every record
    assert row["hook_update"] == 1.0 and row["hook_term"] > 0


@pytest.mark.parametrize("recompute,expect_zero", [(True, True), (False, False)])
def test_recompute_old_logprobs_in_the_persistent_control(tmp_path, recompute, expect_zero):
    tok = memqa_tokenizer()
    cfg = _cfg(tmp_path, reconstruction="persistent", packing="padded", updates=1, lr=0.0, epochs=1,
               num_minibatches=1, distill_coef=0.0, recompute_old_logprobs=recompute,
               grpo_drop_zero_variance=False)  # a random model's groups all score 0: keep their tokens measured
    row = train_memopd(cfg, model=tiny_model(tok, seed=1), tokenizer=tok, teacher=_teacher_model(tok))
    # lr 0: the only minibatch sees the rollout's policy; the persistent transcript moves the log-probs unless the
    # old ones are recomputed by the same forward
    assert (abs(row["approx_kl"]) < 1e-9) == expect_zero, row["approx_kl"]


@pytest.mark.parametrize("reconstruction,packing,credit", [("aligned", "shared_prefix", "mempo"),
                                                          ("persistent", "padded", "himpo")])
def test_short_memopd_run_lowers_the_distillation_loss(tmp_path, reconstruction, packing, credit):
    tok = memqa_tokenizer()
    student, teacher_lm = tiny_model(tok, seed=1), _teacher_model(tok)
    teacher = Teacher(teacher_lm, tok, student_tokenizer=tok)
    layout, loss = ScoringLayout(reconstruction, packing), DistillLossConfig()

    def on_policy_loss():  # the objective: the divergence on the student's own states, same tasks and seeds
        return distillation_loss(student, teacher, _records(student, tok, n=24, seed=500), layout, loss)

    before = on_policy_loss()
    cfg = _cfg(tmp_path, reconstruction=reconstruction, packing=packing, credit=credit)
    row = train_memopd(cfg, model=student, tokenizer=tok, teacher=teacher_lm)
    after = on_policy_loss()
    # Over training seeds 0-3 (both layouts) 3 updates take it to 0.883-0.899 of its start on these 24 episodes; an
    # unchanged student gives exactly 1 (same records). On 6 episodes the ratio spread 0.86-0.93, astride the
    # 0.9 this test once asked for, so a change of sampler's random stream alone could fail it.
    assert after < 0.95 * before, (before, after)
    rows = list(csv.DictReader(open(tmp_path / "metrics.csv")))
    assert [int(r["update"]) for r in rows] == [1, 2, 3] and float(rows[-1]["distill_loss"]) < float(rows[0]["distill_loss"])
    assert {"teacher_s", "credit_mean", "credit_share"} <= set(rows[0])
    assert (tmp_path / "learning_curve.png").exists() and (tmp_path / "checkpoint-0000003").is_dir()
    assert row["update"] == 3


def test_fused_head_makes_the_checkpointed_update(tmp_path):
    """fused_head (the student's head applied once for the PPO side and the reverse KL, analytic backward) ends
    one update on the weights of the checkpointed pair, and the fused path is really taken."""
    import distill.trainer as trainer

    tok = memqa_tokenizer()
    calls = []
    original = trainer.fused_head_reverse_kl
    ends = []
    for fused in (False, True):
        student = tiny_model(tok, seed=1)
        # PPO at temperature 0.7, the distillation at 1.0 (the real-model preset's pair)
        cfg = _cfg(tmp_path / str(fused), updates=1, fused_head=fused, chunk=5, temperature=0.7)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(trainer, "fused_head_reverse_kl", lambda *a, **k: calls.append(fused) or original(*a, **k))
            row = train_memopd(cfg, model=student, tokenizer=tok, teacher=_teacher_model(tok))
        assert abs(row["first_approx_kl"]) < 1e-6  # the training log-probs reproduce sampling's either way
        ends.append([p.detach().clone() for p in student.parameters()])
    assert calls and set(calls) == {True}
    start = [p.detach() for p in tiny_model(tok, seed=1).parameters()]
    moved = max(float((a - s).abs().max()) for a, s in zip(ends[0], start))
    gap = max(float((a - b).abs().max()) for a, b in zip(*ends))
    assert moved > 1e-3 and gap < 1e-3 * moved, (moved, gap)
    # a loss the fused head does not compute keeps the checkpointed pair
    assert not _cfg(tmp_path, loss="jsd").fuses_head() and not _cfg(tmp_path, top_k=4).fuses_head()
    assert _cfg(tmp_path, distill_temperature=2.0).fuses_head() and not _cfg(tmp_path, fused_head=False).fuses_head()


def test_prefix_tree_teacher_scoring_equals_shared_prefix():
    """The teacher's hidden states at the action tokens on a prefix tree (each shared prefix run once) equal
    those on shared_prefix, so scoring the teacher on either gives the same distillation targets."""
    tok = memqa_tokenizer()
    student = tiny_model(tok, seed=1)
    records = _records(student, tok, n=4)
    teacher = Teacher(_teacher_model(tok), tok, student_tokenizer=tok)
    shared = teacher.action_hidden(records, ScoringLayout("aligned", "shared_prefix"))
    tree = teacher.action_hidden(records, ScoringLayout("aligned", "prefix_tree"))
    assert shared.shape == tree.shape == (sum(sum(r.action_mask) for r in records), teacher.model.config.hidden_size)
    assert torch.allclose(shared, tree, rtol=0, atol=1e-4), (shared - tree).abs().max()
    logp_s = torch.cat([lp for _, lp in teacher.logprob_chunks(shared)])
    logp_t = torch.cat([lp for _, lp in teacher.logprob_chunks(tree)])
    assert (logp_s - logp_t).abs().max() < 1e-4


def test_resume_continues_from_the_latest_checkpoint(tmp_path):
    from agents.llm.models.local import save_pretrained

    tok = memqa_tokenizer()
    save_pretrained(_teacher_model(tok), tok, tmp_path / "teacher")
    save_pretrained(tiny_model(tok, seed=1), tok, tmp_path / "student")
    out = tmp_path / "run"
    common = dict(teacher=str(tmp_path / "teacher"), model=str(tmp_path / "student"), save_every=1,
                  episodes_per_update=2, num_minibatches=1, epochs=1)
    train_memopd(_cfg(out, updates=1, **common))
    first = (out / "checkpoint-0000001" / "model.safetensors").read_bytes()
    row = train_memopd(_cfg(out, updates=3, resume=True, **common))
    assert row["update"] == 3
    rows = list(csv.DictReader(open(out / "metrics.csv")))
    assert [int(r["update"]) for r in rows] == [1, 2, 3]
    assert (out / "checkpoint-0000002" / "model.safetensors").read_bytes() != first  # it trained on from update 1
    # Exact: the same 3 updates without the interruption sample the same actions and end on the same weights
    # (the checkpoint carries the sampler's and the minibatch shuffle's states, not only the global RNGs).
    whole = tmp_path / "whole"
    train_memopd(_cfg(whole, updates=3, **common))
    again = list(csv.DictReader(open(whole / "metrics.csv")))
    assert [r["response_tokens"] for r in again] == [r["response_tokens"] for r in rows]
    assert [r["reward"] for r in again] == [r["reward"] for r in rows]
    assert (whole / "checkpoint-0000003" / "model.safetensors").read_bytes() == \
        (out / "checkpoint-0000003" / "model.safetensors").read_bytes()


def test_config_rejects_bad_options_and_a_missing_teacher(tmp_path):
    with pytest.raises(ValueError, match="reverse_kl, forward_kl, jsd"):
        _cfg(tmp_path, loss="kl")
    with pytest.raises(ValueError, match="aligned, persistent"):
        _cfg(tmp_path, reconstruction="flat")
    with pytest.raises(ValueError, match="padded, padding_free, shared_prefix"):
        _cfg(tmp_path, packing="rows")
    with pytest.raises(ValueError, match="none, mempo, himpo"):
        _cfg(tmp_path, credit="both")
    with pytest.raises(ValueError, match="lambda"):
        _cfg(tmp_path, distill_coef=-1)
    with pytest.raises(ValueError, match="attention_backend must be one of auto, sdpa, sdpa_blocks"):
        _cfg(tmp_path, attention_backend="dense")
    assert _cfg(tmp_path, attention_backend="sdpa_blocks").layout().backend == "sdpa_blocks"
    assert _cfg(tmp_path, reconstruction="persistent").minibatch_unit == "episode"
    with pytest.raises(ValueError, match="needs a teacher"):
        train_memopd(_cfg(tmp_path))


# ---------------------------------------------------------------------- the CLI
@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    from agents.llm.models.local import save_pretrained
    from llm_common import toy_tokenizer

    root = tmp_path_factory.mktemp("ckpt")
    tok = memqa_tokenizer()
    save_pretrained(tiny_model(tok, seed=1), tok, root / "student")
    save_pretrained(_teacher_model(tok), tok, root / "teacher")
    other = toy_tokenizer()
    save_pretrained(tiny_model(other, seed=3), other, root / "other")
    return root


def _cli(*argv):
    from memenv.cli import main

    return main(["distill", *map(str, argv)])


def test_cli_rejects_bad_arguments_with_one_clear_line(checkpoints, tmp_path, capsys):
    out = tmp_path / "out"
    base = ["--student", checkpoints / "student", "--out", out]
    cases = [
        ([*base], "needs --teacher PATH"),
        ([*base, "--teacher", tmp_path / "missing"], f"--teacher {tmp_path / 'missing'}: no model checkpoint"),
        (["--teacher", checkpoints / "teacher", "--student", tmp_path / "nope", "--out", out], "--student"),
        ([*base, "--teacher", checkpoints / "teacher", "--loss", "jsd", "--beta", "2"], "beta must be in [0, 1]"),
        ([*base, "--teacher", checkpoints / "teacher", "--set", "lamda=1"], "no field 'lamda'"),
        ([*base, "--teacher", checkpoints / "teacher", "--algo", "grpo", "--group-size", "3",
          "--episodes-per-update", "4"], "group_size"),
        ([*base, "--teacher", checkpoints / "other", "--kw", "max_turns=2"], "teacher's tokenizer"),
    ]
    for argv, expected in cases:
        assert _cli(*argv) == 2
        message = capsys.readouterr().err.strip().splitlines()[-1]  # after transformers' loading bar, if any
        assert message.startswith("memenv distill: error: ") and expected in message and "\n" not in message, message
    assert not out.exists()  # nothing half-written
    with pytest.raises(SystemExit) as err:  # a choice: argparse names the option and the valid values
        _cli(*base, "--teacher", checkpoints / "teacher", "--reconstruction", "flat")
    assert err.value.code == 2 and "--reconstruction: invalid choice: 'flat'" in capsys.readouterr().err


def test_cli_trains_and_diagnoses(checkpoints, tmp_path, capsys):
    import json

    from agents.llm.records.invocation import save_records

    out = tmp_path / "run"
    assert _cli("--teacher", checkpoints / "teacher", "--student", checkpoints / "student", "--out", out,
                "--algo", "ppo", "--updates", 1, "--episodes-per-update", 2, "--num-envs", 2, "--max-new-tokens", 8,
                "--eval-every", 0, "--kw", "objectives=1", "hops=2", "max_turns=2", "--packing", "padding_free",
                "--loss", "forward_kl", "--lambda", 0.5, "--quiet", "--set", "num_minibatches=1") == 0
    printed = capsys.readouterr().out
    assert json.loads(printed.splitlines()[0])["update"] == 1 and "distill_loss" in printed
    config = json.loads((out / "config.json").read_text())
    assert (config["loss"], config["packing"], config["distill_coef"], config["algo"]) == \
        ("forward_kl", "padding_free", 0.5, "ppo")
    assert (out / "metrics.csv").exists() and (out / "learning_curve.png").exists() and (out / "latest").exists()

    tok = memqa_tokenizer()
    from agents.llm.models.local import load_pretrained

    student, _ = load_pretrained(checkpoints / "student")
    save_records(tmp_path / "records.jsonl", _records(student, tok, n=2))
    assert _cli("diagnose", "--records", tmp_path / "records.jsonl", "--model", checkpoints / "student",
                "--csv", tmp_path / "table.csv", "--quiet") == 0
    text = capsys.readouterr().out
    assert all(m in text for m in ("aligned", "padding_free", "shared_prefix", "persistent"))
    rows = {r["method"]: r for r in csv.DictReader(open(tmp_path / "table.csv"))}
    assert float(rows["aligned"]["max_abs_dlogp"]) < 1e-4 and float(rows["shared_prefix"]["max_abs_dlogp"]) < 1e-4
    (tmp_path / "empty.jsonl").write_text("")
    for argv, expected in [(["--records", tmp_path / "none.jsonl"], "no such file"),
                           (["--records", tmp_path / "empty.jsonl"], "empty")]:
        assert _cli("diagnose", *argv, "--model", checkpoints / "student") == 2
        message = capsys.readouterr().err.strip().splitlines()[-1]
        assert message.startswith("memenv distill: error: --records") and expected in message, message


def test_the_teacher_free_control_pushes_down_the_sampled_tokens_by_a_constant(tmp_path):
    """ConstantSignalHook is the policy-gradient loss of a fixed advantage -value on every sampled action token: its
    gradient is value x the gradient of the tokens' mean log-prob (or of their sum over token_denom, the
    micro-batch form); train_memopd with distill_signal="constant" trains without any teacher."""
    from agents.llm.training.actor import ActorOutput
    from distill.trainer import ConstantSignalHook

    logp = torch.tensor([-1.0, -2.0, -0.5], requires_grad=True)
    term, stats = ConstantSignalHook(0.3, coef=2.0)([], ActorOutput(logp))
    term.backward()
    assert torch.allclose(logp.grad, torch.full((3,), 2.0 * 0.3 / 3)) and stats == {"constant_signal": 0.3}
    assert float(term.detach()) == pytest.approx(2.0 * 0.3 * (-3.5 / 3))
    part = torch.tensor([-1.0, -2.0], requires_grad=True)
    ConstantSignalHook(0.3)([], ActorOutput(part, token_denom=4.0))[0].backward()
    assert torch.allclose(part.grad, torch.full((2,), 0.3 / 4))
    with pytest.raises(ValueError, match="distill_signal"):
        _cfg(tmp_path, distill_signal="teachers")
    with pytest.raises(ValueError, match="constant_signal"):
        _cfg(tmp_path, distill_signal="constant", constant_signal=-1.0)
    tok = memqa_tokenizer()
    cfg = _cfg(tmp_path, updates=1, distill_signal="constant", constant_signal=0.5, teacher=None)
    row = train_memopd(cfg, model=tiny_model(tok, seed=1), tokenizer=tok)  # no teacher given, none loaded
    assert row["constant_signal"] == 0.5 and "distill_loss" not in row
