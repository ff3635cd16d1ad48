"""The GPU check of MemOPD's packed attention: RCE of every packing x attention backend in bf16 and fp32, and the
time of padded vs packed teacher scoring and actor passes at a realistic size. One table.

Model: a Qwen2 config of Qwen2.5-0.5B's shape (hidden 896, 24 layers, 14 query / 2 key-value heads, MLP 4864,
~0.5B parameters with the tokenizer's vocabulary) built from the config with random weights (seed 0): nothing
is downloaded. Tokenizer: the real SmolLM2 tokenizer at ``/work/models/smollm2-135m-instruct`` when present
(``--tokenizer`` to change it), else a small one trained on MemQA text (``agents.llm.models.local.build_tokenizer``).

Records: GRPO-like groups (``--groups`` task seeds x ``--group-size`` episodes x ``--turns`` invocations) of
random token ids shaped like MemQA invocations: each prompt is the group's task block, the memory the previous
invocation wrote (the head of its response) and a new information block; the first turn's information is the
same for the whole group (as a GRPO group's identical first prompts). Every record's ``response_logprobs`` are
the model's own log-probs of its response, one sequence at a time with plain causal sdpa, in the dtype of the
row (what a policy sampling in that precision records): RCE = max / p99 |packed - those| over every response
token. fp32 must be <= 1e-4 on every backend; in bf16 the floor is the rounding of a different batch shape
(compare with ``padded`` + ``sdpa``, the same kernel on one sequence per row): a leak across packed sequences
is far above it. The ``flash_attention_2 (no cu_seqlens)`` row is the old input (no boundaries, left to
transformers' ``position_ids`` inference, which it does for one-row batches only): it should show the leak.

Backends: ``sdpa`` (the explicit 4D mask), ``sdpa_blocks`` (exact block attention), ``flex_attention`` (a block
mask; compiled by transformers on CUDA; eager on CPU, where flex has no backward), ``flash_attention_2`` (varlen
with ``cu_seqlens``; padded / padding-free layouts, bf16 only; when ``flash_attn`` is installed) and
``torch_varlen`` (the same boundaries to PyTorch's own flash varlen kernel, ``torch.nn.attention.varlen``: no
extra package; bf16 on CUDA; on CPU the plain-torch reference kernel; every packing: a branch's keys are its
prefix gathered before it, so its RCE on shared_prefix / prefix_tree checks the kernel's bottom-right causal
alignment).

Timing: per packing x backend x dtype, after a warm-up round (flex compiles there), the median of ``--rounds``
rounds of (a) teacher scoring: no grad, the body on the packed batches and the full-vocabulary log-probs at the
action positions (``distill.scoring.action_logprobs``), and (b) an actor pass: the same with grad and a
backward per packed batch. ``speedup`` = the best padded baseline (``sorted_padded``, the fastest backend that
runs it in that dtype) / this row's time. Every forward holds at most ``--token-budget`` tokens.

    python benchmarks/gpu_check.py                 # on a GPU: < 8 minutes on one H200-class GPU
    python benchmarks/gpu_check.py --cpu-smoke     # tiny model, few records, on CPU (< 20 s): the script runs
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib.util
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SMOLLM2 = Path("/work/models/smollm2-135m-instruct")
BACKENDS = ("sdpa", "sdpa_blocks", "flex_attention", "flash_attention_2", "torch_varlen")
OLD_FLASH = "flash_attention_2 (no cu_seqlens)"


def load_tokenizer(path: str | None):
    from agents.llm.models.local import build_tokenizer, load_tokenizer as load, task_texts

    folder = Path(path) if path else SMOLLM2
    if (folder / "tokenizer.json").exists() or (folder / "tokenizer_config.json").exists():
        tok = load(folder)
        if tok.pad_token_id is None:
            tok.pad_token = tok.eos_token
        return tok, str(folder)
    if path:
        raise SystemExit(f"--tokenizer {path}: no tokenizer there")
    return build_tokenizer(task_texts("MemQA-v0", {"objectives": 1, "hops": 2}, episodes=20), vocab_size=600), \
        "tiny MemQA BPE (600)"


def build_model(tokenizer, size: str, device):
    import torch
    from transformers import AutoModelForCausalLM

    from agents.llm.models.local import tiny_config

    if size == "0.5b":  # Qwen2.5-0.5B's shape
        cfg = tiny_config(tokenizer, hidden_size=896, layers=24, heads=14, kv_heads=2, intermediate_size=4864,
                          max_positions=32768, rope_theta=1e6)
    else:
        cfg = tiny_config(tokenizer, hidden_size=64, layers=2, heads=4, kv_heads=2, max_positions=4096)
        cfg.vocab_size = min(len(tokenizer), 2048)  # CPU smoke: a cheap head (the records' ids stay below it)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa", dtype=torch.float32)
    return model.eval()


def make_records(vocab: int, groups: int, group_size: int, turns: int, sizes: dict, seed: int = 0):
    """Records without log-probs yet (see the module doc); ``sizes``: task, info (lo, hi), response (lo, hi)."""
    from agents.llm.records.invocation import InvocationRecord

    rng = random.Random(seed)

    def ids(n):
        return [rng.randrange(3, vocab) for _ in range(n)]

    records = []
    for g in range(groups):
        task = ids(sizes["task"])
        first_info = ids(rng.randint(*sizes["info"]))
        for e in range(group_size):
            memory: list[int] = []
            for t in range(1, turns + 1):
                info = first_info if t == 1 else ids(rng.randint(*sizes["info"]))
                response = ids(rng.randint(*sizes["response"]))
                n = len(response)
                records.append(InvocationRecord(
                    episode_id=f"g{g}e{e}", turn=t, prompt_ids=task + memory + info, response_ids=response,
                    response_logprobs=[0.0] * n, action_mask=[1] * n, memory_mask=[0] * n, group=g,
                    rollout_id="gpu_check", seed=g))
                memory = response[: max(1, n // 2)]  # the next prompt repeats the memory this one wrote
    return records


def with_reference_logprobs(model, records):
    """Copies of ``records`` whose ``response_logprobs`` are ``model``'s, one sequence at a time (plain sdpa)."""
    import dataclasses

    import torch

    from agents.llm.generation.policy import sequence_logprobs

    out = []
    with torch.no_grad():
        for r in records:
            lp = sequence_logprobs(model, r.prompt_ids, r.response_ids, r.temperature)
            out.append(dataclasses.replace(r, response_logprobs=lp.tolist()))
    return out


def available(backend: str, method: str, dtype, device) -> str | None:
    """None if ``backend`` can run ``method`` in ``dtype`` on ``device``, else why not."""
    import torch

    from distill.attention import VARLEN_PACKINGS, torch_varlen_available

    if backend == "flash_attention_2":
        if device.type != "cuda":
            return "needs CUDA"
        if importlib.util.find_spec("flash_attn") is None:
            return "flash_attn not installed"
        if dtype not in (torch.float16, torch.bfloat16):
            return "fp16/bf16 only"
        if method not in VARLEN_PACKINGS:
            return "varlen cannot express a shared prefix"
    if backend == "torch_varlen":
        if not torch_varlen_available():
            return "no torch.nn.attention.varlen in this torch"
        if device.type == "cuda" and dtype not in (torch.float16, torch.bfloat16):
            return "fp16/bf16 only"
    if backend == "flex_attention" and importlib.util.find_spec("torch.nn.attention.flex_attention") is None:
        return "no flex_attention in this torch"
    return None


def rce_of(deltas) -> tuple[float, float]:
    import torch

    d = torch.cat(deltas).double()
    return float(d.max()), float(torch.quantile(d, 0.99))


def packed_logprobs(model, batches, backend, records):
    import torch

    from distill.packing import unpack
    from distill.scoring import action_logprobs

    lps = [action_logprobs(model, b, 1.0, backend=backend).float().cpu() for b in batches]
    return torch.cat(unpack(lps, batches, len(records)))


def old_flash_logprobs(model, batches, records):
    """The old flash inputs: no mask, no cu_seqlens, positions only (what transformers 5 infers from)."""
    import torch

    from distill.attention import model_body
    from distill.packing import unpack

    body, head = model_body(model), model.get_output_embeddings()
    lps = []
    model.set_attn_implementation("flash_attention_2")
    try:
        for b in batches:
            b = b.to(next(model.parameters()).device)
            h = body(input_ids=b.input_ids, position_ids=b.position_ids, use_cache=False).last_hidden_state
            logp = torch.log_softmax(head(h[b.rows, b.cols]).float(), -1)
            lps.append(logp.gather(-1, b.targets[:, None])[:, 0].cpu())
    finally:
        model.set_attn_implementation("sdpa")
    return torch.cat(unpack(lps, batches, len(records)))


def sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device) -> float:
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cpu-smoke", action="store_true", help="tiny model, few short records, on CPU")
    p.add_argument("--tokenizer", help=f"tokenizer folder (default {SMOLLM2} if present)")
    p.add_argument("--groups", type=int, help="GRPO groups (default 4; smoke 2)")
    p.add_argument("--group-size", type=int, help="episodes per group (default 4; smoke 2)")
    p.add_argument("--turns", type=int, help="invocations per episode (default 3; smoke 2)")
    p.add_argument("--token-budget", type=int, help="tokens per forward (default 16384; smoke 2048)")
    p.add_argument("--rounds", type=int, help="timed rounds after the warm-up (default 2; smoke 1)")
    p.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"])
    p.add_argument("--budget", type=float, default=420.0, help="seconds; timings left when it is spent are skipped")
    p.add_argument("--csv", help="also write the table here")
    args = p.parse_args(argv)

    import pandas as pd
    import torch

    from agents.llm.models.precision import dtype_name, host_line, resolve_dtype
    from distill.packing import PACKINGS
    from distill.reconstruct import aligned
    from distill.scoring import action_logprobs

    started = time.perf_counter()
    smoke = args.cpu_smoke
    torch._dynamo.config.recompile_limit = 64  # flex recompiles per dtype / shape; never fall back to eager flex
    device = torch.device("cuda" if torch.cuda.is_available() and not smoke else "cpu")
    if device.type == "cpu":
        torch.set_num_threads(1 if smoke else torch.get_num_threads())
    groups = args.groups or (2 if smoke else 4)
    group_size = args.group_size or (2 if smoke else 4)
    turns = args.turns or (2 if smoke else 3)
    budget = args.token_budget or (2048 if smoke else 16384)
    rounds = args.rounds or (1 if smoke else 2)
    sizes = ({"task": 40, "info": (10, 30), "response": (5, 20)} if smoke else
             {"task": 512, "info": (256, 768), "response": (64, 256)})

    tokenizer, tok_name = load_tokenizer(args.tokenizer)
    base = build_model(tokenizer, "tiny" if smoke else "0.5b", device)
    vocab = base.get_input_embeddings().num_embeddings
    n_params = sum(p.numel() for p in base.parameters())
    raw = make_records(vocab, groups, group_size, turns, sizes)
    n_tokens = sum(len(r.prompt_ids) + len(r.response_ids) for r in raw)
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "none"
    flash = importlib.util.find_spec("flash_attn")
    flash_version = "not installed"
    if flash is not None:
        import flash_attn

        flash_version = flash_attn.__version__
    import transformers

    print(host_line("none", device))
    print(f"gpu {gpu}; torch {torch.__version__}, transformers {transformers.__version__}, flash_attn "
          f"{flash_version}; model Qwen2 {n_params / 1e6:.1f}M params (random init), tokenizer {tok_name} "
          f"({len(tokenizer)}); {len(raw)} records ({groups} groups x {group_size} x {turns} turns), {n_tokens} "
          f"invocation tokens, {sum(len(r.response_ids) for r in raw)} scored; token budget {budget}")
    print(f"set-up done at {time.perf_counter() - started:.0f} s", flush=True)
    eager_flex = device.type == "cpu"  # compiled flex on CPU took ~31 s per first call here; eager is exact too

    rows: list[dict] = []
    runs = []  # (dtype, model, records, batches) per dtype
    pad = tokenizer.pad_token_id or 0
    for dtype_arg in args.dtypes:  # phase 1: RCE of every packing x backend in every dtype (cheap: no grad)
        dtype = resolve_dtype(dtype_arg, device)
        if any(run[0] == dtype for run in runs):
            continue
        model = base if dtype == torch.float32 else copy.deepcopy(base).to(dtype)  # the same weights, rounded
        records = with_reference_logprobs(model, raw)
        ref = torch.cat([torch.tensor(r.response_logprobs) for r in records])
        sequences = aligned(records)
        batches, pack_s = {}, {}
        for method in PACKINGS:
            t0 = time.perf_counter()
            batches[method] = [b.to(device) for b in pack(sequences, method, records, budget, pad)]
            pack_s[method] = time.perf_counter() - t0
        runs.append((dtype, model, records, batches))
        for method in PACKINGS:
            for backend in BACKENDS:
                why = available(backend, method, dtype, device)
                row = {"dtype": dtype_name(dtype), "packing": method, "backend": backend,
                       "rows": sum(b.input_ids.shape[0] for b in batches[method]), "forwards": len(batches[method]),
                       "slots": sum(b.n_slots for b in batches[method]), "pack_s": pack_s[method], "note": why or ""}
                if why is None:
                    ctx = torch.compiler.set_stance("force_eager") if (eager_flex and backend == "flex_attention") \
                        else contextlib.nullcontext()
                    with ctx, torch.no_grad():
                        try:
                            got = packed_logprobs(model, batches[method], backend, records)
                            row["rce_max"], row["rce_p99"] = rce_of([(got - ref).abs()])
                        except Exception as exc:  # noqa: BLE001 - a backend failing on this host is a finding
                            row["note"] = f"error: {type(exc).__name__}: {str(exc)[:80]}"
                rows.append(row)
        if available("flash_attention_2", "padding_free", dtype, device) is None:
            with torch.no_grad():
                got = old_flash_logprobs(model, batches["padding_free"], records)
            mx, p99 = rce_of([(got - ref).abs()])
            rows.append({"dtype": dtype_name(dtype), "packing": "padding_free", "backend": OLD_FLASH,
                         "rce_max": mx, "rce_p99": p99, "note": "old inputs: expected to leak"})
        print(f"{dtype_name(dtype)}: RCE done at {time.perf_counter() - started:.0f} s", flush=True)

    for dtype, model, records, batches in runs:  # phase 2: timings, within the budget
        order = sorted((r for r in rows if r["dtype"] == dtype_name(dtype) and "rce_max" in r
                        and r["backend"] != OLD_FLASH), key=lambda r: r["packing"] != "sorted_padded")
        for row in order:  # the padded baselines first: every speedup needs them
            if time.perf_counter() - started > args.budget:
                row["note"] = (row["note"] + "; " if row["note"] else "") + "timing skipped (budget)"
                continue
            method, backend = row["packing"], row["backend"]
            bs = batches[method]
            flex_cpu = eager_flex and backend == "flex_attention"
            ctx = (lambda: torch.compiler.set_stance("force_eager")) if flex_cpu else contextlib.nullcontext

            def teacher():
                with ctx(), torch.no_grad():
                    for b in bs:
                        action_logprobs(model, b, 1.0, backend=backend)

            def actor():
                with ctx():
                    for b in bs:
                        lp = action_logprobs(model, b, 1.0, backend=backend)
                        (-lp.mean()).backward()
                model.zero_grad(set_to_none=True)

            try:
                if not smoke:
                    timed(teacher, device)  # warm-up (flex compiles here)
                row["teacher_s"] = statistics.median(timed(teacher, device) for _ in range(rounds))
                if flex_cpu:
                    row["note"] = (row["note"] + "; " if row["note"] else "") + "actor n/a: flex has no CPU backward"
                else:
                    model.train()
                    if not smoke:
                        timed(actor, device)
                    row["actor_s"] = statistics.median(timed(actor, device) for _ in range(rounds))
            except Exception as exc:  # noqa: BLE001
                row["note"] = f"timing error: {type(exc).__name__}: {str(exc)[:80]}"
            finally:
                model.eval()
                model.zero_grad(set_to_none=True)
            if device.type == "cuda":
                row["peak_gb"] = torch.cuda.max_memory_allocated(device) / 2**30
                torch.cuda.reset_peak_memory_stats(device)
        for pass_ in ("teacher_s", "actor_s"):
            best = [r[pass_] for r in rows if r["dtype"] == dtype_name(dtype) and r["packing"] == "sorted_padded"
                    and pass_ in r]
            for r in rows:
                if r["dtype"] == dtype_name(dtype) and pass_ in r and best:
                    r[pass_.replace("_s", "_speedup")] = min(best) / r[pass_]
        print(f"{dtype_name(dtype)}: timings done at {time.perf_counter() - started:.0f} s", flush=True)

    table = pd.DataFrame(rows)
    cols = [c for c in ("dtype", "packing", "backend", "rce_max", "rce_p99", "teacher_s", "teacher_speedup",
                        "actor_s", "actor_speedup", "pack_s", "rows", "forwards", "slots", "peak_gb", "note")
            if c in table.columns]
    table = table[cols]
    with pd.option_context("display.width", 250, "display.max_columns", 30, "display.max_colwidth", 60):
        print(table.to_string(index=False, float_format=lambda v: f"{v:.4g}", na_rep="-"))
    fp32 = table[(table["dtype"] == "float32") & (table["backend"] != OLD_FLASH)] if "rce_max" in table else table[:0]
    bad = fp32[fp32["rce_max"] > 1e-4] if len(fp32) else fp32
    print(f"fp32 RCE <= 1e-4 on every packing x backend that ran: {'yes' if len(bad) == 0 else 'NO'}; "
          f"total {time.perf_counter() - started:.1f} s")
    if args.csv:
        from memenv.files import write_atomic

        write_atomic(Path(args.csv), lambda tmp: table.to_csv(tmp, index=False))
        print(f"wrote {args.csv}")
    return 0 if len(bad) == 0 else 1


def pack(sequences, method, records, budget, pad):
    from distill import packing

    return packing.pack(sequences, method, token_budget=budget, pad_id=pad, records=records)


if __name__ == "__main__":
    sys.exit(main())
