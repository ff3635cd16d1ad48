"""``memenv experiment memopd --extend-teacher --teacher-minutes M`` (:mod:`distill.experiment.extend`): a teacher
whose budget ended while its curve still rose continues from its checkpoint in the same folder, on the cosine
re-laid over the new budget; its earlier result is kept; anything but a larger budget, or a stage already made
from the teacher, is refused by name."""

import dataclasses
import json

import pandas as pd
import pytest

from distill.experiment.config import ModelSpec, SettingsMismatchError, _config_record, powered_config
from distill.experiment.extend import budget_grew_only, extend_teacher, format_extension
from test_stages_from import _tiny as _stages_tiny


def _tiny(out, steps=3, **kw):
    """tests/test_stages_from.py's miniature run, its teacher's SFT ``steps`` long."""
    teacher = ModelSpec(hidden=32, layers=1, heads=2, sft_steps=steps, sft_minutes=None, sft_episodes=4)
    return _stages_tiny(out, **{"teacher": teacher, **kw})


def test_the_teacher_continues_from_its_checkpoint_on_the_relaid_cosine_and_its_earlier_result_is_kept(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from agents.llm.training.common import latest_checkpoint
    from agents.llm.training.sft import lr_at
    from distill.experiment.run import run_experiment
    from distill.experiment.stages import _sft_config

    out = tmp_path / "run"
    run_experiment(_tiny(out), until="teacher")
    first = json.loads((out / "teacher" / "result.json").read_text())
    assert first["steps"] == 3
    longer = _tiny(out, steps=6)
    with pytest.raises(SettingsMismatchError, match="teacher.sft_steps 3 -> 6"):  # without the flag: refused
        run_experiment(longer, until="teacher")
    assert budget_grew_only(longer) and not budget_grew_only(_tiny(out, steps=6, vocab=401))
    done = extend_teacher(longer)
    assert done["checkpoint_step"] == 3 and done["from"]["sft_steps"] == 3 and done["to"]["sft_steps"] == 6
    # the old cosine ended at its floor; the new one, laid over 6 steps, is higher there: a warm restart
    assert done["lr_old_schedule"] == pytest.approx(longer.teacher.lr * 0.1)
    assert done["lr_new_schedule"] > 2 * done["lr_old_schedule"]
    assert "resumes at step 3" in format_extension(done) and "re-laid over the new budget" in format_extension(done)
    kept = out / "teacher" / "before-extension-0000003"
    assert json.loads((kept / "result.json").read_text()) == first and (kept / "teacher_eval.csv").exists()
    assert not (out / "teacher" / "result.json").exists() and not (out / "teacher" / "teacher_eval.csv").exists()
    assert json.loads((out / "experiment.json").read_text())["teacher"]["sft_steps"] == 6

    again = extend_teacher(longer)  # the same command again (a resume): nothing moves, nothing is refused
    assert again["again"] and again["checkpoint_step"] == 3 and "already extended to 6 steps" in format_extension(again)
    assert json.loads((kept / "result.json").read_text()) == first
    run_experiment(longer, until="teacher")
    res = json.loads((out / "teacher" / "result.json").read_text())
    assert res["steps"] == 6 and latest_checkpoint(out / "teacher").name == "checkpoint-0000006"
    assert [e["checkpoint_step"] for e in res["extensions"]] == [3]
    rows = pd.read_csv(out / "teacher" / "metrics.csv")
    assert list(rows.step) == [3, 6]  # the first part's row kept, the continuation's appended: one run, resumed
    # the last step ran on the new schedule (by steps here; by CPU-seconds where the budget is minutes)
    assert rows.lr.iloc[-1] == pytest.approx(lr_at(5, _sft_config(longer, longer.teacher, out / "teacher")))
    assert (out / "teacher" / "teacher_eval.csv").exists()  # evaluated afresh
    assert extend_teacher(longer)["again"] and (out / "teacher" / "result.json").exists()  # and after it finished


def _recorded(out, cfg, stages=("teacher",), checkpoint=True):
    """A run folder as the teacher's stage leaves it (no training): record, result, a checkpoint's state."""
    import torch

    out.mkdir(parents=True)
    (out / "experiment.json").write_text(json.dumps(_config_record(cfg)))
    for stage in stages:
        (out / stage).mkdir()
        (out / stage / "result.json").write_text('{"f1": 0.1, "em": 0.0, "seen_f1": 0.2}')
    if checkpoint:
        ckpt = out / "teacher" / "checkpoint-0000003"
        ckpt.mkdir()
        torch.save({"step": 3, "elapsed": (10.0, 20.0)}, ckpt / "trainer_state.pt")
        (out / "teacher" / "latest").write_text(ckpt.name)


@pytest.mark.parametrize("change, says", [
    (dict(steps=3), "budget is unchanged"),
    (dict(steps=2), r"may only grow; teacher.sft_steps 3 -> 2"),
    (dict(steps=6, vocab=401), r"these differ too: vocab 400 -> 401"),
    (dict(steps=6, teacher=ModelSpec(hidden=64, layers=1, heads=2, sft_steps=6, sft_minutes=None, sft_episodes=4)),
     r"these differ too: teacher.hidden 32 -> 64"),
])
def test_anything_but_a_larger_budget_is_refused_by_name_and_nothing_moves(tmp_path, change, says):
    pytest.importorskip("torch")
    out = tmp_path / "run"
    _recorded(out, _tiny(out))
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    with pytest.raises(SettingsMismatchError, match=says):
        extend_teacher(_tiny(out, **change))
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_stages_made_from_the_teacher_a_linked_teacher_or_no_checkpoint_are_refused(tmp_path):
    pytest.importorskip("torch")
    started = tmp_path / "started"
    _recorded(started, _tiny(started), stages=("teacher", "student"))
    (started / "arms").mkdir()
    with pytest.raises(SettingsMismatchError, match=r"the student's start .*, the arms; they would describe"):
        extend_teacher(_tiny(started, steps=6))
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "experiment.json").write_text(json.dumps(_config_record(_tiny(linked))))
    (linked / "teacher").symlink_to(started / "teacher", target_is_directory=True)
    with pytest.raises(SettingsMismatchError, match="is linked from .*extend the teacher in the run that made it"):
        extend_teacher(_tiny(linked, steps=6))
    bare = tmp_path / "bare"
    _recorded(bare, _tiny(bare), checkpoint=False)
    with pytest.raises(SettingsMismatchError, match="has no checkpoint to continue"):
        extend_teacher(_tiny(bare, steps=6))
    with pytest.raises(SettingsMismatchError, match="holds no run"):
        extend_teacher(_tiny(tmp_path / "nothing", steps=6))


def test_the_cli_suggests_the_flag_where_only_the_budget_grew_and_extends_with_it(tmp_path, capsys, monkeypatch):
    pytest.importorskip("torch")
    import distill.experiment.cli
    from memenv.cli import main

    monkeypatch.setattr(distill.experiment.cli, "run_experiment", lambda cfg, until=None: pytest.fail("ran"))
    out = tmp_path / "run"
    cfg = powered_config(str(out))
    _recorded(out, dataclasses.replace(cfg, teacher=dataclasses.replace(cfg.teacher, sft_minutes=100.0)))
    args = ["experiment", "memopd", "--powered", "--out", str(out), "--quiet", "--until", "teacher"]
    assert main(args + ["--teacher-minutes", "250"]) == 2
    err = capsys.readouterr().err
    assert "teacher.sft_minutes 100.0 -> 250.0" in err and "add --extend-teacher" in err
    assert main(args + ["--teacher-minutes", "250", "--lr", "1e-3"]) == 2  # an arm setting is free before any arm
    assert "add --extend-teacher" in capsys.readouterr().err
    assert main(args + ["--extend-teacher", "--teacher-minutes", "250", "--teacher-from", str(tmp_path)]) == 2
    assert "takes neither --stages-from nor --teacher-from" in capsys.readouterr().err
    class Reached(Exception):
        pass

    def reached(cfg, until=None):
        raise Reached(cfg.teacher.sft_minutes)

    monkeypatch.setattr(distill.experiment.cli, "run_experiment", reached)
    with pytest.raises(Reached, match="250"):  # the run starts on the extended settings
        main(args + ["--extend-teacher", "--teacher-minutes", "250"])
    said = capsys.readouterr().out
    assert "teacher extended from 100 min to 250 min: its SFT resumes at step 3" in said
    assert json.loads((out / "experiment.json").read_text())["teacher"]["sft_minutes"] == 250.0
    assert (out / "teacher" / "before-extension-0000003" / "result.json").exists()
