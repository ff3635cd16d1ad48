"""What a phase of the update *should* cost on this CPU: FLOPs and bytes counted from a decoder LM's shapes and the
tokens it actually processed, and the share of a measured limit (``benchmarks/machine_limits.py``) a phase reached.

Counting conventions (issue 62):

- **FLOPs** are the linear layers' matmuls, ``2 x weights x tokens`` for a forward (a multiply and an add per
  weight per token), the body (attention projections and gated MLP of every layer) and the LM head
  (``hidden x vocab``) counted apart. A training forward costs 3x its forward (the backward computes the input's
  and the weights' gradients, a forward's matmuls each). A forward recomputed inside a backward (a checkpointed
  chunk) counts once more. Attention's own products (``QK^T``, ``AV``) are estimated apart and are not in the
  share (their size depends on the masks: causal within each row is assumed).
- **Bytes of a decode step** are the weights read once per step (norms included; a tied embedding is read once, as
  the head) plus the KV cache of each row's real context, at the weights' and cache's dtype.
- **Optimizer bytes**: AdamW reads a parameter, its gradient and two moments and writes the parameter and the
  moments: 7 values per trainable parameter.
- A phase's **limit time** is the sum over its matmul kinds of ``FLOPs / rate at that shape`` (body, head), or
  ``bytes / triad bandwidth``; its **share** is ``limit time / CPU seconds it took``. The rates compared are per
  CPU-second (machine_limits.py measures both clocks: on a shared host the wall clock also counts other jobs'
  time; at 1 thread on an idle host the two agree).

:class:`PhaseMeter` counts the tokens by watching a model's body and head with forward hooks (no FLOP counter
mode: its per-op cost would slow the phases it measures). Nothing here asserts a speed.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections import defaultdict
from dataclasses import asdict, dataclass
from typing import Iterable, Sequence

#: A training forward's matmul FLOPs relative to its forward: forward + the two gradient products of the backward.
TRAIN_FACTOR = 3
#: AdamW per trainable parameter: reads parameter, gradient, exp_avg, exp_avg_sq; writes parameter and both moments.
ADAMW_VALUES = 7
#: Rows of the prefill/training-shaped products the limits are measured at, and the decode batch.
TRAIN_ROWS, DECODE_ROWS = 512, 8


@dataclass(frozen=True)
class Shapes:
    """A decoder-only LM's sizes (Llama / Qwen2 style: gated MLP, grouped-query attention)."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool = True

    @classmethod
    def from_config(cls, config, layers: int | None = None) -> "Shapes":
        """From a transformers config (or a dict of one); ``layers``: the layers a cut model really holds."""
        get = config.get if isinstance(config, dict) else (lambda k, d=None: getattr(config, k, d))
        heads = int(get("num_attention_heads"))
        hidden = int(get("hidden_size"))
        return cls(hidden=hidden, intermediate=int(get("intermediate_size")),
                   layers=int(layers if layers is not None else get("num_hidden_layers")), heads=heads,
                   kv_heads=int(get("num_key_value_heads") or heads),
                   head_dim=int(get("head_dim", None) or hidden // heads), vocab=int(get("vocab_size")),
                   tied=bool(get("tie_word_embeddings", True)))

    def body_matmuls(self) -> list[tuple[int, int, int]]:
        """``(k, n, count per layer)`` of the body's products ``[m, k] x [k, n]``: q, k and v, o, gate and up,
        down."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return [(self.hidden, q, 1), (self.hidden, kv, 2), (q, self.hidden, 1), (self.hidden, self.intermediate, 2),
                (self.intermediate, self.hidden, 1)]

    @property
    def layer_params(self) -> int:
        """Weights of one layer's linear layers."""
        return sum(k * n * c for k, n, c in self.body_matmuls())

    @property
    def body_params(self) -> int:
        return self.layers * self.layer_params

    @property
    def head_params(self) -> int:
        return self.hidden * self.vocab

    @property
    def norm_params(self) -> int:
        """Two RMS norms a layer and the final one."""
        return (2 * self.layers + 1) * self.hidden

    def weight_bytes(self, dtype_bytes: int = 4) -> int:
        """Bytes of weights a decode step reads: every linear layer, the norms, the head (with a tied embedding
        the head is the embedding: read once; an untied embedding's lookup reads a row per token, left out)."""
        return (self.body_params + self.head_params + self.norm_params) * dtype_bytes

    def kv_bytes_per_token(self, dtype_bytes: int = 4) -> int:
        """Bytes of keys and values one context token holds over all layers."""
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes

    def label(self) -> str:
        return f"{self.layers}L d{self.hidden} V{self.vocab}"


def body_flops(shapes: Shapes, tokens: float) -> float:
    """Forward matmul FLOPs of the body's linear layers over ``tokens`` tokens."""
    return 2.0 * shapes.body_params * tokens


def head_flops(shapes: Shapes, rows: float) -> float:
    """Forward FLOPs of the LM head applied to ``rows`` positions."""
    return 2.0 * shapes.head_params * rows


def attention_flops(shapes: Shapes, queries: float, keys_per_query: float) -> float:
    """``QK^T`` and ``AV`` FLOPs of ``queries`` query tokens that each see ``keys_per_query`` keys (all layers)."""
    return 4.0 * shapes.layers * shapes.heads * shapes.head_dim * queries * keys_per_query


def causal_pairs(rows: int, length: int, past: int = 0) -> int:
    """Query-key pairs of ``rows`` rows of ``length`` new tokens after ``past`` cached ones, causal."""
    return rows * (length * past + length * (length + 1) // 2)


@dataclass(frozen=True)
class DecodeWork:
    """The decode of a set of generation calls: steps (one forward each), tokens fed, context tokens read."""

    steps: int
    tokens: int
    context_tokens: int

    def bytes(self, shapes: Shapes, dtype_bytes: int = 4) -> int:
        """Bytes the steps read at least: the weights once a step, each fed row's own KV cache."""
        return self.steps * shapes.weight_bytes(dtype_bytes) + self.context_tokens * shapes.kv_bytes_per_token(
            dtype_bytes)


def decode_work(prompt_lengths: Sequence[Sequence[int]], response_lengths: Sequence[Sequence[int]]) -> DecodeWork:
    """The decode steps of generation calls whose rows start together: per call, its prompts' and its responses'
    lengths. The first token of a response comes from the prefill; each later one is one step of a forward
    holding every row still running, so a call takes ``max(response length) - 1`` steps and a row of prompt ``p``
    and response ``r`` feeds ``r - 1`` tokens that read ``p + 1, ..., p + r - 1`` context tokens."""
    steps = tokens = context = 0
    for prompts, responses in zip(prompt_lengths, response_lengths, strict=True):
        if len(prompts) != len(responses):
            raise ValueError(f"a call with {len(prompts)} prompts and {len(responses)} responses")
        fed = [max(0, r - 1) for r in responses]
        steps += max(fed, default=0)
        tokens += sum(fed)
        context += sum(f * p + f * (f + 1) // 2 for p, f in zip(prompts, fed))
    return DecodeWork(steps, tokens, context)


def adamw_bytes(params: int, dtype_bytes: int = 4) -> int:
    """Bytes one AdamW step moves for ``params`` trainable parameters (:data:`ADAMW_VALUES` values each)."""
    return ADAMW_VALUES * params * dtype_bytes


# ------------------------------------------------------------------------------------------------ the limits
def matmul_rate(limits: dict, m: int, k: int, n: int, dtype: str = "float32", threads: int = 1,
                stat: str = "best", basis: str = "cpu") -> float:
    """GFLOP/s of ``[m, k] x [k, n]`` in ``limits`` (a machine_limits.py record) at ``threads`` threads: per
    CPU-second (``basis="cpu"``, what a phase's CPU seconds are compared with) or on the wall clock (``"wall"``).
    KeyError naming the shape when it was not measured."""
    for row in limits["matmul"]:
        if (row["m"], row["k"], row["n"], row["dtype"], row["threads"]) == (m, k, n, dtype, threads):
            return row[f"gflops_{'cpu_' if basis == 'cpu' else ''}{stat}"]
    raise KeyError(f"no matmul rate for {m}x{k}x{n} {dtype} at {threads} thread(s) in the limits: measure it with "
                   f"benchmarks/machine_limits.py (--model DIR for a model's shapes, --threads {threads})")


def bandwidth(limits: dict, threads: int = 1, stat: str = "best", basis: str = "cpu") -> float:
    """Triad GB/s at ``threads`` threads, per CPU-second or on the wall clock."""
    for row in limits["triad"]:
        if row["threads"] == threads:
            return row[f"gbps_{'cpu_' if basis == 'cpu' else ''}{stat}"]
    raise KeyError(f"no triad bandwidth at {threads} thread(s) in the limits")


def body_seconds(limits: dict, shapes: Shapes, flops: float, m: int = TRAIN_ROWS, dtype: str = "float32",
                 threads: int = 1, basis: str = "cpu") -> float:
    """Seconds the body's ``flops`` take at the measured rates of its own products (each product's share of the
    FLOPs at that product's rate)."""
    parts = shapes.body_matmuls()
    total = sum(k * n * c for k, n, c in parts)
    return sum(flops * (k * n * c / total) / (1e9 * matmul_rate(limits, m, k, n, dtype, threads, basis=basis))
               for k, n, c in parts)


def head_seconds(limits: dict, shapes: Shapes, flops: float, m: int = TRAIN_ROWS, dtype: str = "float32",
                 threads: int = 1, basis: str = "cpu") -> float:
    if not flops:
        return 0.0
    return flops / (1e9 * matmul_rate(limits, m, shapes.hidden, shapes.vocab, dtype, threads, basis=basis))


def share(limit_seconds: float, seconds: float) -> float:
    """The share of its limit a phase reached: limit time / time taken (nan without time)."""
    return limit_seconds / seconds if seconds > 0 else float("nan")


def model_matmuls(shapes: Shapes, rows: Iterable[int] = (TRAIN_ROWS, DECODE_ROWS)) -> list[tuple[int, int, int]]:
    """The distinct ``(m, k, n)`` products of a model at the given row counts: its body's and its head's."""
    kn = list(dict.fromkeys([(k, n) for k, n, _ in shapes.body_matmuls()] + [(shapes.hidden, shapes.vocab)]))
    return [(m, k, n) for m in rows for k, n in kn]


# --------------------------------------------------------------------------------------------- the host line
def cpu_flags() -> list[str]:
    """The CPU flags that decide matmul speed (from /proc/cpuinfo; empty where unreadable)."""
    wanted = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16")
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("flags"):
                    have = set(line.split(":", 1)[1].split())
                    return [f for f in wanted if f in have]
    except OSError:
        pass
    return []


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def host_info() -> dict:
    """What to print beside a figure: the CPU, its flags, torch's capability and native bf16 (as
    agents/llm/models/precision.py decides it), the threads and the load average now."""
    import torch

    from agents.llm.models.precision import amx, native_bf16

    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:
        cpus = os.cpu_count() or 1
    return {"cpu": cpu_model(), "flags": cpu_flags(), "capability": torch.backends.cpu.get_cpu_capability(),
            "native_bf16": native_bf16("cpu"), "amx": amx("cpu"), "cpus": cpus,
            "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
            "load": [round(x, 2) for x in os.getloadavg()], "time": time.strftime("%Y-%m-%d %H:%M:%S")}


def host_text(info: dict) -> str:
    return (f"host: {info['cpu']}, flags {' '.join(info['flags']) or '-'}, capability {info['capability']}, native "
            f"bf16 {'yes' if info['native_bf16'] else 'no'}, amx {'yes' if info['amx'] else 'no'}, {info['cpus']} "
            f"CPUs, torch {info['torch']} threads {info['torch_threads']}, load {' '.join(map(str, info['load']))}")


# --------------------------------------------------------------------------------------------- the meter
class PhaseMeter:
    """Tokens each model's body and head processed, by phase, counted by forward hooks on the modules.

    ``watch(model)`` hooks the body (``model.model``) and the head (``get_output_embeddings()``); the shapes
    come from the module itself at each call (a deep copy of a watched model, as a frozen reference, is counted
    too). ``with meter.phase("actor"): ...`` names what runs. Per ``(phase, stage, model label)`` it sums the
    calls, tokens (``rows x length``), FLOPs, attention FLOPs (causal estimate), the decode steps' bytes and the
    forwards' own CPU seconds (body and head; ``time.process_time``). Stages: ``forward`` (a no-grad forward of
    more than one token a row: a prefill or a scoring pass), ``decode`` (one token a row; the head call after such
    a body call too), ``train`` (a forward with grad: counted 3x), ``recompute`` (a forward inside a backward). A
    prefill of a prefix-tree node of one token counts as a decode step (rare). Each layer's attention module is
    timed too, less its linear projections (``attn_module_cpu_s`` - ``attn_linear_cpu_s``: the attention core's
    forward time). A head applied by its weight (a fused head) is not a module
    call: the caller adds it with :meth:`add_head`."""

    def __init__(self, clock=time.process_time) -> None:
        self.clock = clock
        self.current = "other"
        self.totals: dict[tuple[str, str, str], dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.shapes: dict[str, tuple[Shapes, str]] = {}  # body label -> (shapes, compute dtype)
        self.heads: dict[str, tuple[int, int, str]] = {}  # head label -> (hidden, vocab, compute dtype)
        self._watched: set[int] = set()
        self._body_start: list[tuple] = []
        self._head_start: list[tuple] = []
        self._last_stage = "forward"
        self._handles: list = []
        self._spans: list[float] = []

    @contextlib.contextmanager
    def phase(self, name: str):
        before, self.current = self.current, name
        try:
            yield
        finally:
            self.current = before

    def watch(self, model) -> None:
        import torch

        body = getattr(model, "model", None)
        head = model.get_output_embeddings()
        if body is None or head is None:
            raise TypeError(f"{type(model).__name__}: no .model body or no output embeddings to watch")
        # plain functions, not bound methods: a deep copy of the model (a frozen reference) keeps hooks that
        # count into this meter (copy.deepcopy would copy a bound method's meter with it)
        if id(body) not in self._watched:
            self._watched.add(id(body))
            self._handles += [body.register_forward_pre_hook(lambda m, a, k: self._body_pre(m, a, k), with_kwargs=True),
                              body.register_forward_hook(lambda m, a, o: self._body_post())]
        if id(head) not in self._watched:
            self._watched.add(id(head))
            self._handles += [head.register_forward_pre_hook(lambda m, a: self._head_pre(m, a)),
                              head.register_forward_hook(lambda m, a, o: self._head_post())]
        for layer in getattr(body, "layers", ()):
            attn = getattr(layer, "self_attn", None)
            if attn is None or id(attn) in self._watched:
                continue
            # the attention module's forward time less its linear projections' = the attention core's (RoPE,
            # the cache update, the mask, softmax(QK^T)V): measured, forwards only
            self._watched.add(id(attn))
            self._handles += [attn.register_forward_pre_hook(lambda m, a: self._span_pre()),
                              attn.register_forward_hook(lambda m, a, o: self._span_post("attn_module_cpu_s"))]
            for sub in attn.modules():
                if isinstance(sub, torch.nn.Linear):
                    self._handles += [sub.register_forward_pre_hook(lambda m, a: self._span_pre()),
                                      sub.register_forward_hook(lambda m, a, o: self._span_post("attn_linear_cpu_s"))]

    def _span_pre(self) -> None:
        self._spans.append(self.clock())

    def _span_post(self, name: str) -> None:
        if self._spans and self._body_start:  # only inside a counted body call: added to its key
            self.totals[self._body_start[-1][0]][name] += self.clock() - self._spans.pop()
        elif self._spans:
            self._spans.pop()

    def close(self) -> None:
        """Remove the hooks (from the watched modules; a deep copy keeps its own)."""
        for handle in self._handles:
            handle.remove()
        self._handles, self._watched = [], set()

    @staticmethod
    def _stage(tokens_per_row: int) -> str:
        import torch

        if torch._C._current_graph_task_id() != -1:
            return "recompute"
        if torch.is_grad_enabled():
            return "train"
        return "decode" if tokens_per_row == 1 else "forward"

    @staticmethod
    def _compute_dtype(module) -> str:
        """The dtype the module's matmuls run in: an autocast's where one is on, else its weights'."""
        import torch

        if torch.is_autocast_enabled("cpu"):
            return str(torch.get_autocast_dtype("cpu")).removeprefix("torch.")
        return str(next(module.parameters()).dtype).removeprefix("torch.")

    def _label(self, body) -> str:
        shapes = Shapes.from_config(body.config, layers=len(body.layers))
        dtype = self._compute_dtype(body)
        label = f"{shapes.label()} {dtype}"
        self.shapes[label] = (shapes, dtype)
        return label

    def _body_pre(self, module, args, kwargs) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is None:
            ids = kwargs["inputs_embeds"]
        rows, length = int(ids.shape[0]), int(ids.shape[1])
        label, stage = self._label(module), self._stage(length)
        shapes = self.shapes[label][0]
        past = kwargs.get("past_key_values", kwargs.get("cache"))
        cached = int(past.get_seq_length()) if past is not None and hasattr(past, "get_seq_length") else 0
        mask = kwargs.get("attention_mask")
        key = (self.current, stage, label)
        t = self.totals[key]
        t["calls"] += 1
        t["tokens"] += rows * length
        factor = TRAIN_FACTOR if stage == "train" else 1
        t["body_flops"] += factor * body_flops(shapes, rows * length)
        if stage == "decode":
            # each row's real context: the 2-D mask's ones (a buffer's padding columns are zeros), else the cache
            context = int(mask.sum()) if mask is not None and mask.dim() == 2 else rows * (cached + 1)
            size = next(module.parameters()).element_size()
            t["context_tokens"] += context
            t["decode_bytes"] += shapes.weight_bytes(size) + context * shapes.kv_bytes_per_token(size)
            t["attn_flops"] += attention_flops(shapes, 1, context)
        else:
            t["attn_flops"] += factor * attention_flops(shapes, 1, causal_pairs(rows, length, cached))
        self._last_stage = stage
        self._body_start.append((key, self.clock()))

    def _body_post(self) -> None:
        if self._body_start:
            key, start = self._body_start.pop()
            self.totals[key]["body_cpu_s"] += self.clock() - start

    def _head_pre(self, module, args) -> None:
        hidden = args[0]
        stage = self._stage(2)
        if stage == "forward" and self._last_stage == "decode":  # the head of a decode step's forward
            stage = "decode"
        key = self.add_head(module.weight.shape, int(hidden.numel() // hidden.shape[-1]), stage,
                            self._compute_dtype(module))
        self._head_start.append((key, self.clock()))

    def _head_post(self) -> None:
        if self._head_start:
            key, start = self._head_start.pop()
            self.totals[key]["head_cpu_s"] += self.clock() - start

    def add_head(self, weight_shape, rows: int, stage: str | None = None, dtype: str | None = None
                 ) -> tuple[str, str, str]:
        """A head ``[vocab, hidden]`` applied to ``rows`` positions in the current phase (``stage``: as the
        hooks decide it, by default from the grad mode; ``"train"`` counts 3x; ``dtype``: of its matmul, default
        float32 or the autocast's)."""
        import torch

        vocab, hidden = int(weight_shape[0]), int(weight_shape[1])
        stage = stage or self._stage(2)
        if dtype is None:
            dtype = str(torch.get_autocast_dtype("cpu")).removeprefix("torch.") if torch.is_autocast_enabled("cpu") \
                else "float32"
        label = f"head {hidden}x{vocab} {dtype}"
        self.heads[label] = (hidden, vocab, dtype)
        key = (self.current, stage, label)
        t = self.totals[key]
        t["calls"] += 1
        t["head_rows"] += rows
        t["head_flops"] += (TRAIN_FACTOR if stage == "train" else 1) * 2.0 * hidden * vocab * rows
        return key

    def count_optimizer_steps(self) -> None:
        """Count every optimizer step from now on (a global hook, removed by :meth:`close`): steps and the
        elements of the parameters that had a gradient, by phase."""
        from torch.optim.optimizer import register_optimizer_step_post_hook

        def counted(optimizer, args, kwargs) -> None:
            t = self.totals[(self.current, "step", "optimizer")]
            t["steps"] += 1
            t["params"] += sum(p.numel() for g in optimizer.param_groups for p in g["params"] if p.grad is not None)
            t["param_bytes"] += sum(p.numel() * p.element_size() for g in optimizer.param_groups
                                    for p in g["params"] if p.grad is not None)

        self._handles.append(register_optimizer_step_post_hook(counted))

    def rows(self) -> list[dict]:
        """One dict per ``(phase, stage, label)``."""
        return [{"phase": p, "stage": s, "model": m, **dict(v)} for (p, s, m), v in self.totals.items()]

    def summed(self, phase: str, stages: Iterable[str] | None = None) -> dict[str, float]:
        """The sums of ``phase`` (over ``stages``, default all)."""
        out: dict[str, float] = defaultdict(float)
        for (p, s, _), values in self.totals.items():
            if p == phase and (stages is None or s in stages):
                for k, v in values.items():
                    out[k] += v
        return dict(out)


def phase_work(meter: PhaseMeter, limits: dict, phase: str, stages: Iterable[str] | None = None,
               threads: int = 1) -> dict:
    """What ``phase``'s ``stages`` computed and the least CPU time that takes at ``limits``' rates: FLOPs (body,
    head), the matmul limit time (the body at its products' rates, at :data:`TRAIN_ROWS` rows, or
    :data:`DECODE_ROWS` for decode steps; a head at :data:`TRAIN_ROWS` rows when its calls average >= 64 rows,
    else at the decode batch's), the decode steps' bytes and their bandwidth time, the forwards' own CPU seconds,
    and the kinds a rate was missing for (their FLOPs then have no limit time). ``stages`` None: all of them.
    ``body_*``: the body's alone (``body_cpu_s``: its hook-timed forwards; ``attn_core_cpu_s``: of which the
    attention modules' time outside their projections); ``head_cpu_s``: the heads' timed forwards."""
    stages = set(stages) if stages is not None else {"forward", "decode", "train", "recompute"}
    out = {"body_flops": 0.0, "head_flops": 0.0, "attn_flops": 0.0, "compute_s": 0.0, "body_compute_s": 0.0,
           "bytes": 0.0, "bandwidth_s": 0.0, "forward_cpu_s": 0.0, "body_cpu_s": 0.0, "head_cpu_s": 0.0,
           "attn_core_cpu_s": 0.0, "tokens": 0.0,
           "head_rows": 0.0, "calls": 0.0, "missing": []}
    for (p, s, label), t in meter.totals.items():
        if p != phase or s not in stages:
            continue
        out["forward_cpu_s"] += t.get("body_cpu_s", 0.0) + t.get("head_cpu_s", 0.0)
        out["body_cpu_s"] += t.get("body_cpu_s", 0.0)
        out["head_cpu_s"] += t.get("head_cpu_s", 0.0)
        out["attn_core_cpu_s"] += t.get("attn_module_cpu_s", 0.0) - t.get("attn_linear_cpu_s", 0.0)
        out["attn_flops"] += t.get("attn_flops", 0.0)
        out["tokens"] += t.get("tokens", 0.0)
        out["head_rows"] += t.get("head_rows", 0.0)
        try:
            if label in meter.shapes:
                shapes, dtype = meter.shapes[label]
                out["body_flops"] += t["body_flops"]
                out["calls"] += t["calls"]
                m = DECODE_ROWS if s == "decode" else TRAIN_ROWS
                seconds = body_seconds(limits, shapes, t["body_flops"], m, dtype, threads)
                out["compute_s"] += seconds
                out["body_compute_s"] += seconds
                if s == "decode":
                    out["bytes"] += t["decode_bytes"]
                    out["bandwidth_s"] += t["decode_bytes"] / (1e9 * bandwidth(limits, threads))
            elif label in meter.heads:
                hidden, vocab, dtype = meter.heads[label]
                out["head_flops"] += t["head_flops"]
                m = TRAIN_ROWS if t["head_rows"] / max(t["calls"], 1) >= 64 else DECODE_ROWS
                out["compute_s"] += t["head_flops"] / (1e9 * matmul_rate(limits, m, hidden, vocab, dtype, threads))
        except KeyError as err:
            out["missing"].append(f"{label}: {err}")
    out["flops"] = out["body_flops"] + out["head_flops"]
    return out


def optimizer_work(meter: PhaseMeter, limits: dict, phase: str = "optimizer", threads: int = 1) -> dict:
    """The optimizer steps counted in ``phase``: steps, bytes moved (:data:`ADAMW_VALUES` values per parameter
    that had a gradient) and their bandwidth time."""
    t = meter.totals.get((phase, "step", "optimizer"), {})
    moved = ADAMW_VALUES * t.get("param_bytes", 0.0)
    return {"steps": t.get("steps", 0.0), "params": t.get("params", 0.0), "bytes": moved,
            "bandwidth_s": moved / (1e9 * bandwidth(limits, threads)) if moved else 0.0}


def utilisation_row(phase: str, cpu_s: float, amount: float, limit_s: float, unit: str, note: str = "") -> dict:
    """A table row: ``amount`` (FLOPs or bytes) done in ``cpu_s``; achieved and limit rates in G``unit``/s;
    share = limit time / CPU time."""
    achieved = amount / cpu_s / 1e9 if cpu_s > 0 and amount else float("nan")
    limit = amount / limit_s / 1e9 if limit_s > 0 else float("nan")
    return {"phase": phase, "cpu_s": cpu_s, "amount": amount, "unit": unit, "achieved": achieved, "limit": limit,
            "limit_s": limit_s, "share": share(limit_s, cpu_s), "note": note}


def format_rows(rows: Sequence[dict]) -> str:
    """The utilisation table: phase, CPU-s, work, achieved and limit rate, share of the limit, notes."""
    lines = [f"{'phase':52s} {'CPU-s':>7s} {'work':>11s} {'achieved':>12s} {'limit':>12s} {'share':>6s}  notes"]
    for r in rows:
        unit = r["unit"]
        work = f"{r['amount'] / 1e9:.2f} G{unit}" if r["amount"] else "-"
        rate = (lambda v: f"{v:.2f} G{unit}/s" if v == v else "-")
        shr = f"{100 * r['share']:.0f}%" if r["share"] == r["share"] else "-"
        lines.append(f"{r['phase']:52s} {r['cpu_s']:>7.2f} {work:>11s} {rate(r['achieved']):>12s} "
                     f"{rate(r['limit']):>12s} {shr:>6s}  {r['note']}")
    return "\n".join(lines)


__all__ = ["phase_work", "optimizer_work", "utilisation_row", "format_rows", "Shapes", "DecodeWork", "PhaseMeter", "TRAIN_FACTOR", "ADAMW_VALUES", "body_flops", "head_flops",
           "attention_flops", "causal_pairs", "decode_work", "adamw_bytes", "matmul_rate", "bandwidth",
           "body_seconds", "head_seconds", "share", "model_matmuls", "host_info", "host_text", "asdict"]
