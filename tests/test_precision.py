"""The compute dtype is picked from the hardware: bf16 only where it is native."""

import pytest

torch = pytest.importorskip("torch")

from agents.llm.models import precision  # noqa: E402
from agents.llm.training.sft import SFTConfig  # noqa: E402


def test_auto_follows_fast_bf16(monkeypatch):
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False, raising=False)
    assert not precision.native_bf16("cpu")
    assert precision.resolve_autocast("auto", "cpu") == "none"  # an AVX2-only host: fp32
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True, raising=False)
    assert precision.native_bf16("cpu") and not precision.fast_bf16("cpu")
    assert precision.resolve_autocast("auto", "cpu") == "none"  # AVX512-BF16 without AMX: fp32 measured faster
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True, raising=False)
    assert precision.fast_bf16("cpu") and precision.amx("cpu")
    assert precision.resolve_autocast("auto", "cpu") == "bf16"
    # explicit choices are kept whatever the host
    assert precision.resolve_autocast("none", "cpu") == "none"
    assert precision.resolve_autocast("bf16", "cpu") == "bf16"


def test_native_dtype_is_bf16_only_where_the_host_computes_it(monkeypatch):
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False, raising=False)
    assert precision.resolve_dtype("native", "cpu") == torch.float32
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True, raising=False)
    assert precision.resolve_dtype("native", "cpu") == torch.float32  # AVX512-BF16 alone: fp32 measured faster
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True, raising=False)
    assert precision.resolve_dtype("native", "cpu") == torch.bfloat16
    assert precision.resolve_dtype("auto", "cpu") == torch.float32  # "auto" keeps CPU weights fp32 (sampling)


def test_host_line_names_capability_dtype_and_threads():
    line = precision.host_line("bf16")
    assert torch.backends.cpu.get_cpu_capability() in line
    assert "bf16 autocast" in line and f"torch threads {torch.get_num_threads()}" in line
    assert f"amx {'yes' if precision.amx('cpu') else 'no'}" in line
    assert "dtype fp32" in precision.host_line("none")


def test_bad_autocast_is_named():
    with pytest.raises(ValueError, match="autocast"):
        precision.resolve_autocast("fp8")
    with pytest.raises(ValueError, match="SFTConfig.autocast"):
        SFTConfig(autocast="float16")
    assert SFTConfig().autocast == "auto"
