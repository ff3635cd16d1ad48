"""Every ```python block of README.md runs, as a person pasting it would (each in a fresh namespace).

Long blocks run with a smaller budget: :data:`SMALLER` rewrites a piece of a block's text (each rewrite
must match, so a README edit cannot silently turn it off). After a block, :data:`CHECKS` asserts what the
README says its variables hold.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)

# block text -> the same with a smaller budget (seconds in CI instead of minutes)
SMALLER = {
    # one short rollout (n_steps=128) instead of 30 of 2,048 steps
    "seed=0).learn(60_000, progress_bar=True)": "seed=0, n_steps=128, batch_size=64).learn(128, progress_bar=True)",
    "num_envs=4,": "num_envs=2,",
}


def readme_blocks() -> list[str]:
    return BLOCK.findall(README.read_text(encoding="utf-8"))


def _vector_recipe(ns: dict) -> None:
    history = ns["history"]
    n = ns["envs"].num_envs
    assert len(history) == 3 and all(len(step) == n for step in history)
    assert history[1] == [None] * n  # the NEXT_STEP reset step: no invocation, and no KeyError reading it
    for step in (history[0], history[2]):
        assert all(s["tool"] == "answer" and s["turn"] == 1 and s["retrieved_ids"] == [] for s in step)
    assert history[0][0]["episode_id"] != history[2][0]["episode_id"]


def _quick_start(ns: dict) -> None:
    invocation = ns["info"]["invocation"]
    assert invocation["tool"] == "search" and invocation["tool_input"] == "Wigei"
    assert len(invocation["retrieved_ids"]) == 3 and invocation["answer_f1"] == []


def _strategy(ns: dict) -> None:
    assert ns["done"] and 0.0 <= ns["info"]["summary"]["f1"] <= 1.0
    assert ns["info"]["summary"]["peak_context_tokens"] <= 800


def _index(ns: dict) -> None:
    invocation = ns["info"]["invocation"]
    assert invocation["tool"] == "search" and invocation["retrieved_ids"][0] == "1"  # Paris ranks first
    assert "capital of France" in ns["obs"]


def _server(ns: dict) -> None:
    invocations = ns["info"]["invocation"]
    assert list(invocations["tool"]) == ["search"] * 4
    assert all("Paris" in text for text in invocations["tool_output"])


def _sb3(ns: dict) -> None:
    assert ns["model"].num_timesteps == 128 and ns["model"].n_steps == 128


CHECKS = {"sub_env_info": _vector_recipe, "<search>Wigei</search>": _quick_start, "make_strategy": _strategy,
          "MaskablePPO": _sb3, "build_index(": _index, "PrefetchSearches(": _server}

# A block that talks to a retrieval server gets one: the test's own (tests/test_remote.py) on a free port.
SERVER_URL = "http://127.0.0.1:8000/retrieve"


def test_readme_has_the_snippets_and_every_rewrite_applies():
    blocks = readme_blocks()
    assert len(blocks) >= 4
    text = "\n".join(blocks)
    for old in SMALLER:
        assert text.count(old) == 1, f"README no longer contains {old!r}: update SMALLER"
    for marker in CHECKS:
        assert any(marker in b for b in blocks), marker


@pytest.mark.parametrize("index", range(len(readme_blocks())),
                         ids=[b.strip().splitlines()[0][:40] for b in readme_blocks()])
def test_readme_snippet_runs(index, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # files a snippet writes land here
    code = readme_blocks()[index]
    if SERVER_URL in code:
        _run_with_server(code, index)
        return
    if "sb3_contrib" in code:
        pytest.importorskip("sb3_contrib")
    for old, new in SMALLER.items():
        code = code.replace(old, new)
    _run(code, index)


def _run_with_server(code: str, index: int) -> None:
    from test_remote import RetrievalServer

    Path("questions.jsonl").write_text('{"question": "Which city is the capital of France?", '
                                       '"golden_answers": ["Paris"]}\n')
    with RetrievalServer() as server:
        _run(code.replace(SERVER_URL, server.url), index)


def _run(code: str, index: int) -> None:
    torch = pytest.importorskip("torch") if "torch" in code else None
    threads = torch.get_num_threads() if torch else None
    ns: dict = {"__name__": f"readme_block_{index}"}
    try:
        exec(compile(code, f"README.md[python block {index}]", "exec"), ns)
    finally:
        if torch:
            torch.set_num_threads(threads)  # the snippet sets 1; leave the test process as it was
    for marker, check in CHECKS.items():
        if marker in code:
            check(ns)
