"""Pilot (issue 45 item 5): training demonstrations whose draws rename every entity (a share ``rate`` of them), so
the teacher cannot know entities by name and must copy them. The fair teacher otherwise (both views, hops 1-2),
for 45 CPU-min of SFT; then the experiment's own teacher evaluations (held-out, seen, train draws, persistent)."""
import sys
from dataclasses import replace
from distill.experiment.config import fair_config
from distill.experiment.run import run_experiment
rate = float(sys.argv[1])
minutes = float(sys.argv[2]) if len(sys.argv) > 2 else 45.0
cfg = fair_config(f"runs/pilot_names_{rate:g}", sft_threads=1, workers=1, threads=1, progress=False)
cfg = replace(cfg, teacher=replace(cfg.teacher, sft_minutes=minutes,
                                   sft_env={"hops": (1, 2), "fresh_name_rate": rate}))
print(run_experiment(cfg, until="teacher").to_string())
