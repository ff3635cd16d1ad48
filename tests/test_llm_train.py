"""`memenv train` (SFT, GRPO, PPO): metrics, curves, atomic checkpoints, resume; DDP under torchrun."""

import csv
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[1]
TINY = ["tiny_vocab=300", "tiny_hidden=32", "tiny_layers=1", "tiny_heads=2", "tiny_tokenizer_episodes=10"]
COMMON = ["--kw", "objectives=1", "hops=1", "max_turns=3", "--num-envs", "2", "--max-new-tokens", "8",
          "--eval-episodes", "2", "--threads", "1", "--quiet"]


def _cli(argv):
    import argparse

    from agents.llm.training.cli import register_cli

    parser = argparse.ArgumentParser(prog="memenv")
    register_cli(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def _rows(path):
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def test_sft_then_grpo_and_ppo_with_checkpoints_and_resume(tmp_path):
    sft = tmp_path / "sft"
    base = ["train", "--algo", "sft", "--out", str(sft), "--episodes", "10", "--batch-size", "4",
            "--save-every", "3", "--eval-every", "6", *COMMON, "--set", *TINY]
    assert _cli([*base, "--steps", "6"]) == 0
    assert (sft / "latest").read_text().strip() == "checkpoint-0000006"
    assert sorted(p.name for p in sft.glob("checkpoint-*")) == ["checkpoint-0000003", "checkpoint-0000006"]
    assert not [p for p in sft.iterdir() if p.name.startswith(".")]  # no temporary folders left
    assert (sft / "learning_curve.png").exists() and json.loads((sft / "config.json").read_text())["steps"] == 6
    rows = _rows(sft / "metrics.csv")
    assert rows[-1]["step"] == "6" and rows[-1]["eval_f1"] != ""
    assert _cli([*base, "--steps", "9", "--resume"]) == 0  # continues at step 6
    rows = _rows(sft / "metrics.csv")
    assert [r["step"] for r in rows] == ["6", "9"]
    assert (sft / "latest").read_text().strip() == "checkpoint-0000009"
    start = sft / "checkpoint-0000009"
    for algo in ("grpo", "ppo"):
        out = tmp_path / algo
        rl = ["train", "--algo", algo, "--model", str(start), "--out", str(out), "--episodes-per-update", "4",
              "--group-size", "2", "--save-every", "1", "--eval-every", "2", "--kl-coef", "0.01", *COMMON,
              "--set", "num_minibatches=2", "epochs=1"]
        assert _cli([*rl, "--updates", "2"]) == 0
        assert (out / "latest").read_text().strip() == "checkpoint-0000002"
        assert _cli([*rl, "--updates", "3", "--resume"]) == 0
        rows = _rows(out / "metrics.csv")
        assert [r["update"] for r in rows] == ["0", "1", "2", "3"]
        assert rows[0]["eval_f1"] != "" and rows[-1]["eval_f1"] != ""
        assert (out / "learning_curve.png").exists()
        if algo == "ppo":
            assert (out / "checkpoint-0000003" / "value_head.pt").exists()


def test_cli_rejects_options_of_another_algo(tmp_path):
    from memenv.cli_common import CommandError

    with pytest.raises(CommandError, match="--updates does not apply to --algo sft"):
        _cli(["train", "--algo", "sft", "--updates", "3", "--out", str(tmp_path)])
    with pytest.raises(CommandError, match="PPOConfig has no field 'no_such_field'"):
        _cli(["train", "--algo", "ppo", "--set", "no_such_field=1", "--out", str(tmp_path)])


def test_cli_set_parses_booleans_and_literals():
    import argparse

    from agents.llm.training.cli import build_config, register_cli

    parser = argparse.ArgumentParser()
    register_cli(parser.add_subparsers())
    args = parser.parse_args(["train", "--algo", "ppo", "--set", "budget_counts_eval=false", "value_detach=True",
                              "kl_coef=0.05", "budget_clock=cpu", "env_kwargs={'objectives': 2}"])
    cfg = build_config(args)
    assert cfg.budget_counts_eval is False and cfg.value_detach is True  # "false" must not become a truthy str
    assert cfg.kl_coef == 0.05 and cfg.budget_clock == "cpu" and cfg.env_kwargs["objectives"] == 2
    # every value to its setting's declared type (issue 64): "no" is False, not the truthy string "no"
    args = parser.parse_args(["train", "--algo", "sft", "--set", "gradient_checkpointing=no", "budget_counts_eval=ON",
                              "steps=20", "tiny_split_spaces=off", "warmup=0"])
    cfg = build_config(args)
    assert cfg.gradient_checkpointing is False and cfg.budget_counts_eval is True and cfg.steps == 20
    assert cfg.tiny_split_spaces is False and isinstance(cfg.steps, int)
    from memenv.cli_common import CommandError

    for bad, message in (("gradient_checkpointing=maybe", "takes true or false"), ("steps=2.5", "takes a whole number"),
                         ("steps=many", "takes a whole number"), ("lr=fast", "takes a number")):
        with pytest.raises(CommandError, match=message):
            build_config(parser.parse_args(["train", "--algo", "sft", "--set", bad]))


WORKER = textwrap.dedent("""
    import os, sys
    import torch
    torch.set_num_threads(1)
    sys.path.insert(0, {tests!r})
    from llm_common import memqa_tokenizer, tiny_model
    from agents.llm.training.ppo import PPOConfig, param_checksum, train_rl
    rank = int(os.environ["RANK"])
    tok = memqa_tokenizer()
    model = tiny_model(tok, seed=rank)  # different on purpose: DDP broadcasts rank 0's parameters
    initial = param_checksum(tiny_model(tok, seed=0))
    cfg = PPOConfig(algo={algo!r}, out_dir={out!r}, updates=2, episodes_per_update=4, group_size=2,
                    num_minibatches=2, epochs=1, lr=1e-3, max_new_tokens=8, num_envs=2, eval_every=0,
                    save_every=100, progress=False, env_kwargs={{"objectives": 1, "hops": 1, "max_turns": 2}})
    train_rl(cfg, model=model, tokenizer=tok)
    with open(os.path.join({out!r}, f"checksum.rank{{rank}}"), "w") as fh:
        fh.write(param_checksum(model) + " " + initial)
""")


@pytest.mark.parametrize("algo", ["ppo"])
def test_torchrun_two_cpu_ranks_keep_parameters_identical(tmp_path, algo):
    script = tmp_path / "worker.py"
    script.write_text(WORKER.format(tests=str(ROOT / "tests"), algo=algo, out=str(tmp_path)))
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           str(script)],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    sums = [(tmp_path / f"checksum.rank{r}").read_text().split() for r in (0, 1)]
    assert sums[0][0] == sums[1][0]  # identical after the updates
    assert sums[0][0] != sums[0][1]  # and they did change
    rows = _rows(tmp_path / "metrics.csv")
    assert rows[-1]["update"] == "2"


def test_a_checkpoint_with_non_finite_weights_is_never_saved_nor_made_latest(tmp_path):
    from llm_common import memqa_tokenizer, tiny_model

    from agents.llm.models.local import NonFiniteWeightsError
    from agents.llm.training.common import save_checkpoint

    tok = memqa_tokenizer()
    lm = tiny_model(tok)
    save_checkpoint(tmp_path, 1, lm, tok, {"step": 1})
    head = torch.nn.Linear(4, 1)
    for broken in ("lm", "value_head"):
        with torch.no_grad():
            (next(lm.parameters()) if broken == "lm" else head.bias).fill_(float("nan"))
        with pytest.raises(NonFiniteWeightsError, match=r"checkpoint-0000002: not saved: 1 weight tensor\(s\) hold NaN"):
            save_checkpoint(tmp_path, 2, lm, tok, {"step": 2}, value_head=head)
        with torch.no_grad():
            next(lm.parameters()).zero_()
            head.bias.zero_()
        assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-0000001", "latest"]
        assert (tmp_path / "latest").read_text().strip() == "checkpoint-0000001"


@pytest.mark.parametrize("algo", ["sft", "ppo"])
def test_a_diverging_run_stops_before_its_step_and_keeps_a_finite_latest(tmp_path, algo, capsys):
    """lr=1e30: the first steps make the weights huge, a later loss is NaN; the trainer stops before that step
    (one line, exit 2) and every checkpoint on disk is finite (before: NaN weights were saved as latest)."""
    from safetensors.torch import load_file

    out = tmp_path / algo
    if algo == "sft":
        argv = ["train", "--algo", "sft", "--out", str(out), "--episodes", "6", "--batch-size", "4", "--steps", "8",
                "--save-every", "1", "--eval-every", "100", *COMMON, "--set", "lr=1e30", "grad_clip=1e30", *TINY]
    else:
        argv = ["train", "--algo", "ppo", "--out", str(out), "--episodes-per-update", "4",
                "--updates", "6", "--save-every", "1", "--eval-every", "100", *COMMON, "--set", "lr=1e30",
                "grad_clip=1e30", "epochs=2", *TINY]
    from memenv.cli_common import CommandError

    with pytest.raises(CommandError, match=r"the gradient norm is (nan|inf).*the last checkpoint stays latest"):
        _cli(argv)
    saved = sorted(out.glob("checkpoint-*"))
    for folder in saved:
        assert all(torch.isfinite(t).all() for t in load_file(folder / "model.safetensors").values())
    if saved:
        assert (out / "latest").read_text().strip() == saved[-1].name


def test_only_the_newest_checkpoint_keeps_its_optimizer_state_and_resume_still_works(tmp_path):
    """Adam's state is twice the weights (SmolLM2: 1.08 GB beside 0.54 GB): an older kept checkpoint drops
    ``optimizer.pt`` but still loads with from_pretrained and still holds its step; resume reads the newest."""
    from agents.llm.models.local import load_pretrained
    from agents.llm.training.common import OPTIMIZER_FILE, load_trainer_state

    sft = tmp_path / "sft"
    base = ["train", "--algo", "sft", "--out", str(sft), "--episodes", "6", "--batch-size", "4", "--save-every", "2",
            "--eval-every", "100", *COMMON, "--set", "keep_every=2", *TINY]
    assert _cli([*base, "--steps", "6"]) == 0
    saved = sorted(p.name for p in sft.glob("checkpoint-*"))
    assert saved == ["checkpoint-0000002", "checkpoint-0000004", "checkpoint-0000006"]  # keep_every keeps them all
    assert [(sft / name / OPTIMIZER_FILE).exists() for name in saved] == [False, False, True]
    newest = load_trainer_state(sft / saved[-1], optimizer=True)
    assert newest["step"] == 6 and newest["optimizer"]["state"]  # Adam's moments, from optimizer.pt
    for name in saved[:-1]:
        assert load_pretrained(sft / name)[0] is not None
        assert "optimizer" not in load_trainer_state(sft / name)  # step, RNG, config kept
        with pytest.raises(ValueError, match=rf"{name}: holds no optimizer state .*resume from the run's latest"):
            load_trainer_state(sft / name, optimizer=True)
    assert _cli([*base, "--steps", "8", "--resume"]) == 0  # continues from the newest, its optimizer state read
    assert [r["step"] for r in _rows(sft / "metrics.csv")][-1] == "8"
    assert [(sft / name / OPTIMIZER_FILE).exists() for name in sorted(p.name for p in sft.glob("checkpoint-*"))] == \
        [False, False, False, True]



def test_save_checkpoint_keeps_the_optimizer_state_of_the_latest_and_reads_the_old_layout(tmp_path):
    from llm_common import memqa_tokenizer, tiny_model

    from agents.llm.training.common import OPTIMIZER_FILE, latest_checkpoint, load_trainer_state, save_checkpoint

    tok = memqa_tokenizer()
    lm = tiny_model(tok)
    state = lambda n: {"step": n, "optimizer": {"state": {0: {"exp_avg": torch.full((3,), float(n))}}}}  # noqa: E731
    for n in (1, 2, 3):
        save_checkpoint(tmp_path / "one", n, lm, tok, state(n), keep=3)
        save_checkpoint(tmp_path / "all", n, lm, tok, state(n), keep=3, keep_optimizer=0)
        save_checkpoint(tmp_path / "two", n, lm, tok, state(n), keep=3, keep_optimizer=2)
    has = lambda run: [(p / OPTIMIZER_FILE).exists() for p in sorted((tmp_path / run).glob("checkpoint-*"))]  # noqa: E731
    assert (has("one"), has("all"), has("two")) == ([False, False, True], [True] * 3, [False, True, True])
    assert float(load_trainer_state(latest_checkpoint(tmp_path / "one"))["optimizer"]["state"][0]["exp_avg"][0]) == 3
    save_checkpoint(tmp_path / "one", 2, lm, tok, state(2), keep=3)  # rewritten (an older step): it is the latest
    assert has("one") == [False, True, False]
    legacy = tmp_path / "one" / "checkpoint-0000001"  # written before optimizer.pt: the state inside trainer_state.pt
    torch.save(state(1), legacy / "trainer_state.pt")
    assert float(load_trainer_state(legacy, optimizer=True)["optimizer"]["state"][0]["exp_avg"][0]) == 1


def test_train_help_reads_the_configs_defaults_without_importing_torch():
    """Issue 65: `memenv train --help` took 18 s on a busy machine importing torch for the configs' defaults; it now
    reads them from the configs' source, the same values the dataclasses hold, and imports no torch."""
    import subprocess
    import sys
    from dataclasses import MISSING, fields

    from agents.llm.training.cli import config_defaults
    from agents.llm.training.ppo import PPOConfig
    from agents.llm.training.sft import SFTConfig

    for cls in (SFTConfig, PPOConfig):
        read = config_defaults(cls.__name__)
        real = {f.name: f.default for f in fields(cls) if f.default is not MISSING}
        assert read and all(real[k] == v for k, v in read.items()), cls.__name__
        assert {"lr", "steps" if cls is SFTConfig else "updates", "seed"} <= set(read)
    code = ("import sys\nfrom memenv.cli import main\ntry:\n    main(['train', '--help'])\nexcept SystemExit:\n    pass\n"
            "print('torch' in sys.modules, file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stderr.strip().splitlines()[-1] == "False" and "(default: sft" in done.stdout
