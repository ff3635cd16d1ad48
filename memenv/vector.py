"""Reading Gymnasium vector-env infos one sub-env at a time.

Gymnasium's vector envs combine the sub-envs' info dicts key by key, at every level of nesting: each value
becomes an array over the sub-envs with a boolean ``"_<key>"`` mask saying which sub-envs had the key this
step. A key no sub-env had is absent altogether: on a NEXT_STEP autoreset step where every sub-env was
reset, ``info`` has no ``"invocation"``. :func:`sub_env_info` undoes the combination for one sub-env::

    obs, rewards, terminated, truncated, info = envs.step(actions)
    for i in range(envs.num_envs):
        snapshot = sub_env_info(info, i).get("invocation")  # None on sub-env i's reset step
"""

from __future__ import annotations

from typing import Any

import numpy as np


def to_python(value: Any) -> Any:
    """``value`` with numpy scalars and arrays turned into Python numbers and lists (recursively)."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return [to_python(v) for v in value.tolist()]
    if isinstance(value, dict):
        return {k: to_python(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(to_python(v) for v in value)
    return value


def sub_env_info(info: dict[str, Any], i: int) -> dict[str, Any]:
    """Sub-env ``i``'s own info dict out of a vector env's combined ``info``.

    Keys whose ``"_<key>"`` mask is False for ``i`` are left out, nested dicts are split the same way, and
    values come back as Python objects (``int``, ``float``, ``bool``, ``str``, lists), as the sub-env wrote
    them. Works on ``info["final_info"]`` (SAME_STEP autoreset) too.
    """
    out: dict[str, Any] = {}
    for key, value in info.items():
        if key.startswith("_"):
            continue
        mask = info.get("_" + key)
        if mask is not None and not bool(mask[i]):
            continue
        if isinstance(value, dict):
            out[key] = sub_env_info(value, i)
        elif isinstance(value, (np.ndarray, list, tuple)):
            out[key] = to_python(value[i])
        else:
            out[key] = value
    return out
