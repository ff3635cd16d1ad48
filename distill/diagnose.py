"""Runtime RCE diagnostic: how far each reconstruction/packing moves the log-probs of the sampled tokens.

    from distill.diagnose import diagnose
    table = diagnose(records, model, tokenizer)     # a pandas DataFrame, one row per method
    print(table.to_string(index=False))

Rows (``methods``): ``aligned`` (each invocation as sampled, one per padded row: the reference),
``padding_free``, ``shared_prefix`` (aligned invocations packed), and ``persistent`` (the episode flattened into
one transcript, the misaligned control of MemOPD's paper; needs the tokenizer, scored in padded rows).

Columns: ``max_abs_dlogp`` / ``p99_abs_dlogp``: |recomputed - recorded| log-prob of the sampled tokens (the
records' ``response_logprobs``; run it with the model that sampled them, else policy drift adds in);
``top1_flips``: action positions whose argmax token differs from the aligned one; ``clip_share``: share of action
tokens whose ratio ``exp(recomputed - recorded)`` leaves ``[1 - clip, 1 + clip]`` (a PPO update would clip them
before any learning); ``action_tokens``: tokens scored; ``tokens``: real tokens run through the model;
``slots``: tokens run including padding; ``saved_vs_padded``: ``1 - slots / slots(aligned)``.
"""

from __future__ import annotations

from typing import Sequence

import torch

from distill import DIAGNOSE_METHODS
from distill.scoring import score_records

_PLAN = {  # method -> (reconstruction, packing)
    "aligned": ("aligned", "padded"),
    "padding_free": ("aligned", "padding_free"),
    "shared_prefix": ("aligned", "shared_prefix"),
    "persistent": ("persistent", "padded"),
}


def diagnose(records, model, tokenizer=None, clip: float = 0.2, methods: Sequence[str] = DIAGNOSE_METHODS, *,
             progress: bool = False, **pack_kw):
    """One row per method (see the module doc) as a :class:`pandas.DataFrame`. ``pack_kw`` go to
    :func:`distill.packing.pack` (``token_budget``, ``row_len``, ...). ``persistent`` needs ``tokenizer``."""
    import pandas as pd
    from tqdm.auto import tqdm

    unknown = [m for m in methods if m not in _PLAN]
    if unknown or not methods:
        raise ValueError(f"methods must be a non-empty subset of {DIAGNOSE_METHODS}, got {list(methods)!r}")
    if not 0 < clip < 1:
        raise ValueError(f"clip must be in (0, 1), got {clip}")
    if "persistent" in methods and tokenizer is None:
        raise ValueError("the persistent control tokenises environment text: pass the tokenizer")
    recorded = torch.cat([torch.tensor(r.response_logprobs, dtype=torch.float32) for r in records]) \
        if records else torch.zeros(0)
    # the aligned argmax is the reference for top-1 flips: computed first even when not asked for as a row
    order = ["aligned"] + [m for m in methods if m != "aligned"]
    results = {}
    for method in tqdm(order, desc="diagnose", disable=not progress, leave=False):
        reconstruction, packing = _PLAN[method]
        results[method] = score_records(model, records, packing, reconstruction=reconstruction,
                                        tokenizer=tokenizer, **pack_kw)
    reference = torch.cat(results["aligned"]["argmax"])
    padded_slots = results["aligned"]["slots"]
    rows = []
    for method in methods:
        scored = results[method]
        delta = torch.cat(scored["logprobs"]) - recorded
        ratio = delta.double().exp()
        absd = delta.abs().double()
        rows.append({
            "method": method,
            "reconstruction": _PLAN[method][0],
            "packing": _PLAN[method][1],
            "max_abs_dlogp": float(absd.max()) if absd.numel() else 0.0,
            "p99_abs_dlogp": float(torch.quantile(absd, 0.99)) if absd.numel() else 0.0,
            "top1_flips": int((torch.cat(scored["argmax"]) != reference).sum()),
            "clip_share": float(((ratio < 1 - clip) | (ratio > 1 + clip)).double().mean()) if absd.numel() else 0.0,
            "action_tokens": int(absd.numel()),
            "tokens": scored["tokens"],
            "slots": scored["slots"],
            "saved_vs_padded": 1.0 - scored["slots"] / padded_slots,
        })
    return pd.DataFrame(rows)
