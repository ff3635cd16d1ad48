"""A preliminary start student on the powered teacher's tokenizer (the pipeline's own student stage runs after the
teacher's evaluation): the preset's student recipe, 1,500 SFT steps, to measure the regime's view divergence early."""
import sys
from dataclasses import replace
from pathlib import Path

import torch

from agents.llm.models.local import build_tiny_model, load_tokenizer, save_pretrained
from agents.llm.training.sft import train_sft
from agents.llm.training.common import latest_checkpoint
from distill.experiment.config import powered_config
from distill.experiment.stages import _sft_config

torch.set_num_threads(1)
out = Path("runs/prelim")
teacher = latest_checkpoint(Path("runs/memopd_powered/teacher"))
print("teacher checkpoint", teacher, flush=True)
tok = load_tokenizer(teacher)
cfg = powered_config(str(out), progress=False)
init = out / "student" / "init"
if not (init / "config.json").exists():
    save_pretrained(build_tiny_model(tok, seed=1, hidden_size=cfg.student.hidden, layers=cfg.student.layers,
                                     heads=cfg.student.heads), tok, init)
spec = replace(cfg.student, sft_steps=int(sys.argv[1]) if len(sys.argv) > 1 else 1500)
row = train_sft(_sft_config(cfg, spec, out / "student" / "sft", model=str(init), min_lr_ratio=1.0))
print("done", row.get("step"), row.get("cpu_seconds"), flush=True)
