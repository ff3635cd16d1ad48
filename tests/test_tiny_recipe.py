"""Issue 51: the README's tiny-agent command trains with the recipe that learns (agents.llm.training.recipes), the same
config as benchmarks/learn_memqa.py's SFT (whose runs docs/llm_agents.md reports), field by field; explicit flags
still override it; a pretrained ``--model`` keeps the SFT config's own defaults."""

from __future__ import annotations

import os

import argparse
import importlib.util
import json
from dataclasses import asdict, fields
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
# what a run sets for itself (its length, budget, cadence, folders, threads), not the recipe
RUN_FIELDS = {"out_dir", "steps", "max_seconds", "budget_clock", "eval_every", "save_every", "keep_checkpoints",
              "eval_episodes", "threads", "resume", "progress"}


def _script(name: str):
    spec = importlib.util.spec_from_file_location(f"{name}_benchmark", ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _config(argv: list[str]):
    from agents.llm.training.cli import build_config, register_cli

    parser = argparse.ArgumentParser(prog="memenv")
    register_cli(parser.add_subparsers(dest="command", required=True))
    return build_config(parser.parse_args(argv))


def _learn_memqa_config(tmp_path):
    """The SFTConfig of ``python benchmarks/learn_memqa.py --stage sft`` at its defaults."""
    from agents.llm.training.sft import SFTConfig

    learn = _script("learn_memqa")
    args = learn.build_parser().parse_args(["--stage", "sft", "--out", str(tmp_path)])
    return SFTConfig(**learn.sft_fields(args))


def test_the_readme_command_trains_with_the_recipe_of_learn_memqa(tmp_path):
    from agents.llm.training.recipes import TINY_SFT_ENV, TINY_SFT_RECIPE

    argv = _script("tiny_agent").readme_command()
    assert argv[:3] == ["train", "--algo", "sft"] and "--model" not in argv
    cli = _config(argv)
    for key, value in TINY_SFT_RECIPE.items():
        assert getattr(cli, key) == value, key
    assert (cli.env_id, cli.env_kwargs) == (TINY_SFT_ENV[0], dict(TINY_SFT_ENV[1]))
    learn = _learn_memqa_config(tmp_path)
    differ = {f.name for f in fields(cli) if getattr(cli, f.name) != getattr(learn, f.name)}
    assert differ <= RUN_FIELDS, differ - RUN_FIELDS  # every learning setting the same as the documented runs
    assert cli.schedule_by == "budget" and cli.max_seconds is None  # no budget: the cosine spans the steps
    # the settings the earlier defaults got wrong (issue 51: F1 0.008 after 2,000 steps)
    assert (cli.tiny_split_spaces, cli.tiny_heads, cli.lr, cli.prompt_loss_weight) == ("suffix", 8, 3e-3, 1.0)


def test_flags_and_set_still_override_the_recipe():
    cfg = _config(["train", "--algo", "sft", "--out", "o", "--lr", "5e-4", "--episodes", "100",
                   "--batch-size", "8", "--set", "tiny_heads=4", "prompt_loss_weight=0", "tiny_split_spaces=isolated"])
    assert (cfg.lr, cfg.episodes, cfg.batch_size, cfg.tiny_heads, cfg.prompt_loss_weight, cfg.tiny_split_spaces) == (
        5e-4, 100, 8, 4, 0, "isolated")
    assert cfg.tiny_vocab == 8192 and cfg.warmup == 100  # the rest stays the recipe's
    assert _config(["train", "--algo", "sft", "--model", "tiny", "--out", "o"]).lr == 3e-3


def test_a_pretrained_model_and_rl_keep_their_configs_defaults():
    from agents.llm.training.ppo import PPOConfig
    from agents.llm.training.recipes import TINY_SFT_RECIPE
    from agents.llm.training.sft import SFTConfig

    real = _config(["train", "--algo", "sft", "--model", "smollm2-135m-instruct", "--out", "o"])
    assert real.model == "smollm2-135m-instruct"
    default = SFTConfig()
    assert {k: getattr(real, k) for k in TINY_SFT_RECIPE} == {k: getattr(default, k) for k in TINY_SFT_RECIPE}
    assert real.lr == 1e-3 and real.prompt_loss_weight == 0.0
    ppo = _config(["train", "--algo", "grpo", "--out", "o"])
    assert asdict(ppo) == asdict(PPOConfig(algo="grpo", out_dir="o"))


def test_help_shows_the_tiny_models_defaults(capsys):
    with pytest.raises(SystemExit):
        _config(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "sft (tiny model) 0.003, sft --model 0.001" in text and "TINY_SFT_RECIPE" in text


def test_tiny_agent_benchmark_reads_the_readme_command_and_moves_only_its_out(tmp_path):
    bench = _script("tiny_agent")
    readme = tmp_path / "README.md"
    readme.write_text("pip install -e '.[llm]' && memenv train --algo sft --out runs/sft --steps 2000    "
                      "# a tiny LLM agent on CPU\n")
    argv = bench.readme_command(readme)
    assert argv == ["train", "--algo", "sft", "--out", "runs/sft", "--steps", "2000"]
    assert bench.with_out(argv, tmp_path / "x") == ["train", "--algo", "sft", "--out", str(tmp_path / "x"),
                                                    "--steps", "2000"]
    readme.write_text("memenv bench  # the bench\n")
    with pytest.raises(SystemExit, match="a tiny LLM agent"):
        bench.readme_command(readme)
    rows = [{"step": "10", "cpu_seconds": "6", "loss": "5.0", "token_acc": "0.1", "eval_f1": "", "eval_cpu_seconds": ""},
            {"step": "50", "cpu_seconds": "30", "loss": "2.0", "token_acc": "0.5", "eval_f1": "0.0",
             "eval_cpu_seconds": "12"},
            {"step": "60", "cpu_seconds": "36", "loss": "1.5", "token_acc": "0.6", "eval_f1": "", "eval_cpu_seconds": ""}]
    assert bench.curve(rows) == [{"step": 50, "train_cpu_min": 0.5, "eval_f1": 0.0, "loss": 2.0, "eval_cpu_min": 0.2}]
    assert [r["step"] for r in bench.losses(rows, 50)] == [50, 60]
    # the RSS at a step: the last sample taken while the run had logged that step or an earlier one
    samples = [{"step": 0, "rss_mb": 300.0}, {"step": 150, "rss_mb": 900.0}, {"step": 200, "rss_mb": 950.0},
               {"step": 210, "rss_mb": 990.0}]
    assert bench.rss_at(samples, [100, 200, 250]) == {100: 300.0, 200: 950.0, 250: 990.0}
    assert bench.rss_mb(os.getpid()) > 10 and bench.rss_mb(2**22 + 12345) is None  # this process; no such process


def test_distills_tiny_student_shares_the_tiny_teachers_tokenizer_and_model_settings(monkeypatch):
    """`memenv distill --teacher T` without --student builds the tiny model `memenv train --algo sft` trains, so a
    teacher trained by that command and the student share one tokenizer (else the vocabulary check refuses)."""
    import distill.cli
    from agents.llm.training.recipes import TINY_MODEL_FIELDS

    monkeypatch.setattr(distill.cli, "_teacher", lambda value: value)  # no checkpoint read
    parser = argparse.ArgumentParser(prog="memenv")
    distill.cli.register_cli(parser.add_subparsers(dest="command", required=True))
    student = distill.cli.build_config(parser.parse_args(["distill", "--teacher", "T", "--out", "o"]))
    teacher = _config(["train", "--algo", "sft", "--out", "o"])
    assert {k: getattr(student, k) for k in TINY_MODEL_FIELDS} == {k: getattr(teacher, k) for k in TINY_MODEL_FIELDS}
    assert student.tiny_tokenizer_episodes == teacher.tiny_tokenizer_episodes
    assert student.tiny_split_spaces == "suffix" and student.lr != 3e-3  # the model, not the SFT optimisation
    smaller = distill.cli.build_config(parser.parse_args(["distill", "--teacher", "T", "--out", "o",
                                                          "--set", "tiny_heads=2"]))
    assert smaller.tiny_heads == 2
