"""Failures after start-up in the ``memenv`` commands: a bad ``--out`` fails before any work, ``memenv bench``
keeps each finished cell and resumes, counts an episode that fails on a served model instead of crashing,
Ctrl-C is one line and exit 130 with the finished work kept, and bad checkpoints and records files are one
line naming the file (and the line)."""

from __future__ import annotations

import json
import os
import re
import signal
import struct
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pandas as pd
import pytest

import agents.scripted.bench as bench
from agents.scripted.strategies.qa_strategies import make_strategy
from memenv.cli import main

ROOT = Path(__file__).resolve().parents[1]
ENV = "MemQA-v0:objectives=1,hops=2"
QUICK = ["--envs", ENV, "MemQA-v0:objectives=2,hops=2", "--strategies", "relevance", "history", "-n", "2", "--quiet"]


def run(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exc:
        return int(exc.code or 0)


def last_line(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert lines, "nothing on stderr"
    return lines[-1]


@pytest.fixture
def episodes_run(monkeypatch):
    """Counts the episodes the bench runs (the seeds, in order)."""
    seen: list[int] = []
    real = bench.run_episode

    def counting(env, policy, seed, stop=None):
        seen.append(seed)
        return real(env, policy, seed, stop)

    monkeypatch.setattr(bench.episodes, "run_episode", counting)
    return seen


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# ------------------------------------------------------------------------------------------ --out, up front
def _out_mistakes(tmp_path: Path) -> list[tuple[list[str], str]]:
    afile = tmp_path / "results.txt"
    afile.write_text("the user's own file\n")
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "results.csv").write_text("a,b\n1,2\n")
    return [
        (["--out", str(afile)], "is a file, not a folder"),
        (["--out", str(afile / "sub")], "is a file, so no folder can be made under it"),
        (["--out", str(theirs)], "holds results.csv, not written by a resumable memenv bench"),
    ]


def test_bench_out_mistakes_fail_before_the_first_episode(tmp_path, capsys, episodes_run, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for extra, words in _out_mistakes(tmp_path):
        before = snapshot(tmp_path)
        assert run(["bench", *QUICK, *extra]) == 2, extra
        message = last_line(capsys)
        assert message.startswith("memenv bench: error: --out") and words in message, message
        assert episodes_run == []  # not one episode ran
        assert snapshot(tmp_path) == before  # nothing written, nothing replaced
        sweep = ["bench", "--sweep", "objectives=1,2", "--strategies", "relevance", "-n", "1", "--quiet", *extra]
        assert run(sweep) == 2 and words in last_line(capsys)
        assert episodes_run == [] and snapshot(tmp_path) == before


def test_bench_out_on_a_read_only_file_system_fails_before_the_first_episode(capsys, episodes_run):
    target = Path("/sys/memenv-bench-out")  # sysfs refuses new entries, even to root
    try:
        target.mkdir()
    except OSError:
        pass
    else:  # pragma: no cover - a system where /sys takes folders: nothing to test here
        target.rmdir()
        pytest.skip("/sys is writable here")
    assert run(["bench", *QUICK, "--out", str(target)]) == 2
    message = last_line(capsys)
    assert message.startswith(f"memenv bench: error: --out {target}: cannot write there"), message
    assert episodes_run == []


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into any folder")
def test_bench_out_in_a_folder_without_write_permission(tmp_path, capsys, episodes_run):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    try:
        assert run(["bench", *QUICK, "--out", str(locked / "out")]) == 2
        assert "is not writable" in last_line(capsys)
    finally:
        locked.chmod(0o700)
    assert episodes_run == []


# ------------------------------------------------------------------------------------------ bench: resume
def test_benches_of_other_settings_without_out_each_get_their_own_folder(tmp_path, capsys, episodes_run):
    """The README's order, `memenv bench` then `memenv bench --sweep ...`, in one folder: without --out each
    settings get a folder of their own (bench_out for the default bench, bench_out-HASH for others), so the
    second command neither meets the first one's bench nor overwrites it, and each resumes its own."""
    assert bench.default_out(bench.bench_settings(bench.STRATEGIES, [bench.EnvSpec.parse(e) for e in
                                                                     bench.DEFAULT_ENVS], 30, 0)) == Path("bench_out")
    assert run(["bench", *QUICK]) == 0
    first = capsys.readouterr().out
    sweep = ["bench", "--sweep", "objectives=1,2", "--strategies", "relevance", "-n", "1", "--quiet"]
    assert run(sweep) == 0
    second = capsys.readouterr().out
    folders = sorted(p.name for p in tmp_path.iterdir())
    assert len(folders) == 2 and all(re.fullmatch(r"bench_out-[0-9a-f]{8}", f) for f in folders), folders
    assert f"wrote {folders[0]}" in first + second and f"wrote {folders[1]}" in first + second
    episodes_run.clear()
    assert run(["bench", *QUICK]) == 0 and episodes_run == []  # the same command finds its own folder again
    assert "resuming: 4 of 4 cells already in bench_out-" in capsys.readouterr().out


def test_bench_resumes_finished_cells_and_refuses_other_settings(tmp_path, capsys, episodes_run):
    out = tmp_path / "out"
    assert run(["bench", *QUICK, "--out", str(out)]) == 0
    assert len(episodes_run) == 2 * 2 * 2
    first = pd.read_csv(out / "results.csv")
    manifest = json.loads((out / "bench.json").read_text())
    assert manifest["settings"]["episodes"] == 2 and len(list((out / "cells").glob("cell-*.json"))) == 4
    capsys.readouterr()

    # the same command again: every cell is read back, none runs
    episodes_run.clear()
    assert run(["bench", *QUICK, "--out", str(out)]) == 0
    assert episodes_run == []
    assert "resuming: 4 of 4 cells already in" in capsys.readouterr().out
    pd.testing.assert_frame_equal(pd.read_csv(out / "results.csv"), first)

    # a lost cell runs again, alone
    cell = out / "cells" / bench.store._cell_file("MemQA-v0:objectives=2,hops=2", "history")
    cell.unlink()
    assert run(["bench", *QUICK, "--out", str(out)]) == 0
    assert episodes_run == [0, 1]
    assert cell.exists()
    again = pd.read_csv(out / "results.csv").drop(columns="steps_per_s")
    pd.testing.assert_frame_equal(again, first.drop(columns="steps_per_s"))
    capsys.readouterr()

    # other settings: refused with one line, before any episode; the earlier bench is untouched
    before = snapshot(out)
    episodes_run.clear()
    for change, words in ((["-n", "3"], "episodes: 2 there, 3 here"), (["--seed", "5"], "seed: 0 there, 5 here"),
                          (["--strategies", "relevance"], "strategies: relevance history there, relevance here")):
        argv = ["bench", *QUICK, "--out", str(out), *change]
        assert run(argv) == 2
        message = last_line(capsys)
        assert message.startswith(f"memenv bench: error: --out {out}: holds a bench of other settings"), message
        assert words in message and "--fresh" in message, message
    assert episodes_run == [] and snapshot(out) == before

    # --fresh: every cell again, with the new settings
    assert run(["bench", *QUICK, "--out", str(out), "-n", "3", "--fresh"]) == 0
    assert len(episodes_run) == 4 * 3
    assert (pd.read_csv(out / "results.csv").episodes == 3).all()
    assert len(list((out / "cells").glob("cell-*.json"))) == 4


def test_a_checkpoint_retrained_in_place_is_not_resumed(tmp_path):
    model = _fake_checkpoint(tmp_path / "model")
    specs = [bench.EnvSpec.parse(ENV)]
    before = bench.bench_settings(["relevance", str(model)], specs, 2, 0)
    assert bench.bench_settings(["relevance", str(model)], specs, 2, 0) == before
    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes() + b"")  # rewritten: same bytes, new modification time
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))
    assert bench.bench_settings(["relevance", str(model)], specs, 2, 0)["checkpoints"] != before["checkpoints"]
    assert "checkpoints" not in bench.bench_settings(["relevance"], specs, 2, 0)


def test_bench_refuses_a_manifest_that_is_not_ours(tmp_path, capsys, episodes_run):
    out = tmp_path / "out"
    out.mkdir()
    (out / "bench.json").write_text('{"format": "something else"')
    assert run(["bench", *QUICK, "--out", str(out)]) == 2
    message = last_line(capsys)
    assert "bench.json is not a bench manifest" in message and "line 1" in message, message
    assert run(["bench", *QUICK, "--out", str(out), "--fresh"]) == 2  # --fresh replaces only a bench's own cells
    assert episodes_run == [] and (out / "bench.json").read_text() == '{"format": "something else"'


# --------------------------------------------------------------------------------------------- Ctrl-C
def test_ctrl_c_in_bench_keeps_the_finished_cells(tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"
    real = bench.run_episode
    calls = []

    def interrupted_on_the_fifth(env, policy, seed, stop=None):
        calls.append(seed)
        if len(calls) == 5:
            raise KeyboardInterrupt
        return real(env, policy, seed, stop)

    monkeypatch.setattr(bench.episodes, "run_episode", interrupted_on_the_fifth)
    assert run(["bench", *QUICK, "--out", str(out)]) == 130
    assert last_line(capsys) == (f"memenv bench: interrupted: 2 of 4 cells kept in {out} "
                                 "(rerun the same command to continue)")
    assert len(list((out / "cells").glob("cell-*.json"))) == 2
    assert not (out / "results.csv").exists()  # the results of an unfinished bench are not written as if whole


def test_a_data_file_damaged_past_the_set_up_check_is_one_line_and_keeps_the_cells(tmp_path, capsys, monkeypatch):
    from tasks.types import DataFormatError

    out = tmp_path / "out"
    real = bench.run_episode
    calls = []

    def damaged_on_the_third(env, policy, seed, stop=None):
        calls.append(seed)
        if len(calls) == 3:
            raise DataFormatError("chat.json record 7: 'content' must be a string")
        return real(env, policy, seed, stop)

    monkeypatch.setattr(bench.episodes, "run_episode", damaged_on_the_third)
    assert run(["bench", *QUICK, "--out", str(out)]) == 2
    assert last_line(capsys) == ("memenv bench: error: chat.json record 7: 'content' must be a string; 1 of 4 cells "
                                 f"kept in {out} (rerun the same command to continue)")
    assert len(list((out / "cells").glob("cell-*.json"))) == 1


def test_ctrl_c_in_any_command_is_one_line_and_exit_130(monkeypatch, capsys):
    def interrupt(prompt=""):
        raise KeyboardInterrupt

    monkeypatch.setattr("builtins.input", interrupt)
    assert run(["play", "MemQA-v0", "--kw", "objectives=1"]) == 130
    assert last_line(capsys) == "memenv play: interrupted"


def test_ctrl_c_in_train_says_what_was_kept(tmp_path, monkeypatch, capsys):
    pytest.importorskip("torch")
    import agents.llm.training.sft

    def interrupted(cfg):
        raise KeyboardInterrupt

    monkeypatch.setattr(agents.llm.training.sft, "train_sft", interrupted)
    out = tmp_path / "run"
    assert run(["train", "--algo", "sft", "--out", str(out), "--quiet"]) == 130
    assert last_line(capsys) == f"memenv train: interrupted: no checkpoint written yet in {out}"


def _default_sigint() -> None:
    """In the child before exec: SIGINT back to its default, so that Python installs its Ctrl-C handler. A test
    run launched in the background by a non-interactive shell (``cmd &``) inherits SIGINT ignored, and its
    children would then never see the Ctrl-C these tests send."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_sigint_mid_bench_ends_with_one_line_and_the_rerun_finishes(tmp_path):
    """A real Ctrl-C (SIGINT to the process) while cells are running; then the same command completes the
    bench from the kept cells."""
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "memenv.cli", "bench", "--envs", ENV, "MemQA-v0:objectives=4,hops=2",
            "MemQA-v0:objectives=8,hops=2", "--strategies", "relevance", "history", "keep-all", "-n", "6",
            "--quiet", "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_default_sigint)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            if len(list((out / "cells").glob("cell-*.json"))) >= 2:
                break
            time.sleep(0.02)
        assert proc.poll() is None, "the bench ended before it could be interrupted"
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    message = stderr.strip().splitlines()[-1]
    match = re.fullmatch(rf"memenv bench: interrupted: (\d) of 9 cells kept in {re.escape(str(out))} "
                         r"\(rerun the same command to continue\)", message)
    assert match, message
    kept = int(match.group(1))
    assert 2 <= kept < 9 and len(list((out / "cells").glob("cell-*.json"))) == kept
    done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"resuming: {kept} of 9 cells already in {out}" in done.stdout
    assert len(pd.read_csv(out / "results.csv")) == 9


# ---------------------------------------------------------------------------- bench: failed episodes
class FlakyServer:
    """An OpenAI-compatible completions server on 127.0.0.1 (a stand-in; the tests ask for ``endpoint=completions``)
    whose model is the ``relevance`` strategy; while ``failing`` is above 0 it answers that many completion
    requests with HTTP 400 (no retry helps)."""

    def __init__(self, failing: int = 0, delay: float = 0.0) -> None:
        self.failing, self.lock, self.policy = failing, threading.Lock(), make_strategy("relevance")
        self.delay, self.completions = delay, 0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, code: int, payload: dict) -> None:
                data = json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._send(200, {"data": [{"id": "m"}]})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with owner.lock:
                    fail = owner.failing > 0
                    owner.failing -= fail
                    owner.completions += 1
                time.sleep(owner.delay)
                if fail:
                    return self._send(400, {"error": "the model cannot take this prompt"})
                action = owner.policy.act(body["prompt"])
                cut = min((action.find(s) for s in body["stop"] if s in action), default=len(action))
                matched = next((s for s in body["stop"] if action.find(s) == cut), None)
                self._send(200, {"choices": [{"index": 0, "text": action[:cut], "stop_reason": matched,
                                              "finish_reason": "stop" if matched else "length"}],
                                 "usage": {"prompt_tokens": 1, "completion_tokens": 1}})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> "FlakyServer":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def test_failed_episodes_are_counted_shown_and_run_again_on_resume(tmp_path, capsys):
    out = tmp_path / "out"
    with FlakyServer(failing=2) as server:
        served = f"openai:m@{server.url}?endpoint=completions"
        argv = ["bench", "--envs", ENV, "--strategies", "relevance", served, "-n", "6", "--quiet", "--out", str(out)]
        assert run(argv) == 0
        printed = capsys.readouterr().out
        table = pd.read_csv(out / "results.csv").set_index("strategy")
        assert "failed" in printed.splitlines()[0]  # the table shows the column
        assert table.loc[served, "failed"] == 2 and table.loc[served, "episodes"] == 4
        assert table.loc["relevance", "failed"] == 0 and table.loc["relevance", "episodes"] == 6
        rows = pd.read_csv(out / "episodes.csv")
        errors = rows[rows.strategy == served].error.dropna()
        assert len(errors) == 2 and all(server.url in e and "400" in e for e in errors)
        ok = rows[(rows.strategy == served) & rows.error.isna()]
        # the means are those of the episodes that ran (a failed episode is not a zero)
        assert table.loc[served, "f1"] == pytest.approx(ok.f1.mean())
        # the cell with failures runs again on the next run of the same command; the whole one does not
        assert run(argv) == 0
        assert "resuming: 1 of 2 cells" in capsys.readouterr().out
        table = pd.read_csv(out / "results.csv").set_index("strategy")
        assert table.loc[served, "failed"] == 0 and table.loc[served, "episodes"] == 6
        assert table.loc[served, "f1"] == pytest.approx(table.loc["relevance", "f1"])


def test_too_many_failed_episodes_stop_the_run_with_one_line(tmp_path, capsys):
    out = tmp_path / "out"
    with FlakyServer(failing=10**6) as server:
        served = f"openai:m@{server.url}?endpoint=completions"
        argv = ["bench", "--envs", ENV, "--strategies", "relevance", served, "-n", "20", "--quiet", "--out", str(out),
                "--max-failures", "1"]
        assert run(argv) == 1
        assert server.completions < 20  # stopped early: the served cell's 20 episodes would each have asked once
        message = last_line(capsys)
        assert re.match(r"memenv bench: error: stopped after \d+ failed episodes \(more than --max-failures 1\); "
                        rf"last: .*{re.escape(server.url)}.*; 1 of 2 cells kept in {re.escape(str(out))}", message), \
            message
        assert len(list((out / "cells").glob("cell-*.json"))) == 1
        server.failing = 0  # the server is back: the same command finishes the bench
        assert run(argv) == 0
        table = pd.read_csv(out / "results.csv")
        assert list(table.failed) == [0, 0] and list(table.episodes) == [20, 20]


def test_a_cell_whose_every_episode_failed_exits_1_with_one_line(tmp_path, capsys):
    # -n below --max-failures: the run went to its end and exited 0 with nothing on stderr.
    out = tmp_path / "out"
    with FlakyServer(failing=10**6) as server:
        served = f"openai:m@{server.url}?endpoint=completions"
        argv = ["bench", "--envs", ENV, "--strategies", "relevance", served, "-n", "3", "--quiet", "--out", str(out),
                "--max-failures", "10"]
        assert run(argv) == 1
        captured = capsys.readouterr()
        message = captured.err.strip()
        assert "\n" not in message and re.fullmatch(
            rf"memenv bench: error: every episode failed in 1 of 2 cells \({re.escape(ENV)} x {re.escape(served)}\); "
            rf"last: .*{re.escape(server.url)}.*400.*; rerun the same command to run them again", message), message
        table = pd.read_csv(out / "results.csv").set_index("strategy")  # the tables are written first
        assert table.loc[served, "failed"] == 3 and table.loc[served, "episodes"] == 0
        assert table.loc["relevance", "episodes"] == 3
        server.failing = 0
        assert run(argv) == 0  # the failed cell runs again; the other is kept


def test_max_failures_zero_stops_at_the_first_failure(tmp_path, capsys):
    with FlakyServer(failing=1) as server:
        argv = ["bench", "--envs", ENV, "--strategies", f"openai:m@{server.url}?endpoint=completions", "-n", "3", "--quiet",
                "--out", str(tmp_path / "out"), "--max-failures", "0"]
        assert run(argv) == 1
        assert "stopped after 1 failed episodes (more than --max-failures 0)" in last_line(capsys)


def test_sigint_while_served_episodes_run_on_threads_stops_them_soon(tmp_path):
    """Ctrl-C while a served model's episodes run on the thread pool: the running episodes stop at their next
    step (the queued ones never start), so the command ends after the requests in flight, not after the
    running episodes' remaining ~20 turns each."""
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    long_env = "MemQA-v0:objectives=8,hops=3"  # ~26 turns an episode
    with FlakyServer(delay=0.05) as server:
        argv = [sys.executable, "-m", "memenv.cli", "bench", "--envs", long_env, "--strategies", "relevance",
                f"openai:m@{server.url}?endpoint=completions", "-n", "40", "--quiet", "--out", str(out)]
        proc = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, preexec_fn=_default_sigint)
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and proc.poll() is None and server.completions < 40:
                time.sleep(0.02)
            assert proc.poll() is None and server.completions >= 40
            proc.send_signal(signal.SIGINT)
            at_signal = server.completions
            _, stderr = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        extra = server.completions - at_signal
    assert proc.returncode == 130, stderr
    assert stderr.strip().splitlines()[-1] == (f"memenv bench: interrupted: 1 of 2 cells kept in {out} "
                                               "(rerun the same command to continue)")
    # 8 worker threads: each finishes the request it has in flight (and may have sent one more meanwhile);
    # episodes run to their end would send ~20 more each
    assert extra <= 24, extra


def test_bench_checkpoint_strategy_that_is_damaged(tmp_path, capsys, torch_stack):
    model = _fake_checkpoint(tmp_path / "model", cut_weights=True)
    assert run(["bench", "--envs", ENV, "--strategies", str(model), "-n", "1", "--quiet",
                "--out", str(tmp_path / "out")]) == 2
    message = last_line(capsys)
    assert "model.safetensors is cut" in message and str(model) in message, message
    assert not (tmp_path / "out").exists()


def test_train_resume_from_a_damaged_checkpoint(tmp_path, capsys, torch_stack):
    out = tmp_path / "run"
    checkpoint = _fake_checkpoint(out / "checkpoint-0000004", config='{"model_type": "qwen2",')
    (checkpoint / "trainer_state.pt").write_bytes(b"")
    (out / "latest").write_text("checkpoint-0000004\n")
    (out / "config.json").write_text(json.dumps({"out_dir": str(out)}))
    assert run(["train", "--algo", "sft", "--out", str(out), "--resume", "--quiet"]) == 2
    message = last_line(capsys)
    assert message.startswith(f"memenv train: error: --resume: --out {checkpoint}: config.json is not valid JSON"), \
        message


def test_diagnose_csv_that_is_a_folder(tmp_path, capsys, torch_stack):
    records = tmp_path / "r.jsonl"
    records.write_text(json.dumps(RECORD) + "\n")
    model = _fake_checkpoint(tmp_path / "model")
    assert run(["distill", "diagnose", "--records", str(records), "--model", str(model), "--csv", str(tmp_path)]) == 2
    assert last_line(capsys) == f"memenv distill: error: --csv {tmp_path}: is a folder, not a file"


def test_a_bug_in_an_episode_keeps_its_traceback(tmp_path, monkeypatch):
    def broken(env, policy, seed, stop=None):
        raise ZeroDivisionError("a bug, not a service failure")

    monkeypatch.setattr(bench.episodes, "run_episode", broken)
    with pytest.raises(ZeroDivisionError):
        main(["bench", *QUICK, "--out", str(tmp_path / "out")])


# --------------------------------------------------------------------------- train / distill: --out, models
def _fake_checkpoint(folder: Path, *, config: str | None = None, cut_weights: bool = False) -> Path:
    """The files of a checkpoint folder (not loadable weights): enough for the checks that precede loading."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(config if config is not None else
                                        '{\n  "model_type": "qwen2",\n  "hidden_size": 8\n}\n')
    header = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
    data = struct.pack("<Q", len(header)) + header + bytes(16)
    (folder / "model.safetensors").write_bytes(data[:-5] if cut_weights else data)
    (folder / "tokenizer.json").write_text('{"model": {}}')
    return folder


@pytest.fixture
def torch_stack():
    pytest.importorskip("torch")
    pytest.importorskip("transformers")


def test_train_and_distill_out_mistakes_fail_before_any_work(tmp_path, capsys, torch_stack):
    teacher = _fake_checkpoint(tmp_path / "teacher")
    afile = tmp_path / "notes.txt"
    afile.write_text("mine\n")
    earlier = tmp_path / "earlier"
    earlier.mkdir()
    (earlier / "metrics.csv").write_text("step,loss\n1,2\n")
    (earlier / "checkpoint-0000010").mkdir()
    commands = {"train": ["train", "--algo", "sft"], "distill": ["distill", "--teacher", str(teacher)]}
    for name, command in commands.items():
        for out, words in ((afile, "is a file, not a folder"), (afile / "x", "no folder can be made under it"),
                           (earlier, "holds an earlier run (metrics.csv, checkpoint-0000010); --resume continues it"),
                           (teacher, "holds a config.json that is not a memenv training run's")):
            before = snapshot(tmp_path)
            assert run([*command, "--out", str(out)]) == 2, (name, out)
            message = last_line(capsys)
            assert message.startswith(f"memenv {name}: error: --out {out}") and words in message, message
            assert snapshot(tmp_path) == before


def test_train_on_a_data_file_damaged_past_the_set_up_check(tmp_path, monkeypatch, capsys, torch_stack):
    import agents.llm.training.sft
    from tasks.types import DataFormatError

    def damaged(cfg):
        raise DataFormatError("hotpot.json record 12: 'context' must be a list")

    monkeypatch.setattr(agents.llm.training.sft, "train_sft", damaged)
    out = tmp_path / "run"
    assert run(["train", "--algo", "sft", "--out", str(out), "--quiet"]) == 2
    assert last_line(capsys) == ("memenv train: error: hotpot.json record 12: 'context' must be a list; no checkpoint "
                                 f"written yet in {out}")


def test_train_model_folder_without_a_checkpoint(tmp_path, capsys, torch_stack):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert run(["train", "--algo", "ppo", "--model", str(empty), "--out", str(tmp_path / "run")]) == 2
    assert last_line(capsys) == f"memenv train: error: --model {empty}: no model checkpoint there (config.json missing)"
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("damage,words", [
    ("cut_config", "config.json is not valid JSON (line 3 column"),
    ("no_model_type", "config.json is not a model config (no model_type)"),
    ("cut_weights", "model.safetensors is cut"),
])
def test_distill_teacher_with_a_damaged_checkpoint(tmp_path, capsys, damage, words, torch_stack):
    config = {"cut_config": '{\n  "model_type": "qwen2",\n  "hidden', "no_model_type": '{"hidden_size": 8}'}
    teacher = _fake_checkpoint(tmp_path / "teacher", config=config.get(damage), cut_weights=damage == "cut_weights")
    assert run(["distill", "--teacher", str(teacher), "--out", str(tmp_path / "run")]) == 2
    message = last_line(capsys)
    assert message.startswith(f"memenv distill: error: --teacher {teacher}: ") and words in message, message
    assert not (tmp_path / "run").exists()


# ----------------------------------------------------------------------------------------- records files
RECORD = {"episode_id": "e1", "turn": 1, "prompt_ids": [1, 2], "response_ids": [3], "response_logprobs": [-0.5],
          "action_mask": [1], "memory_mask": [0]}


@pytest.mark.parametrize("content,words", [
    ("\n".join([json.dumps(RECORD)] * 2 + [json.dumps(RECORD)[:25]]), "line 3: not valid JSON"),
    ("[1, 2, 3]\n", "line 1: expected a JSON object (an invocation record), got list"),
    (json.dumps(RECORD) + "\n\n" + json.dumps({**RECORD, "response_ids": "abc"}) + "\n",
     'line 3: response_ids must be a list of token ids, got "abc"'),
    (json.dumps({k: v for k, v in RECORD.items() if k != "turn"}) + "\n", "line 1: not an invocation record (missing turn)"),
    (json.dumps({**RECORD, "action_mask": [1, 1]}) + "\n", "line 1: record ('e1', 1): response_ids (1)"),
])
def test_distill_diagnose_names_the_records_line(tmp_path, capsys, content, words, torch_stack):
    records = tmp_path / "records.jsonl"
    records.write_text(content)
    model = _fake_checkpoint(tmp_path / "model")
    assert run(["distill", "diagnose", "--records", str(records), "--model", str(model)]) == 2
    message = last_line(capsys)
    assert message.startswith(f"memenv distill: error: --records: {records} {words.split(':')[0]}"), message
    assert words in message, message


def test_records_loader_names_the_line_of_bytes_that_are_not_utf8(tmp_path):
    from agents.llm.records.invocation import load_records

    path = tmp_path / "r.jsonl"
    good = (json.dumps(RECORD) + "\n").encode()
    path.write_bytes(good * 2 + b'{"episode_id": "\xff"}\n')
    with pytest.raises(ValueError, match=re.escape(f"{path} line 3: not UTF-8 text")):
        load_records(path)
    path.write_bytes(good * 2)
    assert [r.key for r in load_records(path)] == [("e1", 1), ("e1", 1)]


NUMERIC_MISTAKES = [
    (["bench", "--max-failures", "-1"], "--max-failures"),
    (["bench", "--max-failures", "nan"], "--max-failures"),
    (["distill", "--lambda", "nan"], "--lambda"),
    (["distill", "--beta", "inf"], "--beta"),
    (["distill", "--top-k", "0"], "--top-k"),
    (["distill", "--chunk", "-4"], "--chunk"),
    (["distill", "--token-budget", "0"], "--token-budget"),
    (["distill", "--credit-coef", "-1"], "--credit-coef"),
    (["distill", "--lr", "nan"], "--lr"),
    (["distill", "--kl-coef", "-0.1"], "--kl-coef"),
    (["distill", "--temperature", "0"], "--temperature"),
    (["distill", "--updates", "0"], "--updates"),
    (["distill", "--save-every", "0"], "--save-every"),
    (["distill", "--max-seconds", "inf"], "--max-seconds"),
    (["distill", "--seed", "-1"], "--seed"),
    (["distill", "diagnose", "--records", "r", "--model", "m", "--clip", "1.5"], "--clip"),
    (["distill", "diagnose", "--records", "r", "--model", "m", "--clip", "nan"], "--clip"),
    (["distill", "diagnose", "--records", "r", "--model", "m", "--token-budget", "0"], "--token-budget"),
    (["train", "--algo", "sft", "--set", "lr=nan"], "lr=nan"),
    (["train", "--algo", "sft", "--set", "warmup=inf"], "warmup=inf"),
]


@pytest.mark.parametrize("argv,word", NUMERIC_MISTAKES, ids=[" ".join(a) for a, _ in NUMERIC_MISTAKES])
def test_numeric_options_are_finite_and_in_range(argv, word, capsys, tmp_path, monkeypatch):
    if argv[0] in ("train", "distill"):
        pytest.importorskip("torch")
    monkeypatch.chdir(tmp_path)
    assert run(argv) == 2
    message = last_line(capsys)
    assert message.startswith(f"memenv {argv[0]}") and "error:" in message and word in message, message
    assert not list(tmp_path.iterdir())


def test_cut_pipe_is_not_a_traceback(tmp_path):
    """``memenv bench | head -1``: the reader goes away; the command ends quietly."""
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen([sys.executable, "-m", "memenv.cli", "bench", *QUICK, "--out", str(tmp_path / "o")],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # nobody reads the table
    _, stderr = proc.communicate(timeout=120)
    assert b"Traceback" not in stderr and proc.returncode == 141, stderr.decode()
    assert len(list((tmp_path / "o" / "cells").glob("cell-*.json"))) == 4  # the work itself was kept


# ------------------------------------------------------------------------------------------ atomic folders
def test_an_interrupted_folder_swap_puts_the_earlier_folder_back(tmp_path, monkeypatch):
    import memenv.files as files

    target = tmp_path / "checkpoint"
    target.mkdir()
    (target / "weights").write_text("earlier")
    real_replace = os.replace

    def interrupted_second_replace(src, dst):
        if Path(src).name.startswith(".checkpoint.tmp-"):  # the new folder moving into place
            raise KeyboardInterrupt
        return real_replace(src, dst)

    monkeypatch.setattr(files.os, "replace", interrupted_second_replace)
    with pytest.raises(KeyboardInterrupt):
        files.write_directory_atomic(target, lambda tmp: (tmp / "weights").write_text("newer"))
    monkeypatch.setattr(files.os, "replace", real_replace)
    assert (target / "weights").read_text() == "earlier"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint"]  # no hidden leftovers


def test_a_file_is_not_replaced_by_a_folder(tmp_path):
    from memenv.files import write_directory_atomic

    afile = tmp_path / "corpus.jsonl"
    afile.write_text("{}\n")
    with pytest.raises(FileExistsError, match="is a file, not a folder"):
        write_directory_atomic(afile, lambda tmp: (tmp / "x").write_text("x"))
    assert afile.read_text() == "{}\n" and sorted(p.name for p in tmp_path.iterdir()) == ["corpus.jsonl"]

