"""The viewer's memory diff (agents.llm.records.viewer.memory_diff) against the memory's size: seconds per diff of a
memory of 3, 8, 17 and 100 KB (repeated words, as long-dialogue memories hold), edited locally (one line inserted, one
word renamed on every line) and rewritten whole (every word moved), and the matcher's worst case at its cap (2,000
identical lines). Issue 64's bound: a 100 KB memory under a second.

    python benchmarks/viewer_diff.py
"""

from __future__ import annotations

import random
import time

from agents.llm.records.viewer import DIFF_MAX_PAIRS, memory_diff


def memory(kb: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    text, words = [], 0
    while sum(map(len, text)) < kb * 1000:
        text.append(" ".join(f"w{rng.randrange(500)}" for _ in range(12)) + ".")
        words += 12
    return "\n".join(text)


def main() -> int:
    print(f"caps (unit pairs per level: lines, sentences, words): {DIFF_MAX_PAIRS}")
    for kb in (3, 8, 17, 100):
        before = memory(kb)
        lines = before.split("\n")
        edited = "\n".join(lines[:5] + ["a new line here."] + [ln.replace("w1 ", "w1x ") for ln in lines[5:]])
        rewritten = " ".join(reversed(before.split()))
        for name, after in (("local edit", edited), ("whole rewrite", rewritten)):
            t0 = time.process_time()
            memory_diff(before, after)
            print(f"{kb:>4} KB {name:>13}: {time.process_time() - t0:.3f} CPU-s")
    # the matcher's worst case at the line level's cap: 2,000 identical lines, one changed in the middle
    same = "x\n" * 2000
    t0 = time.process_time()
    memory_diff(same, "x\n" * 1000 + "y\n" + "x\n" * 999)
    print(f"2,000 identical lines, one changed: {time.process_time() - t0:.3f} CPU-s (the worst case measured)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
