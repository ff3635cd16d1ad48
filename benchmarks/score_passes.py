"""CPU cost of an update's scoring passes (the reference's log-probs and the recomputed old log-probs: the ``score``
part of ``benchmarks/arm_update_cost.py``) with and without the passes the trainer saves exactly
(``PPOConfig.old_logprobs_from_first_forward``: the first minibatch's old log-probs from its own training forward;
``ref_logprobs_from_actor``: no reference pass while the actor's weights equal the reference's, a fresh run's first
update), side by side in one process, 1 torch thread, on the records of one rollout of the real-model MemOPD arm
(``--base`` as in ``arm_update_cost.py``: teacher = student = the prepared base, or its first ``--student-layers``).

Variants, each on the same records: ``none`` (every record scored by the actor and by the reference), ``old``
(the first minibatch's old log-probs from its forward: every update after the first), ``old+ref`` (also no
reference pass: the first update of a fresh run). Prints the CPU seconds of each per round, and the largest
difference of the scored old log-probs between variants (the same forward on fewer rows).

    python benchmarks/score_passes.py --base ~/.cache/memenv/models/smollm2-135m-instruct --student-layers 6
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

VARIANTS = {"none": (False, False), "old": (True, False), "old+ref": (True, True)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="a prepared base model folder")
    parser.add_argument("--student-layers", type=int, default=None, metavar="N",
                        help="the student keeps the base's first N decoder layers (default: the preset's; 0 = all)")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)

    import torch

    from agents.llm.models.local import load_pretrained
    from agents.llm.training.ppo import PartClock, advantages_step, first_minibatch, rollout_step, setup
    from agents.llm.models.precision import host_line, resolve_autocast
    from agents.llm.models.pretrained import shrink
    from distill.experiment.config import pretrained_config
    from distill.experiment.stages import arm_config
    from distill.trainer import PackedActorForward

    torch.set_num_threads(1)
    base = Path(args.base).expanduser()
    if not (base / "config.json").exists():
        raise SystemExit(f"--base {base}: not a prepared model folder (no config.json)")
    cfg = replace(pretrained_config("unused"), updates=1)
    if args.student_layers is not None:
        cfg = replace(cfg, student=replace(cfg.student, layers=args.student_layers))
    model, tok = load_pretrained(base)
    if cfg.student.layers:
        model = shrink(model, cfg.student.layers)
    with tempfile.TemporaryDirectory() as scratch:
        run_cfg = replace(arm_config(cfg, "memopd", 0, {"path": str(base)}, {"path": str(base)}), out_dir=scratch,
                          progress=False, threads=1)
        run = setup(run_cfg, model, tok, None, PackedActorForward(run_cfg.layout(), tok, run_cfg.chunk), None)
        print(host_line(resolve_autocast(run_cfg.train_autocast)), f"| student layers {cfg.student.layers or 'all'}",
              flush=True)
        episodes, records = rollout_step(run, 0, PartClock())
        tokens = sum(sum(r.action_mask) for r in records)
        seconds = {name: [] for name in VARIANTS}
        old = {}
        for _ in range(args.rounds):
            for name, (first, ref) in VARIANTS.items():
                run.cfg = replace(run_cfg, old_logprobs_from_first_forward=first, ref_logprobs_from_actor=ref)
                run.ref_may_equal = True
                state = run.mb_rng.bit_generator.state  # every variant draws the same first minibatch
                clock = PartClock()
                batch = advantages_step(run, episodes, records, clock)
                run.mb_rng.bit_generator.state = state
                seconds[name].append(clock.seconds["score"])
                old[name] = batch.old_logps
        n_first = len(first_minibatch(run_cfg, records, batch.first_order))
    print(f"{len(records)} records, {tokens} action tokens; first minibatch {n_first} records")
    for name in VARIANTS:
        print(f"score CPU-s {name:<8} " + " ".join(f"{s:.1f}" for s in seconds[name]))
    diff = max(abs(a - b) for v in ("old", "old+ref") for x, y in zip(old["none"], old[v])
               if y is not None for a, b in zip(x, y))
    print(f"old log-probs of the scored records, variants vs none: max |d| {diff:.2e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
