"""Huge single inputs: a BEAM message of many MB is read in bounded memory (cut to MAX_MESSAGE_CHARS, the rest
never held), and huge action texts cost O(1) beyond the text itself; nothing raises."""

from __future__ import annotations

import json
import os
import random
import sys
import tracemalloc
from pathlib import Path

import pytest

import tasks.beam.chat as beam  # the piecewise reader's threshold is patched where it is read
from memenv.context import count_words, fit_context, truncate_left, truncate_right
from memenv.envs.beam import MemDialogBeamEnv
from memenv.protocol import MAX_ACTION_CHARS, parse_action
from tasks.beam import MAX_MESSAGE_CHARS, BeamConversation, cut_marker, iter_chat_batches

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from huge_inputs import write_chat  # noqa: E402 - the benchmark's streaming writer of a chat with one huge message

MB = 2**20


# ------------------------------------------------------------------------------------------ the piecewise reader
def _nasty_text(rng: random.Random, n: int, lone_surrogates: bool) -> str:
    """Text whose JSON encoding has every kind of escape: quotes, backslashes, control characters, non-ASCII
    and astral characters (surrogate pairs under ensure_ascii; lone surrogates there too), runs of backslashes."""
    pool = ['"', "\\", "\\\\", "\n", "\t", "\x01", "é", "€", "💥", "a", "b", " ", "\\u12", "\\\"", "x" * 30]
    pool += ["\ud800", "\udfff"] if lone_surrogates else []
    return "".join(rng.choice(pool) for _ in range(n))


def _write(path: Path, batches: list, ensure_ascii: bool) -> Path:
    path.write_text(json.dumps(batches, ensure_ascii=ensure_ascii), encoding="utf-8")
    return path


def _chat(rng: random.Random, sizes: list[int], lone_surrogates: bool) -> list:
    return [{"batch_number": b, "time_anchor": "2024-01-01",
             "turns": [[{"role": "user", "id": f"{b}.{k}", "index": k, "content": _nasty_text(rng, n, lone_surrogates)}]
                       for k, n in enumerate(sizes)]} for b in range(3)]


def _contents(path: Path, **kwargs) -> list[tuple[str, int]]:
    return [(m.content, m.cut_chars) for b in iter_chat_batches(path, **kwargs) for m in b.messages]


@pytest.mark.parametrize("ensure_ascii", [True, False])
@pytest.mark.parametrize("seed", range(4))
def test_piecewise_reader_gives_what_the_whole_decode_gives(tmp_path, monkeypatch, seed: int, ensure_ascii: bool) -> None:
    """Forced onto the piecewise path (tiny buffer threshold, 7-character reads, so every escape and
    surrogate pair is split by a read somewhere), the reader returns exactly the contents json.load does, and
    cuts long messages exactly where the whole decode cuts them."""
    rng = random.Random(seed)
    batches = _chat(rng, [0, 3, 40, 400], lone_surrogates=ensure_ascii)
    path = _write(tmp_path / "chat.json", batches, ensure_ascii)
    decoded = json.loads(path.read_text(encoding="utf-8"))  # (a lone high and low surrogate decode as one pair)
    expected = [(m["content"], 0) for b in decoded for t in b["turns"] for m in t]
    assert _contents(path) == expected
    whole_cut = _contents(path, max_message_chars=50)
    assert whole_cut != expected  # the 400-piece messages are over 50 characters
    monkeypatch.setattr(beam, "_HUGE_BATCH_CHARS", 16)
    assert _contents(path, read_size=7) == expected
    assert _contents(path, read_size=7, max_message_chars=50) == whole_cut
    for content, cut in whole_cut:
        if cut:
            original = next(c for c, _ in expected if c.startswith(content[:50]) and len(c) == 50 + cut)
            assert content == original[:50] + cut_marker(cut)


def test_piecewise_reader_names_the_batch_of_a_broken_string(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(beam, "_HUGE_BATCH_CHARS", 16)
    path = tmp_path / "chat.json"
    good = json.dumps({"batch_number": 1, "turns": [[{"role": "user", "id": 1, "content": "fine"}]]})
    long = "y" * 100
    for broken, words in [('"a\\qb"}]]}]', "invalid JSON .*escape"), (f'"{long}\\q{long}"}}]]}}]', "invalid JSON in a string"),
                          ('"a\x01b"}]]}]', "invalid JSON .*control character"), (f'"{long}', "ends inside a string")]:
        path.write_text(f'[{good}, {{"batch_number": 2, "turns": [[{{"role": "user", "id": 2, "content": {broken}',
                        encoding="utf-8")
        with pytest.raises(beam.DataFormatError, match=rf"chat.json: batch 1: .*{words}"):
            list(iter_chat_batches(path, read_size=5, max_message_chars=50))


# ------------------------------------------------------------------------------------------ a huge BEAM message
MESSAGE_MB = 16


@pytest.fixture(scope="module")
def huge_chat(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("huge") / "conv"
    write_chat(str(path), 0, MESSAGE_MB * MB)
    return path


def _episode_peak(path: Path) -> tuple[float, str]:
    """Peak traced allocation of reset plus reading every session of the conversation at ``path`` (the env
    made first, outside the trace), and the first observation. (Their times: benchmarks/huge_inputs.py; a
    test that asserted seconds would fail on a loaded machine.)"""
    env = MemDialogBeamEnv(data_path=str(path), keep_snapshots=False)
    tracemalloc.start()
    try:
        obs, _ = env.reset(seed=0)
        while env.unwrapped._phase == "read":
            env.step("<next/>")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak, obs


def test_a_huge_message_is_read_in_bounded_memory(huge_chat: Path, tmp_path: Path) -> None:
    """One 16 MiB message: a reset (which opens the conversation, streaming it once to count it, then reads
    its first batch) and the steps through every session allocate at most 24 MiB more at any time than the same
    chat without it. The arithmetic: the whole-batch buffer stops at _HUGE_BATCH_CHARS (1 Mi characters, 1 byte
    each here; copied while it grows: 2 MiB), then the message is decoded in 256 Ki reads into a kept head of
    MAX_MESSAGE_CHARS (1 MiB; joined, re-encoded, the batch text and its decode: 4 MiB), and the env shows one
    session (~1 MiB of text, about five copies, two of them 2 bytes a character for the "…" marks: 9 MiB):
    ~15 MiB. The old reader held the message several times over (a 16 MiB buffer, 16 MiB decoded, a list of its
    ~3M words: ~200 MiB)."""
    plain = tmp_path / "plain"
    write_chat(str(plain), 0, 0)
    MemDialogBeamEnv(chat_tokens=4_000)  # builds the shared Text space outside the trace
    base, _ = _episode_peak(plain)
    peak, obs = _episode_peak(huge_chat)
    assert peak - base < 24 * MB, f"peak {peak / MB:.1f} MiB, {base / MB:.1f} MiB without the huge message"
    first = next(BeamConversation.open(huge_chat).iter_batches()).messages[0]
    assert len(first.content) == MAX_MESSAGE_CHARS + len(cut_marker(first.cut_chars))
    assert first.cut_chars == MESSAGE_MB * MB - MAX_MESSAGE_CHARS
    assert "more characters of this message not loaded" in obs and len(obs) <= 1_000_000


# ------------------------------------------------------------------------------------------ huge actions
ACTION_MB = 10
_HUGE_ACTION = ("lorem ipsum dolor sit amet " * (ACTION_MB * MB // 27 + 1))[: ACTION_MB * MB]


@pytest.mark.parametrize("wrap", ["<mem_add>{}</mem_add>", "<mem_add>{}", "{}", "<mem_search>{}</mem_search>",
                                  "<answer>{}</answer>"])
def test_a_huge_action_is_refused_in_constant_memory(wrap: str) -> None:
    """A 10 MB action is over the action space's length: refused (invalid, state unchanged) without reading
    it, so the step allocates a few kB whatever the action's size (the text itself is the caller's)."""
    env = MemDialogBeamEnv(chat_tokens=4_000)
    env.reset(seed=0)
    action = wrap.format(_HUGE_ACTION)
    tracemalloc.start()
    try:
        _, reward, _, _, info = env.step(action)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    step = info["invocation"]
    assert not step["valid"] and f"{len(action):,} characters" in step["error"] and f"{MAX_ACTION_CHARS:,}" in step["error"]
    assert step["action"] is action  # recorded as given, not copied
    assert peak < 2 * MB, f"peak {peak / MB:.2f} MiB"


def test_parse_action_refuses_text_over_the_limit_and_accepts_it_at_the_limit() -> None:
    at_limit = "<memory>m</memory><answer>" + "a" * (MAX_ACTION_CHARS - 35) + "</answer>"
    assert len(at_limit) == MAX_ACTION_CHARS and parse_action(at_limit).valid
    over = parse_action(at_limit + " ")
    assert not over.valid and "100,001 characters" in over.error
    assert parse_action("x" * 50, max_chars=10).error.startswith("action is 50 characters")


# ------------------------------------------------------------------------------------------ counting and cutting
def _reference_cuts(text: str, budget: int) -> tuple[tuple[str, int], tuple[str, int]]:
    """truncate_left and truncate_right as they were: from the list of every word's position."""
    spans = [(m.start(), m.end()) for m in __import__("re").finditer(r"\S+", text)]
    left = (text, 0) if len(spans) <= budget else (text[spans[len(spans) - budget][0]:], len(spans) - budget)
    right = (text, 0) if len(spans) <= budget else (text[:spans[budget - 1][1]], len(spans) - budget)
    return left, right


@pytest.mark.parametrize("seed", range(3))
def test_piecewise_counting_and_cutting_agree_with_the_word_list(monkeypatch, seed: int) -> None:
    """count_words, truncate_left and truncate_right work on pieces and windows (so a huge text never becomes
    a list of its words); with tiny pieces and windows, words across every edge, they agree with str.split."""
    import memenv.context as context

    monkeypatch.setattr(context, "_PIECE", 7)
    rng = random.Random(seed)
    pool = ["a", "bb", " ", "\n", "\t", "\u3000", "\x1c", "\x85", "xyz" * 30]
    for _ in range(300):
        text = "".join(rng.choice(pool) for _ in range(rng.randint(0, 200)))
        assert count_words(text) == len(text.split())
        for budget in (1, 2, 3, 40):
            monkeypatch.setattr(context, "_WINDOW", rng.randint(1, 9))
            assert (truncate_left(text, budget), truncate_right(text, budget)) == _reference_cuts(text, budget)


def test_counting_a_huge_text_allocates_a_few_pieces() -> None:
    """1 MiB of words (~194k): counting, cutting either end and fitting the context allocate O(piece + budget)
    (a 64 Ki-character piece split into ~12k words of ~55 bytes each: under 1 MiB), not the ~12 MiB of a list
    of every word (and 600 MiB at 50 MiB of text)."""
    text = ("lorem ipsum dolor sit amet " * (MB // 27))
    words = len(text.split())
    tracemalloc.start()
    try:
        assert count_words(text) == words
        kept, dropped = truncate_left(text, 1000)
        assert dropped == words - 1000 and kept == "lorem ipsum dolor sit amet " * 200  # its last 1000 words
        assert truncate_right(text, 1000)[1] == words - 1000
        obs, tokens, cut = fit_context("<task>t</task>", text, 2000)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert tokens <= 2000 and cut == words - tokens + 1 + 1  # the marker's word and the task block's word
    assert peak < 3 * MB, f"peak {peak / MB:.1f} MiB"
