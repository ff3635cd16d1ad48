"""Tests for the action protocol (memenv/protocol.py)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memenv.protocol import TOOLS, ParsedAction, format_action, parse_action

# ---------------------------------------------------------------------------------------------- valid forms


@pytest.mark.parametrize(
    "text, memory, tool, argument",
    [
        ("<memory>m</memory><search>q</search>", "m", "search", "q"),
        ("<memory> two\nlines </memory><answer> A; B </answer>", "two\nlines", "answer", "A; B"),
        ("<think>hmm</think><memory>m</memory><search>q</search>", "m", "search", "q"),
        ("  <think>x</think>\n<memory>m</memory>\n\n<answer>a</answer>  \n", "m", "answer", "a"),
        ("<memory></memory><search>q</search>", "", "search", "q"),
        ("<memory>m</memory><answer></answer>", "m", "answer", ""),
        # Tags inside a block are its content (non-greedy to the matching closer).
        ("<memory>see <search>x</search> later</memory><search>q</search>", "see <search>x</search> later", "search", "q"),
        ("<memory>é ✓ 😀</memory><search>Zürich</search>", "é ✓ 😀", "search", "Zürich"),
    ],
)
def test_valid_actions(text: str, memory: str, tool: str, argument: str) -> None:
    parsed = parse_action(text)
    assert parsed == ParsedAction(memory=memory, tool=tool, argument=argument)
    assert parsed.valid and parsed.error is None


def test_history_mode_memory_optional() -> None:
    assert parse_action("<search>q</search>", require_memory=False) == ParsedAction(None, "search", "q")
    assert parse_action("<think>t</think><answer>a</answer>", require_memory=False) == ParsedAction(None, "answer", "a")
    assert parse_action("<memory>n</memory><search>q</search>", require_memory=False) == ParsedAction("n", "search", "q")


def test_memory_only_action_when_allowed() -> None:
    parsed = parse_action("<memory> chunk notes </memory>", allow_memory_only=True)
    assert parsed == ParsedAction(memory="chunk notes", tool=None, argument=None)
    assert parsed.valid
    parsed = parse_action("<think>x</think><memory>n</memory>", allow_memory_only=True, tools=("answer",))
    assert parsed == ParsedAction(memory="n")
    # A tool call may still follow.
    parsed = parse_action("<memory>n</memory><answer>a</answer>", allow_memory_only=True, tools=("answer",))
    assert parsed == ParsedAction("n", "answer", "a")


def test_memory_only_rejected_by_default() -> None:
    parsed = parse_action("<memory>m</memory>")
    assert not parsed.valid
    assert parsed.error.startswith("missing tool call")
    assert "<search>" in parsed.error and "<answer>" in parsed.error


# ---------------------------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "text, kwargs, fragment",
    [
        ("<search>q</search>", {}, "missing <memory>"),
        ("<think>t</think><answer>a</answer>", {}, "missing <memory>"),
        ("<memory>m</memory><search>q</search><answer>a</answer>", {}, "exactly one tool call per action, got 2"),
        ("<memory>m</memory><search>a</search><search>b</search>", {}, "exactly one tool call"),
        ("<memory>m</memory><search>q", {}, "unbalanced tag: opening <search>"),
        ("<memory>m<search>q</search>", {}, "unbalanced tag: opening <memory>"),
        ("<memory>m</memory>q</search>", {}, "unbalanced tag: closing </search>"),
        ("<memory>m</memory>hello<search>q</search>", {}, "text outside the protocol tags: 'hello'"),
        ("<memory>m</memory><search>q</search> trailing", {}, "text outside the protocol tags: 'trailing'"),
        ("just some text", {}, "text outside the protocol tags"),
        ("<memory>m</memory><search>   </search>", {}, "empty search query"),
        ("<memory>m</memory><search></search>", {}, "empty search query"),
        ("", {}, "empty action"),
        ("   \n\t ", {}, "empty action"),
        ("<memory>m</memory><search>q</search>", {"tools": ("answer",)}, "<search> is not available here; use <answer>"),
        ("<memory>a</memory><memory>b</memory><search>q</search>", {}, "<memory> must come once"),
        ("<memory>m</memory><search>q</search><memory>n</memory>", {}, "<memory> must come once"),
        ("<memory>m</memory><think>t</think><search>q</search>", {}, "<think> is only allowed once"),
        ("<think>a</think><think>b</think><memory>m</memory><search>q</search>", {}, "<think> is only allowed once"),
        ("<MEMORY>m</MEMORY><search>q</search>", {}, "text outside the protocol tags"),
        ("<memory>m</memory>", {"require_memory": False}, "missing tool call"),
        ("<think>t</think>", {"require_memory": False}, "missing tool call"),
    ],
)
def test_malformed_actions(text: str, kwargs: dict, fragment: str) -> None:
    parsed = parse_action(text, **kwargs)
    assert not parsed.valid
    assert parsed.memory is None and parsed.tool is None and parsed.argument is None
    assert fragment in parsed.error


@pytest.mark.parametrize("value", [None, 3, b"<memory>m</memory><search>q</search>", ["x"], {"a": 1}, 1.5])
def test_non_string_action(value) -> None:
    parsed = parse_action(value)
    assert not parsed.valid
    assert parsed.error == f"action must be a string, got {type(value).__name__}"


def test_stray_text_snippet_is_short() -> None:
    parsed = parse_action("x" * 10_000)
    assert parsed.error.startswith("text outside the protocol tags")
    assert len(parsed.error) < 100


def test_format_action_round_trip() -> None:
    for memory, tool, argument in [("m", "search", "q"), ("", "answer", "a; b"), (None, "search", "z")]:
        text = format_action(memory, tool, argument)
        assert parse_action(text, require_memory=memory is not None) == ParsedAction(memory, tool, argument)
    assert format_action("m") == "<memory>m</memory>"
    assert parse_action(format_action("m"), allow_memory_only=True) == ParsedAction("m")


# ---------------------------------------------------------------------------------------------- properties

_TAG_FRAGMENTS = st.sampled_from(
    [f"<{t}>" for t in ("think", "memory", "search", "answer")]
    + [f"</{t}>" for t in ("think", "memory", "search", "answer")]
    + ["<", ">", "</", "/>", "<memory", "memory>", "<Memory>", "\n", " ", ";", "😀", "\x00", "\ud800"]
)
_TAGGY_TEXT = st.lists(st.one_of(_TAG_FRAGMENTS, st.text(max_size=8)), max_size=30).map("".join)
_FLAGS = st.fixed_dictionaries(
    {
        "require_memory": st.booleans(),
        "allow_memory_only": st.booleans(),
        "tools": st.sampled_from([TOOLS, ("search",), ("answer",)]),
    }
)


def _check_consistent(parsed: ParsedAction, flags: dict) -> None:
    assert isinstance(parsed, ParsedAction)
    if parsed.valid:
        if parsed.tool is None:
            assert flags["allow_memory_only"] and parsed.memory is not None
        else:
            assert parsed.tool in flags["tools"]
            assert isinstance(parsed.argument, str)
            if parsed.tool == "search":
                assert parsed.argument.strip()
        if flags["require_memory"]:
            assert parsed.memory is not None
    else:
        assert isinstance(parsed.error, str) and parsed.error
        assert (parsed.memory, parsed.tool, parsed.argument) == (None, None, None)


@settings(max_examples=300, deadline=None)
@given(text=st.text(), flags=_FLAGS)
def test_parse_never_raises_on_arbitrary_text(text: str, flags: dict) -> None:
    _check_consistent(parse_action(text, **flags), flags)


@settings(max_examples=400, deadline=None)
@given(text=_TAGGY_TEXT, flags=_FLAGS)
def test_parse_never_raises_on_tag_fragments(text: str, flags: dict) -> None:
    _check_consistent(parse_action(text, **flags), flags)


_PLAIN = st.text(alphabet=st.characters(blacklist_characters="<", blacklist_categories=("Cs",)), max_size=30)


@settings(max_examples=200, deadline=None)
@given(memory=_PLAIN, tool=st.sampled_from(TOOLS), argument=_PLAIN, think=st.one_of(st.none(), _PLAIN))
def test_format_then_parse_round_trips(memory: str, tool: str, argument: str, think: str | None) -> None:
    text = ("" if think is None else f"<think>{think}</think>") + format_action(memory, tool, argument)
    parsed = parse_action(text)
    if tool == "search" and not argument.strip():
        assert parsed.error == "empty search query"
    else:
        assert parsed == ParsedAction(memory.strip(), tool, argument.strip())
