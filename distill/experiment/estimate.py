"""The expected CPU time of a pretrained-base experiment (``memenv experiment memopd --fair --model ...`` prints it
before it starts): :func:`estimate_cpu` sums the stages' costs from measured per-part figures (:data:`MEASURED`),
:func:`format_estimate` states the sum and its parts. Torch-free.

The formula (CPU seconds; ``ep(L)``, ``step(L)`` and ``upd(arm, L)`` the per-episode, per-SFT-step and per-update
costs of a model with ``L`` of the base's decoder layers, :func:`depth_scaled`):

- teacher = ``teacher.sft_minutes`` x 60 (its SFT budget is CPU time) + its SFT curve (``steps / curve_every``
  points of ``curve_episodes`` episodes) + its evaluations (held-out and seen in each view it is trained on, and
  the training draws of the fresh world) x ``ep(teacher)``;
- student = ``student_max_steps`` x ``step(student)`` (the cap: an upper bound; the window rule usually stops it
  earlier) + one probe of ``probe_episodes`` per probe point + its evaluation, x ``ep(student)``;
- actor timing = ``MEASURED["actor_timing_cpu_s"]`` x the student's depth factor (once);
- lr sweep = values x ``sweep_seeds`` x (``updates`` x ``upd("rl")`` + ``probe_episodes`` x ``ep``);
- GRPO-trained arms = seeds x updates x ``upd(arm)``; SFT arms = seeds x updates x ``upd(equal_cpu_arm)`` (they
  train for that arm's CPU);
- evaluations = per arm run (held-out + seen at the end, + ``curve_episodes`` per intermediate curve point for the
  GRPO-trained arms) x ``ep(student)``.

A per-update figure scales with the episodes per update (``tasks_per_update x group_size`` over the measured 8).

Where :data:`MEASURED` holds a ``"run"`` block (it does: issue 47's own run of the real fair preset), its figures
replace issue 33's: the current code's update per arm, SFT steps and evaluation episodes, measured at that run's
depths (the 30-layer teacher, a 15-layer student) and rescaled from them by the same depth rule (``at``). Issue
33's figures, scaled from the whole model, had priced that preset's updates at less than half of what it measured.

Where :data:`MEASURED` holds ``"item3"`` (it does: issue 62 item 3's arm update and rollout, measured before and
after it, after the figures above), every update is priced by its update ratio and every greedy episode (the
teacher's and the student's evaluations and probes) by its rollout ratio; SFT steps are not (item 3's levers are the
arm update's fused head, the decode's LM head and the PPO optimizer).

What the update's speed work buys (issue 62 item 5): :data:`MEASURED` ``["replay"]`` holds the update before issue
33 against the update now on the same replayed rollouts (``benchmarks/update_replay.py``, its record named
there); :func:`arms_cpu` prices an experiment's arms (their training and their evaluations) at any number of
seeds with the code now and, by those measured ratios, with the code before issue 33.
``python -m distill.experiment.estimate --seeds 16`` prints it for the real fair preset.
"""

from __future__ import annotations

from typing import Any

from distill.experiment.config import SFT_ARMS, ExperimentConfig

#: The replayed update's mean CPU-s, both sides (results/update_before_after/smollm2_6layer.json, "summary")
REPLAY_ROUNDS = 3
REPLAY_UPDATE_BEFORE, REPLAY_UPDATE_AFTER = 152.9, 115.4
REPLAY_ROLLOUT_BEFORE, REPLAY_ROLLOUT_AFTER = 61.6, 54.9

#: Measured on the 2-core dev machine (AVX512 with native bf16, 1 torch thread, the other core busy;
#: docs/results_history.md "MemOPD on a real model" and docs/distill_speed.md "Cost of one arm update"), for
#: SmolLM2-135M-Instruct (30 layers):
MEASURED: dict[str, Any] = {
    "base_layers": 30,
    # an SFT step of 16 invocations, the whole model, the short system prompt, bf16 autocast (issue 33's teacher)
    "sft_step_cpu_s": 39.0,
    # a greedy evaluation episode (96-token cap, the short prompt), the whole model: issue 33's 15 arm runs spent
    # ~1.3 CPU-hours on 990 (50 held-out + 16 seen each; the collapsed control's 6-turn episodes included); its
    # first 6 layers: 3/8 of that, the ratio of the first preset's figures ("~8 s" and "~3 s each at 1 thread",
    # at the 64-token cap and the long prompt)
    "episode_cpu_s": 4.7,
    "episode_cpu_s_6_layers": 4.7 * 3 / 8,
    # one update of 8 episodes (2 tasks x 4), the whole model as the student: each arm's training CPU per run over
    # its 4 updates in issue 33's 5-seed run (GRPO alone 11.0, MemOPD 9.3, teacher-persistent 12.0 CPU-min per run)
    "update_cpu_s": {"rl": 165.0, "memopd": 140.0, "teacher_persistent": 180.0},
    "update_episodes": 8,
    # the 30-layer teacher's scoring in one MemOPD update (arm_update_cost.py --run: 12.0 CPU-s): not the student's
    "teacher_scoring_cpu_s": 12.0,
    # the actor's forward+backward per token, first 6 layers vs all 30 (lora_actor_cost.py full weights: 9.93 CPU-s
    # for 8 x 352 tokens, 7.83 for 2 x 314): what a cut of the base keeps of an update's and an SFT step's cost
    "actor_ms_per_token_6_layers": 9.93 / (8 * 352) * 1000,
    "actor_ms_per_token": 7.83 / (2 * 314) * 1000,
    # the one-off actor timing of the layouts (timing_rounds 1), the whole model as the student
    "actor_timing_cpu_s": 28 * 60.0,
    # The figures above were measured under bf16 autocast (bf16 teacher). "auto"/"native" now pick fp32 on a CPU
    # without AMX, the dev machine's: the 6-layer arm update measured 397.8 -> 290.6 CPU-s side by side
    # (benchmarks/arm_update_cost.py --baseline precision, docs/distill_speed.md); applied to updates and SFT steps.
    "fp32_factor": 290.6 / 397.8,
    # one SFT step of the fair teacher (both views, two-hop demonstrations, 16 invocations, all 30 layers, fp32):
    # issue 47's run, steps 10-50 (under load: 78-125 CPU-s per step, mean 94; measured, so not scaled)
    "sft_step_cpu_s_two_views": 94.0,
    # Issue 47's run of the real fair preset (runs/memopd_real_fair, 2026-12-06; AVX512, no AMX, fp32, 1 torch
    # thread per process, two processes on the 2 cores): the current code at that preset's shapes (the weak
    # 15-layer student writes ~50-60 tokens per action, 3-4 turns per episode)
    "run": {
        "student_layers": 15,
        "update_episodes": 4,  # 1 task x 4
        # training CPU per update (the trainer's clock, lr warm-up included, 12 updates): GRPO alone, the mean of
        # its 5 seeds (839.6-965.8 CPU-s per run); MemOPD and the control, their seed 0 (1,110.4 and 1,115.1)
        "update_cpu_s": {"rl": 75.2, "memopd": 92.5, "teacher_persistent": 92.9},
        # the weak start's SFT: 1,478 CPU-s for 60 steps (16 invocations each)
        "student_sft_step_cpu_s": 24.6,
        # the teacher's SFT on both views: 10,816 CPU-s for 117 steps
        "teacher_sft_step_cpu_s_two_views": 92.4,
        # the teacher's greedy evaluation episodes: 1,306 CPU-s for 148 (both views, held-out, seen, train draws)
        "teacher_episode_cpu_s": 8.8,
        # the student's, after training (an arm's 82: 50 held-out, 16 seen, 16 midway; the process's CPU less its
        # training): 13.4 after GRPO alone's seed 4, ~5.2 after MemOPD's seed 0 and 7.8 after the control's (both
        # collapsed to short episodes); their mean. The weak start writes ~50-60 tokens per action over 3-4 turns.
        "student_episode_cpu_s": 8.8,
    },
    # The update before issue 33 (commit 8b14ace) against the update now, on the same recorded rollout replayed
    # through both codes (benchmarks/update_replay.py; CPU-s of the process, mean of REPLAY_ROUNDS rounds each,
    # sides alternated; AVX2-only host, no native bf16, fp32 on both sides, 1 torch thread, the other core shared):
    # the 6-layer student, the whole SmolLM2 as teacher, 1 task x 4 episodes, every action at the 96-token cap.
    # "update": the replayed update (reference / old log-probs, teacher, actor, optimizer); "rollout": each side
    # sampling its own episodes (greedy evaluation episodes are priced by its ratio too: the same generation code).
    "replay": {
        "record": "results/update_before_after/smollm2_6layer.json",
        "update_cpu_s": {"before": REPLAY_UPDATE_BEFORE, "after": REPLAY_UPDATE_AFTER},
        "rollout_cpu_s": {"before": REPLAY_ROLLOUT_BEFORE, "after": REPLAY_ROLLOUT_AFTER},
    },
    # Issue 62 item 3 (after the code the figures above were measured with): the MemOPD arm update, rollout
    # included, at 976dcf6 against 0e5b887 (benchmarks/arm_update_cost.py in a worktree of each, 3 runs each,
    # means; the 6-layer student, the whole SmolLM2 as teacher; AVX2 host, fp32, 1 thread, load 2-5.5)
    "item3": {
        "record": "results/limits/item3_before_after.json",
        "update_cpu_s": {"before": 274.37, "after": 216.22},
        "rollout_cpu_s": {"before": 58.28, "after": 48.01},
    },
}


def _fixed_share(whole: float, six: float, layers: int = 30) -> float:
    """The depth-independent share ``a / (a + layers * b)`` of a cost ``a + b L`` measured at 6 and ``layers``."""
    per_layer = (whole - six) / (layers - 6)
    return (six - 6 * per_layer) / whole


def depth_scaled(cost: float, layers: int, kind: str, measured: dict[str, Any] = MEASURED,
                 at: int | None = None) -> float:
    """``cost`` (measured with ``at`` of the base's layers, default all) for a model of ``layers`` of them:
    ``cost x g(L) / g(at)`` with ``g(L) = h + (1 - h) L / L_base``, ``h`` the depth-independent share (embeddings,
    LM head, environment), from the two measured depths of ``kind``: ``"episode"`` (greedy episodes) or
    ``"actor"`` (forward+backward: SFT steps, updates)."""
    base = measured["base_layers"]
    depth = lambda n: base if n in (0, None) or n >= base else n  # noqa: E731
    layers, at = depth(layers), depth(at)
    if kind == "episode":
        h = _fixed_share(measured["episode_cpu_s"], measured["episode_cpu_s_6_layers"], base)
    elif kind == "actor":
        h = _fixed_share(measured["actor_ms_per_token"], measured["actor_ms_per_token_6_layers"], base)
    else:
        raise ValueError(f"kind must be 'episode' or 'actor', got {kind!r}")
    return cost * (h + (1 - h) * layers / base) / (h + (1 - h) * at / base)


def _later(measured: dict[str, Any], phase: str) -> float:
    """The factor a speed-up measured after the figures above (``measured["item3"]``) puts on ``phase``
    (``"update_cpu_s"``: an arm update, rollout included; ``"rollout_cpu_s"``: sampling, hence greedy evaluation
    episodes); 1 without one."""
    later = measured.get("item3")
    return 1.0 if later is None else later[phase]["after"] / later[phase]["before"]


def _update(cfg: ExperimentConfig, arm: str, measured: dict[str, Any]) -> float:
    """One GRPO update of ``arm`` at ``cfg``'s student depth and episodes per update."""
    run = measured.get("run")
    if run is not None:  # the current code's own figures, at the run's student depth and episodes per update
        per = depth_scaled(run["update_cpu_s"][arm], cfg.student.layers, "actor", measured, at=run["student_layers"])
        return per * cfg.tasks_per_update * cfg.group_size / run["update_episodes"] * _later(measured, "update_cpu_s")
    total = measured["update_cpu_s"][arm]
    teacher = measured["teacher_scoring_cpu_s"] if arm != "rl" else 0.0
    per = depth_scaled(total - teacher, cfg.student.layers, "actor", measured) + teacher
    return per * measured.get("fp32_factor", 1.0) * cfg.tasks_per_update * cfg.group_size / measured["update_episodes"] \
        * _later(measured, "update_cpu_s")


def estimate_cpu(cfg: ExperimentConfig, measured: dict[str, Any] = MEASURED) -> dict[str, float]:
    """Expected CPU seconds per part of ``cfg``'s run on a pretrained base (module docstring), and ``total``."""
    if cfg.model is None:
        raise ValueError("estimate_cpu prices a pretrained base's run (cfg.model); the tiny models' costs are in "
                         "docs/results.md")
    t, s = cfg.teacher, cfg.student
    ep_t = depth_scaled(measured["episode_cpu_s"], t.layers, "episode", measured)
    ep_s = depth_scaled(measured["episode_cpu_s"], s.layers, "episode", measured)
    fp32 = measured.get("fp32_factor", 1.0)
    if len(t.sft_views) > 1 and "sft_step_cpu_s_two_views" in measured:
        step_t = depth_scaled(measured["sft_step_cpu_s_two_views"], t.layers, "actor", measured)
    else:
        step_t = depth_scaled(measured["sft_step_cpu_s"], t.layers, "actor", measured) * fp32
    step_s = depth_scaled(measured["sft_step_cpu_s"], s.layers, "actor", measured) * fp32
    if (run := measured.get("run")) is not None:  # the current code's own figures, rescaled from their depths
        at_t, at_s = measured["base_layers"], run["student_layers"]
        ep_t = depth_scaled(run["teacher_episode_cpu_s"], t.layers, "episode", measured, at=at_t)
        ep_s = depth_scaled(run["student_episode_cpu_s"], s.layers, "episode", measured, at=at_s)
        step_s = depth_scaled(run["student_sft_step_cpu_s"], s.layers, "actor", measured, at=at_s)
        if len(t.sft_views) > 1:
            step_t = depth_scaled(run["teacher_sft_step_cpu_s_two_views"], t.layers, "actor", measured, at=at_t)
    ep_t, ep_s = ep_t * _later(measured, "rollout_cpu_s"), ep_s * _later(measured, "rollout_cpu_s")
    teacher_sft = t.sft_minutes * 60 if t.sft_minutes else t.sft_steps * step_t
    curve_points = int(teacher_sft / step_t) // t.curve_every if t.curve_every else 0
    views = len(t.sft_views)
    teacher_eps = curve_points * t.curve_episodes + views * (cfg.eval_episodes + cfg.seen_eval_episodes) + \
        (cfg.seen_eval_episodes if cfg.env_kwargs.get("fresh_facts") else 0)
    probes = cfg.student_probes or range(s.sft_steps, cfg.student_max_steps + 1, s.sft_steps)
    probe_points = len({n for n in probes if n < cfg.student_max_steps} | {cfg.student_max_steps})
    parts = {"teacher": teacher_sft + teacher_eps * ep_t,
             "student": cfg.student_max_steps * step_s
             + (probe_points * cfg.probe_episodes + cfg.eval_episodes + cfg.seen_eval_episodes) * ep_s,
             "actor timing": depth_scaled(measured["actor_timing_cpu_s"], s.layers, "actor", measured)
             * cfg.tasks_per_update * cfg.group_size / measured["update_episodes"]}
    sweep = len(cfg.rl_lr_sweep) * cfg.sweep_seeds if "rl" in cfg.arms and cfg.rl_lr is None else 0
    parts["lr sweep"] = sweep * (cfg.updates * _update(cfg, "rl", measured) + cfg.probe_episodes * ep_s)
    grpo = [a for a in cfg.arms if a not in SFT_ARMS]
    parts["GRPO-trained arms"] = cfg.seeds * cfg.updates * sum(_update(cfg, a, measured) for a in grpo)
    sft = [a for a in cfg.arms if a in SFT_ARMS]
    parts["SFT arms (equal CPU)"] = cfg.seeds * cfg.updates * len(sft) * _update(cfg, cfg.equal_cpu_arm, measured)
    curve = len(range(min(cfg.curve_every, cfg.updates), cfg.updates, min(cfg.curve_every, cfg.updates)))
    per_run = cfg.eval_episodes + cfg.seen_eval_episodes
    parts["arm evaluations"] = cfg.seeds * ep_s * (len(grpo) * (per_run + curve * cfg.curve_episodes)
                                                    + len(sft) * per_run)
    parts["total"] = sum(parts.values())
    return parts


def arms_cpu(cfg: ExperimentConfig, seeds: int | None = None, measured: dict[str, Any] = MEASURED
             ) -> dict[str, dict[str, float]]:
    """CPU seconds of ``cfg``'s arms (GRPO-trained, SFT at equal CPU, their evaluations; :func:`estimate_cpu`'s
    parts) at ``seeds`` training seeds (default ``cfg.seeds``): ``"now"`` as :func:`estimate_cpu` prices them,
    ``"before issue 33"`` with each update's rollout and training priced by ``measured["replay"]``'s before / after
    ratios (the evaluations by its rollout's ratio), ``"total"`` in each. Where ``measured`` holds ``"item3"``
    (issue 62 item 3's arm update before and after it), ``"now"`` is priced after item 3, as
    :func:`estimate_cpu` prices it, and the same without it is ``"before issue 62 item 3"``."""
    from dataclasses import replace

    names = ("GRPO-trained arms", "SFT arms (equal CPU)", "arm evaluations")
    cfg = replace(cfg, seeds=cfg.seeds if seeds is None else seeds)
    earlier = {k: v for k, v in measured.items() if k != "item3"}
    parts = estimate_cpu(cfg, earlier)
    now = {n: parts[n] for n in names}
    replay = measured["replay"]
    rollout = replay["rollout_cpu_s"]["after"]
    whole = rollout + replay["update_cpu_s"]["after"]
    train = (replay["rollout_cpu_s"]["before"] + replay["update_cpu_s"]["before"]) / whole  # an update, its rollout in
    sample = replay["rollout_cpu_s"]["before"] / rollout
    before = {"GRPO-trained arms": now["GRPO-trained arms"] * train, "SFT arms (equal CPU)": now["SFT arms (equal CPU)"]
              * train, "arm evaluations": now["arm evaluations"] * sample}
    out = {"now": {**now, "total": sum(now.values())}, "before issue 33": {**before, "total": sum(before.values())}}
    if "item3" in measured:  # the figures above predate issue 62 item 3: "now" is priced after it
        parts = estimate_cpu(cfg, measured)
        after = {n: parts[n] for n in names}
        out = {"now": {**after, "total": sum(after.values())}, "before issue 62 item 3": out["now"],
               "before issue 33": out["before issue 33"]}
    return out


def format_arms(arms: dict[str, dict[str, float]], seeds: int, measured: dict[str, Any] = MEASURED) -> str:
    """One line: the arms' CPU-hours now and with the code before issue 33, and where the ratio comes from."""
    now, old = arms["now"]["total"], arms["before issue 33"]["total"]
    return (f"the arms at {seeds} seeds: ~{now / 3600:.1f} CPU-hours (training "
            f"{(arms['now']['GRPO-trained arms'] + arms['now']['SFT arms (equal CPU)']) / 3600:.1f}, evaluations "
            f"{arms['now']['arm evaluations'] / 3600:.1f}); with the update before issue 33 ~{old / 3600:.1f} "
            f"({old / now:.2f}x; ratios from {measured['replay']['record']}"
            + (f" and {measured['item3']['record']}: {arms['before issue 62 item 3']['total'] / now:.2f}x of it issue "
               "62 item 3's" if "before issue 62 item 3" in arms else "") + ")")


def format_estimate(parts: dict[str, float]) -> str:
    """One line: the total in CPU-hours, then each part in CPU-minutes."""
    detail = ", ".join(f"{name} {seconds / 60:.0f}" for name, seconds in parts.items() if name != "total")
    return (f"expected CPU time: ~{parts['total'] / 3600:.1f} CPU-hours on the 2-core dev machine at 1 thread "
            f"(CPU-min: {detail}; distill.experiment.estimate; the student's SFT priced to its step cap)")


def main(argv=None) -> int:
    """``python -m distill.experiment.estimate [--seeds N]``: the real fair preset's estimate and its arms at N
    seeds (default 16: the power analysis' minimum, docs/results.md), now and before issue 33."""
    import argparse

    from distill.experiment.config import real_fair_config

    parser = argparse.ArgumentParser(description=main.__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=16, help="training seeds of the arms (default 16)")
    args = parser.parse_args(argv)
    if args.seeds < 1:
        parser.error(f"--seeds must be >= 1, got {args.seeds}")
    from dataclasses import replace

    cfg = real_fair_config("unused")
    print(f"the real fair preset ({cfg.seeds} seeds): {format_estimate(estimate_cpu(cfg))}")
    if args.seeds != cfg.seeds:
        print(f"at {args.seeds} seeds: {format_estimate(estimate_cpu(replace(cfg, seeds=args.seeds)))}")
    print(format_arms(arms_cpu(cfg, args.seeds), args.seeds))
    return 0


__all__ = ["MEASURED", "arms_cpu", "depth_scaled", "estimate_cpu", "format_arms", "format_estimate"]

if __name__ == "__main__":
    raise SystemExit(main())
