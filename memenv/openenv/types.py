"""The OpenEnv types of a memenv server: the action, observation and state models, and :func:`jsonable` (an info
dict made JSON-safe)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from openenv.core.env_server import Action, Observation, State
from pydantic import Field


#: Concurrent sessions a server accepts unless told otherwise.
DEFAULT_MAX_SESSIONS = 64


def jsonable(value: Any) -> Any:
    """``value`` as JSON-native data: numpy scalars and arrays to Python numbers and lists, tuples and sets to
    lists, mapping keys to strings, anything else to its ``repr``. memenv's info dicts are already of these types
    (the info contract), so for them this is the identity up to tuples becoming lists."""
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)  # JSON has no NaN/inf: keep them readable
    if isinstance(value, np.generic):
        return jsonable(value.item())
    if isinstance(value, np.ndarray):
        return jsonable(value.tolist())
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [jsonable(v) for v in value]
    return repr(value)


class MemenvAction(Action):
    """One action: ``text`` is the action text of the env's protocol (``"<memory>...</memory><search>...
    </search>"``, ``"<mem_add>...</mem_add>"``). Anything else (a number, a list) reaches the env as it is and is
    an invalid step there, as in-process."""

    text: Any = Field(..., description="the action text, e.g. '<memory>notes</memory><search>query</search>'")


class MemenvObservation(Observation):
    """What a reset or step returns (``reward`` and ``done`` are OpenEnv's; ``done = terminated or truncated``)."""

    text: str = Field(default="", description="the whole text the policy sees at this invocation")
    info: dict[str, Any] = Field(default_factory=dict, description="the step's info (invocation, summary), JSON-safe")
    terminated: bool = Field(default=False, description="the episode ended (an answer, the end of the task)")
    truncated: bool = Field(default=False, description="the episode was cut (the turn limit)")


class MemenvState(State):
    """``episode_id`` (the client's ``episode_id`` of the last reset when it gave one, as OpenEnv's state
    contract asks, else the env's own), ``env_episode_id`` (the env's own, as in the snapshots), ``step_count``
    (steps of this episode), ``env_id``, ``env_kwargs``, ``done``, ``memory`` (the memory text the next
    observation shows), ``episode_return``."""

    env_episode_id: str | None = None
    env_id: str = ""
    env_kwargs: dict[str, Any] = Field(default_factory=dict)
    done: bool = True
    memory: str = ""
    episode_return: float = 0.0
    client_episode_id: str | None = None
    max_observation_chars: int = 1_000_000
    max_action_chars: int = 100_000
