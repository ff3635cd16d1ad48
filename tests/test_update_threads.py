"""benchmarks/update_threads.py (issue 46's lever c: one arm process at 2 threads against two at 1) and the
``--side after --json`` mode of benchmarks/arm_update_cost.py its children run."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _row(updates: int, wall: float, cpu_per_update: float) -> dict:
    return {"updates": updates, "wall": wall, "whole_wall": wall + 10, "updates_per_hour": updates / wall * 3600,
            "cpu_per_update": cpu_per_update, "tokens_per_action": 50.0, "peak_rss_gb": 1.0, "load": (0.1, 0.2)}


def test_summary_ratios_are_the_settings_means():
    bench = _load("update_threads")
    rows = {"1x1": [_row(2, 400, 150.0), _row(2, 400, 150.0)], "1x2": [_row(2, 300, 170.0), _row(2, 300, 170.0)],
            "2x1": [_row(4, 450, 160.0), _row(4, 450, 160.0)]}
    text = "\n".join(bench.summary(rows))
    # 2 x 1: 4 updates in 450 s = 32/h; 1 x 2: 2 in 300 s = 24/h; 1 x 1: 18/h
    assert "2 x 1 / 1 x 2, updates per wall-hour: 1.33x" in text
    assert "(what the second thread buys one process): 1.33x; CPU-s per update 1.13x" in text
    assert "(what sharing the machine costs each process): 1.07x" in text
    assert text.count("\n1x1 ") + text.startswith("1x1 ") == 2  # one line per round


def test_child_command_runs_the_update_now_alone_at_the_settings_threads():
    bench = _load("update_threads")
    args = bench.argparse.Namespace(updates=3, arm="rl", run=None, base="/m", student_layers=6)
    cmd = bench.child_command(args, 2)
    assert cmd[1].endswith("arm_update_cost.py")
    joined = " ".join(cmd)
    for part in ("--side after", "--json", "--threads 2", "--updates 3", "--arm rl", "--base /m",
                 "--student-layers 6"):
        assert part in joined


@pytest.mark.parametrize("argv, message", [(["--json"], "--json needs --side after"),
                                           (["--threads", "0"], "--threads must be >= 1")])
def test_arm_update_cost_refuses_a_json_table_and_zero_threads(argv, message, tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "arm_update_cost.py"), "--base", str(tmp_path),
                           *argv], capture_output=True, text=True)
    assert proc.returncode == 2 and message in proc.stderr


@pytest.mark.slow  # three child processes each training one MemOPD update of a tiny model: ~1-3 min
def test_update_threads_end_to_end_on_a_tiny_base(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from llm_common import save_tiny_base

    save_tiny_base(tmp_path / "base")
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "update_threads.py"), "--base",
                           str(tmp_path / "base"), "--student-layers", "2", "--updates", "1", "--settings", "1x1",
                           "2x1"], capture_output=True, text=True, cwd=tmp_path,
                          env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    table = {line.split()[0]: line.split() for line in lines if line.split() and line.split()[0] in ("1x1", "2x1")}
    assert table["1x1"][1] == "1" and table["2x1"][1] == "2"  # updates done: one per process
    assert any(line.startswith("2 x 1 / 1 x 1, CPU-s per update") for line in lines)


@pytest.mark.slow  # one MemOPD update of a tiny model: ~30-60 s
def test_arm_update_cost_side_after_prints_its_line_without_a_baseline(tmp_path):
    pytest.importorskip("transformers")
    from llm_common import save_tiny_base

    save_tiny_base(tmp_path / "base")
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "arm_update_cost.py"), "--base",
                           str(tmp_path / "base"), "--student-layers", "2", "--side", "after"],
                          capture_output=True, text=True, cwd=tmp_path,
                          env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert any(line.startswith("after: ") for line in proc.stdout.splitlines())
    assert "before" not in proc.stdout
