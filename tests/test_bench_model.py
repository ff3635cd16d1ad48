"""``memenv bench --strategies PATH``: a saved checkpoint runs as a greedy LLM strategy beside scripted ones."""

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import pandas as pd  # noqa: E402

from llm_common import ENV_KW, memqa_envs, memqa_tokenizer, tiny_model  # noqa: E402

from agents.llm.models.local import save_pretrained  # noqa: E402
from agents.llm.generation.policy import LLMPolicy  # noqa: E402
from agents.llm.records.rollouts import rollout  # noqa: E402
from agents.scripted.bench import run_bench  # noqa: E402
from memenv.cli import main  # noqa: E402

SPEC = "MemQA-v0:" + ",".join(f"{k}={v}" for k, v in ENV_KW.items()) + ",max_turns=2"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    tok = memqa_tokenizer()
    path = tmp_path_factory.mktemp("model") / "student"
    save_pretrained(tiny_model(tok, seed=3), tok, path)
    return path


def test_checkpoint_runs_beside_scripted_strategies_on_the_same_seeds(checkpoint):
    summary, episodes = run_bench(["relevance", str(checkpoint)], [SPEC], episodes=3, seed=5, progress=False)
    assert list(summary.strategy) == ["relevance", str(checkpoint)]
    model_rows = episodes[episodes.strategy == str(checkpoint)]
    assert list(model_rows.seed) == [5, 6, 7] == list(episodes[episodes.strategy == "relevance"].seed)
    # the bench's figures are those of a greedy rollout of that checkpoint on the same seeds
    from agents.llm.models.local import load_pretrained

    lm, tok = load_pretrained(checkpoint)
    direct = rollout(LLMPolicy(lm, tok, temperature=0.0, max_new_tokens=96), memqa_envs(2, max_turns=2), [5, 6, 7])
    assert list(model_rows.f1) == pytest.approx([ep.f1 for ep in direct])
    assert list(model_rows.peak_context_tokens) == [ep.info["peak_context_tokens"] for ep in direct]
    assert list(model_rows.invocations) == [ep.turns for ep in direct]


def test_cli_accepts_a_model_path_and_writes_one_table(checkpoint, tmp_path, capsys):
    out = tmp_path / "bench"
    assert main(["bench", "--strategies", "keep-all", str(checkpoint), "--envs", SPEC, "-n", "2", "--out", str(out),
                 "--quiet"]) == 0
    table = pd.read_csv(out / "results.csv")
    assert set(table.strategy) == {"keep-all", str(checkpoint)}
    assert str(checkpoint) in capsys.readouterr().out


def test_a_folder_without_config_is_refused_naming_it(tmp_path, capsys):
    empty = tmp_path / "not_a_model"
    empty.mkdir()
    with pytest.raises(SystemExit) as err:
        main(["bench", "--strategies", str(empty), "--out", str(tmp_path / "o")])
    assert err.value.code == 2
    message = capsys.readouterr().err
    assert "not_a_model" in message and "config.json" in message
    assert not (tmp_path / "o").exists()


def test_a_models_bench_bar_shows_tokens_inside_invocations(checkpoint, capsys, monkeypatch):
    """A real model's batch of invocations takes minutes: the bench bar's postfix shows the tokens generated inside
    them as they come (not only after each batch), and the invocations after each batch."""
    from agents.llm.records import rollouts

    monkeypatch.setattr(rollouts._Progress, "REDRAW_S", 0.0)  # report every decoding step, so the text is seen
    seen = []
    real = rollouts._Progress.tokens
    monkeypatch.setattr(rollouts._Progress, "tokens", lambda self, n: (real(self, n), seen.append(self.generated)))
    run_bench([str(checkpoint)], [SPEC], episodes=2, seed=5, progress=True)
    err = capsys.readouterr().err
    assert seen and seen == sorted(seen)
    assert f"{seen[-1]} tokens" in err and "tok/s" in err and "invocations" in err
    import re

    # tokens shown before the first batch of invocations ended (the bar moves inside an invocation)
    assert re.search(r": 0 invocations, [0-9.]+/s, [1-9][0-9]* tokens, [0-9.]+ tok/s", err), err[-500:]
