"""The invocation record (docs/design.md): one model invocation, exact to the token.

An invocation occupies positions ``0 .. len(prompt_ids) + len(response_ids) - 1``, as when it was sampled
(:attr:`InvocationRecord.input_ids`). ``action_mask`` and ``memory_mask`` are aligned with ``response_ids``
(one entry per response token; prompt tokens are never actions): ``action_mask[t] = 1`` for a sampled token
(every response token of :class:`agents.llm.generation.policy.LLMPolicy`), ``memory_mask[t] = 1`` for a sampled token
strictly inside ``<memory>…</memory>`` (the tag tokens themselves are 0; an unclosed ``<memory>`` runs to the end of
the response). :meth:`InvocationRecord.sequence_masks` gives both over the whole sequence.

Masks are computed on ids: when the tags are single tokens (the tiny tokenizers of :mod:`agents.llm.models.local`) by
matching ids, otherwise from the character offsets of the decoded ids (decoding, never re-tokenizing).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Iterable, Sequence

from memenv.files import write_atomic


@dataclass
class InvocationRecord:
    episode_id: str
    turn: int  # 1-based, as in the env snapshot
    prompt_ids: list[int]
    response_ids: list[int]
    response_logprobs: list[float]  # behaviour policy: log_softmax(logits / temperature)[token]
    action_mask: list[int]
    memory_mask: list[int]
    reward: float = 0.0  # env reward of this step (the final F1 on the answering step of MemQA)
    done: bool = False  # last invocation of its episode (terminated or truncated)
    terminated: bool = False
    episode_return: float = 0.0  # sum of the episode's rewards, known once the episode ended
    return_to_go: float = 0.0  # sum_{k>=0} gamma^k r_{turn+k}, over invocations (gamma of the rollout)
    advantage: float | None = None  # sequence-level advantage (GRPO: the trajectory's group-normalised one)
    token_advantages: list[float] | None = None  # per response token (PPO GAE; or GRPO broadcast)
    token_returns: list[float] | None = None  # per response token value targets (PPO)
    values: list[float] | None = None  # per response token old values (PPO)
    temperature: float = 1.0
    finish_reason: str = ""
    seed: int | None = None  # the task seed the episode was reset with
    group: int | None = None  # GRPO group id (episodes sharing a task seed)
    snapshot: dict[str, Any] = field(default_factory=dict)  # info["invocation"] of the env
    # Pooling across updates (records written before these fields existed load with the defaults):
    rollout_id: str = ""  # unique per rollout call: (rollout_id, episode_id, turn) is unique across updates
    gold: list[list[str]] | None = None  # the episode's gold answers: per objective, its accepted answers
    tokenizer_fingerprint: str = ""  # tokenizer_fingerprint() of the tokenizer that made the ids

    def __post_init__(self) -> None:
        n = len(self.response_ids)
        if len(self.response_logprobs) != n or len(self.action_mask) != n or len(self.memory_mask) != n:
            raise ValueError(f"record {self.key}: response_ids ({n}), response_logprobs "
                             f"({len(self.response_logprobs)}), action_mask ({len(self.action_mask)}) and "
                             f"memory_mask ({len(self.memory_mask)}) must have the same length")
        for name in PER_TOKEN_OPTIONAL:  # one value per response token, or none (an exporter writes them row by row)
            values = getattr(self, name)
            if values is not None and len(values) != n:
                raise ValueError(f"{self.describe()}: {name} has {len(values)} values for {n} response tokens")
        if not isinstance(self.snapshot, dict):
            raise ValueError(f"{self.describe()}: snapshot must be a JSON object (the env's info['invocation']), got "
                             f"{type(self.snapshot).__name__}")

    @property
    def key(self) -> tuple[str, int]:
        return (self.episode_id, self.turn)

    @property
    def uid(self) -> tuple[str, str, int]:
        """``(rollout_id, episode_id, turn)``: unique across rollout calls (updates)."""
        return (self.rollout_id, self.episode_id, self.turn)

    def describe(self) -> str:
        """How errors name this record."""
        return f"record (episode_id={self.episode_id!r}, turn={self.turn}, rollout_id={self.rollout_id!r})"

    @property
    def input_ids(self) -> list[int]:
        return list(self.prompt_ids) + list(self.response_ids)

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids)

    def __len__(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)

    def sequence_masks(self) -> tuple[list[int], list[int]]:
        """``(action_mask, memory_mask)`` over ``input_ids`` (0 on the prompt)."""
        pad = [0] * len(self.prompt_ids)
        return pad + list(self.action_mask), pad + list(self.memory_mask)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "InvocationRecord":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


def tokenizer_fingerprint(tokenizer) -> str:
    """A stable hash (16 hex digits) of ``tokenizer``'s vocabulary: every token string with its id, added tokens
    included. Equal fingerprints mean the same ids denote the same tokens (the teacher/student vocabulary check).
    Cached on the tokenizer object."""
    cached = getattr(tokenizer, "_memenv_fingerprint", None)
    if cached is not None:
        return cached
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: (kv[1], kv[0]))
    digest = hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode("utf-8")).hexdigest()[:16]
    try:
        tokenizer._memenv_fingerprint = digest
    except AttributeError:
        pass
    return digest


def _tag_ids(tokenizer, tag: str) -> int | None:
    ids = tokenizer.encode(tag, add_special_tokens=False)
    return ids[0] if len(ids) == 1 and tokenizer.decode(ids) == tag else None


def memory_mask(response_ids: Sequence[int], tokenizer, open_tag: str = "<memory>",
                close_tag: str = "</memory>") -> list[int]:
    """1 for the tokens strictly inside ``open_tag … close_tag`` of ``response_ids`` (see module doc)."""
    ids = list(response_ids)
    cache = getattr(tokenizer, "_memenv_tag_ids", None)
    if cache is None:
        cache = {}
        try:
            tokenizer._memenv_tag_ids = cache
        except AttributeError:
            pass
    if (open_tag, close_tag) not in cache:
        cache[(open_tag, close_tag)] = (_tag_ids(tokenizer, open_tag), _tag_ids(tokenizer, close_tag))
    open_id, close_id = cache[(open_tag, close_tag)]
    mask = [0] * len(ids)
    if open_id is not None and close_id is not None:
        inside = False
        for i, t in enumerate(ids):
            if t == open_id and not inside:
                inside = True
            elif t == close_id and inside:
                inside = False
            elif inside:
                mask[i] = 1
        return mask
    # Multi-token tags: character spans of each token from decoding growing prefixes of the ids.
    ends, prev = [], 0
    for i in range(len(ids)):
        prev = max(prev, len(tokenizer.decode(ids[:i + 1], skip_special_tokens=False)))
        ends.append(prev)
    text = tokenizer.decode(ids, skip_special_tokens=False)
    spans, pos = [], 0
    while True:
        a = text.find(open_tag, pos)
        if a < 0:
            break
        b = text.find(close_tag, a + len(open_tag))
        spans.append((a + len(open_tag), len(text) if b < 0 else b))
        if b < 0:
            break
        pos = b + len(close_tag)
    start = 0
    for i, end in enumerate(ends):
        if any(start < hi and end > lo for lo, hi in spans):
            mask[i] = 1
        start = end
    return mask


def save_records(path: str | os.PathLike, records: Iterable[InvocationRecord]) -> None:
    """JSON lines, one record a line (written atomically). ``save_records(path, records)``: the path first; the
    arguments the other way round (or anything but records) are refused before anything is written."""
    if not isinstance(path, (str, os.PathLike)):
        hint = " (the arguments are (path, records): swapped?)" if isinstance(records, (str, os.PathLike)) else ""
        raise TypeError(f"save_records: path must be a file path, got {type(path).__name__}{hint}")
    records = list(records)
    bad = next((r for r in records if not isinstance(r, InvocationRecord)), None)
    if bad is not None:
        raise TypeError(f"save_records: records must be InvocationRecords, got a {type(bad).__name__}")

    def write(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as fh:
            for r in records:
                fh.write(json.dumps(r.to_dict(), default=_json_default) + "\n")

    write_atomic(Path(path), write)


#: Per-token fields a record may hold (None) or hold one value per response token.
PER_TOKEN_OPTIONAL = ("token_advantages", "token_returns", "values")
#: Token ids are stored as 64-bit integers by every exporter (TRL, Tinker: int64 tensors and arrays).
MAX_TOKEN_ID = 2**63 - 1
#: Fields without a default, and what each must hold (checked when records are loaded from a file).
_REQUIRED = {"episode_id": "a string", "turn": "an integer", "prompt_ids": "a list of token ids",
             "response_ids": "a list of token ids", "response_logprobs": "a list of numbers",
             "action_mask": "a list of 0/1", "memory_mask": "a list of 0/1"}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _field_problem(name: str, value: Any) -> bool:
    """Whether ``value`` is not what the field ``name`` holds."""
    if name == "episode_id":
        return not isinstance(value, str)
    if name == "turn":
        return not _is_int(value)
    if not isinstance(value, list):
        return True
    if name == "response_logprobs":
        return not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)
    if name in ("action_mask", "memory_mask"):
        return not all(v in (0, 1) and not isinstance(v, float) for v in value)
    return not all(_is_int(v) and 0 <= v <= MAX_TOKEN_ID for v in value)


def _finite_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _optional_problem(data: dict[str, Any]) -> str | None:
    """What is wrong with a record's optional fields (a per-token list of another type, a number that is not finite,
    a snapshot or gold of another shape), or None."""
    for name in PER_TOKEN_OPTIONAL:
        value = data.get(name)
        if value is not None and not (isinstance(value, list) and all(_finite_number(v) for v in value)):
            return f"{name} must be a list of finite numbers (one per response token) or null, got {_excerpt(value)}"
    for name in ("reward", "episode_return", "return_to_go", "temperature"):
        if name in data and not _finite_number(data[name]):
            return f"{name} must be a finite number, got {_excerpt(data[name])}"
    if data.get("advantage") is not None and not _finite_number(data["advantage"]):
        return f"advantage must be a finite number or null, got {_excerpt(data['advantage'])}"
    if "snapshot" in data and not isinstance(data["snapshot"], dict):
        return f"snapshot must be a JSON object, got {_excerpt(data['snapshot'])}"
    gold = data.get("gold")
    if gold is not None and not (isinstance(gold, list) and all(
            isinstance(g, list) and all(isinstance(a, str) for a in g) for g in gold)):
        return f"gold must be a list of lists of answers (strings) or null, got {_excerpt(gold)}"
    return None


def load_records(path: str | os.PathLike) -> list[InvocationRecord]:
    """The records of a JSON-lines file (:func:`save_records`). A line that is not a record raises a
    ``ValueError`` naming the file and its line number (1-based, blank lines counted) and what is wrong."""
    records = []
    with open(path, "rb") as fh:  # lines decoded one by one: an error names its own line
        for number, raw in enumerate(fh, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ValueError(f"{path} line {number}: not UTF-8 text (byte {exc.start} of the line)") from None
            if line.strip():
                records.append(_record(line, f"{path} line {number}"))
    return records


def _record(line: str, where: str) -> InvocationRecord:
    """One line of a records file as a record (``where`` names the file and line in errors)."""
    try:
        data = json.loads(line)
    except json.JSONDecodeError as exc:
        cut = "" if line.endswith("\n") else "; the file ends inside it (cut?)"
        raise ValueError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno}{cut})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected a JSON object (an invocation record), got {type(data).__name__}")
    missing = [name for name in _REQUIRED if name not in data]
    if missing:
        raise ValueError(f"{where}: not an invocation record (missing {', '.join(missing)})")
    for name, expected in _REQUIRED.items():
        if _field_problem(name, data[name]):
            raise ValueError(f"{where}: {name} must be {expected}, got {_excerpt(data[name])}")
    problem = _optional_problem(data)
    if problem:
        raise ValueError(f"{where} (episode_id={data['episode_id']!r}, turn={data['turn']}): {problem}")
    try:
        return InvocationRecord.from_dict(data)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: {exc}") from None


def _excerpt(value: Any) -> str:
    text = json.dumps(value, default=repr)
    return text if len(text) <= 60 else text[:57] + "..."


def _json_default(value: Any) -> Any:
    try:
        import numpy as np

        if isinstance(value, np.generic):
            return value.item()
        if isinstance(value, np.ndarray):
            return value.tolist()
    except ImportError:  # pragma: no cover
        pass
    return repr(value)
