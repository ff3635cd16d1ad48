"""The dtype and attention-implementation options of every model load: one resolution, clear errors, plumbed
through load_pretrained, RunConfig / MemOPDConfig, the Teacher and the CLIs."""

import argparse

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from llm_common import memqa_tokenizer, tiny_model  # noqa: E402

from agents.llm.models import precision  # noqa: E402
from agents.llm.models.local import load_pretrained, save_pretrained  # noqa: E402
from agents.llm.models.precision import check_attn_implementation, resolve_dtype  # noqa: E402


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    tok = memqa_tokenizer()
    path = tmp_path_factory.mktemp("ckpt") / "tiny"
    save_pretrained(tiny_model(tok), tok, path)
    return path


def test_resolve_dtype_names_aliases_and_torch_dtypes():
    for names, dtype in ((("float32", "fp32", "FP32", "torch.float32", None), torch.float32),
                         (("bfloat16", "bf16", "BF16"), torch.bfloat16), (("float16", "fp16", "half"), torch.float16)):
        for name in names:
            assert resolve_dtype(name) is dtype, name
        assert resolve_dtype(dtype) is dtype


def test_auto_is_float32_on_cpu_and_bfloat16_on_a_cuda_device_that_has_it(monkeypatch):
    # on CPU always float32, even where bf16 is native (the token-exact reference)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True, raising=False)
    assert resolve_dtype("auto", "cpu") is torch.float32
    assert resolve_dtype("auto") is torch.float32
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert resolve_dtype("auto", "cuda") is torch.bfloat16
    assert resolve_dtype("auto", torch.device("cuda", 1)) is torch.bfloat16
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)  # e.g. a V100
    assert resolve_dtype("auto", "cuda") is torch.float32
    assert resolve_dtype("fp16", "cuda") is torch.float16  # explicit choices are kept


def test_bad_dtype_is_a_value_error_naming_it():
    for bad in ("fp8", "int8", "", 16):
        with pytest.raises(ValueError, match="teacher_dtype must be one of auto, float32, bfloat16, float16"):
            resolve_dtype(bad, name="teacher_dtype")
    with pytest.raises(ValueError, match="floating"):
        resolve_dtype(torch.int64)
    with pytest.raises(ValueError, match=r"dtype must be one of .*got 'bf32'"):
        load_pretrained("/nonexistent", dtype="bf32")  # before the folder is even looked at


def test_bf16_load_gives_bf16_params_and_auto_on_cpu_gives_float32(checkpoint):
    model, _ = load_pretrained(checkpoint, dtype="bf16")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    model, _ = load_pretrained(checkpoint, dtype="auto", device="cpu")
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    model, _ = load_pretrained(checkpoint)  # the default stays float32
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert model.config._attn_implementation == "sdpa"
    model, _ = load_pretrained(checkpoint, attn_implementation="eager", dtype=torch.float16)
    assert model.config._attn_implementation == "eager"
    assert {p.dtype for p in model.parameters()} == {torch.float16}


def test_flash_attention_without_gpu_dtype_or_package_fails_clearly_before_loading(checkpoint, monkeypatch):
    with pytest.raises(ValueError, match="flash_attention_2 needs a CUDA device"):
        load_pretrained(checkpoint, dtype="bf16", attn_implementation="flash_attention_2")
    with pytest.raises(ValueError, match="float16/bfloat16 only; got dtype float32"):
        check_attn_implementation("flash_attention_2", torch.float32, "cuda")
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "flash_attn" else real(name, *a))
    with pytest.raises(ValueError, match="needs the flash_attn package"):
        check_attn_implementation("flash_attention_2", torch.bfloat16, "cuda")
    with pytest.raises(ValueError, match="attn_implementation must be one of sdpa, eager"):
        load_pretrained(checkpoint, attn_implementation="flash")
    assert check_attn_implementation("flex_attention", torch.float32, "cpu") == "flex_attention"


def test_run_config_dtype_reaches_the_loaded_and_the_built_model(checkpoint):
    from agents.llm.training.ppo import PPOConfig
    from agents.llm.training.common import Dist, load_or_build_model

    lm, _ = load_or_build_model(PPOConfig(model=str(checkpoint), dtype="bf16"), Dist())
    assert {p.dtype for p in lm.parameters()} == {torch.bfloat16}
    cfg = PPOConfig(dtype="bfloat16", attn_implementation="eager", tiny_tokenizer_episodes=3, tiny_vocab=300,
                    tiny_hidden=32, tiny_layers=1, tiny_heads=2)
    lm, _ = load_or_build_model(cfg, Dist())
    assert {p.dtype for p in lm.parameters()} == {torch.bfloat16}
    assert lm.config._attn_implementation == "eager"
    lm, _ = load_or_build_model(PPOConfig(model=str(checkpoint)), Dist())
    assert {p.dtype for p in lm.parameters()} == {torch.float32}  # default
    with pytest.raises(ValueError, match="dtype must be one of"):
        load_or_build_model(PPOConfig(model=str(checkpoint), dtype="double"), Dist())


def test_memopd_config_and_teacher_take_a_dtype(checkpoint):
    from distill.teacher import Teacher
    from distill.trainer import MemOPDConfig

    cfg = MemOPDConfig(teacher=str(checkpoint), dtype="float32", teacher_dtype="bf16")
    assert cfg.teacher_dtype == "bf16"
    with pytest.raises(ValueError, match="teacher_dtype must be one of"):
        MemOPDConfig(teacher=str(checkpoint), teacher_dtype="fp64")
    with pytest.raises(ValueError, match="dtype must be one of"):
        MemOPDConfig(teacher=str(checkpoint), dtype="int4")
    with pytest.raises(ValueError, match="teacher_attn_implementation must be one of"):
        MemOPDConfig(teacher=str(checkpoint), teacher_attn_implementation="flash2")
    tok = memqa_tokenizer()
    teacher = Teacher.from_pretrained(checkpoint, student_tokenizer=tok, dtype="bf16")
    assert {p.dtype for p in teacher.model.parameters()} == {torch.bfloat16}
    with pytest.raises(ValueError, match="flash_attention_2 needs a CUDA device"):
        Teacher.from_pretrained(checkpoint, dtype="bf16", attn_implementation="flash_attention_2")


def test_clis_take_dtype_and_attention_options(checkpoint):
    from agents.llm.training import cli as train_cli
    from distill import cli as distill_cli
    from memenv.cli_common import CommandError

    def parser(register):
        p = argparse.ArgumentParser()
        register(p.add_subparsers(dest="command"))
        return p

    args = parser(train_cli.register_cli).parse_args(["train", "--algo", "ppo", "--dtype", "bf16",
                                                      "--attn-implementation", "eager"])
    cfg = train_cli.build_config(args)
    assert (cfg.dtype, cfg.attn_implementation) == ("bf16", "eager")
    train_cli.check_model_options(cfg)  # loads on CPU
    cfg.attn_implementation = "flash_attention_2"
    with pytest.raises(CommandError, match="--attn-implementation=flash_attention_2 needs a CUDA device"):
        train_cli.check_model_options(cfg)
    args = parser(distill_cli.register_cli).parse_args(
        ["distill", "--teacher", str(checkpoint), "--dtype", "fp32", "--teacher-dtype", "bf16"])
    cfg = distill_cli.build_config(args)
    assert (cfg.dtype, cfg.teacher_dtype) == ("fp32", "bf16")
    with pytest.raises(SystemExit):
        parser(distill_cli.register_cli).parse_args(["distill", "--teacher", str(checkpoint), "--dtype", "fp8"])
    assert set(precision.DTYPE_CHOICES) <= set(train_cli.DTYPE_CHOICES)
    assert set(precision.ATTN_IMPLEMENTATIONS) == set(train_cli.ATTN_CHOICES)
