"""Where output goes (issue 64): every command that writes refuses, in one line and before any work, an output that
is its own input (or a link to it), a symbolic link, a device, a path under a regular file or an empty path; the
input is left as it was."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from memenv.cli_common import CommandError, check_out_dir, check_out_file


def test_check_out_file_refuses_each_kind_of_bad_output(tmp_path):
    data = tmp_path / "records.jsonl"
    data.write_text("{}\n")
    (tmp_path / "link").symlink_to(data)
    (tmp_path / "null").symlink_to("/dev/null")
    cases = {
        str(data): "is the input",
        str(tmp_path / "link"): "is the input",  # a link to the input is the input
        str(tmp_path / "sub" / ".." / "records.jsonl"): "is the input",
        str(tmp_path / "null"): r"is a symbolic link \(to /dev/null\)",
        "/dev/null": "not a regular file",
        str(tmp_path): "is a folder",
        str(data / "out.jsonl"): "is a file, so no file can be written under it",
        "  ": "expected a file name",
    }
    (tmp_path / "sub").mkdir()
    for path, message in cases.items():
        with pytest.raises(CommandError, match=message):
            check_out_file(path, "--out", inputs=[data])
    assert data.read_text() == "{}\n"
    assert check_out_file(tmp_path / "new" / "rows.jsonl", "--out", inputs=[data]) == tmp_path / "new" / "rows.jsonl"
    with pytest.raises(CommandError, match="is the input"):
        check_out_dir(tmp_path / "sub", "--out", inputs=[tmp_path / "sub" / "."])


def _records(tmp_path) -> Path:
    from agents.llm.records.invocation import InvocationRecord, save_records

    path = tmp_path / "records.jsonl"
    save_records(path, [InvocationRecord("e", 1, [1, 2], [3], [-0.5], [1], [0], reward=1.0, done=True)])
    return path


@pytest.mark.parametrize("command", [
    lambda r, out: ["records", "export", str(r), "--to", "trl", "--out", out],
    lambda r, out: ["view", str(r), "-o", out],
])
def test_export_and_view_never_replace_their_input(tmp_path, capsys, command):
    from memenv.cli import main

    records = _records(tmp_path)
    before = records.read_bytes()
    (tmp_path / "alias").symlink_to(records)
    (tmp_path / "stdout").symlink_to("/dev/stdout")
    for out, message in ((str(records), "is the input"), (str(tmp_path / "alias"), "is the input"),
                         (str(tmp_path / "stdout"), "is a symbolic link"),
                         (str(records / "x"), "is a file, so no file can be written under it")):
        assert main(command(records, out)) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err
    assert records.read_bytes() == before and (tmp_path / "alias").is_symlink()
    assert os.readlink(tmp_path / "stdout") == "/dev/stdout"
    assert main(command(records, str(tmp_path / "fine.out"))) == 0 and (tmp_path / "fine.out").is_file()


def test_shrink_and_experiment_refuse_an_out_that_is_their_input(tmp_path, capsys):
    from memenv.cli import main

    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    assert main(["models", "shrink", str(tmp_path / "model"), "--layers", "1", "--out", str(tmp_path / "model")]) == 2
    assert "is the input" in capsys.readouterr().err
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "experiment.json").write_text("{}")
    assert main(["experiment", "memopd", "--quick", "--out", str(tmp_path / "run"), "--stages-from",
                 str(tmp_path / "run" / ".")]) == 2
    assert "is the input" in capsys.readouterr().err
    assert main(["experiment", "memopd", "--quick", "--out", str(tmp_path / "new"), "--stages-from", ""]) == 2
    assert "--stages-from: expected a run's folder, got an empty path" in capsys.readouterr().err
    assert not (tmp_path / "new").exists() and sorted(p.name for p in (tmp_path / "run").iterdir()) == ["experiment.json"]


def test_shrink_checks_its_source_like_prepare_and_distill(tmp_path, capsys):
    """A source folder with cut or missing weights is one line naming the file, not a safetensors traceback."""
    pytest.importorskip("torch")
    from llm_common import save_tiny_base

    from memenv.cli import main

    save_tiny_base(tmp_path / "base")
    weights = tmp_path / "base" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])  # a cut copy
    capsys.readouterr()  # the base's own saving progress
    assert main(["models", "shrink", str(tmp_path / "base"), "--layers", "1", "--out", str(tmp_path / "s")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "model.safetensors" in err[0], err
    weights.unlink()
    assert main(["models", "shrink", str(tmp_path / "base"), "--layers", "1", "--out", str(tmp_path / "s")]) == 2
    assert "no weights there" in capsys.readouterr().err and not (tmp_path / "s").exists()


def test_a_saved_model_folder_is_readable_as_the_umask_says(tmp_path):
    """Issue 64: model.safetensors came out 0600 whatever the umask (others could not read a shared cache); every
    file of an atomically written folder now has the mode the umask gives a new file."""
    pytest.importorskip("torch")
    from llm_common import save_tiny_base

    old = os.umask(0o022)
    try:
        save_tiny_base(tmp_path / "base")
    finally:
        os.umask(old)
    modes = {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "base").iterdir() if p.is_file()}
    assert modes["model.safetensors"] == 0o644 and set(modes.values()) == {0o644}, modes


def test_long_input_envs_keep_a_bounded_number_of_snapshots_by_default():
    """Issue 64: a default episode's summary keeps the last DEFAULT_KEPT_SNAPSHOTS snapshots and counts the others,
    so memory no longer grows with the episode; True keeps every one, N the last N, and a bad value is refused."""
    import gymnasium as gym

    import memenv  # noqa: F401
    from memenv.validation import DEFAULT_KEPT_SNAPSHOTS, ArgumentTypeError

    def play(**kw):
        env = gym.make("MemRead-v0", **kw)
        env.reset(seed=0)
        steps, info = 0, {}
        while "summary" not in info:
            _, _, _, _, info = env.step("<memory>x</memory>")  # keep reading: one chunk a step
            steps += 1
        return steps, info["summary"]

    steps, summary = play(max_turns=40, keep_snapshots=3)
    assert len(summary["snapshots"]) == 3 and summary["snapshots_dropped"] == steps - 3
    assert [s["turn"] for s in summary["snapshots"]] == list(range(steps - 2, steps + 1))  # the last ones
    steps, summary = play(max_turns=40, keep_snapshots=True)
    assert len(summary["snapshots"]) == steps and summary["snapshots_dropped"] == 0
    assert gym.make("MemRead-v0").unwrapped.keep_snapshots == DEFAULT_KEPT_SNAPSHOTS
    assert gym.make("MemDialog-v0").unwrapped.keep_snapshots == DEFAULT_KEPT_SNAPSHOTS
    for bad in (0, -1, "all", 2.5):
        with pytest.raises(ArgumentTypeError, match="keep_snapshots"):
            gym.make("MemRead-v0", keep_snapshots=bad)
