"""Which precision a host computes fast in, decided from the hardware, never assumed.

A bf16 autocast is a win only where the hardware computes bf16 much faster than fp32 (:func:`fast_bf16`): a CUDA
device with bf16, a CPU with AMX tiles. Native bf16 instructions alone are not enough: on the dev machine's
AVX512-BF16 CPU without AMX (1 thread, torch 2.13, oneDNN 3.12) fp32 is the faster choice everywhere we measured,
because every bf16 matmul first casts its fp32 weights and reorders them for the bf16 kernel:
SmolLM2-135M forward + backward over 2 x 314 tokens 4.2-4.3 CPU-s in fp32 vs 7.5-8.3 under bf16 autocast (1.8x);
its no-grad forward 1.26-1.35 CPU-s in fp32 vs 2.23-2.26 with bf16 weights (1.8x); a tiny Qwen2 (d 128, 4 layers,
vocab 8,192) SFT forward + backward 1.3 vs 2.3 (1.7x) (``python benchmarks/precision_speed.py``). An earlier note
here said the tiny models' SFT step was ~1.5x faster in bf16 on "AVX512-BF16 or AMX"; it was not reproduced on
this host. On an AVX2-only CPU bf16 is emulated: 8.5x *slower* (8.8 vs 1.04 CPU-s per step). ``autocast="auto"``
in the trainers resolves through :func:`resolve_autocast`, and every speed or learning figure is printed beside
:func:`host_line` (capability, native bf16, AMX, dtype, threads).
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


def amx(device: str | torch.device = "cpu") -> bool:
    """True when ``device`` is a CPU with AMX tiles (the matrix unit whose bf16 throughput is many times fp32's)."""
    return torch.device(device).type == "cpu" and bool(getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)())


def fast_bf16(device: str | torch.device = "cpu") -> bool:
    """True where bf16 compute is expected to beat fp32 (what ``"auto"`` and ``"native"`` follow): a CUDA device with
    bf16, a CPU with AMX. Not a CPU with AVX512-BF16 alone: measured slower than fp32 there (module docstring)."""
    device = torch.device(device)
    if device.type == "cuda":
        return native_bf16(device)
    return amx(device)


def resolve_autocast(autocast: str, device: str | torch.device = "cpu") -> str:
    """``"auto"`` -> ``"bf16"`` where bf16 is fast on ``device`` (:func:`fast_bf16`), else ``"none"``; other values
    unchanged."""
    if autocast not in AUTOCAST_CHOICES:
        raise ValueError(f"autocast must be one of {AUTOCAST_CHOICES}, got {autocast!r}")
    if autocast == "auto":
        return "bf16" if fast_bf16(device) else "none"
    return autocast


def host_line(autocast: str = "none", device: str | torch.device = "cpu") -> str:
    """One line to print beside a figure: CPU capability, native bf16, compute dtype and torch threads."""
    dtype = "bf16 autocast (weights fp32)" if autocast == "bf16" else "fp32"
    return (f"host: cpu capability {torch.backends.cpu.get_cpu_capability()}, native bf16 "
            f"{'yes' if native_bf16('cpu') else 'no'}, amx {'yes' if amx('cpu') else 'no'}, "
            f"device {torch.device(device).type}, dtype {dtype}, "
            f"torch threads {torch.get_num_threads()}")


# ---------------------------------------------------------------------- model weights: dtype and attention
#: Names a model's weight dtype may be given as (``memenv train --dtype``, ``RunConfig.dtype``, ``load_pretrained``).
DTYPE_CHOICES = ("auto", "float32", "bfloat16", "float16", "native")
_DTYPE_ALIASES = {"float32": "float32", "fp32": "float32", "float": "float32", "bfloat16": "bfloat16",
                  "bf16": "bfloat16", "float16": "float16", "fp16": "float16", "half": "float16"}
#: Attention implementations a model may be loaded with (``attn_implementation``).
ATTN_IMPLEMENTATIONS = ("sdpa", "eager", "flash_attention_2", "flex_attention")


def resolve_dtype(dtype=None, device: str | torch.device | None = None, name: str = "dtype") -> torch.dtype:
    """The ``torch.dtype`` of model weights for ``dtype`` on ``device`` (the one place this is decided).

    ``dtype``: ``"auto"``, ``"float32"`` / ``"fp32"``, ``"bfloat16"`` / ``"bf16"``, ``"float16"`` / ``"fp16"``, a
    floating ``torch.dtype``, or None (float32). ``"auto"``: bfloat16 on a CUDA device that supports it, else
    float32: on CPU always float32, the token-exact reference precision of every equality check (bf16 weights
    on CPU would change the sampled tokens' log-probs, and on an AVX2-only CPU every bf16 op is emulated).
    ``"native"``: bfloat16 wherever the device computes it fast (:func:`fast_bf16`: CUDA with bf16, a CPU with
    AMX; not AVX512-BF16 alone, where fp32 weights were 1.8x faster), else float32: for weights whose outputs need
    not reproduce sampling (a frozen teacher), on any host. Anything else raises a ValueError naming ``name``, the
    value and the choices."""
    if dtype is None:
        return torch.float32
    if isinstance(dtype, torch.dtype):
        if not dtype.is_floating_point:
            raise ValueError(f"{name} must be a floating dtype ({', '.join(DTYPE_CHOICES)}); got {dtype}")
        return dtype
    if not isinstance(dtype, str):
        raise ValueError(f"{name} must be one of {', '.join(DTYPE_CHOICES)} (or fp32/bf16/fp16, or a torch dtype); "
                         f"got {dtype!r}")
    key = dtype.strip().lower().removeprefix("torch.")
    if key == "auto":
        dev = torch.device(device) if device is not None else torch.device("cpu")
        return torch.bfloat16 if dev.type == "cuda" and native_bf16(dev) else torch.float32
    if key == "native":
        dev = torch.device(device) if device is not None else torch.device("cpu")
        return torch.bfloat16 if fast_bf16(dev) else torch.float32
    if key not in _DTYPE_ALIASES:
        raise ValueError(f"{name} must be one of {', '.join(DTYPE_CHOICES)} (or fp32/bf16/fp16, or a torch dtype); "
                         f"got {dtype!r}")
    return getattr(torch, _DTYPE_ALIASES[key])


def check_dtype(dtype, name: str = "dtype"):
    """``dtype`` unchanged if :func:`resolve_dtype` accepts it (for config fields, checked without a device)."""
    resolve_dtype(dtype, "cpu", name)
    return dtype


def dtype_name(dtype: torch.dtype) -> str:
    """``"float32"``, ``"bfloat16"``, ... (for host lines and tables)."""
    return str(dtype).removeprefix("torch.")


def check_attn_implementation(impl: str, dtype: torch.dtype | None = None, device: str | torch.device | None = None,
                              name: str = "attn_implementation") -> str:
    """``impl`` if a model can be loaded with it on ``device`` in ``dtype``, else a clear error before loading:
    an unknown name (ValueError naming ``name`` and the choices); ``flash_attention_2`` without a CUDA device, in
    float32, or without the ``flash_attn`` package (flash-attention runs fp16/bf16 on CUDA only)."""
    import importlib.util

    if impl not in ATTN_IMPLEMENTATIONS:
        raise ValueError(f"{name} must be one of {', '.join(ATTN_IMPLEMENTATIONS)}; got {impl!r}")
    if impl == "flash_attention_2":
        dev = torch.device(device) if device is not None else torch.device("cpu")
        if dev.type != "cuda":
            raise ValueError(f"{name}=flash_attention_2 needs a CUDA device (got device {dev}); on CPU use sdpa "
                             "(or flex_attention)")
        if dtype is not None and dtype not in (torch.float16, torch.bfloat16):
            raise ValueError(f"{name}=flash_attention_2 computes in float16/bfloat16 only; got dtype "
                             f"{dtype_name(dtype)}: load with dtype bfloat16 (or auto)")
        if importlib.util.find_spec("flash_attn") is None:
            raise ValueError(f"{name}=flash_attention_2 needs the flash_attn package (pip install flash-attn), "
                             "which is not installed; use sdpa or flex_attention")
    return impl
