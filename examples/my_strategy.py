"""Your own memory strategy, benchmarked beside the built-in ones without editing memenv (docs/bench.md):

    memenv bench --strategies examples/my_strategy.py:KeepLastSentences relevance --envs MemQA-v0 -n 10
    python examples/my_strategy.py    # the same from Python (agents.scripted.bench.run_bench): ~2 CPU-s
"""

import re


class KeepLastSentences:
    """A first-in-first-out memory: the newest "X is/lies in Y" sentences read, up to a word budget. It searches
    each question's last named entity once, then answers with what a kept sentence says that entity is in."""

    context = "memory"  # the env's context mode it is written for (also: env_kwargs = {...}, name = "...")

    def __init__(self, budget_words: int = 80):
        self.budget = budget_words

    def reset(self, env=None):  # before every episode (env: the unwrapped env)
        self.kept, self.searched = [], 0

    def act(self, observation: str) -> str:  # the whole prompt in, the action text out
        questions = re.findall(r"Question \d+: (.*)", observation)
        self.kept += re.findall(r"[A-Z][^.]* (?:is a \w+ in|lies in|is in) [^.]*\.", observation.rpartition("</memory>")[2])
        while len(" ".join(self.kept).split()) > self.budget:
            self.kept.pop(0)  # first in, first out
        memory = " ".join(self.kept)
        names = [re.findall(r"[A-Z]\w+(?: [A-Z]\w+)*", q)[-1] for q in questions]
        if self.searched < len(names):
            self.searched += 1
            return f"<memory>{memory}</memory><search>{names[self.searched - 1]}</search>"
        answers = [next((s.rstrip(".").split(" in ")[-1] for s in reversed(self.kept) if s.startswith(n)), "")
                   for n in names]
        return f"<memory>{memory}</memory><answer>{'; '.join(answers)}</answer>"


if __name__ == "__main__":  # the bench from Python: this file's strategy beside relevance
    import argparse

    from agents.scripted.bench import run_bench

    parser = argparse.ArgumentParser(description="KeepLastSentences beside relevance on MemQA-v0")
    parser.add_argument("-n", "--episodes", type=int, default=10)
    args = parser.parse_args()
    summary, _ = run_bench(strategies=[f"{__file__}:KeepLastSentences", "relevance"], envs=["MemQA-v0"],
                           episodes=args.episodes)
    print(summary[["env", "strategy", "f1", "peak_context_tokens"]].to_string(index=False))
