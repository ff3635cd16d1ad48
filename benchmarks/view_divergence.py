"""Do the teacher's two views differ in a regime? Before any arm runs: for a run's teacher and start student, on
each MemQA setting asked for, two (``--batches``) independent GRPO-shaped batches of the student's own rollouts (the
arms' temperature and token cap), scored by the teacher in the aligned view (the memory state) and in the persistent
view (the flattened transcript): the cosine between the two distillation gradients on one batch beside the
same-view noise cosine, the cosine of the views' expected gradients (from products across batches, so the noise
both views share on a batch cancels; a jackknife SE from 3 batches on),
the per-token KL and argmax disagreement (overall and per turn), the share of invocations where the transcript
holds a gold answer the memory lost, and the teacher's greedy held-out F1 acting in each view (``distill.views``).

    python benchmarks/view_divergence.py --run results/memopd_fair --json views.json --plot views.png \\
        --setting base: --setting top3:top_k=3 --setting obj3:objectives=3,top_k=3

``--setting NAME:KEY=VALUE,...`` overrides the run's env settings (``NAME:`` alone: the run's own); repeat it for a
table. ``--run`` is a ``memenv experiment memopd`` folder with its teacher and start student built (``--until
student``; ``results/memopd_fair`` holds the fair run's). 1 torch thread; the figures depend only on the models, the
settings and the seeds. Prints a host line, one row per setting and, with ``--per-turn``, each setting's turns.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # teacher_views.py beside this file: the run's checks
from teacher_views import check_inputs  # noqa: E402


def _refuse(message: str) -> SystemExit:
    """One line on stderr, exit status 2 (as ``memenv`` commands refuse a user's input)."""
    print(f"view_divergence.py: error: {message}", file=sys.stderr)
    return SystemExit(2)

#: The columns of a setting's row (the table the regime is chosen from).
COLUMNS = ["setting", "env", "between_view_cosine", "same_view_cosine", "between_view_cosine_gap", "between_view_cosine_tool", "grad_norm_ratio",
           "expected_between_view_cosine", "expected_between_view_cosine_se", "view_difference_cosine", "difference_to_noise", "kl_mean", "kl_median",
           "argmax_differs", "memory_token_share", "kl_memory_tokens", "kl_tool_tokens", "info_gap_share", "kl_info_gap", "kl_no_gap", "argmax_info_gap", "argmax_no_gap",
           "turns_per_episode", "invocations", "action_tokens", "teacher_f1_memory", "teacher_f1_persistent",
           "teacher_f1_gap"]


def parse_setting(text: str) -> tuple[str, dict]:
    """``"obj3:objectives=3,top_k=3"`` -> ``("obj3", {"objectives": 3, "top_k": 3})``; ``"base:"`` -> no override.
    A :class:`SystemExit` (status 2) naming the setting where it is malformed."""
    name, sep, body = text.partition(":")
    if not sep or not name.strip():
        raise _refuse(f"--setting {text!r}: expected NAME:KEY=VALUE,... (NAME: alone for the run's own settings)")
    kwargs = {}
    for item in filter(None, (p.strip() for p in body.split(","))):
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise _refuse(f"--setting {text!r}: {item!r} is not KEY=VALUE")
        try:
            kwargs[key.strip()] = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            kwargs[key.strip()] = value.strip()
    return name.strip(), kwargs


def measure(cfg, teacher_lm, student_lm, tok, episodes: int, teacher_episodes: int,
            batches: int = 2) -> tuple[dict, object]:
    """One setting's row (:data:`COLUMNS` but ``setting``) and its per-turn table."""
    from distill.experiment.evaluation import evaluate_per_seed
    from distill.experiment.stages import _sample_records
    from distill.teacher import Teacher
    from distill.views import view_divergence

    batch_a = _sample_records(student_lm, tok, cfg, episodes, seed=123)
    batch_b = _sample_records(student_lm, tok, cfg, episodes, seed=456, first_task=9 * 10**6 + 10**5)
    more = [_sample_records(student_lm, tok, cfg, episodes, seed=1000 + k, first_task=9 * 10**6 + k * 10**5)
            for k in range(2, batches)]
    teacher = Teacher(teacher_lm, tok, student_tokenizer=tok, student_model=student_lm)
    result = view_divergence(teacher, student_lm, tok, batch_a, batch_b, backend=cfg.attention_backend, more=more)
    row = {"env": dict(cfg.env_kwargs), **{k: result.summary[k] for k in COLUMNS if k in result.summary}}
    if teacher_episodes:
        quiet = replace(cfg, progress=False)
        f1 = {view: float(evaluate_per_seed(teacher_lm, tok, quiet, pool="heldout", episodes=teacher_episodes,
                                            view=view).f1.mean()) for view in ("memory", "persistent")}
        row.update(teacher_f1_memory=f1["memory"], teacher_f1_persistent=f1["persistent"],
                   teacher_f1_gap=f1["memory"] - f1["persistent"])
    return row, result.per_turn


def plot(rows: list[dict], path: Path) -> None:
    """Between-view against same-view gradient cosine per setting (bars), the 0.9 line the regime must reach."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from memenv.files import write_atomic

    x = np.arange(len(rows))
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(rows) + 2), 4.2), constrained_layout=True)
    ax.bar(x - 0.27, [r["between_view_cosine"] for r in rows], 0.27, label="between views (same batch)")
    expected = [r.get("expected_between_view_cosine", float("nan")) for r in rows]
    errors = [r.get("expected_between_view_cosine_se", float("nan")) for r in rows]
    ax.bar(x, expected, 0.27, yerr=[0 if e != e else e for e in errors], capsize=3,
           label="between views, expected gradients (across batches)")
    ax.bar(x + 0.27, [r["same_view_cosine"] for r in rows], 0.27, label="same view, two batches (noise)")
    ax.axhline(0.9, color="k", linestyle=":", label="0.9: the views must differ at least this much")
    ax.set_xticks(x, [r["setting"] for r in rows], rotation=30, ha="right")
    ax.set(ylabel="cosine of the distillation gradients", ylim=(min(0.0, *(r["same_view_cosine"] for r in rows)), 1.02),
           title="Do the teacher's two views give different training signals?")
    ax.legend(fontsize=8, loc="lower left")
    ax.grid(alpha=0.3, axis="y")
    write_atomic(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110))
    plt.close(fig)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", required=True, help="the experiment's --out folder (teacher and student built)")
    parser.add_argument("--setting", action="append", default=None,
                        help="NAME:KEY=VALUE,... env settings over the run's (repeat; default: the run's own)")
    parser.add_argument("--episodes", type=int, default=32, help="episodes per batch (--batches batches per setting)")
    parser.add_argument("--batches", type=int, default=2,
                        help="independent batches (>= 2; from 3 on the expected-gradient cosine has a jackknife SE)")
    parser.add_argument("--teacher-episodes", type=int, default=32,
                        help="held-out episodes of the teacher's greedy F1 per view (0: not measured)")
    parser.add_argument("--json", default=None, help="write the rows, the per-turn tables and the host here")
    parser.add_argument("--plot", default=None, help="write the cosines per setting as a PNG here")
    parser.add_argument("--per-turn", action="store_true", help="print each setting's per-turn table")
    args = parser.parse_args(argv)
    if args.episodes < 1 or args.teacher_episodes < 0 or args.batches < 2:
        raise _refuse(f"--episodes must be >= 1, --teacher-episodes >= 0 and --batches >= 2, got {args.episodes}, "
                      f"{args.teacher_episodes} and {args.batches}")
    settings = [parse_setting(s) for s in (args.setting or ["run:"])]
    if len({name for name, _ in settings}) != len(settings):
        raise _refuse("--setting: two settings share a name")
    run = Path(args.run)
    paths, saved = check_inputs(run, args.json)
    if args.plot is not None:
        check_inputs(run, args.plot)

    import time

    import pandas as pd
    import torch
    from tqdm.auto import tqdm

    from memenv.files import write_text_atomic
    from agents.llm.models.local import load_pretrained
    from agents.llm.models.precision import host_line
    from distill.experiment.config import ExperimentConfig, ModelSpec
    from distill.teacher import VocabularyMismatchError, check_vocabulary

    torch.set_num_threads(1)
    try:
        specs = {k: ModelSpec(**saved.pop(k)) for k in ("teacher", "student")}
        base = replace(ExperimentConfig(**{**saved, **specs}), out=str(run), progress=False)
        configs = [(name, replace(base, env_kwargs={**base.env_kwargs, **kw})) for name, kw in settings]
    except (TypeError, ValueError) as err:  # a setting this version does not know, or out of its range
        raise _refuse(f"{run / 'experiment.json'} with --setting: {err}") from None
    host = host_line()
    print(host, f"| {args.episodes} x {args.batches} episodes of the start student per setting at temperature "
          f"{base.temperature}, {base.max_new_tokens}-token cap", flush=True)
    student, tok = load_pretrained(paths["student"])
    teacher, teacher_tok = load_pretrained(paths["teacher"])
    try:  # the views are the student's ids: the teacher must read them as the same tokens
        check_vocabulary(teacher_tok, tok, teacher)
    except VocabularyMismatchError as err:
        raise _refuse(str(err)) from None
    rows, turns, skipped = [], {}, {}
    cpu0 = time.process_time()
    for name, cfg in tqdm(configs, desc="settings"):
        try:
            row, per_turn = measure(cfg, teacher, student, tok, args.episodes, args.teacher_episodes, args.batches)
        except (TypeError, ValueError) as err:  # an env setting MemQA refuses, a prompt beyond the context window
            print(f"--setting {name}: skipped: {err}", file=sys.stderr, flush=True)
            skipped[name] = str(err)
            continue
        rows.append({"setting": name, **row})
        turns[name] = per_turn
    if not rows:
        raise _refuse("no setting could be measured (each one's reason is above)")
    table = pd.DataFrame(rows).reindex(columns=COLUMNS)
    with pd.option_context("display.width", 200, "display.max_columns", 30):
        print(table.drop(columns=["env"]).to_string(index=False, float_format=lambda v: f"{v:.3f}"))
        if args.per_turn:
            for name, per_turn in turns.items():
                print(f"\n{name}:\n{per_turn.to_string(index=False, float_format=lambda v: f'{v:.3f}')}")
    cpu = time.process_time() - cpu0
    print(f"{len(rows)} settings ({len(skipped)} skipped), {cpu:.0f} CPU-s")
    if args.json:
        record = {"host": host, "run": str(run), "episodes_per_batch": args.episodes, "batches": args.batches,
                  "teacher_episodes": args.teacher_episodes, "cpu_seconds": cpu, "skipped": skipped,
                  "rows": json.loads(table.to_json(orient="records")),
                  "per_turn": {k: json.loads(v.to_json(orient="records")) for k, v in turns.items()}}
        write_text_atomic(Path(args.json), json.dumps(record, indent=1))
    if args.plot:
        plot(rows, Path(args.plot))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
