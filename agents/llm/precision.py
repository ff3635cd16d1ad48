"""Which precision a host computes fast in, decided from the hardware, never assumed.

A bf16 autocast is a win only where the hardware has native bf16 arithmetic: on a CPU with AVX512-BF16 or AMX
an SFT step of the tiny models is ~1.5x faster in bf16 than in fp32; on an AVX2-only CPU of the same size it was
8.5x *slower* (8.8 vs 1.04 CPU-s per step), because every bf16 op is emulated. ``autocast="auto"`` in the trainers
resolves through :func:`resolve_autocast`, and every speed or learning figure is printed beside
:func:`host_line` (capability, native bf16, dtype, threads).
"""

from __future__ import annotations

import torch

AUTOCAST_CHOICES = ("auto", "none", "bf16")


def native_bf16(device: str | torch.device = "cpu") -> bool:
    """True when ``device`` computes bf16 natively (CUDA with bf16 support; a CPU with AVX512-BF16 or AMX)."""
    device = torch.device(device)
    if device.type == "cuda":
        return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
    if device.type != "cpu":
        return False
    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(bool(getattr(torch.cpu, name, lambda: False)()) for name in probes)


def resolve_autocast(autocast: str, device: str | torch.device = "cpu") -> str:
    """``"auto"`` -> ``"bf16"`` where bf16 is native on ``device``, else ``"none"``; other values unchanged."""
    if autocast not in AUTOCAST_CHOICES:
        raise ValueError(f"autocast must be one of {AUTOCAST_CHOICES}, got {autocast!r}")
    if autocast == "auto":
        return "bf16" if native_bf16(device) else "none"
    return autocast


def host_line(autocast: str = "none", device: str | torch.device = "cpu") -> str:
    """One line to print beside a figure: CPU capability, native bf16, compute dtype and torch threads."""
    dtype = "bf16 autocast (weights fp32)" if autocast == "bf16" else "fp32"
    return (f"host: cpu capability {torch.backends.cpu.get_cpu_capability()}, native bf16 "
            f"{'yes' if native_bf16('cpu') else 'no'}, device {torch.device(device).type}, dtype {dtype}, "
            f"torch threads {torch.get_num_threads()}")
