"""Tests for context modes, token counting and the context budget (memenv/context.py)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memenv.context import ContextMode, count_words, fit_context, truncate_left

# ---------------------------------------------------------------------------------------------- ContextMode


@pytest.mark.parametrize(
    "spec, name, window, uses_memory, keeps_transcript",
    [
        ("memory", "memory", 0, True, False),
        ("history", "history", 0, False, True),
        ("none", "none", 0, False, False),
        ("window:1", "window", 1, False, True),
        ("window:12", "window", 12, False, True),
    ],
)
def test_context_mode_parse(spec, name, window, uses_memory, keeps_transcript) -> None:
    mode = ContextMode.parse(spec)
    assert (mode.name, mode.window) == (name, window)
    assert mode.uses_memory is uses_memory
    assert mode.keeps_transcript is keeps_transcript


@pytest.mark.parametrize(
    "spec", ["", "Memory", "hist", "window", "window:", "window:0", "window:-2", "window:x", "window:1.5", "memory "]
)
def test_context_mode_rejects(spec: str) -> None:
    with pytest.raises(ValueError, match="unknown context mode") as err:
        ContextMode.parse(spec)
    assert repr(spec) in str(err.value)


@pytest.mark.parametrize("spec", [None, 3, ["memory"]])
def test_context_mode_rejects_non_strings(spec) -> None:
    with pytest.raises(ValueError, match="context must be a string"):
        ContextMode.parse(spec)


# ---------------------------------------------------------------------------------------------- counting


def test_count_words() -> None:
    assert count_words("") == 0
    assert count_words("  a  b\n\tc ") == 3
    assert count_words("<task>\nx\n</task>") == 3


# ---------------------------------------------------------------------------------------------- truncate_left


def test_truncate_left_default_counter() -> None:
    text = "one two  three\nfour five"
    assert truncate_left(text, 10) == (text, 0)
    assert truncate_left(text, 5) == (text, 0)
    assert truncate_left(text, 3) == ("three\nfour five", 2)
    assert truncate_left(text, 1) == ("five", 4)
    assert truncate_left(text, 0) == ("", 5)
    assert truncate_left("", 3) == ("", 0)


def test_truncate_left_custom_counter() -> None:
    text = "aaa bbb ccc"  # 11 characters
    assert truncate_left(text, 11, counter=len) == (text, 0)
    assert truncate_left(text, 10, counter=len) == ("bbb ccc", 4)
    assert truncate_left(text, 7, counter=len) == ("bbb ccc", 4)
    assert truncate_left(text, 6, counter=len) == ("ccc", 8)
    assert truncate_left(text, 2, counter=len) == ("", 11)  # no word suffix fits
    assert truncate_left(text, 0, counter=len) == ("", 11)


_WORDS = st.lists(st.text(alphabet="abcdefghé😀", min_size=1, max_size=6), max_size=25)
_SEPS = st.sampled_from([" ", "  ", "\n", "\t", " \n"])


@settings(max_examples=200, deadline=None)
@given(words=_WORDS, sep=_SEPS, budget=st.integers(0, 40), use_len=st.booleans())
def test_truncate_left_properties(words: list[str], sep: str, budget: int, use_len: bool) -> None:
    text = sep.join(words)
    counter = len if use_len else None
    count = len if use_len else count_words
    kept, dropped = truncate_left(text, budget, counter)
    assert text.endswith(kept)
    assert count(kept) <= budget
    assert dropped == count(text) - count(kept)
    if count(text) <= budget:
        assert kept == text and dropped == 0
    else:
        # The cut is at a word start, and as late as the budget allows: one more word would not fit.
        cut = len(text) - len(kept)
        if kept:
            assert cut == 0 or text[cut - 1].isspace()
            assert not kept[0].isspace()
        longer = [i for i in range(cut) if i == 0 or (text[i - 1].isspace() and not text[i].isspace())]
        if longer:
            assert count(text[longer[-1]:]) > budget


# ---------------------------------------------------------------------------------------------- fit_context

TASK = "<task>\nQuestion 1: who?\n</task>"  # 5 words
BODY = "\n<memory>\n" + " ".join(f"m{i}" for i in range(30)) + "\n</memory>\n<information>r1 r2 r3</information>"


def test_fit_context_without_budget() -> None:
    text, tokens, dropped = fit_context(TASK, BODY, None)
    assert text == TASK + BODY
    assert tokens == count_words(TASK + BODY)
    assert dropped == 0


def test_fit_context_body_fits() -> None:
    total = count_words(TASK + BODY)
    text, tokens, dropped = fit_context(TASK, BODY, total)
    assert (text, tokens, dropped) == (TASK + BODY, total, 0)
    assert "[…]" not in text


@pytest.mark.parametrize("budget", [6, 7, 10, 20, 30])
def test_fit_context_truncates_body_keeps_task(budget: int) -> None:
    text, tokens, dropped = fit_context(TASK, BODY, budget)
    assert text.startswith(TASK)
    assert tokens <= budget
    assert count_words(text) <= budget
    assert dropped > 0
    rest = text[len(TASK):]
    assert text.endswith("</information>")  # the newest part is kept
    if budget == 6:  # room for one word: the newest word beats the marker
        assert rest == "r3</information>"
        assert count_words(rest) + dropped == count_words(BODY)
    else:
        assert rest.startswith("\n[…] ")  # the cut is marked, on its own line
        # What was kept plus what was dropped is the whole body.
        assert count_words(rest) - 1 + dropped == count_words(BODY)


def test_fit_context_task_alone_too_long_keeps_the_task() -> None:
    # The task block (the questions) is never cut: with no room left, it alone is shown and the overflow is
    # reported honestly in the token count.
    text, tokens, dropped = fit_context(TASK, BODY, 3)
    assert text == TASK
    assert tokens == count_words(TASK) > 3
    assert dropped == count_words(BODY)


@pytest.mark.parametrize("budget", [1, 3, 5, 6])
def test_fit_context_min_body_keeps_the_newest_body(budget: int) -> None:
    text, tokens, dropped = fit_context(TASK, BODY, budget, min_body=4)
    assert text.startswith(TASK)
    assert text.endswith("r2 r3</information>")
    assert tokens == count_words(text) == count_words(TASK) + 4  # marker + the three newest words
    assert "\n[…] " in text
    assert dropped == count_words(BODY) - 3


def test_fit_context_reported_tokens_match_text() -> None:
    # Regression: the cut marker used to be glued to the task block ('</task>[…]'), over-counting by one.
    text, tokens, _ = fit_context(TASK, BODY, 12)
    assert tokens == count_words(text)


def test_fit_context_custom_counter_respects_budget() -> None:
    # Regression: when the room left after the task block was smaller than the marker, the marker overran it.
    task = "<task>abcdef</task>"  # 19 characters
    text, tokens, _ = fit_context(task, "\nhello world this is the body", len(task) + 2, counter=len)
    assert tokens <= len(task) + 2
    assert len(text) <= len(task) + 2


def test_fit_context_custom_counter() -> None:
    task = "<task>abcdef</task>"
    body = "\nhello world this is the body"
    text, tokens, dropped = fit_context(task, body, len(task) + 13, counter=len)
    assert text.startswith(task)
    assert text.endswith("the body")
    assert tokens == len(text) <= len(task) + 13
    assert dropped > 0
    assert "[…]" in text
