"""A checkpoint's prompt settings: the file beside its weights that says which system prompt it was trained with.

Here, below both :mod:`agents.llm.models.local` (which saves and loads them with a checkpoint) and
:mod:`agents.llm.models.pretrained` (which writes them into a converted model's folder), so neither imports the other
for it. Torch-free.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

PROMPT_FILE = "memenv_prompt.json"  # a checkpoint's prompt settings (system prompt), read by load_pretrained


def read_prompt_settings(path: str | os.PathLike) -> dict[str, Any]:
    """The prompt settings saved with a checkpoint (``{"system_prompt": ...}``), ``{}`` when it has none.

    :func:`agents.llm.models.local.load_pretrained` puts them on the tokenizer (``tokenizer.memenv_prompt``) and
    :func:`agents.llm.models.local.save_pretrained` writes them back, so a model trained with a system prompt is
    sampled, trained further and benchmarked with the same one (``system_prompt="checkpoint"``, the default of
    :class:`agents.llm.generation.policy.LLMPolicy`)."""
    file = Path(path) / PROMPT_FILE
    if not file.is_file():
        return {}
    try:
        settings = json.loads(file.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise ValueError(f"{file}: not valid JSON ({exc})") from None
    prompt = settings.get("system_prompt") if isinstance(settings, dict) else None
    if not isinstance(settings, dict) or not (prompt is None or isinstance(prompt, str)):
        raise ValueError(f"{file}: expected an object with a string 'system_prompt', got {settings!r:.80}")
    return settings
