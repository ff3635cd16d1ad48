"""benchmarks/update_replay.py (issue 62 item 4): the recorded episodes come back as the same records (a field the
tree lacks is dropped and named), a child imports only its own tree even with the venv's editable install, each
side's overrides, the summary's mean / sd / ratio; and MEASURED["replay"] matches its record (issue 62 item 5).
Nothing is timed."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import update_replay as U  # noqa: E402


def _episodes():
    from agents.llm.records.invocation import InvocationRecord
    from agents.llm.records.rollouts import Episode

    def rec(turn, n):
        return InvocationRecord("e0", turn, [1, 2, 3], list(range(n)), [-0.5] * n, [1] * n, [0] * n, reward=0.25,
                                group=0, rollout_id="r", snapshot={"turn": turn})

    return [Episode("e0", 7, [rec(1, 4), rec(2, 2)], {"f1": 0.25}, 0)]


def test_recorded_episodes_replay_as_the_same_records():
    from agents.llm.records.invocation import InvocationRecord
    from agents.llm.records.rollouts import Episode

    episodes = _episodes()
    data = json.loads(json.dumps(U.episodes_to_json(episodes)))
    again, dropped = U.episodes_from_json(data, Episode, InvocationRecord)
    assert dropped == []
    assert [asdict(r) for r in again[0].records] == [asdict(r) for r in episodes[0].records]
    assert (again[0].seed, again[0].group, again[0].info, again[0].reward) == (7, 0, {"f1": 0.25}, 0.5)
    assert U.action_stats(again) == {"episodes": 1, "records": 2, "tokens_per_action": 3.0, "action_tokens": 6,
                                     "prompt_tokens": 6, "turns": 2.0}

    @dataclass
    class OlderRecord:  # a tree whose record has fewer fields: they are dropped and named
        episode_id: str
        turn: int
        prompt_ids: list
        response_ids: list

    older, dropped = U.episodes_from_json(data, Episode, OlderRecord)
    assert older[0].records[1] == OlderRecord("e0", 2, [1, 2, 3], [0, 1])
    assert set(dropped) == {f.name for f in fields(InvocationRecord)} - {"episode_id", "turn", "prompt_ids",
                                                                          "response_ids"}


def test_a_child_imports_only_its_own_tree(tmp_path):
    tree = tmp_path / "tree"
    for name in ("agents", "distill", "memenv", "tasks"):
        (tree / name).mkdir(parents=True)
        (tree / name / "__init__.py").write_text("")
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(ROOT / 'benchmarks')!r})
        import update_replay
        files = update_replay._isolate(__import__('pathlib').Path({str(tree)!r}))
        print(sorted(files.values()))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(ROOT), check=True)
    assert out.stdout.strip() == str(sorted(str(tree / n / "__init__.py") for n in ("agents", "distill", "memenv",
                                                                                      "tasks")))
    (tree / "tasks" / "__init__.py").unlink()  # a package the tree lacks would come from elsewhere: refused
    (tree / "tasks").rmdir()
    failed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(ROOT))
    assert failed.returncode != 0 and "not from the tree" in failed.stderr + failed.stdout


def test_sides_are_the_arm_config_now_and_the_earlier_teacher_settings():
    spec = U.sides("/base", 6, tasks=1)
    cfg = spec["config"]
    assert (cfg["teacher"], cfg["model"], cfg["episodes_per_update"], cfg["group_size"]) == ("/base", "/base", 4, 4)
    assert spec["sides"] == {"after": {"ref_logprobs_from_actor": False},
                             "before": {"teacher_packing": None, "teacher_dtype": None}}
    assert U.sides("/base", 6)["config"]["episodes_per_update"] == 8  # the preset's 2 tasks


def test_summary_mean_sd_and_ratio():
    def run(side, update, rollout):
        return {"side": side, "phases_cpu_s": {"rollout": rollout, "score": 1.0, "hook": 2.0, "actor_rest": 3.0,
                                               "optimizer": 0.5, "update": update},
                "own_rollout": {"tokens_per_action": 96.0}, "metrics": {"distill_loss": 1.0}}

    runs = [run("before", 10.0, 4.0), run("after", 5.0, 2.0), run("after", 7.0, 2.0), run("before", 14.0, 4.0)]
    table = U.summarise(runs)
    assert table["update"]["before"]["mean"] == 12.0 and table["update"]["after"]["mean"] == 6.0
    assert table["update"]["before"]["sd"] == pytest.approx(2 ** 1.5) and table["update"]["ratio"] == 2.0
    assert table["rollout"]["ratio"] == 2.0 and table["score"]["ratio"] == 1.0
    text = U.format_table(table, runs)
    assert "12.0 ± 2.8" in text and "before: its own rollouts' tokens per action 96.0, 96.0" in text


def test_measured_replay_figures_are_the_records():
    from distill.experiment.estimate import MEASURED

    replay = MEASURED["replay"]
    record = json.loads((ROOT / replay["record"]).read_text())
    summary = record["summary"]
    for side in ("before", "after"):
        assert replay["update_cpu_s"][side] == pytest.approx(summary["update"][side]["mean"], abs=0.05)
        assert replay["rollout_cpu_s"][side] == pytest.approx(summary["rollout"][side]["mean"], abs=0.05)
    assert {r["side"] for r in record["runs"]} == {"before", "after"}
    assert min(sum(r["side"] == s for r in record["runs"]) for s in ("before", "after")) >= 3
    assert all(r["replayed"]["record_fields_dropped"] == [] for r in record["runs"])
