"""One source for the documented cost of memenv's commands: the ``--help`` texts read these strings, and
``tests/test_costs.py`` checks that the README states the same figures, so the two cannot drift apart.

Each figure is what was measured on the 2-core dev machine (shared with other work, so the CPU time of a command
can rise when other jobs share the cores); where two measurements differ, both are stated. Re-measure with the
command itself: ``memenv`` prints ``done in ... wall, ... CPU-s`` after every timed command.
"""

from __future__ import annotations

#: command -> its cost as documented (README and ``--help``).
COSTS: dict[str, str] = {
    # `memenv bench` at its defaults: 15 CPU-s (39 s wall at load average 8) and 18 CPU-s in two measurements on an
    # AVX512 host; 20.9 and 21.5 CPU-s in fresh clones on an AVX2-only host (2026-12-07), and on that host later
    # 25.1 and 27.9 with other work beside it and 27.2 at load ~1 (fresh clones, 2026-12-07, nothing in its path
    # changed between them).
    "bench": "15-28 CPU-s (21-28 on an AVX2-only host)",
    # `memenv models prepare smollm2-135m-instruct`, the first time (the conversion); then 0.1 s (a cache check).
    "prepare": "32 s measured here, 115 s on a busy 2-core machine; later 0.1 s",
    # `memenv experiment memopd --quick`: 7.2 CPU-min (4.8 wall-min) alone, 10.7 CPU-min on the shared machine;
    # 2026-12-07 on an AVX2-only 2-core host under load 4-6 (a test suite or a benchmark beside it): 19.8 CPU-min
    # (16.8 wall) with the default 2 torch threads (a thread spins waiting on its descheduled partner), 13.1 (11.9
    # wall) with --threads 1 --sft-threads 1. Its student trains 2 rounds of 200 steps by design (the smoke run's
    # probe never reaches 0.15; 400 steps make its actions mostly valid), so that is not a surprise second round.
    "quick": "7-20 CPU-min (7.2 alone, 4.8 wall-min; on shared cores 13.1 with --threads 1 --sft-threads 1, 19.8 with its default 2 threads)",
    # `memenv train --algo sft --out runs/sft --steps 2000 --threads 1` (the README's tiny agent), the whole command
    # as written (benchmarks/tiny_agent.py --stop-at 0, 2026-12-06, AVX512 with native bf16, a machine shared with
    # other jobs): 46.3 CPU-min, of which 39.2 training and 6.7 its 40 evaluations of 64 episodes; 51.8 wall-min.
    # That run trained under bf16 autocast; "auto" now picks fp32 on a CPU without AMX, whose tiny-recipe step is
    # 1.28x cheaper there (benchmarks/sft_step_speed.py, side by side): an upper bound, not re-measured whole.
    "tiny_sft": "46 CPU-min (39 training + 7 for its 40 evaluations; measured in bf16, fp32 steps are 1.28x cheaper)",
}


def cost(command: str) -> str:
    """The documented cost of ``command`` (a key of :data:`COSTS`)."""
    return COSTS[command]


__all__ = ["COSTS", "cost"]
