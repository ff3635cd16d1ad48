"""CPU cost of the actor's training step (forward + backward, then the optimizer step) with the full weights vs
low-rank adapters (``PPOConfig.lora_rank``, :mod:`agents.llm.training.lora`), side by side in one process, 1 torch
thread.

The student is the prepared ``--base`` folder's first ``--student-layers`` decoder layers (``shrink``, as
``benchmarks/arm_update_cost.py --student-layers``; 0: the whole model). The records are synthetic: ``--records``
rows of ``--prompt-tokens`` prompt and ``--action-tokens`` action tokens (random ids; the cost depends on the
shapes only), run through the trainers' default actor forward (:class:`agents.llm.training.common.ActorCritic`, one
row per record, the LM head over the whole vocabulary at the action tokens) under the arms' training precision
(``--autocast``, default ``auto``: bf16 autocast where the CPU computes it natively). The loss is the log-probs'
mean minus a small entropy term: what the backward costs does not depend on the loss's value. Each round runs every
setting once, in turn (interleaved, so a change of the host's load reaches every setting), each on its own fresh
model and optimizer, after one untimed warm-up step; the table gives per setting the mean CPU seconds of the
forward + backward and of the optimizer step, and the trainable parameters.

This is the actor part of ``arm_update_cost.py`` alone (that benchmark's ``--lora-rank`` runs the whole update):
the MemOPD arms' packed forward with the fused head skips the frozen head's weight gradient in the same way.

    python benchmarks/lora_actor_cost.py --base ~/.cache/memenv/models/smollm2-135m-instruct --student-layers 6 --ranks 0 8
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="a prepared base model folder")
    parser.add_argument("--student-layers", type=int, default=6, metavar="N", help="0: the whole model")
    parser.add_argument("--ranks", type=int, nargs="+", default=[0, 8], help="0: the full weights")
    parser.add_argument("--records", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--action-tokens", type=int, default=96)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--autocast", default="auto", choices=["auto", "none", "bf16"])
    args = parser.parse_args(argv)

    import torch

    from agents.llm.training.lora import add_adapters
    from agents.llm.models.local import load_pretrained, use_float32_attention
    from agents.llm.models.precision import host_line, resolve_autocast
    from agents.llm.models.pretrained import shrink
    from agents.llm.training.common import ActorCritic, collate

    torch.set_num_threads(1)
    autocast = resolve_autocast(args.autocast, "cpu")
    base, tok = load_pretrained(Path(args.base).expanduser())
    vocab = base.get_input_embeddings().weight.shape[0]
    gen = torch.Generator().manual_seed(0)
    seqs = [(torch.randint(0, vocab, (args.prompt_tokens,), generator=gen).tolist(),
             torch.randint(0, vocab, (args.action_tokens,), generator=gen).tolist()) for _ in range(args.records)]
    batch = collate(seqs, tok.pad_token_id or 0)

    def build(rank: int):
        lm = shrink(base, args.student_layers) if args.student_layers else load_pretrained(Path(args.base).expanduser())[0]
        if autocast != "none":  # as the trainer: attention stays fp32 under the CPU's bf16 autocast
            use_float32_attention(lm)
        if rank:
            add_adapters(lm, rank)
        actor = ActorCritic(lm, autocast=autocast)
        params = [p for p in actor.parameters() if p.requires_grad]
        return actor, torch.optim.AdamW(params, lr=1e-5), sum(p.numel() for p in params)

    def step(actor, opt) -> tuple[float, float]:
        t = time.process_time()
        logp, ent, _ = actor(**batch.inputs(), entropy=True)
        (-(logp.mean()) - 1e-3 * ent.mean()).backward()
        t1 = time.process_time()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return t1 - t, time.process_time() - t1

    print(host_line(autocast, "cpu"), f"| {args.student_layers or 'all'} layers, {args.records} records x "
          f"({args.prompt_tokens} prompt + {args.action_tokens} action tokens), rounds {args.rounds}", flush=True)
    models = {r: build(r) for r in args.ranks}
    del base
    for actor, opt, _ in models.values():
        step(actor, opt)  # warm-up (oneDNN plans, the optimizer's state), untimed
    times = {r: [] for r in args.ranks}
    for k in range(args.rounds):
        for r in args.ranks:
            times[r].append(step(*models[r][:2]))
            print(f"round {k + 1} rank {r}: fwd+bwd {times[r][-1][0]:.2f} CPU-s, optimizer {times[r][-1][1]:.3f}",
                  flush=True)
    full = sum(t[0] for t in times[args.ranks[0]]) / args.rounds
    print(f"\n{'setting':<18}{'trainable':>12}{'fwd+bwd CPU-s':>15}{'optimizer':>11}{'vs first':>10}")
    for r in args.ranks:
        fb = sum(t[0] for t in times[r]) / args.rounds
        op = sum(t[1] for t in times[r]) / args.rounds
        print(f"{('full weights' if r == 0 else f'lora rank {r}'):<18}{models[r][2]:>12,}{fb:>15.2f}{op:>11.3f}"
              f"{full / fb:>9.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
