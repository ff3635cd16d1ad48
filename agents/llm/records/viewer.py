"""``memenv view``: one self-contained HTML page of what an agent kept, invocation by invocation (docs/exchange.md).

    memenv view records.jsonl -o trace.html                      # invocation records (agents.llm.records.invocation)
    memenv view bench_out/trace.jsonl -o trace.html              # episode traces (memenv bench --trace)
    memenv view records.jsonl --teacher runs/teacher -o trace.html  # + a teacher-vs-student heat strip

The page needs no server, no network and no script from elsewhere: the episodes as a list, and per invocation its
prompt (the memory state the policy saw), the memory's diff against the previous invocation, the action, the reward
and the token counts. Records scored by a teacher get a heat strip per response token: the teacher's log-prob of
the sampled token minus the student's (blue: the teacher finds it likelier; red: less likely). Every text is
HTML-escaped; text that cannot be encoded (a lone surrogate) is replaced.

Inputs, told apart by their first line: JSON lines of invocation records, or of *episode traces*
(``{"episode_id", "label", "snapshots": [info["invocation"], ...], "summary": {...}}``, :func:`episode_trace`).
"""

from __future__ import annotations

import argparse
import difflib
import html
import json
import os
import re
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from memenv.cli_common import CommandError, HelpFormatter, check_out_file, require_file
from memenv.files import write_text_atomic

__all__ = ["episode_trace", "load_view_input", "records_view", "register_cli", "render_html", "save_traces",
           "traces_view", "write_view"]


# ------------------------------------------------------------------------------------------------- inputs
def episode_trace(summary: Mapping[str, Any], label: str = "") -> dict[str, Any]:
    """An episode trace from an episode's ``info["summary"]`` (run with ``keep_snapshots=True``)."""
    snapshots = list(summary.get("snapshots") or [])
    episode_id = snapshots[0].get("episode_id", "") if snapshots else ""
    kept = {k: v for k, v in summary.items() if k != "snapshots" and isinstance(v, (str, int, float, bool, type(None)))}
    return {"episode_id": str(episode_id), "label": label, "snapshots": snapshots, "summary": kept}


def save_traces(path: str | os.PathLike, traces: Iterable[Mapping[str, Any]]) -> None:
    """Episode traces as JSON lines, written atomically."""
    write_text_atomic(path, "".join(json.dumps(t, default=repr) + "\n" for t in traces))


def _clean(text: Any) -> str:
    """``text`` as a string that encodes to UTF-8 (lone surrogates replaced)."""
    text = "" if text is None else str(text)
    return text.encode("utf-8", "replace").decode("utf-8")


def _invocation(snapshot: Mapping[str, Any], previous_memory: str | None) -> dict[str, Any]:
    before = _clean(snapshot.get("memory_before"))
    after = _clean(snapshot.get("memory_after"))
    return {"turn": snapshot.get("turn"), "prompt": _clean(snapshot.get("observation")),
            "memory_before": before, "memory_after": after,
            "previous_memory": before if previous_memory is None else previous_memory,
            "action": _clean(snapshot.get("action")), "reward": snapshot.get("reward"),
            "tool": _clean(snapshot.get("tool")), "error": _clean(snapshot.get("error")),
            "valid": snapshot.get("valid", True), "context_tokens": snapshot.get("context_tokens")}


def traces_view(traces: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Episode traces as the page's episodes."""
    episodes = []
    for t in traces:
        invocations, previous = [], None
        for snap in t.get("snapshots") or []:
            inv = _invocation(snap, previous)
            previous = inv["memory_after"]
            invocations.append(inv)
        title = " ".join(x for x in (_clean(t.get("label")), _clean(t.get("episode_id"))) if x)
        episodes.append({"title": title, "summary": dict(t.get("summary") or {}), "invocations": invocations})
    return episodes


def records_view(records: Sequence[Any], teacher: Mapping | None = None, tokenizer=None) -> list[dict[str, Any]]:
    """Invocation records (:class:`agents.llm.records.invocation.InvocationRecord`) as the page's episodes; ``teacher``
    (uid -> :class:`agents.llm.records.exchange.TeacherScores`) adds the heat strip, its tokens decoded by ``tokenizer``
    (token ids shown without one)."""
    from agents.llm.records.exchange import episode_key, ordered

    episodes: dict[str, dict[str, Any]] = {}
    previous: dict[str, str] = {}
    for r in ordered(records):
        key = episode_key(r)
        title = " · ".join(x for x in (f"seed {r.seed}" if r.seed is not None else "",
                                        f"group {r.group}" if r.group is not None else "",
                                        f"episode {r.episode_id}", f"rollout {r.rollout_id}" if r.rollout_id else "")
                           if x)
        ep = episodes.setdefault(key, {"title": title, "summary": {"return": r.episode_return}, "invocations": []})
        snap = dict(r.snapshot or {})
        snap.setdefault("turn", r.turn)
        snap.setdefault("reward", r.reward)
        inv = _invocation(snap, previous.get(key))
        previous[key] = inv["memory_after"]
        inv.update(prompt_tokens=len(r.prompt_ids), response_tokens=len(r.response_ids),
                   memory_tokens=sum(r.memory_mask))
        scores = None if teacher is None else teacher.get(r.uid)
        if scores is not None:
            texts = ([_clean(tokenizer.decode([t], skip_special_tokens=False)) for t in r.response_ids]
                     if tokenizer is not None else [f"[{t}]" for t in r.response_ids])
            inv["heat"] = [(text, float(t) - float(s)) for text, t, s in
                           zip(texts, scores.logprobs, r.response_logprobs)]
        ep["invocations"].append(inv)
    return list(episodes.values())


def load_view_input(path: str | os.PathLike) -> tuple[str, list[Any]]:
    """``("records", records)`` or ``("traces", traces)`` from a JSON-lines file; a ``ValueError`` naming the file
    and line when it is neither."""
    with open(path, "rb") as fh:
        first = next((line for line in fh if line.strip()), None)
    if first is None:
        raise ValueError(f"{path}: empty (expected JSON lines of invocation records or episode traces)")
    try:
        data = json.loads(first.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        data = None
    if isinstance(data, dict) and "prompt_ids" in data:
        from agents.llm.records.invocation import load_records

        return "records", load_records(path)
    if isinstance(data, dict) and "snapshots" in data:
        traces = []
        with open(path, "rb") as fh:
            for number, raw in enumerate(fh, start=1):
                if not raw.strip():
                    continue
                try:
                    trace = json.loads(raw.decode("utf-8"))
                except (UnicodeDecodeError, json.JSONDecodeError) as exc:
                    cut = "" if raw.endswith(b"\n") else "; the file ends inside it (cut?)"
                    raise ValueError(f"{path} line {number}: not a JSON episode trace ({exc}{cut})") from None
                if not isinstance(trace, dict) or not isinstance(trace.get("snapshots"), list):
                    raise ValueError(f"{path} line {number}: not an episode trace (no snapshots list)")
                bad = next((i for i, snap in enumerate(trace["snapshots"]) if not isinstance(snap, dict)), None)
                if bad is not None:
                    raise ValueError(f"{path} line {number}: snapshot {bad} is not a JSON object (an invocation's "
                                     "info['invocation'])")
                if "summary" in trace and not isinstance(trace["summary"], (dict, type(None))):
                    raise ValueError(f"{path} line {number}: its summary is not a JSON object")
                traces.append(trace)
        return "traces", traces
    raise ValueError(f"{path} line 1: neither an invocation record (prompt_ids) nor an episode trace (snapshots)")


# ------------------------------------------------------------------------------------------------- the page
_STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:0;display:flex;color:#222}
nav{width:16rem;flex:none;height:100vh;overflow:auto;position:sticky;top:0;border-right:1px solid #ccc;padding:.5rem}
nav a{display:block;color:#225;text-decoration:none;padding:2px 0;overflow-wrap:anywhere}
main{flex:1;padding:.5rem 1rem;min-width:0}
.episode{border-top:2px solid #888;margin-top:1rem}
.invocation{border:1px solid #ccc;border-radius:4px;margin:.5rem 0;padding:.3rem .6rem}
.meta{color:#555;font-size:12px}
pre{white-space:pre-wrap;overflow-wrap:anywhere;background:#f6f6f6;padding:.3rem;margin:.2rem 0;max-height:24rem;overflow:auto}
ins{background:#cfc;text-decoration:none}del{background:#fcc}
.heat span{white-space:pre-wrap;border-right:1px solid #fff}
.bad{color:#a00}
"""

# Counts what the page shows once it has loaded (the headless-browser test reads them back from the DOM).
_SCRIPT = """
document.addEventListener('DOMContentLoaded',function(){
 var n=document.querySelectorAll('section.invocation').length;
 var e=document.querySelectorAll('section.episode').length;
 document.getElementById('counts').textContent=e+' episodes, '+n+' invocations';
 document.body.setAttribute('data-invocations',String(n));
});
"""


def _e(text: Any) -> str:
    return html.escape(_clean(text), quote=True)


#: How a memory is cut for the diff, coarse to fine: lines, sentences (and the spaces after them), words (and the
#: spaces between them). Each finer level runs only inside a block the coarser one found changed.
_DIFF_LEVELS = (r"[^\n]*\n|[^\n]+", r"[^.!?;\n]*[.!?;]+\s*|[^.!?;\n]+\s*|\s+", r"\s+|\S+")
#: The most unit pairs (len(a) x len(b)) each level's matcher compares (lines, sentences, words); a block beyond it
#: is matched at the next finer level, and at the word level shown whole (deleted, then inserted): difflib's matcher
#: grows faster than quadratically in repeated units (a 17 KB memory diffed word by word took ~9 minutes), so the caps
#: bound the page's cost (benchmarks/viewer_diff.py: a 100 KB memory in well under a second).
DIFF_MAX_PAIRS = (4_000_000, 1_000_000, 200_000)


def _diff_units(a: list[str], b: list[str], level: int, out: list[str]) -> None:
    """Appends the diff of units ``a`` -> ``b`` (cut at ``_DIFF_LEVELS[level]``) to ``out``."""
    finest = level + 1 == len(_DIFF_LEVELS)
    if not a or not b or (finest and len(a) * len(b) > DIFF_MAX_PAIRS[level]):  # nothing to match, or too large
        if a:
            out.append(f"<del>{_e(''.join(a))}</del>")
        if b:
            out.append(f"<ins>{_e(''.join(b))}</ins>")
        return
    if len(a) * len(b) > DIFF_MAX_PAIRS[level]:  # too many units to match at this level: match finer ones instead
        _diff_units(re.findall(_DIFF_LEVELS[level + 1], "".join(a)), re.findall(_DIFF_LEVELS[level + 1], "".join(b)),
                    level + 1, out)
        return
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if op == "equal":
            out.append(_e("".join(a[i1:i2])))
        elif finest or i1 == i2 or j1 == j2:  # words, or a pure deletion or insertion: shown as it is
            if i2 > i1:
                out.append(f"<del>{_e(''.join(a[i1:i2]))}</del>")
            if j2 > j1:
                out.append(f"<ins>{_e(''.join(b[j1:j2]))}</ins>")
        else:  # a changed block: finer inside it
            _diff_units(re.findall(_DIFF_LEVELS[level + 1], "".join(a[i1:i2])),
                        re.findall(_DIFF_LEVELS[level + 1], "".join(b[j1:j2])), level + 1, out)


def memory_diff(before: str, after: str) -> str:
    """The change from ``before`` to ``after`` as escaped HTML with ``<del>``/``<ins>``: line by line, then inside each
    changed block sentence by sentence, then word by word (:data:`_DIFF_LEVELS`), so that a deletion and an insertion
    never interleave across lines and shifted lines stay aligned. Its cost is bounded: no level compares more unit
    pairs than :data:`DIFF_MAX_PAIRS` allows it, a larger changed block at the word level being shown whole (the whole
    old block deleted, the new one inserted). Dropping every ``<ins>`` gives ``before`` back, every ``<del>`` ``after``."""
    out: list[str] = []
    _diff_units(re.findall(_DIFF_LEVELS[0], before), re.findall(_DIFF_LEVELS[0], after), 0, out)
    return "".join(out)


def _heat(cells: Sequence[tuple[str, float]]) -> str:
    spans = []
    for text, delta in cells:
        alpha = min(1.0, abs(delta) / 4.0)
        color = f"rgba(40,90,220,{alpha:.2f})" if delta > 0 else f"rgba(220,50,40,{alpha:.2f})"
        spans.append(f'<span style="background:{color}" title="teacher - student = {delta:+.3f}">{_e(text)}</span>')
    return '<div class="heat">' + "".join(spans) + "</div>"


def _num(value: Any) -> str:
    """A figure as the page shows it: floats to at most 4 significant digits, never "-0"."""
    if isinstance(value, float):
        text = f"{value:.4g}"
        return "0" if text in ("-0", "0") else text
    return _clean(value)


#: What the heat strip's colours mean (shown above it).
HEAT_LEGEND = ("blue: the teacher gives the sampled token a higher log-prob than the student did; red: lower; the "
               "stronger the colour, the larger the difference (full at 4 nats); hover a token for its figure")


def _invocation_html(i: int, j: int, inv: Mapping[str, Any]) -> str:
    counts = [f"turn {_e(inv.get('turn'))}", f"reward {_e(_num(inv.get('reward')))}"]
    for key, name in (("context_tokens", "context tokens"), ("prompt_tokens", "prompt tokens"),
                      ("response_tokens", "response tokens"), ("memory_tokens", "memory tokens")):
        if inv.get(key) is not None:
            counts.append(f"{name} {_e(inv[key])}")
    if inv.get("tool"):
        counts.append(f"tool {_e(inv['tool'])}")
    error = f'<div class="bad">invalid: {_e(inv["error"])}</div>' if not inv.get("valid", True) else ""
    changed = inv["previous_memory"] != inv["memory_after"]
    diff = memory_diff(inv["previous_memory"], inv["memory_after"]) if changed else "<i>unchanged</i>"
    heat = ""
    if inv.get("heat"):
        heat = (f'<div><b>teacher vs student</b> (log-prob difference per response token)</div>'
                f'<div class="meta legend">{_e(HEAT_LEGEND)}</div>' + _heat(inv["heat"]))
    return (f'<section class="invocation" id="ep{i}-inv{j}" data-turn="{_e(inv.get("turn"))}">'
            f'<div class="meta">{" · ".join(counts)}</div>{error}'
            f"<details><summary>prompt (the memory state the policy saw)</summary><pre>{_e(inv['prompt'])}</pre></details>"
            f"<div><b>memory diff</b></div><pre>{diff}</pre>"
            f"<div><b>action</b></div><pre>{_e(inv['action'])}</pre>{heat}</section>")


def render_html(episodes: Sequence[Mapping[str, Any]], title: str = "memenv trace") -> str:
    """The whole page (one string, no external resource)."""
    nav, body = [], []
    for i, ep in enumerate(episodes):
        summary = " · ".join(f"{_e(k)} {_e(_num(v))}" for k, v in (ep.get("summary") or {}).items())
        nav.append(f'<a href="#ep{i}">{_e(ep["title"] or f"episode {i + 1}")} ({len(ep["invocations"])})</a>')
        body.append(f'<section class="episode" id="ep{i}"><h2>{_e(ep["title"] or f"episode {i + 1}")}</h2>'
                    f'<div class="meta">{len(ep["invocations"])} invocations · {summary}</div>'
                    + "".join(_invocation_html(i, j, inv) for j, inv in enumerate(ep["invocations"])) + "</section>")
    total = sum(len(ep["invocations"]) for ep in episodes)
    return ("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; "
            "script-src 'unsafe-inline'; img-src data:\">"
            f"<title>{_e(title)}</title><style>{_STYLE}</style><script>{_SCRIPT}</script></head><body>"
            f"<nav><b>{len(episodes)} episodes</b>{''.join(nav)}</nav>"
            f"<main><h1>{_e(title)}</h1><div id=\"counts\" class=\"meta\">{len(episodes)} episodes, {total} invocations "
            f"(static count)</div>{''.join(body)}</main></body></html>")


def write_view(path: str | os.PathLike, episodes: Sequence[Mapping[str, Any]], title: str = "memenv trace") -> None:
    write_text_atomic(path, render_html(episodes, title))


# ------------------------------------------------------------------------------------------------- CLI
def _run(args: argparse.Namespace) -> int:
    out = check_out_file(args.out, "-o", inputs=[args.input])
    require_file(args.input, "JSON lines of invocation records or episode traces")
    try:
        kind, items = load_view_input(args.input)
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    except OSError as exc:
        raise CommandError(f"{args.input}: cannot read it ({exc.strerror or exc})") from None
    if kind == "records":
        teacher = tokenizer = None
        if args.teacher is not None:
            from agents.llm.records.exchange import teacher_scores
            from agents.llm.records.cli import load_teacher

            model, tokenizer = load_teacher(args.teacher, items)
            teacher = teacher_scores(model, items, tokenizer=tokenizer)
        try:
            episodes = records_view(items, teacher, tokenizer)
        except ValueError as exc:
            raise CommandError(f"{args.input}: {exc}") from None
    else:
        if args.teacher is not None:
            raise CommandError("--teacher needs invocation records (episode traces hold no token ids)")
        episodes = traces_view(items)
    write_view(out, episodes, title=args.title or Path(args.input).name)
    if not args.quiet:
        print(f"{sum(len(e['invocations']) for e in episodes)} invocations of {len(episodes)} episodes -> {out}")
    return 0


def register_cli(subparsers) -> None:
    """Adds ``memenv view`` (entry point group ``memenv.commands``)."""
    p = subparsers.add_parser("view", help="write one self-contained HTML page of episodes, invocation by invocation",
                              description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("input", help="JSON lines of invocation records, or of episode traces (memenv bench --trace)")
    p.add_argument("-o", "--out", default="trace.html", help="the HTML file to write (atomically)")
    p.add_argument("--teacher", default=None,
                   help="records only: a teacher checkpoint with the records' tokenizer (adds the heat strip)")
    p.add_argument("--title", default=None, help="the page's title (default: the input's file name)")
    p.add_argument("--quiet", action="store_true", help="print nothing on success")
    p.set_defaults(func=_run)
