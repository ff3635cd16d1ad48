"""The same tiny runs on two trees, compared bit for bit: a refactor that moves code must not change a weight.

``python benchmarks/same_runs.py --out DIR`` runs, through the ``memenv`` CLI of the tree this file lies in (a
subprocess with that tree first on ``PYTHONPATH``, so a copy of this file in another checkout runs that
checkout's code): ``train --algo sft`` (6 steps of a tiny model), ``train --algo ppo`` and ``--algo grpo`` (2
updates each from the SFT checkpoint), ``distill`` (one MemOPD update, teacher and student both SFT
checkpoints), ``records collect`` (4 episodes) and ``records export --to trl``. About a minute on one CPU core.

``python benchmarks/same_runs.py --compare A B`` compares two such folders: every tensor of every checkpoint
(``.safetensors`` and ``.pt``) with ``torch.equal``, every metrics row, config and record exactly, except the
columns that time the run (seconds, rates, elapsed time), a rollout's random id and the run folder's own path. It prints
each difference and exits 1 if there is one, else prints how much it compared and exits 0.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path

TREE = Path(__file__).resolve().parents[1]
TINY = ["tiny_vocab=300", "tiny_hidden=32", "tiny_layers=1", "tiny_heads=2", "tiny_tokenizer_episodes=10"]
COMMON = ["--kw", "objectives=1", "hops=1", "max_turns=3", "--num-envs", "2", "--max-new-tokens", "8",
          "--threads", "1", "--quiet"]
# What differs between two runs of the same code (measured: the same tree twice): the clocks (metrics columns
# ``*_s``, ``*seconds``, ``*_per_s``; a checkpoint's ``elapsed``) and the random id of a rollout (uuid4).
NOT_COMPARED = re.compile(r"(_s|seconds|_per_s)$|^elapsed$|^rollout_id$")


def _memenv(*argv: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(TREE) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    cmd = [sys.executable, "-m", "memenv.cli", *argv]
    done = subprocess.run(cmd, cwd=TREE, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")


def run_all(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    sft = out / "sft"
    _memenv("train", "--algo", "sft", "--out", str(sft), "--episodes", "10", "--batch-size", "4", "--steps", "6",
            "--save-every", "3", "--eval-every", "6", "--eval-episodes", "2", *COMMON, "--set", *TINY)
    start, earlier = sft / "checkpoint-0000006", sft / "checkpoint-0000003"
    for algo in ("ppo", "grpo"):
        _memenv("train", "--algo", algo, "--model", str(start), "--out", str(out / algo), "--updates", "2",
                "--episodes-per-update", "4", "--group-size", "2", "--save-every", "1", "--eval-every", "2",
                "--eval-episodes", "2", "--kl-coef", "0.01", *COMMON, "--set", "num_minibatches=2", "epochs=1")
    _memenv("distill", "--teacher", str(earlier), "--student", str(start), "--out", str(out / "distill"),
            "--algo", "ppo", "--updates", "1", "--episodes-per-update", "2", "--num-envs", "2", "--max-new-tokens",
            "8", "--eval-every", "0", "--kw", "objectives=1", "hops=2", "max_turns=2", "--packing", "padding_free",
            "--loss", "forward_kl", "--lambda", "0.5", "--quiet", "--set", "num_minibatches=1")
    records = out / "records.jsonl"
    _memenv("records", "collect", "--model", str(start), "-n", "4", "--num-envs", "2", "--max-new-tokens", "8",
            "--kw", "objectives=1", "hops=1", "max_turns=3", "--out", str(records), "--quiet")
    _memenv("records", "export", str(records), "--to", "trl", "--out", str(out / "trl_rows.jsonl"), "--quiet")
    print(f"wrote {out} with the code of {TREE}")


def _compared(key: str) -> bool:
    return not NOT_COMPARED.search(key)


def _same(a, b, where: str, problems: list[str], counts: dict[str, int], roots: tuple[str, str]) -> None:
    import torch

    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        counts["tensors"] += 1
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype
                and a.shape == b.shape and torch.equal(a, b)):
            problems.append(f"{where}: tensors differ")
    elif isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            problems.append(f"{where}: keys differ: {sorted(set(a) ^ set(b), key=str)}")
        for key in sorted(set(a) & set(b), key=str):
            if _compared(str(key)):
                _same(a[key], b[key], f"{where}[{key!r}]", problems, counts, roots)
    elif isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and type(a) is type(b):
        if len(a) != len(b):
            problems.append(f"{where}: lengths {len(a)} != {len(b)}")
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{where}[{i}]", problems, counts, roots)
    elif isinstance(a, str) and isinstance(b, str):
        counts["values"] += 1
        if a.replace(roots[0], "<RUN>") != b.replace(roots[1], "<RUN>"):  # a config names its own run folder
            problems.append(f"{where}: {a!r} != {b!r}")
    elif type(a).__module__ == "numpy" or type(b).__module__ == "numpy":  # the numpy RNG state of a checkpoint
        import numpy as np

        counts["values"] += 1
        if not (type(a) is type(b) and np.array_equal(a, b)):
            problems.append(f"{where}: numpy values differ")
    else:
        counts["values"] += 1
        if a != b and not (a != a and b != b):  # NaN equals NaN here: the same computation gives the same NaN
            problems.append(f"{where}: {a!r} != {b!r}")


def _read(path: Path):
    import torch

    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    if path.suffix in (".pt", ".bin"):
        return torch.load(path, map_location="cpu", weights_only=False)
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".csv":
        return [dict(row) for row in csv.DictReader(text.splitlines())]
    if path.suffix == ".json":
        return json.loads(text)
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    return text


def compare(a: Path, b: Path) -> int:
    import torch

    torch.set_num_threads(1)
    problems: list[str] = []
    counts = {"files": 0, "tensors": 0, "values": 0}
    files_a = {p.relative_to(a) for p in a.rglob("*") if p.is_file() and p.suffix != ".png"}
    files_b = {p.relative_to(b) for p in b.rglob("*") if p.is_file() and p.suffix != ".png"}
    if files_a != files_b:
        problems.append(f"files differ: {sorted(map(str, files_a ^ files_b))}")
    for rel in sorted(files_a & files_b):
        counts["files"] += 1
        _same(_read(a / rel), _read(b / rel), str(rel), problems, counts, (str(a), str(b)))
    for line in problems:
        print(line)
    print(f"compared {counts['files']} files: {counts['tensors']} tensors, {counts['values']} other values; "
          f"{len(problems)} differences")
    return 1 if problems else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--out", type=Path, help="run the tiny runs into this folder")
    group.add_argument("--compare", nargs=2, type=Path, metavar=("A", "B"), help="compare two such folders")
    args = parser.parse_args(argv)
    if args.out is not None:
        run_all(args.out.resolve())
        return 0
    return compare(*(p.resolve() for p in args.compare))


if __name__ == "__main__":
    sys.exit(main())
