"""Reading shell commands out of documentation: shared by the README and documented-command tests."""

from __future__ import annotations


def join_continuations(lines: list[str]) -> list[str]:
    """``lines`` stripped, with each ``\\``-continued line joined to the ones that follow it."""
    joined: list[str] = []
    buffer = ""
    for raw in lines:
        line = raw.strip()
        if line.endswith("\\"):
            buffer += line[:-1] + " "
            continue
        joined.append(buffer + line)
        buffer = ""
    if buffer:
        joined.append(buffer)
    return joined
