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
"""

from __future__ import annotations

from typing import Any

from distill.experiment.config import SFT_ARMS, ExperimentConfig

#: Measured on the 2-core dev machine (AVX512 with native bf16, 1 torch thread, the other core busy; docs/results.md
#: "MemOPD on a real model" and docs/distill.md "Cost of one arm update"), for SmolLM2-135M-Instruct (30 layers):
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
    # (benchmarks/arm_update_cost.py --baseline precision, docs/distill.md); applied to updates and SFT steps.
    "fp32_factor": 290.6 / 397.8,
    # one SFT step of the fair teacher (both views, two-hop demonstrations, 16 invocations, all 30 layers, fp32):
    # issue 47's run, steps 10-50 (under load: 78-125 CPU-s per step, mean 94; measured, so not scaled)
    "sft_step_cpu_s_two_views": 94.0,
}


def _fixed_share(whole: float, six: float, layers: int = 30) -> float:
    """The depth-independent share ``a / (a + layers * b)`` of a cost ``a + b L`` measured at 6 and ``layers``."""
    per_layer = (whole - six) / (layers - 6)
    return (six - 6 * per_layer) / whole


def depth_scaled(cost: float, layers: int, kind: str, measured: dict[str, Any] = MEASURED) -> float:
    """``cost`` (measured with all of the base's layers) for a model of ``layers`` of them: ``cost x (h + (1 - h)
    L / L_base)``, ``h`` the depth-independent share (embeddings, LM head, environment), from the two measured
    depths of ``kind``: ``"episode"`` (greedy episodes) or ``"actor"`` (forward+backward: SFT steps, updates)."""
    base = measured["base_layers"]
    layers = base if layers in (0, None) or layers >= base else layers
    if kind == "episode":
        h = _fixed_share(measured["episode_cpu_s"], measured["episode_cpu_s_6_layers"], base)
    elif kind == "actor":
        h = _fixed_share(measured["actor_ms_per_token"], measured["actor_ms_per_token_6_layers"], base)
    else:
        raise ValueError(f"kind must be 'episode' or 'actor', got {kind!r}")
    return cost * (h + (1 - h) * layers / base)


def _update(cfg: ExperimentConfig, arm: str, measured: dict[str, Any]) -> float:
    """One GRPO update of ``arm`` at ``cfg``'s student depth and episodes per update."""
    total = measured["update_cpu_s"][arm]
    teacher = measured["teacher_scoring_cpu_s"] if arm != "rl" else 0.0
    per = depth_scaled(total - teacher, cfg.student.layers, "actor", measured) + teacher
    return per * measured.get("fp32_factor", 1.0) * cfg.tasks_per_update * cfg.group_size / measured["update_episodes"]


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


def format_estimate(parts: dict[str, float]) -> str:
    """One line: the total in CPU-hours, then each part in CPU-minutes."""
    detail = ", ".join(f"{name} {seconds / 60:.0f}" for name, seconds in parts.items() if name != "total")
    return (f"expected CPU time: ~{parts['total'] / 3600:.1f} CPU-hours on the 2-core dev machine at 1 thread "
            f"(CPU-min: {detail}; distill.experiment.estimate; the student's SFT priced to its step cap)")


__all__ = ["MEASURED", "depth_scaled", "estimate_cpu", "format_estimate"]
