"""One MemOPD arm update, the code before issue 33 against the code now, on the **same** rollouts (issue 62 item 4).

``benchmarks/arm_update_cost.py`` compares today's code with its speed flags off, each side sampling its own
episodes. This benchmark runs the earlier code itself (a git worktree of the commit before issue 33's work,
:data:`BEFORE_ISSUE_33`) and replays one recorded rollout through both:

1. **record** (a child process on the tree now): the arm's first rollout (the real-model preset's MemOPD arm,
   the ``--base`` model as teacher, its first ``--student-layers`` layers as the student, no SFT), written to
   ``rollouts.json`` (every episode and its invocation records: prompt ids, sampled ids, their log-probs, masks,
   rewards, groups);
2. **rounds**: per round one child process per side, in an order that alternates (round 1 before then after,
   round 2 after then before, ...). Each child imports only its own tree (``sys.path[0]`` = the tree, the
   venv's editable finder removed; the module files are printed and checked), builds the same models from the
   same folder, and runs its own ``train_memopd`` for one update, 1 torch thread. Its rollout function is
   wrapped: the child's **own** rollout runs and is timed (each side samples its own episodes with its own
   generation code: the rollout phase is compared separately, with the tokens per action of each side), and then
   the **recorded** episodes are returned in its place, rebuilt as that tree's ``Episode`` / ``InvocationRecord``
   (the two trees' dataclasses have the same fields; any field a tree lacks would be dropped and named). The
   update that follows therefore trains both sides on the same prompts and sampled tokens.

The update's phases are timed the same way on both sides (CPU seconds of the process, ``time.process_time``),
by wrappers around the tree's own functions: the scoring passes (reference and recomputed old log-probs: the old
tree's ``agents.llm.ppo._score``, the new ``score_records``), the loss hook's ``on_update`` (the teacher's
pass), ``torch.optim.AdamW.step``; the update is the span from the rollout's return to the metrics row's
append, and "actor and the rest" is the update less those three. The new side's own part clock
(``*_cpu_s`` columns) is kept in the record beside them.

The sides' settings: **after** is :func:`distill.experiment.stages.arm_config` of the real-model preset now
(``pretrained_config``), with ``ref_logprobs_from_actor=False``: the reference pass that a fresh run's *first*
update skips is paid, as on every later update (one update replayed stands for the steady state). **before** is
the same config's fields that the old tree knows (the unknown ones are listed: the levers added since), with
the teacher on the actor's packing in the model's dtype (``teacher_packing=None``, ``teacher_dtype=None``), as
the arms scored then. Both train in fp32 on a CPU without AMX (``train_autocast="auto"`` picks fp32 there).

    git worktree add /tmp/wt_before 8b14ace && git worktree add --detach /tmp/wt_after HEAD
    python benchmarks/update_replay.py --base ~/.cache/memenv/models/smollm2-135m-instruct --student-layers 6 \
        --tasks-per-update 1 --before-tree /tmp/wt_before --after-tree /tmp/wt_after --rounds 3 \
        --out results/update_before_after/smollm2_6layer.json

The recorded rollout is kept beside the record (``<out stem>_rollouts.json``; ``--rollouts`` replays it again).

The record (written atomically): the command, the host line before and after each child, every child's
figures, the per-phase mean ± sd and ratio, the rollout's tokens per action per side.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BEFORE_ISSUE_33 = "8b14ace"  # the parent of 9686a83, issue 33's first commit (tree prefill), on both its branches
PHASES = ("rollout", "score", "hook", "actor_rest", "optimizer", "update")
LABELS = {"rollout": "rollout (each side its own)", "score": "reference / old log-probs", "hook": "teacher scoring",
          "actor_rest": "actor fwd/bwd and the rest", "optimizer": "optimizer (AdamW.step)",
          "update": "update (replayed, the sum)"}


# ------------------------------------------------------------------------------------------ the child process
def _isolate(tree: Path) -> dict:
    """Import memenv's packages from ``tree`` only: it goes first on sys.path, the editable install's finder
    is removed. Returns the module files (checked to lie in ``tree``)."""
    sys.path[:] = [str(tree)] + [p for p in sys.path if Path(p or ".").resolve() != tree
                                 and Path(p or ".").resolve() != Path(__file__).resolve().parent]
    sys.meta_path[:] = [f for f in sys.meta_path if "__editable__" not in type(f).__module__
                        and "__editable__" not in getattr(f, "__module__", "") and "__editable__" not in repr(f)]
    import importlib

    files = {}
    for name in ("agents", "distill", "memenv", "tasks"):
        mod = importlib.import_module(name)
        path = Path(mod.__file__).resolve()
        if tree not in path.parents:
            raise SystemExit(f"{name} imported from {path}, not from the tree {tree}")
        files[name] = str(path)
    return files


def episodes_to_json(episodes) -> list[dict]:
    from dataclasses import asdict

    return [{"episode_id": e.episode_id, "seed": e.seed, "group": e.group, "info": e.info,
             "records": [asdict(r) for r in e.records]} for e in episodes]


def episodes_from_json(data: list[dict], episode_cls, record_cls) -> tuple[list, list[str]]:
    """The recorded episodes as this tree's classes; the record fields this tree lacks (dropped) are returned."""
    from dataclasses import fields

    known = {f.name for f in fields(record_cls)}
    dropped = sorted({k for e in data for r in e["records"] for k in r if k not in known})
    episodes = [episode_cls(e["episode_id"], e["seed"], [record_cls(**{k: v for k, v in r.items() if k in known})
                                                          for r in e["records"]], e["info"], e["group"])
                for e in data]
    return episodes, dropped


def action_stats(episodes) -> dict:
    records = [r for e in episodes for r in e.records]
    return {"episodes": len(episodes), "records": len(records),
            "tokens_per_action": sum(len(r.response_ids) for r in records) / max(1, len(records)),
            "action_tokens": sum(sum(r.action_mask) for r in records),
            "prompt_tokens": sum(len(r.prompt_ids) for r in records),
            "turns": len(records) / max(1, len(episodes))}


def child(args) -> int:
    tree = Path(args.tree).resolve()
    files = _isolate(tree)
    import dataclasses
    import resource

    import torch

    torch.set_num_threads(1)
    import distill.trainer as trainer

    # The tree's own module paths: agents/llm by concern (issue 60) or the flat folder before it.
    by_concern = (tree / "agents" / "llm" / "training" / "ppo.py").is_file()
    ppo = importlib.import_module("agents.llm.training.ppo" if by_concern else "agents.llm.ppo")
    training = importlib.import_module("agents.llm.training.common" if by_concern else "agents.llm.training")
    load_pretrained = importlib.import_module("agents.llm.models.local" if by_concern
                                              else "agents.llm.models").load_pretrained
    shrink = importlib.import_module("agents.llm.models.pretrained" if by_concern else "agents.llm.pretrained").shrink
    InvocationRecord = importlib.import_module("agents.llm.records.invocation" if by_concern
                                               else "agents.llm.records").InvocationRecord
    Episode = importlib.import_module("agents.llm.records.rollouts" if by_concern else "agents.llm.rollouts").Episode
    write_text_atomic = importlib.import_module("memenv.files" if by_concern else "agents.files").write_text_atomic

    spec = json.loads(Path(args.config).read_text())
    fields = {f.name for f in dataclasses.fields(trainer.MemOPDConfig)}
    wanted = {**spec["config"], **spec["sides"][args.side]}
    unknown = sorted(k for k in wanted if k not in fields)
    scratch = tempfile.mkdtemp(prefix=f"replay_{args.side}_")
    cfg = trainer.MemOPDConfig(**{**{k: v for k, v in wanted.items() if k in fields},
                                  "out_dir": scratch, "progress": False, "updates": 1, "eval_every": 0,
                                  "threads": 1})
    out = {"side": args.side, "tree": str(tree), "modules": files, "config_fields_unknown": unknown,
           "config": {k: getattr(cfg, k) for k in sorted(fields) if k not in ("tiny_tokenizer_episodes",)}}
    clock = {p: 0.0 for p in ("rollout", "score", "hook", "optimizer")}
    marks: dict[str, float] = {}

    def timed(fn, part):
        def wrapper(*a, **k):
            start = time.process_time()
            try:
                return fn(*a, **k)
            finally:
                clock[part] += time.process_time() - start
        return wrapper

    real_rollout = ppo.rollout

    def replay_rollout(*a, **k):
        start, wall = time.process_time(), time.perf_counter()
        own = real_rollout(*a, **k)
        clock["rollout"] += time.process_time() - start
        out["rollout_wall_s"] = time.perf_counter() - wall
        out["own_rollout"] = action_stats(own)
        if args.save_rollouts:
            write_text_atomic(args.save_rollouts, json.dumps(episodes_to_json(own), default=str))
            raise _Recorded
        episodes, dropped = episodes_from_json(json.loads(Path(args.rollouts).read_text()), Episode,
                                               InvocationRecord)
        out["replayed"] = {**action_stats(episodes), "record_fields_dropped": dropped}
        marks["update_start"] = time.process_time()
        return episodes

    append = training.MetricsLog.append

    def append_marked(self, row):
        if "update_start" in marks and "update_end" not in marks:
            marks["update_end"] = time.process_time()
        return append(self, row)

    ppo.rollout = replay_rollout
    training.MetricsLog.append = append_marked
    scorer = "score_records" if hasattr(ppo, "score_records") else "_score"  # the new tree's name, the old's
    setattr(ppo, scorer, timed(getattr(ppo, scorer), "score"))
    out["score_function"] = f"{ppo.__name__}.{scorer}"
    trainer.MemOPDHook.on_update = timed(trainer.MemOPDHook.on_update, "hook")
    torch.optim.AdamW.step = timed(torch.optim.AdamW.step, "optimizer")

    cpu0 = time.process_time()
    lm, tok = load_pretrained(spec["base"])
    if spec["student_layers"]:
        small = shrink(lm, spec["student_layers"])
        del lm
        lm = small
    out["load_student_cpu_s"] = time.process_time() - cpu0
    try:
        trainer.train_memopd(cfg, model=lm, tokenizer=tok)
    except _Recorded:
        out["recorded"] = args.save_rollouts
    else:
        import pandas as pd

        row = pd.read_csv(Path(scratch) / "metrics.csv").iloc[-1].to_dict()
        out["metrics"] = {k: (float(v) if isinstance(v, (int, float)) else v) for k, v in row.items()}
        update = marks["update_end"] - marks["update_start"]
        out["phases_cpu_s"] = {
            "rollout": clock["rollout"], "score": clock["score"], "hook": clock["hook"],
            "optimizer": clock["optimizer"], "update": update,
            "actor_rest": update - clock["score"] - clock["hook"] - clock["optimizer"]}
    out["process_cpu_s"] = time.process_time()
    out["peak_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
    Path(args.json_out).write_text(json.dumps(out, indent=1, default=str))
    return 0


class _Recorded(Exception):
    """Raised by the recording child after it wrote the rollout (nothing else is trained)."""


# ----------------------------------------------------------------------------------------------- the parent
def sides(base: str, layers: int, tasks: int | None = None) -> dict:
    """The arm's config now (every field, JSON) and each side's overrides (see the module doc); ``tasks``: the
    GRPO groups per update (default the preset's)."""
    from dataclasses import asdict, replace

    from distill.experiment.config import pretrained_config
    from distill.experiment.stages import arm_config

    cfg = replace(pretrained_config("unused"), updates=1, curve_every=1)
    if tasks:
        cfg = replace(cfg, tasks_per_update=tasks)
    cfg = replace(cfg, student=replace(cfg.student, layers=layers))
    run_cfg = arm_config(cfg, "memopd", 0, {"path": base}, {"path": base})
    return {"base": base, "student_layers": layers, "config": json.loads(json.dumps(asdict(run_cfg), default=str)),
            "sides": {"after": {"ref_logprobs_from_actor": False},
                      "before": {"teacher_packing": None, "teacher_dtype": None}}}


def run_child(tree: Path, side: str, config: Path, scratch: Path, name: str, extra: list[str]) -> dict:
    from benchmarks.limits import host_info

    json_out = scratch / f"{name}.json"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(tree)
    host_start = host_info()
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--tree", str(tree), "--side", side,
           "--config", str(config), "--json-out", str(json_out), *extra]
    wall = time.perf_counter()
    proc = subprocess.run(cmd, cwd=str(tree), env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{name} ({side}, {tree}) failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    result = json.loads(json_out.read_text())
    result.update(host_start=host_start, host_end=host_info(), child_wall_s=time.perf_counter() - wall)
    return result


def summarise(runs: list[dict]) -> dict:
    """Per side and phase: values, mean, sd; the ratio of the means before / after."""
    table: dict = {}
    for phase in PHASES:
        row = {}
        for side in ("before", "after"):
            values = [r["phases_cpu_s"][phase] for r in runs if r["side"] == side]
            row[side] = {"values": values, "mean": statistics.fmean(values),
                         "sd": statistics.stdev(values) if len(values) > 1 else 0.0}
        row["ratio"] = row["before"]["mean"] / row["after"]["mean"] if row["after"]["mean"] else float("nan")
        table[phase] = row
    return table


def format_table(table: dict, runs: list[dict]) -> str:
    lines = [f"{'CPU-s per update (mean ± sd)':<30}{'before':>16}{'after':>16}{'ratio':>8}"]
    for phase in PHASES:
        row = table[phase]
        cell = {s: f"{row[s]['mean']:.1f} ± {row[s]['sd']:.1f}" for s in ("before", "after")}
        lines.append(f"{LABELS[phase]:<30}{cell['before']:>16}{cell['after']:>16}{row['ratio']:>8.2f}")
    for side in ("before", "after"):
        own = [r["own_rollout"]["tokens_per_action"] for r in runs if r["side"] == side]
        loss = [r["metrics"].get("distill_loss", float("nan")) for r in runs if r["side"] == side]
        lines.append(f"{side}: its own rollouts' tokens per action {', '.join(f'{t:.1f}' for t in own)}; "
                     f"distill_loss {', '.join(f'{v:.6f}' for v in loss)}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--tree", help=argparse.SUPPRESS)
    parser.add_argument("--side", choices=["before", "after"], help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    parser.add_argument("--json-out", help=argparse.SUPPRESS)
    parser.add_argument("--save-rollouts", help=argparse.SUPPRESS)
    parser.add_argument("--rollouts", help="replay this rollouts.json instead of recording one")
    parser.add_argument("--base", help="a prepared base model folder (teacher = it, student = its first layers)")
    parser.add_argument("--student-layers", type=int, default=6, metavar="N",
                        help="the student keeps the base's first N layers (0: the whole model; default 6)")
    parser.add_argument("--tasks-per-update", type=int, default=None, metavar="N",
                        help="GRPO groups (of the preset's group size) per update (default: the preset's)")
    parser.add_argument("--before-tree", help=f"a checkout of the code before issue 33 (git worktree add PATH "
                                              f"{BEFORE_ISSUE_33})")
    parser.add_argument("--after-tree", help="the code now (default: this checkout; a worktree of a commit keeps "
                                             "it fixed while others edit this one)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of both sides, order alternating (default 3)")
    parser.add_argument("--out", help="the record (JSON, written atomically)")
    args = parser.parse_args(argv)
    if args.child:
        return child(args)
    if not (args.base and args.before_tree and args.out):
        parser.error("--base, --before-tree and --out are needed")
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    now_tree = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(now_tree))
    from memenv.files import write_text_atomic
    from benchmarks.limits import host_info, host_text

    trees = {"after": Path(args.after_tree).resolve() if args.after_tree else now_tree,
             "before": Path(args.before_tree).resolve()}
    base = str(Path(args.base).expanduser().resolve())
    record = {"command": " ".join(["python", "benchmarks/update_replay.py", *(argv or sys.argv[1:])]),
              "before_commit": subprocess.run(["git", "-C", str(trees["before"]), "rev-parse", "HEAD"],
                                              capture_output=True, text=True).stdout.strip(),
              "after_commit": subprocess.run(["git", "-C", str(trees["after"]), "rev-parse", "HEAD"],
                                             capture_output=True, text=True).stdout.strip(),
              "host": host_info(), "runs": []}
    print(host_text(record["host"]), flush=True)
    print(f"before: {trees['before']} at {record['before_commit'][:10]}; after: {trees['after']} at "
          f"{record['after_commit'][:10]}", flush=True)
    with tempfile.TemporaryDirectory(prefix="update_replay_") as tmp:
        scratch = Path(tmp)
        config = scratch / "sides.json"
        config.write_text(json.dumps(sides(base, args.student_layers, args.tasks_per_update)))
        rollouts = Path(args.rollouts).resolve() if args.rollouts else \
            Path(args.out).resolve().with_name(Path(args.out).stem + "_rollouts.json")
        rollouts.parent.mkdir(parents=True, exist_ok=True)
        if not args.rollouts:
            rec = run_child(trees["after"], "after", config, scratch, "record", ["--save-rollouts", str(rollouts)])
            record["recording"] = rec
            print(f"recorded {rollouts}: {rec['own_rollout']}", flush=True)
        record["rollouts"] = str(rollouts.relative_to(now_tree) if rollouts.is_relative_to(now_tree) else rollouts)
        for r in range(args.rounds):
            for side in (("before", "after") if r % 2 == 0 else ("after", "before")):
                result = run_child(trees[side], side, config, scratch, f"round{r + 1}_{side}",
                                   ["--rollouts", str(rollouts)])
                result["round"] = r + 1
                record["runs"].append(result)
                p = result["phases_cpu_s"]
                print(f"round {r + 1} {side}: " + ", ".join(f"{k} {v:.1f}" for k, v in p.items())
                      + f"; own rollout {result['own_rollout']['tokens_per_action']:.1f} tokens/action; "
                      f"{host_text(result['host_end'])}", flush=True)
        record["summary"] = summarise(record["runs"])
        record["host_end"] = host_info()
    text = format_table(record["summary"], record["runs"])
    print("\n" + text + "\n" + host_text(record["host_end"]), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(args.out, json.dumps(record, indent=1, default=str))
    print(f"wrote {args.out}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
