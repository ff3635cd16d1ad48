"""How often the MemQA oracle finds its evidence on real data, and what honest answering costs in F1.

    python benchmarks/oracle_evidence.py                                  # the HotpotQA dev file, every item
    python benchmarks/oracle_evidence.py --data FILE.json --limit 300     # a HotpotQA file, first 300 items
    python benchmarks/oracle_evidence.py --corpus corpus.jsonl --questions questions.jsonl   # a generic pair

One episode per question (MemQA, one objective, the env's default turns and ``top_k``), questions in file
order. Three oracles side by side:

* ``before``: the oracle as it was before it became honest, replayed: it searched the first unread supporting
  title again and again until found or out of turns, and answered the gold answer whatever it had read (so
  its F1 is 1 by construction);
* ``titles only``: the honest oracle without reformulation (each title searched once);
* ``reformulating``: the honest oracle (:class:`agents.scripted.strategies.qa_strategies.OraclePolicy`, the default).

Printed per oracle: episodes whose evidence was complete (every supporting document retrieved and kept),
episodes whose answer memory supported, F1 and EM, searches per episode, and episodes that repeated a query.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from agents.scripted.strategies.qa_strategies import OraclePolicy
from memenv.envs.memqa import MemQAEnv
from tasks.corpus import load_qa_pair
from tasks.hotpot import load_hotpotqa

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "hotpotqa" / "hotpot_dev_distractor_1100.json"


class InOrder:
    """A task source serving a dataset's questions in file order, one per episode (one search index for all)."""

    def __init__(self, dataset) -> None:
        self.documents = dataset.documents
        self.questions = dataset.questions
        self.position = 0

    def sample_questions(self, rng, n: int) -> list:
        picked = [self.questions[(self.position + i) % len(self.questions)] for i in range(n)]
        self.position += n
        return picked


def replay_before(env: MemQAEnv) -> tuple[bool, int, int]:
    """The pre-honesty oracle on the env's current question: ``(evidence complete, searches, repeated)``."""
    question = env.questions[0]
    titles = [env.document(d).title for d in question.supporting_ids]
    read: set[str] = set()
    queries: list[str] = []
    for _ in range(env.max_turns - 1):
        pending = [t for t in titles if t not in read]
        if not pending:
            break
        queries.append(pending[0])
        read |= {env.documents[i].title for i in env.index.search(pending[0], env.top_k)} & set(titles)
    return read >= set(titles), len(queries), int(len(set(queries)) < len(queries))


def run_honest(env: MemQAEnv, policy: OraclePolicy, seed: int) -> dict:
    obs, _ = env.reset(seed=seed)
    policy.reset(env)
    while True:
        obs, _, terminated, truncated, info = env.step(policy.act(obs))
        if terminated or truncated:
            break
    summary = info["summary"]
    return {"complete": policy.evidence_complete, "supported": all(policy.supported), "f1": summary["f1"],
            "em": summary["em"], "searches": len(policy.queries),
            "repeated": int(len(set(policy.queries)) < len(policy.queries))}


def main(argv: list[str] | None = None) -> pd.DataFrame:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, default=DEFAULT_DATA, help="a HotpotQA file (default: %(default)s)")
    p.add_argument("--corpus", type=Path, help="a generic corpus JSONL (with --questions) instead of --data")
    p.add_argument("--questions", type=Path, help="a generic questions JSONL (with --corpus)")
    p.add_argument("--limit", type=int, default=None, help="first N questions only (default: all)")
    args = p.parse_args(argv)
    if (args.corpus is None) != (args.questions is None):
        p.error("--corpus and --questions go together")
    dataset = load_qa_pair(args.corpus, args.questions) if args.corpus else load_hotpotqa(args.data)
    n = len(dataset.questions) if args.limit is None else min(args.limit, len(dataset.questions))
    source = InOrder(dataset)
    env = MemQAEnv(objectives=1, source=source)
    print(f"{dataset.name}: {n} questions, {len(dataset.documents):,} documents, top_k={env.top_k}, "
          f"max_turns={env.max_turns}")

    rows: dict[str, list[dict]] = {"before": [], "titles only": [], "reformulating": []}
    for name, policy in (("titles only", OraclePolicy(reformulate=False)), ("reformulating", OraclePolicy())):
        source.position = 0
        for seed in tqdm(range(n), desc=name, unit="ep"):
            rows[name].append(run_honest(env, policy, seed))
            if name == "titles only":
                complete, searches, repeated = replay_before(env)
                rows["before"].append({"complete": complete, "supported": complete, "f1": 1.0, "em": 1.0,
                                       "searches": searches, "repeated": repeated})
    table = pd.DataFrame([
        {"oracle": name, "evidence complete": np.mean([r["complete"] for r in cell]),
         "answers supported": np.mean([r["supported"] for r in cell]), "F1": np.mean([r["f1"] for r in cell]),
         "EM": np.mean([r["em"] for r in cell]), "searches/episode": np.mean([r["searches"] for r in cell]),
         "episodes repeating a query": int(sum(r["repeated"] for r in cell))}
        for name, cell in (("before", rows["before"]), ("titles only", rows["titles only"]),
                           ("reformulating", rows["reformulating"]))
    ])
    with pd.option_context("display.float_format", "{:.3f}".format, "display.width", 160):
        print(table.to_string(index=False))
    print("before: answered the gold answer in every episode, with or without evidence "
          "(its 'answers supported' is its evidence rate).")
    return table


if __name__ == "__main__":
    main()
