"""benchmarks/limits.py (issue 62): FLOPs and bytes counted from a model's shapes against hand arithmetic for a tiny
config, the decode steps of generation calls, the limit time of a phase at given rates, and the hooks that count the
tokens a model really processed. No timing is asserted."""

from __future__ import annotations

import copy
import inspect
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import limits as L  # noqa: E402

# hidden 8, intermediate 16, 2 layers, 2 heads of 4, 1 KV head, vocab 32, tied
CONFIG = {"hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
          "num_key_value_heads": 1, "head_dim": 4, "vocab_size": 32, "tie_word_embeddings": True}
# one layer: q 8x8 = 64, k and v 8x4 each = 64, o 8x8 = 64, gate and up 8x16 each = 256, down 16x8 = 128 -> 576
LAYER, BODY, HEAD, NORMS = 576, 2 * 576, 8 * 32, (2 * 2 + 1) * 8
WEIGHT_BYTES = (BODY + HEAD + NORMS) * 4  # 5,792
KV_PER_TOKEN = 2 * 2 * 1 * 4 * 4  # keys and values, 2 layers, 1 KV head of 4, fp32: 64 bytes


def shapes() -> L.Shapes:
    return L.Shapes.from_config(CONFIG)


def test_counts_match_hand_arithmetic():
    s = shapes()
    assert (s.layer_params, s.body_params, s.head_params, s.norm_params) == (LAYER, BODY, HEAD, NORMS)
    assert s.weight_bytes() == 5792 and s.weight_bytes(2) == 2896
    assert s.kv_bytes_per_token() == KV_PER_TOKEN
    assert L.body_flops(s, 10) == 2 * 1152 * 10 == 23040
    assert L.head_flops(s, 5) == 2 * 256 * 5 == 2560
    # QK^T and AV: 2 FLOPs per multiply-add, 2 products, 2 heads of 4, 2 layers: 64 per query-key pair
    assert L.attention_flops(s, 3, 7) == 64 * 21
    assert L.causal_pairs(1, 3) == 6 and L.causal_pairs(2, 2, past=3) == 2 * (2 * 3 + 3)
    assert L.adamw_bytes(1000) == 7 * 1000 * 4


def test_config_defaults_and_an_untied_head():
    s = L.Shapes.from_config({**CONFIG, "head_dim": None, "num_key_value_heads": None, "tie_word_embeddings": False})
    assert (s.head_dim, s.kv_heads, s.tied) == (4, 2, False)  # hidden / heads; KV heads = heads
    assert s.layer_params == 64 * 4 + 256 + 128


def test_decode_work_of_generation_calls():
    # call 1: prompts of 3 and 5 tokens, responses of 4 and 2 (the first token of each comes from the prefill):
    # row 1 feeds 3 tokens reading 4, 5, 6 context tokens; row 2 feeds 1 reading 6; 3 steps. Call 2: no step.
    work = L.decode_work([[3, 5], [2]], [[4, 2], [1]])
    assert work == L.DecodeWork(steps=3, tokens=4, context_tokens=21)
    assert work.bytes(shapes()) == 3 * WEIGHT_BYTES + 21 * KV_PER_TOKEN == 18720
    with pytest.raises(ValueError):
        L.decode_work([[3, 5]], [[4]])


def fake_limits(slow_mlp: bool = True) -> dict:
    """Rates per CPU-second: 1 GFLOP/s for every product, 2 for the MLP's at 512 rows; 4 for the head at 512
    rows, 0.5 at 8; triad 10 GB/s."""
    rows = []
    for m, k, n in L.model_matmuls(shapes()):
        rate = 1.0
        if m == 512 and 16 in (k, n):
            rate = 2.0 if slow_mlp else 1.0
        if n == 32:
            rate = 4.0 if m == 512 else 0.5
        rows.append({"m": m, "k": k, "n": n, "dtype": "float32", "threads": 1, "gflops_cpu_best": rate,
                     "gflops_best": rate})
    return {"matmul": rows, "triad": [{"threads": 1, "gbps_cpu_best": 10.0, "gbps_best": 10.0}]}


def test_limit_time_weights_each_product_by_its_flops():
    lim = fake_limits()
    # the attention projections are 192 of the layer's 576 weights (rate 1), the MLP 384 (rate 2)
    assert L.body_seconds(lim, shapes(), 2e9) == pytest.approx(2 * (1 / 3) / 1 + 2 * (2 / 3) / 2)
    assert L.head_seconds(lim, shapes(), 8e9) == pytest.approx(2.0)
    assert L.head_seconds(lim, shapes(), 8e9, m=8) == pytest.approx(16.0)
    assert L.matmul_rate(lim, 8, 8, 16) == 1.0
    with pytest.raises(KeyError, match="no matmul rate for 512x8x99"):
        L.matmul_rate(lim, 512, 8, 99)
    assert L.bandwidth(lim) == 10.0
    row = L.utilisation_row("x", cpu_s=4.0, amount=2e9, limit_s=1.0, unit="FLOP")
    assert (row["achieved"], row["limit"], row["share"]) == (0.5, 2.0, 0.25)


def tiny_llama():
    torch = pytest.importorskip("torch")
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(**CONFIG, max_position_embeddings=64, pad_token_id=0)
    return LlamaForCausalLM(config).eval()


def test_meter_counts_the_tokens_each_stage_processed():
    import torch

    model = tiny_llama()
    meter = L.PhaseMeter()
    meter.watch(model)
    meter.watch(model)  # idempotent: counted once
    ids = torch.randint(1, 32, (2, 5))
    with meter.phase("rollout"), torch.no_grad():
        out = model(input_ids=ids, use_cache=True, logits_to_keep=1)  # a prefill: body 10 tokens, head 2 rows
        mask = torch.ones(2, 6, dtype=torch.long)
        cache_arg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        model(input_ids=ids[:, :1], attention_mask=mask, use_cache=True, logits_to_keep=1,
              **{cache_arg: out[cache_arg] if cache_arg in out else out.past_key_values})  # a decode step: 2 rows
    body = meter.totals[("rollout", "forward", "2L d8 V32 float32")]
    assert (body["calls"], body["tokens"], body["body_flops"]) == (1, 10, 23040)
    assert body["attn_flops"] == 64 * L.causal_pairs(2, 5)
    step = meter.totals[("rollout", "decode", "2L d8 V32 float32")]
    assert (step["tokens"], step["context_tokens"]) == (2, 12)
    assert step["decode_bytes"] == WEIGHT_BYTES + 12 * KV_PER_TOKEN
    assert meter.totals[("rollout", "forward", "head 8x32 float32")]["head_rows"] == 2
    assert meter.totals[("rollout", "decode", "head 8x32 float32")]["head_flops"] == 2 * 256 * 2

    reference = copy.deepcopy(model)  # a frozen reference made from the watched model counts into the same meter
    meter.count_optimizer_steps()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with meter.phase("score"), torch.no_grad():
        reference(input_ids=ids)
    with meter.phase("actor"):
        model(input_ids=ids).logits.sum().backward()  # a training forward: 3x its forward's FLOPs
    with meter.phase("optimizer"):
        optimizer.step()
    meter.close()
    assert meter.totals[("score", "forward", "2L d8 V32 float32")]["body_flops"] == 23040
    train = meter.totals[("actor", "train", "2L d8 V32 float32")]
    assert train["body_flops"] == 3 * 23040
    assert meter.totals[("actor", "train", "head 8x32 float32")]["head_flops"] == 3 * 2 * 256 * 10
    params = sum(p.numel() for p in model.parameters())
    assert L.optimizer_work(meter, fake_limits())["params"] == params  # every parameter had a gradient
    assert L.optimizer_work(meter, fake_limits())["bytes"] == 7 * 4 * params
    with meter.phase("rollout"), torch.no_grad():
        model(input_ids=ids)
    assert meter.totals[("rollout", "forward", "2L d8 V32 float32")]["calls"] == 1  # closed: no longer counted

    work = L.phase_work(meter, fake_limits(), "rollout", ["forward"])
    # body at 512 rows: 23,040 FLOPs, a third at 1 GFLOP/s, two thirds at 2; head of 2 rows a call: 8 rows' rate
    assert work["flops"] == 23040 + 2 * 256 * 2
    assert work["compute_s"] == pytest.approx(23040 * (1 / 3) / 1e9 + 23040 * (2 / 3) / 2e9 + 1024 / 0.5e9)
    decode = L.phase_work(meter, fake_limits(), "rollout", ["decode"])
    assert decode["bytes"] == WEIGHT_BYTES + 12 * KV_PER_TOKEN
    assert decode["bandwidth_s"] == pytest.approx(decode["bytes"] / 10e9)
    assert L.phase_work(meter, {"matmul": [], "triad": []}, "score", ["forward"])["missing"]


def test_fused_head_added_by_the_caller_counts_as_training():
    meter = L.PhaseMeter()
    with meter.phase("actor"):
        meter.add_head((32, 8), rows=7, stage="train")
    t = meter.totals[("actor", "train", "head 8x32 float32")]
    assert (t["head_rows"], t["head_flops"]) == (7, 3 * 2 * 8 * 32 * 7)


def test_attention_core_time_is_the_module_less_its_projections():
    import torch

    ticks = iter(range(10**6))
    meter = L.PhaseMeter(clock=lambda: float(next(ticks)))  # every clock read one tick later
    model = tiny_llama()
    meter.watch(model)
    with meter.phase("score"), torch.no_grad():
        model(input_ids=torch.randint(1, 32, (1, 4)))
    t = meter.totals[("score", "forward", "2L d8 V32 float32")]
    # per layer: q, k, v, o read the clock twice each inside the attention module's span of 9 ticks
    assert (t["attn_module_cpu_s"], t["attn_linear_cpu_s"]) == (2 * 9, 2 * 4)
    assert L.phase_work(meter, fake_limits(), "score")["attn_core_cpu_s"] == 2 * 5


def test_rollout_throughput_shares_of_an_engine():
    import importlib.util

    spec = importlib.util.spec_from_file_location("rollout_throughput", ROOT / "benchmarks" / "rollout_throughput.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    fields = bench.decode_fields([[[1, 2, 3], [1, 2, 3, 4, 5]], [[7, 7]]], [[4, 2], [1]])
    assert fields == {"prompts": 3, "decode_steps": 3, "decode_fed_tokens": 4, "decode_context_tokens": 21}
    result = {"prefill_cpu_s": 1.0, "decode_cpu_s": 2.0, "computed_prefill_tokens": 10, **fields}
    prefill, decode = bench.utilisation([result], shapes(), fake_limits(), 1, local=True)
    # prefill: 10 body tokens at 512 rows' rates, one head row per prompt (3) at 8 rows' rate (0.5 GFLOP/s)
    limit = 23040 * (1 / 3) / 1e9 + 23040 * (2 / 3) / 2e9 + 2 * 256 * 3 / 0.5e9
    assert prefill["amount"] == 23040 + 2 * 256 * 3 and prefill["share"] == pytest.approx(limit / 1.0)
    # decode: 3 steps of the weights and 21 context tokens' KV, against 10 GB/s, in 2 CPU-s
    assert decode["amount"] == 18720 and decode["share"] == pytest.approx(18720 / 10e9 / 2.0)
    assert [r["phase"] for r in bench.utilisation([result], shapes(), fake_limits(), 1, local=False)] == [
        "decode (mean batch 1.3)"]
