"""Every ```python block of README.md and docs/*.md runs, as a person pasting it would (each in a fresh namespace).

Long blocks run with a smaller budget: :data:`SMALLER` rewrites a piece of a block's text (each rewrite
must match exactly once, so an edit cannot silently turn it off). After a block, :data:`CHECKS` asserts what the
page says its variables hold. A block that cannot run here (it needs checkpoints trained for minutes) is listed
in :data:`NOT_RUN` with the reason and the test that covers the same call; every entry must match one block.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from shell_text import join_continuations

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)

# block text -> the same with a smaller budget (seconds in CI instead of minutes)
SMALLER = {
    # one short rollout (n_steps=128) instead of 30 of 2,048 steps
    "seed=0).learn(60_000, progress_bar=True)": "seed=0, n_steps=128, batch_size=64).learn(128, progress_bar=True)",
    "num_envs=4,": "num_envs=2,",
    # 64 and 16 task rows instead of 4,096 and 256
    'memenv_verl_dataset("MemQA-v0", 4096,': 'memenv_verl_dataset("MemQA-v0", 64,',
    'memenv_verl_dataset("MemQA-v0", 256,': 'memenv_verl_dataset("MemQA-v0", 16,',
}

# marker -> why the block is not run here (and what covers it)
NOT_RUN = {
    "train_memopd(cfg": "needs the teacher and student checkpoints of the commands above it (minutes of SFT); "
                        "train_memopd on tiny models is tested in tests/test_distill_trainer.py",
    "environment_factory=functools.partial(MemQAToolEnv": "needs a tool-calling chat model; two GRPO steps of the "
                        "same call on a tiny tool-calling model are tests/test_trl_tools.py",
}


def page_blocks() -> list[tuple[str, str]]:
    """``(page name, block text)`` of every python block, page by page."""
    out = []
    for page in PAGES:
        name = page.relative_to(ROOT).as_posix()
        out += [(name, code) for code in BLOCK.findall(page.read_text(encoding="utf-8"))]
    return out


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


def _beam(ns: dict) -> None:
    env = ns["env"]  # the last one made: the SelfMem loop
    assert env.spec.id == "MemDialog-BEAM-v0" and env.unwrapped.refine_strategy


def _verl_data(ns: dict) -> None:
    import pandas as pd

    train, val = pd.read_parquet("memqa_train.parquet"), pd.read_parquet("memqa_val.parquet")
    assert len(train) == 64 and len(val) == 16
    assert set(train.agent_name) == {"memenv_agent"}
    seeds = lambda df: {row["seed"] for row in df.extra_info}  # noqa: E731
    assert not seeds(train) & seeds(val)  # validation tasks are not training tasks


def _served(ns: dict) -> None:
    import json

    import gymnasium as gym

    local = gym.make("MemQA-v0", objectives=1)
    local.reset(seed=0)
    info = local.step("<memory>Q1: Wigei</memory><search>Wigei</search>")[4]
    assert ns["info"] == json.loads(json.dumps(info)) and ns["info"]["invocation"]["tool"] == "search"


CHECKS = {"sub_env_info": _vector_recipe, "<search>Wigei</search>": _quick_start, "make_strategy": _strategy,
          "MaskablePPO": _sb3, "build_index(": _index, "PrefetchSearches(": _server,
          "refine_strategy=True": _beam, "memenv_verl_dataset(": _verl_data, "connect(server.url)": _served}

# A block that talks to a retrieval server gets one: the test's own (tests/test_remote.py) on a free port.
SERVER_URL = "http://127.0.0.1:8000/retrieve"


def test_pages_have_the_snippets_and_every_rewrite_applies():
    blocks = [code for _, code in page_blocks()]
    assert len(blocks) >= 8
    text = "\n".join(blocks)
    for marker in SMALLER:
        assert text.count(marker) == 1, f"the pages no longer contain {marker!r} once: update SMALLER"
    for marker in NOT_RUN:
        assert sum(marker in b for b in blocks) == 1, f"no single block contains {marker!r}: update NOT_RUN"
    for marker in CHECKS:
        assert any(marker in b for b in blocks), marker
    readme = [code for page, code in page_blocks() if page == "README.md"]
    assert any("<search>Wigei</search>" in b for b in readme)  # the quick start stays on the first page


@pytest.mark.parametrize("index", range(len(page_blocks())),
                         ids=[f"{page}:{code.strip().splitlines()[0][:40]}" for page, code in page_blocks()])
def test_snippet_runs(index, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # files a snippet writes land here
    page, code = page_blocks()[index]
    for marker, reason in NOT_RUN.items():
        if marker in code:
            pytest.skip(f"{page}: {reason}")
    if SERVER_URL in code:
        _run_with_server(code, page, index)
        return
    if "sb3_contrib" in code:
        pytest.importorskip("sb3_contrib")
    if "openenv" in code:
        pytest.importorskip("openenv.core.env_server", reason="openenv not installed: pip install 'memenv[openenv]'")
    if "to_parquet" in code:
        pytest.importorskip("pyarrow")
    for old, new in SMALLER.items():
        code = code.replace(old, new)
    _run(code, page, index)


def _run_with_server(code: str, page: str, index: int) -> None:
    from test_remote import RetrievalServer

    Path("questions.jsonl").write_text('{"question": "Which city is the capital of France?", '
                                       '"golden_answers": ["Paris"]}\n')
    with RetrievalServer() as server:
        _run(code.replace(SERVER_URL, server.url), page, index)


def _run(code: str, page: str, index: int) -> None:
    torch = pytest.importorskip("torch") if "torch" in code else None
    threads = torch.get_num_threads() if torch else None
    ns: dict = {"__name__": f"page_block_{index}"}
    try:
        exec(compile(code, f"{page}[python block {index}]", "exec"), ns)
    finally:
        if torch:
            torch.set_num_threads(threads)  # the snippet sets 1; leave the test process as it was
    for marker, check in CHECKS.items():
        if marker in code:
            check(ns)


LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6} (.+)$", re.MULTILINE)


def _slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = heading.strip().lower().replace("`", "")
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = BLOCK.sub("", re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"), flags=re.DOTALL | re.MULTILINE))
    return {_slug(h) for h in HEADING.findall(text)}


def test_every_relative_link_and_anchor_resolves():
    broken = []
    for page in PAGES:
        for target in LINK.findall(page.read_text(encoding="utf-8")):
            if re.match(r"[a-z]+://", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_every_figure_is_shown_on_a_page():
    shown = {(page.parent / t).resolve() for page in PAGES for t in LINK.findall(page.read_text(encoding="utf-8"))}
    unused = [f.name for f in sorted((ROOT / "docs" / "figures").glob("*.png")) if f.resolve() not in shown]
    assert not unused, f"figures no page shows: {unused}"


def test_pages_name_the_dependency_versions_of_pyproject():
    """A version a page states for a dependency is the one pyproject.toml requires."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    specs = [*project["dependencies"], *(d for group in project["optional-dependencies"].values() for d in group)]
    required = {}
    for spec in specs:
        m = re.match(r"([A-Za-z0-9_.-]+)\s*(>=\s*[0-9][^,;\s]*)", spec)
        if m:
            required[m.group(1).lower()] = m.group(2).replace(" ", "")
    assert {"torch", "transformers", "tokenizers"} <= set(required)
    wrong = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for m in re.finditer(r"\b([a-z][a-z0-9_-]+)(>=[0-9][0-9.]*)", text):
            name, version = m.groups()
            if "pins" in text[max(0, m.start() - 12):m.start()]:  # another package's pin (verl's), not ours
                continue
            if name in required and version != required[name]:
                wrong.append(f"{page.relative_to(ROOT)}: {name}{version}, pyproject: {name}{required[name]}")
    assert not wrong, "\n".join(wrong)


# ------------------------------------------------------------------------------ the README's commands, in order
SHELL_BLOCK = re.compile(r"^```(?:bash|sh|shell)\n(.*?)^```", re.DOTALL | re.MULTILINE)

# a README command -> why it does not run here (each must match one command: an edit cannot silently drop a run)
NOT_RUN_SHELL = {
    "pip install": "installs: the test environment is that install",
    "python -m pytest": "the suite itself",
    "memenv play": "interactive: reads the player's actions from the terminal",
    "memenv train": "minutes of training; the same calls on tiny budgets: tests/test_examples.py (the training chain)",
    "memenv experiment": "the end-to-end experiment: tests/test_experiment.py (slow)",
    "memenv models prepare": "converts the real model (slow): tests/test_real_model.py",
    "smollm2-135m-instruct relevance": "the real model's bench (slow): tests/test_real_model.py",
    "runs/smol_sft": "needs the SFT checkpoint of the train line above (16 min)",
    "memenv distill": "needs trained teacher and student checkpoints (minutes): tests/test_distill_trainer.py",
}
# a smaller budget appended to a command that runs (argparse keeps the last value)
SMALLER_SHELL = {"memenv bench": ["-n", "1", "--quiet"]}


def readme_shell_commands() -> list[str]:
    """The README's shell commands in order: continuations joined, comments dropped, ``&&`` chains split."""
    out = []
    for body in SHELL_BLOCK.findall((ROOT / "README.md").read_text(encoding="utf-8")):
        for line in join_continuations(body.splitlines()):
            line = line.split("  #")[0].strip()  # a trailing comment (two spaces, then #)
            if line and not line.startswith("#"):
                out += [part.strip() for part in line.split("&&")]
    return out


def test_readme_commands_run_in_order_in_one_folder(tmp_path, capsys):
    """A newcomer copying the README's lines one by one into one folder (a fresh checkout) meets no error: the
    cheap commands run here, in order, in one folder, with a smaller episode budget; the others are named in
    NOT_RUN_SHELL with the test that covers them."""
    import subprocess

    from memenv.cli import main

    commands = readme_shell_commands()
    assert len(commands) >= 10
    for marker in NOT_RUN_SHELL:
        assert any(marker in c for c in commands), f"no README command contains {marker!r}: update NOT_RUN_SHELL"
    ran = []
    for command in commands:
        if any(marker in command for marker in NOT_RUN_SHELL):
            continue
        if command.startswith("memenv "):
            argv = shlex.split(command)[1:]
            extra = next((v for k, v in SMALLER_SHELL.items() if command.startswith(k)), [])
            status = main(argv + extra)
            capsys.readouterr()
        else:  # plain shell (a file the next command reads)
            status = subprocess.run(command, shell=True, cwd=tmp_path, timeout=60).returncode
        assert status == 0, f"README command failed in order: {command}"
        ran.append(command)
    assert sum(c.startswith("memenv bench") for c in ran) >= 2 and any("index build" in c for c in ran), ran
    # each bench found a folder of its own (the sweep's settings are not the first bench's)
    assert len([p for p in tmp_path.iterdir() if p.name.startswith("bench_out")]) == 2


def test_ci_runs_the_readmes_test_command_then_the_slow_tests_from_a_used_checkout():
    """.ci/run runs the README's test command as written (so the two cannot drift), then the tests it leaves
    out (`-m slow`), after making a bench_out/ and a runs/ of other settings in the checkout it runs from."""
    command = next(c for c in readme_shell_commands() if c.startswith("python -m pytest"))
    assert '-m "not slow"' in command
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    runs = [i for i, line in enumerate(ci) if command in line]
    slow = [i for i, line in enumerate(ci) if line.startswith("python -m pytest -q -m slow")]
    used = [i for i, line in enumerate(ci) if "--out bench_out" in line or "--out runs/" in line]
    assert runs and slow and len(used) == 2, (runs, slow, used)
    assert max(used) < runs[0] < slow[0]
    assert any(line.startswith("export MEMENV_CACHE=") for line in ci[:runs[0]])  # the tests' cache, named


def test_the_readme_lists_every_registered_env_id_and_the_trl_example():
    from memenv.registration import ENVIRONMENTS

    text = (ROOT / "README.md").read_text()
    missing = [env_id for env_id in ENVIRONMENTS if f"`{env_id}`" not in text]
    assert not missing, missing
    assert "examples/trl_grpo_memqa.py" in text and "GRPOTrainer" in text


def test_readme_reads_at_a_glance():
    """Issue 49: the README stays at most 200 lines; long material goes to docs/ pages it links."""
    lines = (Path(__file__).parent.parent / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; move material into docs/"
