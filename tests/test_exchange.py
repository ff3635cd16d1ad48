"""Invocation records exported to TRL / slime / SkyRL / Tinker / verl / prime-rl rows: round trips, the rows'
own token semantics reproduce the recorded log-probs on the model that sampled them (RCE <= 1e-4), row weights,
teacher payloads, and the CLI's bad-input lines."""

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from llm_common import memqa_envs, memqa_tokenizer, tiny_model  # noqa: E402

from agents.llm.records.exchange import (TARGETS, TeacherScores, export_records, import_rows, ordered,  # noqa: E402
                                         read_export, row_to_json, row_weights, teacher_scores, write_export)
from agents.llm.generation.policy import LLMPolicy  # noqa: E402
from agents.llm.records.invocation import save_records  # noqa: E402
from agents.llm.records.rollouts import records_of, rollout  # noqa: E402
from memenv.cli import main  # noqa: E402

RCE_TOL = 1e-4


@pytest.fixture(scope="module")
def sampled():
    """Records of a tiny model (3 episodes, up to 3 invocations each), with GRPO-like advantages stamped on the
    first two episodes' records and per-token advantages on the third's."""
    tok = memqa_tokenizer()
    model = tiny_model(tok, seed=3)
    policy = LLMPolicy(model, tok, temperature=0.8, max_new_tokens=10, seed=2)
    records = records_of(rollout(policy, memqa_envs(3, max_turns=3), [0, 1, 2], groups=[4, 4, 5]))
    episodes = sorted({r.episode_id for r in records})
    for r in records:
        i = episodes.index(r.episode_id)
        if i < 2:
            r.advantage = [0.5, -0.25][i]
        else:
            r.token_advantages = [0.1 * (t + 1) for t in range(len(r.response_ids))]
    return model, tok, records


def _shuffled(records):
    return list(reversed(records))  # the exporter orders episodes and turns itself


def _exportable(records, target):
    """TRL's rows carry one advantage per row: the episode with per-token advantages stays out."""
    return [r for r in records if r.token_advantages is None] if target == "trl" else records


@pytest.mark.parametrize("target", TARGETS)
def test_rows_round_trip_ids_masks_logprobs_advantages_and_weights(sampled, target, tmp_path):
    _, _, records = sampled
    records = _exportable(records, target)
    for weight in ("token", "row", "episode"):
        rows = export_records(_shuffled(records), target, weight=weight)
        path = tmp_path / f"{target}-{weight}.jsonl"
        write_export(path, rows)
        expected = ordered(_shuffled(records))
        assert [(r.episode_id, r.turn) for r in expected] == sorted(
            [(r.episode_id, r.turn) for r in expected], key=lambda k: ([r.episode_id for r in expected].index(k[0]), k[1]))
        weights = row_weights(expected, weight)
        for back in (import_rows(target, rows), import_rows(target, read_export(path))):
            assert len(back) == len(expected)
            for got, r, w in zip(back, expected, weights):
                assert got.prompt_ids == r.prompt_ids and got.response_ids == r.response_ids
                assert got.action_mask == r.action_mask
                assert got.response_logprobs == pytest.approx(r.response_logprobs, abs=1e-7)  # float32 in TRL/Tinker
                want = r.token_advantages or [r.advantage] * len(r.response_ids)
                assert got.token_advantages == pytest.approx(want, abs=1e-7)
                assert got.weight == pytest.approx(w, rel=1e-6)


def test_weight_policies_mean_what_they_say(sampled):
    _, _, records = sampled
    records = ordered(records)
    token = row_weights(records, "token")
    row = row_weights(records, "row")
    episode = row_weights(records, "episode")
    assert token == [1.0] * len(records)
    for r, w in zip(records, row):  # every invocation sums to 1
        assert w * sum(r.action_mask) == pytest.approx(1.0)
    totals = {}
    for r, w in zip(records, episode):  # every episode sums to 1
        totals[r.episode_id] = totals.get(r.episode_id, 0.0) + w * sum(r.action_mask)
    assert all(t == pytest.approx(1.0) for t in totals.values()) and len(totals) == 3
    with pytest.raises(ValueError, match="weight policy"):
        row_weights(records, "sequence")


def _native(target, row):
    """Each target's own reading of one row: ``(full token ids, {position of a token in the ids: recorded log-prob
    of it})``, from that layout's documented semantics (not through import_rows)."""
    data = row_to_json(row) if not isinstance(row, dict) else row
    if target == "trl":
        ids = data["input_ids"]
        return ids, {i: lp for i, (m, lp) in enumerate(zip(data["completion_mask"], data["old_log_probs"])) if m}
    if target == "slime":
        ids, n = data["tokens"], data["response_length"]
        start = len(ids) - n
        return ids, {start + i: lp for i, (m, lp) in enumerate(zip(data["loss_mask"], data["rollout_log_probs"])) if m}
    if target == "tinker":  # input i predicts target_tokens[i], the token at position i + 1
        inputs, loss = data["model_input"], data["loss_fn_inputs"]
        ids = list(inputs) + [loss["target_tokens"][-1]]
        assert ids[1:] == loss["target_tokens"]
        return ids, {i + 1: lp for i, (w, lp) in enumerate(zip(loss["weights"], loss["logprobs"])) if w > 0}
    if target == "verl":
        p = data["prompt_ids"]
        return p + data["response_ids"], {len(p) + i: lp for i, (m, lp) in
                                          enumerate(zip(data["response_mask"], data["response_logprobs"])) if m}
    if target == "prime":
        t = data["tokens"]
        p = t["prompt_ids"]
        return p + t["completion_ids"], {len(p) + i: lp for i, (m, lp) in
                                         enumerate(zip(t["completion_mask"], t["completion_logprobs"])) if m}
    raise AssertionError(target)


def _skyrl_native(batch):
    for p, r, m, lps in zip(batch["prompt_token_ids"], batch["response_ids"], batch["loss_masks"],
                            batch["rollout_logprobs"]):
        yield p + r, {len(p) + i: lp for i, (mm, lp) in enumerate(zip(m, lps)) if mm}


@pytest.mark.parametrize("target", TARGETS)
def test_each_exported_row_reproduces_the_recorded_logprobs_on_the_sampling_model(sampled, target):
    model, _, records = sampled
    records = _exportable(records, target)
    rows = export_records(records, target)
    if target == "skyrl":
        pairs = list(_skyrl_native(rows[0]))
        assert rows[0]["is_last_step"].count(True) == 3  # one last step per trajectory, steps contiguous
    else:
        pairs = [_native(target, row) for row in rows]
    temperature = records[0].temperature
    worst, scored = 0.0, 0
    model.eval()
    with torch.no_grad():
        for ids, positions in pairs:
            assert positions, "a row with no trained token"
            logits = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0].float() / temperature
            logp = torch.log_softmax(logits, -1)
            for pos, recorded in positions.items():
                worst = max(worst, abs(logp[pos - 1, ids[pos]].item() - recorded))
                scored += 1
    assert scored == sum(sum(r.action_mask) for r in records)
    assert worst <= RCE_TOL, worst


def test_rce_check_sees_a_row_shifted_by_one_token(sampled):
    """The check above is not vacuous: Tinker's targets read one position off give log-probs far off."""
    model, _, records = sampled
    ids, positions = _native("tinker", export_records(records[:1], "tinker")[0])
    logits = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0].float() / records[0].temperature
    logp = torch.log_softmax(logits, -1)
    off = max(abs(logp[pos - 2, ids[pos - 1]].item() - lp) for pos, lp in positions.items())
    assert off > 1e-2


def test_real_classes_where_the_package_installs(sampled):
    _, _, records = sampled
    from trl.experimental.async_grpo.async_rollout_worker import RolloutSample

    grpo = _exportable(records, "trl")
    assert all(isinstance(r, RolloutSample) for r in export_records(grpo, "trl"))
    assert {row.advantage for row in export_records(grpo, "trl")} == {0.5, -0.25}  # one per conversation
    with pytest.raises(ValueError, match="per-token advantages"):
        export_records(records, "trl")
    tinker = pytest.importorskip("tinker")
    datum = export_records(records, "tinker")[0]
    assert isinstance(datum, tinker.types.Datum)
    assert datum.model_input.length == len(records[0].input_ids) - 1 or datum.model_input.length > 0
    assert set(datum.loss_fn_inputs) == {"target_tokens", "logprobs", "weights", "advantages"}


def test_tinker_rows_without_the_package_are_the_datum_layout_as_plain_data(sampled, monkeypatch, tmp_path):
    """Where the tinker package does not install, the exporter writes the same layout as plain dicts: the Datum's
    own fields (its JSON, where tinker is here to compare), which round-trip and read the same tokens."""
    import importlib.util
    import sys

    _, _, records = sampled
    scores = {r.uid: TeacherScores([-1.0] * len(r.response_ids)) for r in records}
    datums = (export_records(records, "tinker", weight="row", teacher=scores)
              if importlib.util.find_spec("tinker") is not None else None)
    monkeypatch.setitem(sys.modules, "tinker", None)  # `from tinker import types` now raises ImportError
    rows = export_records(records, "tinker", weight="row", teacher=scores)
    assert all(type(row) is dict and set(row) == {"model_input", "loss_fn_inputs"} for row in rows)
    assert set(rows[0]["loss_fn_inputs"]) == {"target_tokens", "logprobs", "weights", "advantages", "teacher_logprobs"}
    if datums is not None:
        assert len(datums) == len(rows)
        for datum, row in zip(map(row_to_json, datums), rows):
            assert datum["model_input"] == row["model_input"] and set(datum["loss_fn_inputs"]) == set(row["loss_fn_inputs"])
            for key, values in row["loss_fn_inputs"].items():  # the Datum holds float32 arrays
                assert datum["loss_fn_inputs"][key] == pytest.approx(values, abs=1e-6), key
            assert _native("tinker", datum)[0] == _native("tinker", row)[0]
    path = tmp_path / "tinker.jsonl"
    write_export(path, rows)
    expected = ordered(records)
    back = import_rows("tinker", read_export(path))
    assert [(b.prompt_ids, b.response_ids, b.action_mask) for b in back] == \
        [(r.prompt_ids, r.response_ids, r.action_mask) for r in expected]
    for got, r, w in zip(back, expected, row_weights(expected, "row")):
        assert got.response_logprobs == r.response_logprobs and got.weight == pytest.approx(w, rel=1e-9)


def test_teacher_payload_sampled_logprobs_and_top_k(sampled):
    model, tok, records = sampled
    teacher = tiny_model(tok, seed=11)
    scores = teacher_scores(teacher, records, top_k=3, tokenizer=tok)
    r = ordered(records)[0]
    s = scores[r.uid]
    assert len(s.logprobs) == len(r.response_ids) and all(len(t) == 3 for t in s.top_ids)
    assert all(lp <= top[0] + 1e-6 for lp, top in zip(s.logprobs, s.top_logprobs))  # top-1 is the most likely
    # a teacher other than the sampler: its log-probs differ from the behaviour log-probs
    assert max(abs(a - b) for a, b in zip(s.logprobs, r.response_logprobs)) > 1e-3
    slime = export_records(records, "slime", teacher=scores)[0]
    assert slime["teacher_log_probs"] == s.logprobs and slime["metadata"]["teacher_top_ids"] == s.top_ids
    verl = export_records(records, "verl", teacher=scores)[0]
    assert verl.extra_fields["teacher_logprobs"] == s.logprobs
    prime = export_records(records, "prime", teacher=scores)[0]
    assert prime["extras"]["teacher_top_logprobs"] == s.top_logprobs
    tinker = row_to_json(export_records(records, "tinker", teacher=scores)[0])
    pad = len(r.prompt_ids) - 1
    assert tinker["loss_fn_inputs"]["teacher_logprobs"][pad:] == pytest.approx(s.logprobs, abs=1e-6)
    with pytest.raises(ValueError, match="no teacher scores"):
        export_records(records, "slime", teacher={})
    with pytest.raises(ValueError, match="teacher log-probs for"):
        export_records(records, "verl", teacher={r.uid: TeacherScores([0.0]) for r in records})


def test_records_of_another_tokenizer_are_refused(sampled):
    _, _, records = sampled
    other = [r for r in records]
    import copy

    stray = copy.deepcopy(other[-1])
    stray.tokenizer_fingerprint = "0" * 16
    stray.turn = 99
    with pytest.raises(ValueError, match="another tokenizer"):
        export_records(other + [stray], "verl")
    with pytest.raises(ValueError, match="unknown target"):
        export_records(records, "openrlhf")


def _cli(*args):
    return main(["records", "export", *map(str, args)])


def test_cli_exports_and_refuses_bad_input_with_one_line(sampled, tmp_path, capsys):
    _, _, records = sampled
    path = tmp_path / "records.jsonl"
    save_records(path, records)
    out = tmp_path / "rows.jsonl"
    assert _cli(path, "--to", "prime", "--weight", "row", "--out", out) == 0
    rows = read_export(out)
    assert len(rows) == len(records) and rows[0]["trajectory_id"]
    capsys.readouterr()

    cut = tmp_path / "cut.jsonl"
    cut.write_text(path.read_text()[:-40])
    bad_out = tmp_path / "never.jsonl"
    assert _cli(cut, "--to", "slime", "--out", bad_out) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "cut?" in err and not bad_out.exists()

    mixed = tmp_path / "mixed.jsonl"
    lines = path.read_text().splitlines()
    last = json.loads(lines[-1])
    last["tokenizer_fingerprint"], last["turn"] = "f" * 16, 77
    mixed.write_text("\n".join(lines + [json.dumps(last)]) + "\n")
    assert _cli(mixed, "--to", "tinker", "--out", bad_out) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "another tokenizer" in err and not bad_out.exists()

    with pytest.raises(SystemExit) as exc:
        _cli(path, "--to", "openrlhf", "--out", bad_out)
    assert exc.value.code == 2 and "invalid choice" in capsys.readouterr().err and not bad_out.exists()


def test_one_record_check_for_every_reader_names_the_record_and_the_field(tmp_path):
    """Issue 64: per-token lists of another length than the response, token ids beyond 64 bits, a snapshot or gold
    of another shape, a number that is not finite: refused when a record is made or read, naming the record and the
    field; a teacher asked to score an id outside its vocabulary names the record instead of an IndexError."""
    import json as _json

    from agents.llm.records.invocation import InvocationRecord, load_records

    base = dict(episode_id="e", turn=1, prompt_ids=[1, 2], response_ids=[3, 4, 5], response_logprobs=[-1.0] * 3,
                action_mask=[1] * 3, memory_mask=[0] * 3)
    with pytest.raises(ValueError, match=r"turn=1.*token_advantages has 2 values for 3 response tokens"):
        InvocationRecord(**base, token_advantages=[0.1, 0.2])
    with pytest.raises(ValueError, match="snapshot must be a JSON object"):
        InvocationRecord(**base, snapshot=[1, 2])
    cases = {
        "response_ids": ([3, 4, 2**64], "response_ids must be a list of token ids"),
        "token_returns": ([1.0, "x", 2.0], "token_returns must be a list of finite numbers"),
        "advantage": (float("nan"), "advantage must be a finite number"),
        "gold": ([["a"], "b"], "gold must be a list of lists"),
        "snapshot": ("text", "snapshot must be a JSON object"),
    }
    for field, (value, message) in cases.items():
        path = tmp_path / f"{field}.jsonl"
        path.write_text(_json.dumps({**base, field: value}) + "\n")
        with pytest.raises(ValueError, match=message):
            load_records(path)
    torch = pytest.importorskip("torch")
    from agents.llm.records.exchange import teacher_scores
    from llm_common import memqa_tokenizer, tiny_model

    tok = memqa_tokenizer()
    model = tiny_model(tok)
    far = InvocationRecord(**{**base, "response_ids": [3, 4, 10**6]})
    with pytest.raises(ValueError, match=r"turn=1.*token id 1000000 is outside the teacher's vocabulary"):
        teacher_scores(model, [far])
    assert torch.is_tensor(torch.tensor([2**63 - 1]))  # the largest id accepted still fits an int64


def test_records_collect_writes_what_export_and_view_read(tmp_path, capsys):
    """Issue 65: one command rolls a model out and writes invocation records; records export and memenv view read
    them; save_records refuses its arguments swapped; a served model is refused in one line."""
    pytest.importorskip("torch")
    from llm_common import save_tiny_base

    from agents.llm.records.invocation import InvocationRecord, load_records, save_records
    from memenv.cli import main

    save_tiny_base(tmp_path / "model")
    out = tmp_path / "records.jsonl"
    assert main(["records", "collect", "--model", str(tmp_path / "model"), "--env", "MemQA-v0", "--kw",
                 "objectives=1", "hops=1", "max_turns=2", "-n", "3", "--max-new-tokens", "8", "--out", str(out),
                 "--quiet"]) == 0
    records = load_records(out)
    assert len({r.episode_id for r in records}) == 3 and all(r.gold for r in records)
    assert main(["records", "export", str(out), "--to", "trl", "--out", str(tmp_path / "rows.jsonl"), "--quiet"]) == 0
    assert main(["view", str(out), "-o", str(tmp_path / "page.html"), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["records", "collect", "--model", "openai:m@http://127.0.0.1:9", "--out", str(tmp_path / "x")]) == 2
    assert "carry no token ids" in capsys.readouterr().err
    with pytest.raises(TypeError, match="swapped"):
        save_records(records, tmp_path / "y.jsonl")
    with pytest.raises(TypeError, match="must be InvocationRecords"):
        save_records(tmp_path / "y.jsonl", [{"episode_id": "e"}])
    assert not (tmp_path / "y.jsonl").exists() and isinstance(records[0], InvocationRecord)
