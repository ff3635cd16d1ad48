"""The action protocol: ``[<think>…</think>] [<memory>…</memory>] <search>…</search> | <answer>…</answer>``.

Parsing never raises on action text: a malformed action comes back as a :class:`ParsedAction` with
``error`` set to a message a person (or a model) can act on. An action longer than :data:`MAX_ACTION_CHARS`
(the envs' action space) is refused before it is read, so a huge text costs nothing beyond itself.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

TOOLS = ("search", "answer")
#: The longest action text read (characters): the ``max_length`` of the envs' Text action space
#: (``max_action_chars`` of :class:`memenv.envs.base.MemEnvBase`).
MAX_ACTION_CHARS = 100_000
_TAG = re.compile(r"<(/?)(think|memory|search|answer)>")
_OPEN = re.compile(r"<(think|memory|search|answer)>")
_WORD = re.compile(r"\S{1,64}")


@dataclass(frozen=True)
class ParsedAction:
    """A parsed action. ``memory`` is None when the action has no ``<memory>`` block."""

    memory: str | None = None
    tool: str | None = None  # "search" | "answer" | None (memory-only action)
    argument: str | None = None
    error: str | None = None

    @property
    def valid(self) -> bool:
        return self.error is None


def _snippet(text: str, limit: int = 40) -> str:
    """The start of ``text``, whitespace runs collapsed, at most ``limit`` characters (reads O(limit) of it)."""
    parts: list[str] = []
    size, end = 0, None
    for match in _WORD.finditer(text):  # pieces of at most 64 characters: a huge word is not copied whole
        if end is not None and match.start() > end:
            parts.append(" ")
        parts.append(match.group())
        size, end = size + len(match.group()) + 1, match.end()
        if size > limit:
            break
    text = "".join(parts)
    return repr(text if len(text) <= limit else text[: limit - 1] + "…")


def action_too_long(text: str, max_chars: int | None = MAX_ACTION_CHARS) -> str | None:
    """The error for an action text over ``max_chars`` characters (None: no limit), or None."""
    if max_chars is None or len(text) <= max_chars:
        return None
    return (f"action is {len(text):,} characters: over the {max_chars:,} an action may have (the action "
            "space's max_length); nothing of it was read")


def parse_action(text: str, *, require_memory: bool = True, tools: tuple[str, ...] = TOOLS,
                 allow_memory_only: bool = False, max_chars: int | None = MAX_ACTION_CHARS) -> ParsedAction:
    """Parse ``text`` into a :class:`ParsedAction`.

    ``require_memory``: the action must rewrite the memory (compressed-memory modes).
    ``tools``: which tool tags are accepted. ``allow_memory_only``: a lone ``<memory>`` block is a complete
    action (reading envs between chunks). ``max_chars``: a longer text is refused unread (None: no limit).
    """
    if not isinstance(text, str):
        return ParsedAction(error=f"action must be a string, got {type(text).__name__}")
    too_long = action_too_long(text, max_chars)
    if too_long:
        return ParsedAction(error=too_long)
    # One left-to-right scan (linear time even on 100k characters of unclosed tags): each opening tag's
    # block runs to the first matching closing tag; text between blocks must be blank.
    blocks: list[tuple[str, str]] = []
    pos = 0
    while True:
        match = _OPEN.search(text, pos)
        if match is None:
            if text[pos:].strip():
                return ParsedAction(error=_stray(text[pos:]))
            break
        if text[pos:match.start()].strip():
            return ParsedAction(error=_stray(text[pos:match.start()]))
        name = match.group(1)
        close = text.find(f"</{name}>", match.end())
        if close < 0:
            return ParsedAction(error=_stray(text[match.start():]))
        blocks.append((name, text[match.end():close]))
        pos = close + len(name) + 3
    if not blocks:
        return ParsedAction(error="empty action: expected " + _expected(require_memory, tools, allow_memory_only))

    names = [name for name, _ in blocks]
    if names[0] == "think":
        names, blocks = names[1:], blocks[1:]
    if "think" in names:
        return ParsedAction(error="<think> is only allowed once, at the start of the action")
    memory = None
    if names and names[0] == "memory":
        memory = blocks[0][1].strip()
        names, blocks = names[1:], blocks[1:]
    if "memory" in names:
        return ParsedAction(error="<memory> must come once, before the tool call")
    if require_memory and memory is None:
        return ParsedAction(error="missing <memory>…</memory>: every action must rewrite the memory first")
    if not names:
        if allow_memory_only and memory is not None:
            return ParsedAction(memory=memory)
        return ParsedAction(error="missing tool call: expected " + _expected(require_memory, tools, allow_memory_only))
    if len(names) > 1:
        return ParsedAction(error=f"exactly one tool call per action, got {len(names)}: " + ", ".join(f"<{n}>" for n in names))
    tool, argument = names[0], blocks[0][1].strip()
    if tool not in tools:
        return ParsedAction(error=f"<{tool}> is not available here; use " + " or ".join(f"<{t}>" for t in tools))
    if tool == "search" and not argument:
        return ParsedAction(error="empty search query")
    return ParsedAction(memory=memory, tool=tool, argument=argument)


def _stray(fragment: str) -> str:
    tag = _TAG.search(fragment)
    if tag:
        kind = "closing" if tag.group(1) else "opening"
        return f"unbalanced tag: {kind} <{tag.group(1)}{tag.group(2)}> without its pair"
    return f"text outside the protocol tags: {_snippet(fragment)}"


def _expected(require_memory: bool, tools: tuple[str, ...], allow_memory_only: bool) -> str:
    tool_part = " or ".join(f"<{t}>…</{t}>" for t in tools)
    memory_part = "<memory>…</memory> then " if require_memory else "[<memory>…</memory>] then "
    if allow_memory_only:
        return f"<memory>…</memory>, optionally followed by {tool_part}"
    return memory_part + tool_part


def format_action(memory: str | None, tool: str | None = None, argument: str = "") -> str:
    """The canonical text of an action (what scripted agents emit)."""
    text = "" if memory is None else f"<memory>{memory}</memory>"
    if tool is not None:
        text += f"<{tool}>{argument}</{tool}>"
    return text
