"""``memenv view``: one self-contained HTML page of episodes; escaped hostile text; the page opened in a real
headless browser (Debian's chromium; the test skips where it is not installed, CI installs it)."""

import json
import os
import re
import shutil
import subprocess

import pytest

from agents.llm.records.viewer import load_view_input, memory_diff, render_html, save_traces, traces_view, write_view
from memenv.cli import main

HOSTILE = ("<script>document.title='pwned'</script>\"quoted\" 'single' & <b>bold</b> "
           "<img src=x onerror=\"document.title='pwned'\">")


def _trace(n_turns: int, label: str = "hostile", observation: str = HOSTILE) -> dict:
    snapshots = []
    memory = ""
    for t in range(1, n_turns + 1):
        after = f"{memory} fact{t}".strip()
        snapshots.append({"episode_id": f"e-{label}", "turn": t, "observation": observation + f" turn {t}",
                          "memory_before": memory, "memory_after": after,
                          "action": f"<memory>{after}</memory><search>{HOSTILE}</search>", "reward": 0.0,
                          "tool": "search", "valid": True, "error": None, "context_tokens": 10 * t})
        memory = after
    return {"episode_id": f"e-{label}", "label": label, "snapshots": snapshots, "summary": {"f1": 0.5}}


def _hostile_traces() -> list[dict]:
    long_line = "x" * 200_000
    replaced = "bad bytes \ufffd\ufffd here, a lone surrogate \ud800 too"
    return [_trace(3), _trace(2, "long", long_line), _trace(1, "replaced", replaced)]


def test_hostile_text_is_escaped_and_the_page_is_self_contained(tmp_path):
    page = render_html(traces_view(_hostile_traces()), title="<script>x</script>")
    assert "<script>document.title" not in page and "<img src=x" not in page
    assert "&lt;script&gt;document.title=&#x27;pwned&#x27;&lt;/script&gt;" in page
    assert "&quot;quoted&quot;" in page
    assert len(re.findall(r"<script>", page)) == 1  # the page's own counting script, nothing injected
    assert "x" * 200_000 in page  # long lines are kept (wrapped by CSS), not cut
    assert "\ufffd" in page and "\ud800" not in page
    assert not re.search(r"(src|href)=\"(https?:)?//", page)  # nothing loaded from elsewhere
    path = tmp_path / "trace.html"
    write_view(path, traces_view(_hostile_traces()))
    assert path.read_text(encoding="utf-8").count('<section class="invocation"') == 6


def test_memory_diff_marks_what_changed():
    import html as html_module

    for before, after in (("a b c", "a c d"), ("keep this\nold line", "keep this\nnew line\nmore"), ("", "x y")):
        diff = memory_diff(before, after)
        old = re.sub(r"<ins>.*?</ins>", "", diff, flags=re.S).replace("<del>", "").replace("</del>", "")
        new = re.sub(r"<del>.*?</del>", "", diff, flags=re.S).replace("<ins>", "").replace("</ins>", "")
        assert html_module.unescape(old) == before and html_module.unescape(new) == after
    assert "<del>" in memory_diff("a b c", "a c d") and "<ins>d</ins>" in memory_diff("a b c", "a c d")
    assert memory_diff("one\ntwo", "one\nthree") == "one\n<del>two</del><ins>three</ins>"
    assert memory_diff("<x>", "<y>") == "<del>&lt;x&gt;</del><ins>&lt;y&gt;</ins>"


def test_bench_trace_writes_the_page_of_its_cells(tmp_path):
    out = tmp_path / "bench"
    assert main(["bench", "-n", "1", "--quiet", "--strategies", "relevance", "history", "--envs", "MemQA-v0",
                 "--out", str(out), "--trace"]) == 0
    kind, traces = load_view_input(out / "trace.jsonl")
    assert kind == "traces" and len(traces) == 2
    turns = sum(len(t["snapshots"]) for t in traces)
    assert turns >= 2 and all(t["snapshots"] for t in traces)
    page = (out / "trace.html").read_text(encoding="utf-8")
    assert page.count('<section class="invocation"') == turns and "MemQA-v0 · history" in page


def test_records_page_has_prompts_diffs_counts_and_a_teacher_heat_strip(tmp_path):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from llm_common import memqa_envs, memqa_tokenizer, tiny_model

    from agents.llm.records.exchange import teacher_scores
    from agents.llm.generation.policy import LLMPolicy
    from agents.llm.records.invocation import save_records
    from agents.llm.records.rollouts import records_of, rollout
    from agents.llm.records.viewer import records_view

    torch.manual_seed(0)
    tok = memqa_tokenizer()
    model = tiny_model(tok, seed=3)
    records = records_of(rollout(LLMPolicy(model, tok, temperature=0.8, max_new_tokens=8, seed=2),
                                 memqa_envs(2, max_turns=2), [0, 1]))
    scores = teacher_scores(tiny_model(tok, seed=9), records, tokenizer=tok)
    episodes = records_view(records, scores, tok)
    assert sum(len(e["invocations"]) for e in episodes) == len(records)
    page = render_html(episodes)
    assert page.count('<section class="invocation"') == len(records)
    assert page.count('title="teacher - student = ') == sum(len(r.response_ids) for r in records)
    assert f"prompt tokens {len(records[0].prompt_ids)}" in page or "prompt tokens" in page

    path = tmp_path / "records.jsonl"
    save_records(path, records)
    assert load_view_input(path)[0] == "records"
    out = tmp_path / "view.html"
    assert main(["view", str(path), "-o", str(out), "--quiet"]) == 0
    assert out.read_text(encoding="utf-8").count('<section class="invocation"') == len(records)


def test_cli_bad_input_one_line_exit_2_nothing_written(tmp_path, capsys):
    traces = tmp_path / "trace.jsonl"
    save_traces(traces, _hostile_traces())
    out = tmp_path / "page.html"
    assert main(["view", str(traces), "-o", str(out), "--quiet"]) == 0 and out.is_file()
    cut = tmp_path / "cut.jsonl"
    cut.write_text(traces.read_text(encoding="utf-8")[:-500], encoding="utf-8")
    never = tmp_path / "never.html"
    for bad in (cut, tmp_path / "missing.jsonl"):
        assert main(["view", str(bad), "-o", str(never)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and str(bad.name) in err and not never.exists()
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps({"question": "not a trace"}) + "\n")
    assert main(["view", str(other), "-o", str(never)]) == 2
    assert "neither an invocation record" in capsys.readouterr().err and not never.exists()


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.browser
@pytest.mark.skipif(_chromium() is None, reason="needs Debian's chromium (apt-get install chromium; CI installs it)")
def test_the_page_opens_in_a_real_headless_browser(tmp_path):
    traces = _hostile_traces() + [_trace(4, "plain", "plain observation")]
    page = tmp_path / "trace.html"
    write_view(page, traces_view(traces), title="browser test")
    expected = sum(len(t["snapshots"]) for t in traces)
    env = {**os.environ, "HOME": str(tmp_path)}  # chromium writes its profile under HOME: never the user's
    base = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
            f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=3000"]
    dom = subprocess.run(base + ["--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120,
                         env=env, check=True).stdout
    # the page's script ran in the browser (it wrote the counts), and no hostile text ran as script
    assert f'data-invocations="{expected}"' in dom
    assert f"{len(traces)} episodes, {expected} invocations</div>" in dom
    assert "<title>browser test</title>" in dom and "pwned</title>" not in dom
    shot = tmp_path / "trace.png"
    subprocess.run(base + [f"--screenshot={shot}", "--window-size=1200,900", page.as_uri()], capture_output=True,
                   timeout=120, env=env, check=True)
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5_000


def _undiff(diff: str, drop: str) -> str:
    """The text a diff keeps when its ``<drop>`` parts are removed (and the other tags unwrapped)."""
    import html
    import re

    keep = "ins" if drop == "del" else "del"
    text = re.sub(rf"<{drop}>.*?</{drop}>", "", diff, flags=re.DOTALL)
    return html.unescape(text.replace(f"<{keep}>", "").replace(f"</{keep}>", ""))


def test_memory_diff_is_exact_and_bounded_on_long_memories():
    """Issue 64: a long memory rewritten in part or whole still gives a diff from which both texts come back exactly
    (its cost is bounded by DIFF_MAX_PAIRS per level; benchmarks/viewer_diff.py times it); lines shifted by an
    insertion stay aligned (no deletion and insertion interleaved across lines)."""
    import random
    import re

    from agents.llm.records.viewer import DIFF_MAX_PAIRS

    rng = random.Random(0)
    words = [f"w{rng.randrange(500)}" for _ in range(21000)]  # ~100 KB of text, many repeated words
    before = "\n".join(" ".join(words[i:i + 12]) + "." for i in range(0, len(words), 12))
    lines = before.split("\n")
    edited = "\n".join(lines[:50] + ["a new line here."] + [ln.replace("w1 ", "w1x ") for ln in lines[50:]])
    rewritten = " ".join(reversed(words))  # one line, every word moved
    for after in (edited, rewritten, "", before):
        diff = memory_diff(before, after)
        assert _undiff(diff, "ins") == before and _undiff(diff, "del") == after
    assert len(before) > 100_000 and max(DIFF_MAX_PAIRS) <= 4 * 10**6
    # a local edit of a long memory is shown as local: the deleted text is the few words that changed
    deleted = "".join(re.findall(r"<del>(.*?)</del>", memory_diff(before, edited), flags=re.DOTALL))
    assert 0 < len(deleted) < 0.05 * len(before)
    assert memory_diff("a\nb\nc\n", "a\nX\nb\nc\n") == "a\n<ins>X\n</ins>b\nc\n"


def test_a_trace_whose_snapshot_or_summary_is_not_an_object_is_one_line(tmp_path, capsys):
    import json

    from memenv.cli import main

    for name, trace in (("snap", {"snapshots": [{"turn": 1}, "text"]}), ("summ", {"snapshots": [], "summary": [1]})):
        path = tmp_path / f"{name}.jsonl"
        path.write_text(json.dumps(trace) + "\n")
        assert main(["view", str(path), "-o", str(tmp_path / f"{name}.html")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "line 1:" in err[0] and "not a JSON object" in err[0], err
        assert not (tmp_path / f"{name}.html").exists()


def test_the_page_reads_at_a_glance_headings_figures_and_a_legend():
    """Issue 65: a records page heads each episode with its seed, group and episode id; figures show no "-0"; the
    heat strip has a legend saying what its colours mean."""
    from agents.llm.records.exchange import TeacherScores
    from agents.llm.records.invocation import InvocationRecord
    from agents.llm.records.viewer import HEAT_LEGEND, records_view

    r = InvocationRecord("ep7", 1, [1, 2], [3, 4], [-1.0, -2.0], [1, 1], [0, 0], reward=-0.0, episode_return=-0.0,
                         seed=42, group=3, rollout_id="r1")
    page = render_html(records_view([r], {r.uid: TeacherScores([-0.5, -2.5])}), "t")
    assert "seed 42 · group 3 · episode ep7 · rollout r1" in page
    main = page.split("<main>")[1]
    assert ("reward 0<" in main or "reward 0 " in main) and "return 0<" in main
    assert "-0<" not in main and "-0 " not in main
    assert HEAT_LEGEND in page
