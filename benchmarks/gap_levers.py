"""Issue 62 item 3's levers, each old against new side by side in one process, CPU seconds (``time.process_time``),
1 torch thread, the sides alternated over ``--rounds`` rounds, mean ± sd:

- ``head8``: the decode step's LM head product, ``[rows, 576] x [49,152, 576]^T``, as ``torch.nn.functional.linear``
  (MKL's sgemm) and on the weight reordered once for oneDNN (:mod:`agents.llm.generation.packed_head`), at 1, 2, 4
  and 8 rows (random weights of SmolLM2's head shape);
- ``fused``: :func:`distill.losses.fused_head_reverse_kl` forward and backward on ``--fused-rows`` action tokens (one
  actor call's; random hidden states, heads of SmolLM2's shape; at the arms' temperatures, PPO 0.7 and
  distillation 1.0, and at one temperature), the code of ``--old-rev`` (``git show``; default the commit before
  issue 62's item 3) against the tree's; the outputs and gradients compared bit for bit;
- ``decode``: the tree path's decode of SmolLM2-135M cut to 6 layers (the arm update's student), 8 prompts of
  400-470 random tokens, 96 tokens sampled at T=1, ``LLMPolicy(packed_head=False)`` against ``True`` (the same seed:
  the same tokens; the largest log-prob difference printed); needs ``--base``;
- ``adamw``: one AdamW step over the 6-layer student's parameters with random gradients, ``foreach`` (torch's
  default) against ``fused`` (:func:`agents.llm.training.ppo.fused_adamw`); needs ``--base``.

On request (not in the default ``--parts``; the records of the rollout's gap against vLLM and of the packed head's
size floor):

- ``body``: one decode step's body products of the 30-layer SmolLM2 (random weights of its shapes, 30 layers' worth
  so that they stream from memory as in a step) at 4 and 8 rows: separate products through sgemm (as transformers
  runs them), q/k/v and gate/up fused into one product each, separate and fused on weights reordered once for
  oneDNN; the reorder's CPU-s for the 30 layers beside;
- ``heads``: the packed head's reorder against what it saves a step, at 8 rows, for heads of 4,096 x 128 (the tiny
  presets') up to SmolLM2's 49,152 x 576: the steps a batch must decode to earn the reorder back
  (:data:`agents.llm.generation.packed_head.MIN_HEAD_BYTES`).

    python benchmarks/gap_levers.py --base ~/.cache/memenv/models/smollm2-135m-instruct \
        --json results/limits/gap_levers.json

On a shared host the CPU seconds of both sides move with the load (cache and memory bandwidth are shared); the
sides run in the same minutes, alternated, so their ratio is the figure to read. The host line is recorded.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402

V, D = 49152, 576


def _stats(values: list[float]) -> dict:
    return {"mean": statistics.mean(values), "sd": statistics.stdev(values) if len(values) > 1 else 0.0,
            "values": values}


def _per_call(fn, loops: int = 5) -> float:
    """CPU seconds of one call of ``fn``, the mean of ``loops`` calls after one warm-up call."""
    fn()
    start = time.process_time()
    for _ in range(loops):
        fn()
    return (time.process_time() - start) / loops


def _alternate(sides: dict, rounds: int, inner) -> dict:
    """``inner(fn) -> seconds`` per side per round, the order reversed every other round."""
    out = {k: [] for k in sides}
    names = list(sides)
    for r in range(rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            out[name].append(inner(sides[name]))
    return {k: _stats(v) for k, v in out.items()}


def _reorder(w: torch.Tensor) -> torch.Tensor:
    from agents.llm.generation.packed_head import REORDER_BATCH

    return torch.ops.mkldnn._reorder_linear_weight(w, REORDER_BATCH)


def _packed(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "")


def head8(rounds: int) -> dict:
    g = torch.Generator().manual_seed(0)
    w = torch.randn(V, D, generator=g) * 0.02
    start = time.process_time()
    packed = _reorder(w)
    reorder_s = time.process_time() - start
    rows_out = {}
    for rows in (1, 2, 4, 8):
        x = torch.randn(rows, 1, D, generator=g)
        sides = {"linear": lambda: torch.nn.functional.linear(x, w), "packed": lambda: _packed(x, packed)}
        diff = float((sides["linear"]() - sides["packed"]()).abs().max())
        res = _alternate(sides, rounds, _per_call)
        res["speedup"] = res["linear"]["mean"] / res["packed"]["mean"]
        res["weight_GBps"] = {k: w.numel() * 4 / res[k]["mean"] / 1e9 for k in ("linear", "packed")}
        res["max_abs_diff"] = diff
        rows_out[str(rows)] = res
        print(f"head {rows} rows: linear {res['linear']['mean'] * 1e3:.1f} ± {res['linear']['sd'] * 1e3:.1f} ms, "
              f"packed {res['packed']['mean'] * 1e3:.1f} ± {res['packed']['sd'] * 1e3:.1f} ms "
              f"({res['speedup']:.2f}x; {res['weight_GBps']['packed']:.1f} GB/s of weights; max |diff| {diff:.1e})")
    return {"reorder_cpu_s": reorder_s, "rows": rows_out}


def _old_losses(rev: str):
    text = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:distill/losses.py"], check=True,
                          capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / "losses_old.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location("losses_old", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["losses_old"] = mod  # (its dataclasses look their module up)
    spec.loader.exec_module(mod)
    return mod


def fused(rounds: int, rows: int, old_rev: str, temperatures: tuple[float, float]) -> dict:
    from distill import losses as new

    old = _old_losses(old_rev)
    g = torch.Generator().manual_seed(0)
    w = (torch.randn(V, D, generator=g) * 0.05).requires_grad_()
    w_t = torch.randn(V, D, generator=g) * 0.05
    h0, h_t = torch.randn(rows, D, generator=g), torch.randn(rows, D, generator=g)
    targets = torch.randint(0, V, (rows,), generator=g)
    outs = {}

    def run(mod):
        h = h0.clone().requires_grad_()
        w.grad = None
        start = time.process_time()
        lp, ent, kl = mod.fused_head_reverse_kl(w, h, targets, lambda x: torch.nn.functional.linear(x, w_t), h_t,
                                                temperatures[0], distill_temperature=temperatures[1])
        mid = time.process_time()
        (0.3 * lp.sum() + 0.01 * ent.sum() + 0.5 * kl.sum()).backward()
        end = time.process_time()
        outs[mod.__name__] = (lp.detach(), ent.detach(), kl.detach(), h.grad, w.grad.clone())
        return mid - start, end - mid

    both = {"old": old, "new": new}
    times = {"old": [], "new": []}
    for r in range(rounds):
        for name in (("old", "new") if r % 2 == 0 else ("new", "old")):
            times[name].append(run(both[name]))
    res = {}
    for name, v in times.items():
        res[name] = {"forward": _stats([f for f, _ in v]), "backward": _stats([b for _, b in v]),
                     "total": _stats([f + b for f, b in v])}
    res["speedup"] = res["old"]["total"]["mean"] / res["new"]["total"]["mean"]
    res["bit_equal"] = [bool(torch.equal(a, b)) for a, b in zip(outs[old.__name__], outs[new.__name__])]
    res["rows"], res["old_rev"], res["temperatures"] = rows, old_rev, list(temperatures)
    old_t = res["old"]["total"]
    print(f"fused head, {rows} rows, temperatures {temperatures}: {old_rev} {old_t['mean']:.2f} ± {old_t['sd']:.2f} "
          f"CPU-s, now {res['new']['total']['mean']:.2f} ± {res['new']['total']['sd']:.2f} ({res['speedup']:.2f}x); "
          f"outputs and gradients bit-equal: {res['bit_equal']}")
    return res


def _student(base: str):
    from agents.llm.models.local import load_pretrained
    from agents.llm.models.pretrained import shrink

    model, tok = load_pretrained(os.path.expanduser(base))
    return shrink(model, 6).eval(), tok


def decode(rounds: int, model, tok) -> dict:
    from agents.llm.generation.policy import LLMPolicy

    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(100, 40000, (400 + 10 * i,), generator=g).tolist() for i in range(8)]
    gens, runs = {}, {False: [], True: []}
    for r in range(rounds):
        for on in ((False, True) if r % 2 == 0 else (True, False)):
            policy = LLMPolicy(model, tok, temperature=1.0, max_new_tokens=96, seed=1, stop=(), packed_head=on)
            policy.eos_ids = set()
            gens[on] = policy.generate_ids(prompts)
            runs[on].append((policy.stats["decode_cpu_s"], policy.stats["decode_rows"]))
    steps = max(len(x.response_ids) for x in gens[True]) - 1
    same = all(a.response_ids == b.response_ids for a, b in zip(gens[False], gens[True]))
    worst = max(abs(x - y) for a, b in zip(gens[False], gens[True]) for x, y in zip(a.response_logprobs,
                                                                                   b.response_logprobs))
    res = {"plain": _stats([c for c, _ in runs[False]]), "packed": _stats([c for c, _ in runs[True]]),
           "steps": steps, "row_steps": runs[True][0][1], "same_tokens": same, "max_logprob_diff": worst}
    res["speedup"] = res["plain"]["mean"] / res["packed"]["mean"]
    res["ms_per_step"] = {k: res[k]["mean"] / steps * 1e3 for k in ("plain", "packed")}
    print(f"decode, 6-layer SmolLM2, 8 rows x {steps + 1} tokens: plain head {res['plain']['mean']:.2f} ± "
          f"{res['plain']['sd']:.2f} CPU-s, packed {res['packed']['mean']:.2f} ± {res['packed']['sd']:.2f} "
          f"({res['speedup']:.2f}x; {res['ms_per_step']['packed']:.1f} ms a step); same tokens {same}, "
          f"log-probs within {worst:.1e}")
    return res


def adamw(rounds: int, model) -> dict:
    params = list(model.parameters())
    sides, kept = {}, {}
    for kind in ("foreach", "fused"):
        ps = [p.detach().clone().requires_grad_() for p in params]
        g = torch.Generator().manual_seed(0)
        for p in ps:
            p.grad = torch.randn(p.shape, generator=g) * 1e-3
        opt = torch.optim.AdamW(ps, lr=1e-5, weight_decay=0.01,
                                **({"fused": True} if kind == "fused" else {"foreach": True}))
        opt.step()  # the first step allocates the moments
        sides[kind], kept[kind] = opt.step, ps

    def inner(step):
        start = time.process_time()
        step()
        return time.process_time() - start

    res = _alternate(sides, rounds, inner)
    n = sum(p.numel() for p in params)
    res["params"] = n
    res["speedup"] = res["foreach"]["mean"] / res["fused"]["mean"]
    with torch.no_grad():
        res["max_param_diff"] = max(float((a - b).abs().max()) for a, b in zip(kept["foreach"], kept["fused"]))
    res["GBps_7_values"] = {k: 28 * n / res[k]["mean"] / 1e9 for k in ("foreach", "fused")}
    print(f"AdamW step, {n / 1e6:.1f}M parameters: foreach {res['foreach']['mean']:.3f} ± {res['foreach']['sd']:.3f} "
          f"CPU-s, fused {res['fused']['mean']:.3f} ± {res['fused']['sd']:.3f} ({res['speedup']:.1f}x); parameters "
          f"within {res['max_param_diff']:.1e} after {rounds + 1} steps")
    return res


def body(rounds: int, layers: int = 30) -> dict:
    g = torch.Generator().manual_seed(0)
    shapes = {"q": (576, 576), "k": (192, 576), "v": (192, 576), "o": (576, 576), "gate": (1536, 576),
              "up": (1536, 576), "down": (576, 1536)}
    w = [{k: torch.randn(*s, generator=g) * 0.02 for k, s in shapes.items()} for _ in range(layers)]
    fused_w = [{"qkv": torch.cat([l["q"], l["k"], l["v"]]), "o": l["o"], "gateup": torch.cat([l["gate"], l["up"]]),
                "down": l["down"]} for l in w]
    start = time.process_time()
    packed_w = [{k: _reorder(v) for k, v in l.items()} for l in w]
    reorder_s = time.process_time() - start
    packed_fused = [{k: _reorder(v) for k, v in l.items()} for l in fused_w]
    nbytes = sum(v.numel() for l in w for v in l.values()) * 4
    out = {"layers": layers, "weight_MB": nbytes / 1e6, "reorder_cpu_s": reorder_s, "rows": {}}
    F = torch.nn.functional.linear
    for rows in (4, 8):
        x, h = torch.randn(rows, 1, 576, generator=g), torch.randn(rows, 1, 1536, generator=g)

        def step(ws, mm):
            for l in ws:
                for k, v in l.items():
                    mm(h if k == "down" else x, v)

        sides = {"sgemm": lambda: step(w, F), "sgemm_fused": lambda: step(fused_w, F),
                 "packed": lambda: step(packed_w, _packed), "packed_fused": lambda: step(packed_fused, _packed)}
        res = _alternate(sides, rounds, _per_call)
        for k in sides:
            res[k]["weight_GBps"] = nbytes / res[k]["mean"] / 1e9
            res[k]["x_vs_sgemm"] = res["sgemm"]["mean"] / res[k]["mean"]
        out["rows"][str(rows)] = res
        print(f"body, {layers} layers, {rows} rows: " + ", ".join(
            f"{k} {res[k]['mean'] * 1e3:.1f} ± {res[k]['sd'] * 1e3:.1f} ms ({res[k]['x_vs_sgemm']:.2f}x, "
            f"{res[k]['weight_GBps']:.1f} GB/s)" for k in sides) + f"; reorder {reorder_s:.2f} CPU-s")
    return out


def heads(rounds: int) -> dict:
    g = torch.Generator().manual_seed(0)
    out = {}
    for vocab, d in ((4096, 128), (8192, 256), (16384, 256), (32768, 384), (V, D)):
        w = torch.randn(vocab, d, generator=g) * 0.02
        x = torch.randn(8, 1, d, generator=g)
        p = _reorder(w)
        reorder_s = _per_call(lambda: _reorder(w), loops=5)  # one reorder alone is too short for the CPU clock
        loops = max(5, int(2e8 // (vocab * d * 8)))  # small heads: more calls, so the CPU clock resolves them
        res = _alternate({"linear": lambda: torch.nn.functional.linear(x, w), "packed": lambda: _packed(x, p)},
                         rounds, lambda fn: _per_call(fn, loops))
        saved = res["linear"]["mean"] - res["packed"]["mean"]
        res.update(reorder_cpu_s=reorder_s, weight_MiB=vocab * d * 4 / 2**20,
                   breakeven_steps=reorder_s / saved if saved > 0 else None)
        out[f"{vocab}x{d}"] = res
        even = f"{res['breakeven_steps']:.0f} steps to break even" if saved > 0 else "never breaks even"
        print(f"head {vocab} x {d} ({res['weight_MiB']:.0f} MiB), 8 rows: linear {res['linear']['mean'] * 1e3:.3f} ms, "
              f"packed {res['packed']['mean'] * 1e3:.3f} ms, reorder {reorder_s * 1e3:.1f} ms: {even}")
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", help="SmolLM2-135M's folder (decode and adamw need it)")
    parser.add_argument("--parts", default="head8,fused,decode,adamw", help="any of head8, fused, decode, adamw, "
                        "body, heads (default: the first four)")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--fused-rows", type=int, default=1152, help="action tokens of one actor call (default "
                        "1,152: the arm update's, 8 calls of 12 actions x 96 tokens)")
    parser.add_argument("--fused-temperatures", default="0.7,1.0", help="PPO's and the distillation's (default: "
                        "the arms', 0.7 and 1.0; 1.0,1.0 runs the one-temperature path)")
    parser.add_argument("--old-rev", default="976dcf6", help="the commit whose distill/losses.py is the old side")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    from limits import host_info, host_text

    host = host_info()
    print(host_text(host))
    parts = args.parts.split(",")
    out = {"command": "python " + " ".join([Path(sys.argv[0]).as_posix()] + sys.argv[1:]), "host": host}
    if "head8" in parts:
        out["head8"] = head8(args.rounds)
    if "fused" in parts:
        temps = tuple(float(t) for t in args.fused_temperatures.split(","))
        out["fused"] = fused(args.rounds, args.fused_rows, args.old_rev, temps)
        out["fused_one_temperature"] = fused(max(2, args.rounds - 1), args.fused_rows, args.old_rev, (1.0, 1.0))
    if "decode" in parts or "adamw" in parts:
        if not args.base:
            parser.error("decode and adamw need --base")
        model, tok = _student(args.base)
        if "decode" in parts:
            out["decode"] = decode(max(2, args.rounds - 1), model, tok)
        if "adamw" in parts:
            out["adamw"] = adamw(args.rounds, model)
    if "body" in parts:
        out["body"] = body(args.rounds)
    if "heads" in parts:
        out["heads"] = heads(args.rounds)
    out["host_after"] = host_info()
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
        print("wrote", args.json)


if __name__ == "__main__":
    main()
