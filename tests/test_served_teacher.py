"""The served teacher (``--teacher openai:NAME@URL``) against a stand-in server on 127.0.0.1: a standard-library
HTTP server that answers ``/v1/completions`` with ``prompt_logprobs`` computed by a tiny in-process model, as vLLM
does (it is a stand-in, not vLLM: the real server is tested in tests/test_vllm.py). It checks the scores, the
error cases (another tokenizer, one swapped vocabulary entry, fewer positions), the two losses, and short MemOPD
runs through the trainer and the CLI."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
import gymnasium as gym  # noqa: E402

from llm_common import ENV_KW, memqa_tokenizer, tiny_model  # noqa: E402

from agents.llm.generation.policy import LLMPolicy, sequence_logprobs  # noqa: E402
from agents.llm.records.rollouts import records_of, rollout  # noqa: E402
from distill.losses import DistillLossConfig, distill_loss, reverse_kl  # noqa: E402
from distill.served_teacher import (PROBE, ServedTeacher, ServedTeacherError, ServedTeacherHook,  # noqa: E402
                                    ServedTokenizerMismatch, check_served_options, sampled_reverse_kl_term,
                                    top_k_served_loss, vocabulary_probe)
from distill.teacher import VocabularyMismatchError  # noqa: E402

ENV = {**ENV_KW, "max_turns": 2}


class StandInTeacher:
    """A stand-in OpenAI-compatible teacher server (not vLLM) backed by ``model``.

    ``mode``: ``"ok"``; ``"other_tokenizer"`` (text prompts are tokenized with every id shifted by one, as a
    server with another vocabulary would); ``"fewer"`` (the last prompt position is missing); ``"no_ids"`` (no
    ``prompt_token_ids`` in the reply). ``swap=(k, m)``: text prompts are tokenized with ids k and m exchanged.
    ``corrupt``: called on the last position's entry of every scored prompt (a damaged answer);
    ``tokenize_status``: the status ``POST /tokenize`` answers (404: no such route, as servers other than vLLM)."""

    def __init__(self, model, tokenizer, mode: str = "ok", swap: tuple[int, int] | None = None,
                 corrupt=None, tokenize_status: int = 404) -> None:
        self.model, self.tokenizer, self.mode, self.swap = model.eval(), tokenizer, mode, swap
        self.corrupt, self.tokenize_status, self.tokenize_calls = corrupt, tokenize_status, 0
        self.bodies: list[dict] = []
        self.lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, code: int, payload) -> None:
                data = json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._send(200, {"object": "list", "data": [{"id": "standin"}]})

            def do_POST(self):
                if self.path.rstrip("/") != "/v1/completions":  # an OpenAI-compatible server without vLLM's /tokenize
                    self.rfile.read(int(self.headers["Content-Length"]))
                    with owner.lock:
                        owner.tokenize_calls += self.path.rstrip("/") == "/tokenize"
                    self._send(owner.tokenize_status, {"detail": "Not Found"})
                    return
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with owner.lock:
                    owner.bodies.append(body)
                    reply = owner.answer(body)
                self._send(200, reply)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @torch.no_grad()
    def answer(self, body: dict) -> dict:
        prompt = body["prompt"]
        if isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt, add_special_tokens=bool(body.get("add_special_tokens", True)))
            if self.mode == "other_tokenizer":
                ids = [(i + 1) % len(self.tokenizer) for i in ids]
            if self.swap is not None:  # a tokenizer with two vocabulary entries exchanged
                a, b = self.swap
                ids = [b if i == a else a if i == b else i for i in ids]
        else:
            ids = list(prompt)
        k = int(body.get("prompt_logprobs") or 0)
        logp = torch.log_softmax(self.model(input_ids=torch.tensor([ids])).logits[0].float(), -1)
        positions = [None]
        for t in range(1, len(ids)):
            row = logp[t - 1]
            order = row.argsort(descending=True)
            rank = {int(i): r + 1 for r, i in enumerate(order[:max(k, 1)].tolist())}
            entry = {str(ids[t]): {"logprob": float(row[ids[t]]), "rank": rank.get(ids[t], int((row > row[ids[t]]).sum()) + 1)}}
            for i in order[:k].tolist():
                entry[str(i)] = {"logprob": float(row[i]), "rank": rank[i]}
            positions.append(entry)
        if self.mode == "fewer":
            positions = positions[:-1]
        if self.corrupt is not None and not isinstance(prompt, str):
            self.corrupt(positions[-1], ids[-1])
        choice = {"index": 0, "text": "x", "finish_reason": "length", "prompt_logprobs": positions,
                  "token_ids": [int(logp[-1].argmax())]}
        if self.mode != "no_ids":
            choice["prompt_token_ids"] = ids
        return {"object": "text_completion", "choices": [choice],
                "usage": {"prompt_tokens": len(ids), "completion_tokens": 1}}

    def __enter__(self) -> "StandInTeacher":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _env():
    import memenv  # noqa: F401

    return gym.make("MemQA-v0", **ENV)


def _records(model, tok, n=3):
    policy = LLMPolicy(model, tok, temperature=1.0, max_new_tokens=10, seed=0)
    return records_of(rollout(policy, [_env(), _env()], list(range(n)), groups=[0] * n))


@pytest.fixture(scope="module")
def setup():
    tok = memqa_tokenizer()
    return tok, tiny_model(tok, seed=1), tiny_model(tok, seed=2, initializer_range=0.3)


def test_scores_are_the_teachers_log_probs_at_the_action_tokens(setup):
    tok, student, teacher = setup
    records = _records(student, tok)
    records[0].action_mask = [0] * len(records[0].action_mask)  # a record without action tokens is not sent
    with StandInTeacher(teacher, tok) as server:
        served = ServedTeacher(f"openai:standin@{server.url}", tok, top_k=4, concurrency=3)
        scores = served.score(records)
        bodies = server.bodies
    checks = [b for b in bodies if isinstance(b["prompt"], str)]  # the tokenizer check: text prompts, sent first
    assert bodies[:len(checks)] == checks
    assert sorted(b["prompt"] for b in checks) == sorted([PROBE] + vocabulary_probe(tok)[0])
    assert all(b["add_special_tokens"] is False and b["prompt_logprobs"] is None for b in checks)
    sent = [b["prompt"] for b in bodies[len(checks):]]
    assert sorted(map(tuple, sent)) == sorted(tuple(r.input_ids) for r in records[1:])  # the records' ids as sampled
    assert all(b["max_tokens"] == 1 and b["prompt_logprobs"] == 4 for b in bodies[len(checks):])
    expected = torch.cat([sequence_logprobs(teacher, r.prompt_ids, r.response_ids)[torch.tensor(r.action_mask) == 1]
                          for r in records])
    assert scores.sampled.shape == expected.shape and expected.numel() > 10
    assert (scores.sampled - expected).abs().max() < 1e-5
    # top-k: the teacher's 4 most likely tokens at each action position, by rank
    full = torch.cat([_full_logp(teacher, r)[torch.tensor(r.action_mask) == 1] for r in records])
    top_v, top_i = full.topk(4, dim=-1)
    assert torch.equal(scores.top_ids, top_i) and (scores.top_logp - top_v).abs().max() < 1e-5
    assert scores.tokens == sum(len(r) for r in records[1:])


@torch.no_grad()
def _full_logp(model, record):
    ids = torch.tensor([record.input_ids])
    logits = model(input_ids=ids).logits[0, record.prompt_len - 1:len(record) - 1].float()
    return torch.log_softmax(logits, -1)


def test_a_server_with_another_tokenizer_fails_before_any_work(setup):
    tok, _, teacher = setup
    with StandInTeacher(teacher, tok, mode="other_tokenizer") as server:
        with pytest.raises(ServedTokenizerMismatch, match=f"teacher server {server.url} .*first difference at "
                                                          "position 0") as err:
            ServedTeacher(f"openai:standin@{server.url}", tok)
        assert all(isinstance(b["prompt"], str) for b in server.bodies)  # only the check's texts, nothing scored
    assert isinstance(err.value, VocabularyMismatchError)  # memenv distill prints it as one line, exit 2


def test_a_server_whose_tokenizer_differs_in_one_token_is_caught(setup):
    """Two vocabulary entries swapped (ids k and m, neither in the probe text): the probe alone would pass, the
    whole-vocabulary texts do not."""
    tok, _, teacher = setup
    in_probe = set(tok.encode(PROBE, add_special_tokens=False))
    k, m = [i for i in range(len(tok)) if i not in in_probe and tok.encode(tok.decode([i]), add_special_tokens=False)
            == [i]][-2:]
    with StandInTeacher(teacher, tok, mode="ok", swap=(k, m)) as server:
        with pytest.raises(ServedTokenizerMismatch, match=r"tokenizes part \d of \d of its vocabulary's texts into"):
            ServedTeacher(f"openai:standin@{server.url}", tok)
        probe_reply = server.answer({"prompt": PROBE, "add_special_tokens": False})["choices"][0]
    assert probe_reply["prompt_token_ids"] == tok.encode(PROBE, add_special_tokens=False)  # the old check passed


def test_the_vocabulary_probe_covers_every_id_whose_text_round_trips():
    tok = memqa_tokenizer()
    chunks, coverage = vocabulary_probe(tok, lines_per_chunk=100)
    assert len(chunks) == -(-len(tok) // 100)
    seen = {i for c in chunks for i in tok.encode(c, add_special_tokens=False)}
    round_trips = {i for i in range(len(tok)) if tok.encode(tok.decode([i]), add_special_tokens=False) == [i]}
    assert round_trips <= seen and coverage == len(seen) / len(tok) >= len(round_trips) / len(tok) > 0.7


def test_fewer_positions_or_no_ids_are_clear_errors(setup):
    tok, student, teacher = setup
    records = _records(student, tok, n=2)
    with StandInTeacher(teacher, tok, mode="fewer") as server:
        served = ServedTeacher(f"openai:standin@{server.url}", tok)
        n = len(records[0])
        with pytest.raises(ServedTeacherError, match=rf"returned {n - 1} positions of prompt_logprobs for a prompt "
                                                     rf"of {n} tokens \(expected one per token\)"):
            served.score(records[:1])
    with StandInTeacher(teacher, tok, mode="no_ids") as server:
        with pytest.raises(ServedTeacherError, match="sent no prompt_token_ids for the tokenizer probe"):
            ServedTeacher(f"openai:standin@{server.url}", tok)


def _set_sampled(value):
    def corrupt(entry, token):
        entry[str(token)]["logprob"] = value
    return corrupt


def _set_other_top(value):
    def corrupt(entry, token):
        other = next(k for k, v in entry.items() if k != str(token) and v["rank"] <= 4)
        entry[other]["logprob"] = value
    return corrupt


def _add_top(key):
    def corrupt(entry, token):
        entry[key] = {"logprob": -0.5, "rank": 1}
    return corrupt


@pytest.mark.parametrize("corrupt, top_k, message", [
    (_set_sampled(float("-inf")), None, r"token \d+: log-prob -inf is not a finite log-probability"),
    (_set_sampled(float("nan")), None, r"token \d+: log-prob nan is not a finite log-probability"),
    (_set_sampled(0.5), None, "log-prob 0.5 is not a finite log-probability"),
    (_set_other_top(float("nan")), 4, r"top-k id \d+: log-prob nan is not a finite log-probability"),
    (_set_other_top(float("-inf")), 4, r"top-k id \d+: log-prob -inf is not a finite log-probability"),
    (_add_top("600"), 4, r"top-k id '600' is not an id of the student's vocabulary \(0..599\)"),
    (_add_top("-3"), 4, r"top-k id '-3' is not an id of the student's vocabulary"),
    (_add_top("x"), 4, r"top-k id 'x' is not an id of the student's vocabulary"),
])
def test_a_teacher_answer_that_is_not_a_finite_in_vocabulary_log_prob_is_refused(setup, corrupt, top_k, message):
    tok, student, teacher = setup
    assert len(tok) == 600
    records = _records(student, tok, n=1)[:1]
    records[0].action_mask = [1] * len(records[0].response_ids)
    with StandInTeacher(teacher, tok, corrupt=corrupt) as server:
        served = ServedTeacher(f"openai:standin@{server.url}", tok, top_k=top_k)
        with pytest.raises(ServedTeacherError, match=message):
            served.score(records)


def test_memopd_with_a_teacher_answering_minus_inf_stops_before_anything_is_written(setup, tmp_path):
    """-inf made the distillation loss NaN, and the NaN weights were saved as the latest checkpoint."""
    from distill.trainer import MemOPDConfig, train_memopd

    tok, _, teacher = setup
    student = tiny_model(tok, seed=1)
    with StandInTeacher(teacher, tok, corrupt=_set_sampled(float("-inf"))) as server:
        cfg = MemOPDConfig(env_id="MemQA-v0", env_kwargs=ENV, out_dir=str(tmp_path), algo="grpo", updates=1,
                           episodes_per_update=2, group_size=2, epochs=1, num_minibatches=1, max_new_tokens=6,
                           num_envs=2, eval_every=0, save_every=1, progress=False, distill_coef=1.0,
                           teacher=f"openai:standin@{server.url}")
        with pytest.raises(ServedTeacherError, match="is not a finite log-probability"):
            train_memopd(cfg, model=student, tokenizer=tok)
    assert not list(tmp_path.glob("checkpoint-*")) and not (tmp_path / "latest").exists()
    assert all(torch.isfinite(p).all() for p in student.parameters())


def test_the_tokenizer_check_keeps_the_callers_retries(setup):
    """The /tokenize requests of the tokenizer check used their own retries (2) and timeout (30 s)."""
    tok, _, teacher = setup
    with StandInTeacher(teacher, tok, tokenize_status=503) as server:
        ServedTeacher(f"openai:standin@{server.url}", tok, retries=0, backoff=0.0)
        assert server.tokenize_calls == 1  # one attempt (retries=0), then the completions fallback
    with StandInTeacher(teacher, tok, tokenize_status=503) as server:
        ServedTeacher(f"openai:standin@{server.url}", tok, retries=1, backoff=0.0)
        assert server.tokenize_calls == 2


def test_sampled_reverse_kl_term_has_the_gradient_of_the_reverse_kl():
    """Over every token weighted by pi (the exact expectation of on-policy samples), the surrogate's gradient is
    the gradient of KL(pi || q); its value is the KL itself."""
    torch.manual_seed(0)
    logits = torch.randn(3, 11, requires_grad=True)
    teacher = torch.log_softmax(torch.randn(3, 11), -1)
    logp = torch.log_softmax(logits, -1)
    tokens = torch.arange(11).repeat(3)
    rows = torch.arange(3).repeat_interleave(11)
    student = logp[rows, tokens]
    term, estimate = sampled_reverse_kl_term(student, teacher[rows, tokens], student.detach())
    weight = logp.exp().detach()[rows, tokens]
    surrogate = (weight * term).sum()
    (grad,) = torch.autograd.grad(surrogate, logits)
    exact = reverse_kl(torch.log_softmax(logits, -1), teacher).sum()
    (want,) = torch.autograd.grad(exact, logits)
    assert torch.allclose(grad, want, atol=1e-6)
    assert torch.isclose((weight * estimate).sum(), exact.detach(), atol=1e-6)


@pytest.mark.parametrize("mode", ["tail", "renorm"])
def test_top_k_served_loss_equals_the_in_process_top_k_loss(mode):
    torch.manual_seed(1)
    head = torch.nn.Linear(8, 50, bias=False)
    hidden = torch.randn(9, 8, requires_grad=True)
    teacher = torch.log_softmax(torch.randn(9, 50) * 3, -1)
    cfg = DistillLossConfig(top_k=5, top_k_mode=mode, chunk=4)
    top_v, top_i = teacher.topk(5, dim=-1)
    served = top_k_served_loss(head, hidden, top_v, top_i, cfg)
    local = distill_loss(torch.log_softmax(head(hidden), -1), teacher, cfg)
    assert torch.allclose(served, local, atol=1e-6)
    served.sum().backward()
    assert hidden.grad is not None and hidden.grad.abs().sum() > 0


def test_served_options_that_cannot_work_are_named():
    with pytest.raises(ValueError, match="distill_temperature must be 1"):
        check_served_options(DistillLossConfig(temperature=2.0))
    with pytest.raises(ValueError, match="teacher_reconstruction 'persistent' needs an in-process teacher"):
        check_served_options(DistillLossConfig(), "persistent")
    with pytest.raises(ValueError, match="--loss jsd needs --top-k K"):
        check_served_options(DistillLossConfig(kind="jsd"))
    check_served_options(DistillLossConfig(kind="jsd", top_k=4))


@pytest.mark.parametrize("top_k", [None, 4])
def test_memopd_with_a_served_teacher_trains_the_student(setup, tmp_path, top_k):
    from distill.trainer import MemOPDConfig, train_memopd

    tok, _, teacher = setup
    student = tiny_model(tok, seed=1)
    before = [p.detach().clone() for p in student.parameters()]
    with StandInTeacher(teacher, tok) as server:
        cfg = MemOPDConfig(env_id="MemQA-v0", env_kwargs=ENV, out_dir=str(tmp_path), algo="grpo", updates=2,
                           episodes_per_update=4, group_size=2, epochs=1, num_minibatches=1, lr=3e-3,
                           max_new_tokens=10, num_envs=2, eval_every=0, save_every=100, progress=False,
                           distill_coef=1.0, chunk=16, token_budget=512, top_k=top_k,
                           teacher=f"openai:standin@{server.url}")
        last = train_memopd(cfg, model=student, tokenizer=tok)
        scored = [b for b in server.bodies if isinstance(b["prompt"], list)]
    assert len(scored) >= 8 and all(b["prompt_logprobs"] == (top_k or 0) for b in scored)
    assert "distill_loss" in last and last["teacher_s"] > 0
    assert any((p - q).abs().max() > 0 for p, q in zip(student.parameters(), before))


def test_distill_cli_with_a_served_teacher_of_another_tokenizer_is_one_line(setup, tmp_path, capsys):
    from memenv.cli import main

    tok, _, teacher = setup
    with StandInTeacher(teacher, tok, mode="other_tokenizer") as server:
        code = main(["distill", "--teacher", f"openai:standin@{server.url}", "--out", str(tmp_path / "run"),
                     "--updates", "1", "--quiet", "--kw", "objectives=1", "hops=2"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "tokenizes a probe into" in err and server.url in err
    assert main(["distill", "--teacher", "openai:no-url", "--out", str(tmp_path / "r2")]) == 2
    assert "--teacher: bad served-model strategy 'openai:no-url'" in capsys.readouterr().err
    assert main(["distill", "--teacher", "openai:m@127.0.0.1:1", "--loss", "jsd", "--out", str(tmp_path / "r3")]) == 2
    assert "--loss jsd needs --top-k K" in capsys.readouterr().err
