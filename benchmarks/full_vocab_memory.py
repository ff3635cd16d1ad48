"""Full-vocabulary distillation at V = 49,152 (SmolLM2's head) in bounded memory: the chunked LM head.

    python benchmarks/full_vocab_memory.py [--positions 2048] [--chunks 128 512 0]

For each chunk size (0: one chunk, i.e. every position's logits at once), a fresh subprocess computes the
reverse KL of a student against the teacher over all 49,152 vocabulary entries at ``--positions`` action
positions and back-propagates it to the student's hidden states and head, then reports its peak resident set
(sampled every 2 ms) above the one it had just before, the time, and the loss (equal across chunk sizes: the chunking is exact).
Heads: SmolLM2-135M-Instruct's (teacher) and a 4-layer cut of it (student), from ``memenv models prepare``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import threading
import time

from memread_rss import _rss_mb  # current RSS in MB (benchmarks/ is on sys.path)


def one(positions: int, chunk: int, threads: int) -> dict:
    import torch

    from agents.llm.models.local import load_pretrained
    from distill.losses import DistillLossConfig, chunked_distill_loss

    torch.set_num_threads(threads)
    model, _ = load_pretrained("smollm2-135m-instruct")
    teacher_head = model.get_output_embeddings()
    student_head = torch.nn.Linear(teacher_head.in_features, teacher_head.out_features, bias=False)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():  # the same student head in every subprocess
        student_head.weight.copy_(teacher_head.weight + 0.01 * torch.randn(teacher_head.weight.shape, generator=gen))
    for p in model.parameters():
        p.requires_grad_(False)
    width = teacher_head.in_features
    h_student = torch.randn(positions, width, generator=gen).requires_grad_(True)
    h_teacher = torch.randn(positions, width, generator=gen)
    gc.collect()
    base = _rss_mb()  # now, not the lifetime peak (loading the model peaked higher)
    peak = [base]
    done = threading.Event()

    def sample() -> None:  # the resident set every 2 ms while the loss runs
        while not done.is_set():
            peak[0] = max(peak[0], _rss_mb())
            time.sleep(0.002)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    started = time.perf_counter()
    cfg = DistillLossConfig(kind="reverse_kl", chunk=chunk or positions)
    per_token = chunked_distill_loss(student_head, h_student, teacher_head, h_teacher, cfg)
    loss = per_token.mean()
    loss.backward()
    seconds = time.perf_counter() - started
    done.set()
    sampler.join()
    return {"chunk": chunk or positions, "positions": positions, "vocab": teacher_head.out_features,
            "peak_mb_above_start": peak[0] - base, "seconds": seconds, "loss": float(loss),
            "grad_norm": float(h_student.grad.norm())}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--positions", type=int, default=2048)
    parser.add_argument("--chunks", type=int, nargs="+", default=[128, 512, 0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    from records import add_record_option  # benchmarks/records.py: the committed record

    add_record_option(parser)
    args = parser.parse_args(argv)
    if args.child is not None:
        print(json.dumps(one(args.positions, args.child, args.threads)))
        return 0
    import pandas as pd
    import torch

    from agents.llm.models.precision import host_line

    torch.set_num_threads(args.threads)
    rows = []
    for chunk in args.chunks:
        # A fixed mmap threshold: glibc otherwise raises it after the first large free, and later chunk-sized
        # buffers come from the heap and stay resident after they are freed, so RSS would count dead chunks.
        env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072"}
        out = subprocess.run([sys.executable, __file__, "--positions", str(args.positions), "--threads",
                              str(args.threads), "--child", str(chunk)], capture_output=True, text=True, check=True,
                             env=env)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    table = pd.DataFrame(rows)
    print(host_line())
    print(table.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    spread = table["loss"].max() - table["loss"].min()
    print(f"loss identical across chunk sizes within {spread:.2e}; one chunk's logits alone would be "
          f"{args.positions * int(table['vocab'][0]) * 4 / 2**20:.0f} MB per fp32 tensor")
    if args.record:
        from records import write_record

        write_record(args.record, __file__, argv, {"dtype": "float32", "threads": args.threads, "rows": rows,
                                                   "loss_spread": float(spread)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
