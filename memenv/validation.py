"""Checks for environment keyword arguments: one clear error per bad value, raised at ``gym.make`` time.

Every check names the parameter, says what it accepts (range, options or type) and shows the value it got,
so that ``gym.make("MemQA-v0", comparison_rate=1.5)`` fails with
``ValueError: comparison_rate must be a number in [0, 1], got 1.5`` instead of misbehaving later.

A value of the wrong type raises :class:`ArgumentTypeError`, which is both a ``TypeError`` and a
``ValueError`` (as numpy's ``AxisError`` is both a ``ValueError`` and an ``IndexError``): callers may catch
either. A value of the right type outside its range raises ``ValueError``. ``bool`` is never accepted where a
number is meant (``True`` is an ``int`` in Python, but ``objectives=True`` is a mistake), and numbers must be
finite.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Callable, Collection, Iterable
from typing import Any

import numpy as np

__all__ = [
    "ArgumentTypeError",
    "check_bool",
    "check_callable",
    "check_choice",
    "check_int",
    "check_int_tuple",
    "check_number",
    "check_path",
    "check_rate",
    "check_str_tuple",
]


class ArgumentTypeError(TypeError, ValueError):
    """A keyword argument of the wrong type (a ``TypeError`` that ``except ValueError`` also catches)."""


def _bounds(minimum: float | None, maximum: float | None) -> str:
    if minimum is not None and maximum is not None:
        return f" in [{minimum}, {maximum}]"
    if minimum is not None:
        return f" >= {minimum}"
    if maximum is not None:
        return f" <= {maximum}"
    return ""


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def check_int(name: str, value: Any, *, minimum: int | None = None, maximum: int | None = None,
              allow_none: bool = False, hint: str = "") -> int | None:
    """``value`` as an ``int`` in ``[minimum, maximum]`` (``None`` passes when ``allow_none``).

    ``hint`` is appended to the range error (e.g. why there is a maximum).
    """
    if value is None and allow_none:
        return None
    expected = f"an int{_bounds(minimum, maximum)}" + (" or None" if allow_none else "")
    if not _is_int(value):
        raise ArgumentTypeError(f"{name} must be {expected}, got {value!r} ({type(value).__name__})")
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise ValueError(f"{name} must be {expected}, got {value!r}" + (f" ({hint})" if hint else ""))
    return int(value)


def check_number(name: str, value: Any, *, minimum: float | None = None, maximum: float | None = None) -> float:
    """``value`` as a finite ``float`` in ``[minimum, maximum]`` (ints accepted, bools and NaN/inf not)."""
    expected = f"a finite number{_bounds(minimum, maximum)}"
    if not isinstance(value, numbers.Real) or isinstance(value, (bool, np.bool_)):
        raise ArgumentTypeError(f"{name} must be {expected}, got {value!r} ({type(value).__name__})")
    number = float(value)
    if not math.isfinite(number) or (minimum is not None and number < minimum) or (
            maximum is not None and number > maximum):
        raise ValueError(f"{name} must be {expected}, got {value!r}")
    return number


def check_rate(name: str, value: Any) -> float:
    """``value`` as a probability: a finite number in ``[0, 1]``."""
    return check_number(name, value, minimum=0, maximum=1)


def check_bool(name: str, value: Any) -> bool:
    """``value`` if it is ``True`` or ``False`` (``0``, ``1``, ``"yes"`` are rejected: they are mistakes)."""
    if not isinstance(value, (bool, np.bool_)):
        raise ArgumentTypeError(f"{name} must be True or False, got {value!r} ({type(value).__name__})")
    return bool(value)


#: How many invocation snapshots the long-input envs (MemRead, MemDialog and its datasets) keep for an episode's
#: summary by default: the last 256. Every snapshot holds its observation's text, so keeping them all grows with the
#: episode (a 1M-token BEAM chat read one message per step kept 4.6 GB); ``keep_snapshots=True`` keeps them all.
DEFAULT_KEPT_SNAPSHOTS = 256


def check_keep_snapshots(value: Any) -> bool | int:
    """``keep_snapshots``: ``True`` (every snapshot), ``False`` (none) or a whole number >= 1 (the last that many)."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)) and value >= 1:
        return int(value)
    raise ArgumentTypeError(f"keep_snapshots must be True, False or a whole number >= 1 (the last that many "
                            f"snapshots), got {value!r} ({type(value).__name__})")


def check_choice(name: str, value: Any, options: Collection[str], *, allow_none: bool = False) -> str | None:
    """``value`` if it is one of ``options`` (strings); the error lists them."""
    if value is None and allow_none:
        return None
    valid = ", ".join(repr(o) for o in options) + (" or None" if allow_none else "")
    if not isinstance(value, str):
        raise ArgumentTypeError(f"{name} must be one of {valid}, got {value!r} ({type(value).__name__})")
    if value not in options:
        raise ValueError(f"unknown {name} {value!r}: valid options are {valid}")
    return value


def check_str_tuple(name: str, value: Any, options: Collection[str], *, allow_none: bool = True) -> tuple[str, ...] | None:
    """A non-empty list or tuple of strings from ``options``, as a tuple without repeats.

    A bare string is rejected (``"temporal"`` would otherwise be read as its letters); the error suggests
    the one-element tuple.
    """
    if value is None and allow_none:
        return None
    valid = ", ".join(repr(o) for o in options)
    if isinstance(value, str):
        hint = f"; did you mean ({value!r},)?" if value in options else ""
        raise ArgumentTypeError(f"{name} must be a list or tuple of names from {valid}, got the string "
                                f"{value!r}{hint}")
    if not isinstance(value, (list, tuple)):
        raise ArgumentTypeError(f"{name} must be a list or tuple of names from {valid}, got {value!r} "
                                f"({type(value).__name__})")
    if not value:
        raise ValueError(f"{name} must name at least one of {valid}, got an empty {type(value).__name__}")
    for item in value:
        if not isinstance(item, str):
            raise ArgumentTypeError(f"{name} must hold strings from {valid}, got {item!r} ({type(item).__name__})")
        if item not in options:
            raise ValueError(f"unknown {name} entry {item!r}: valid options are {valid}")
    return tuple(dict.fromkeys(value))


def check_int_tuple(name: str, value: Any, *, minimum: int, maximum: int) -> tuple[int, ...]:
    """One int in ``[minimum, maximum]`` or a non-empty list/tuple of them, as a tuple."""
    expected = f"an int in [{minimum}, {maximum}] or a non-empty tuple of them"
    items: Iterable[Any]
    if _is_int(value):
        items = (value,)
    elif isinstance(value, (list, tuple)) and value:
        items = value
    else:
        error = ArgumentTypeError if not isinstance(value, (list, tuple)) else ValueError
        raise error(f"{name} must be {expected}, got {value!r}")
    out = []
    for item in items:
        if not _is_int(item):
            raise ArgumentTypeError(f"{name} must be {expected}, got {value!r} (holds {type(item).__name__})")
        if not minimum <= item <= maximum:
            raise ValueError(f"{name} must be {expected}, got {value!r}")
        out.append(int(item))
    return tuple(out)


def check_path(name: str, value: Any, *, allow_none: bool = True) -> str | None:
    """``value`` as a path string (``str`` or ``os.PathLike``); emptiness is rejected."""
    if value is None and allow_none:
        return None
    if not isinstance(value, (str, os.PathLike)):
        raise ArgumentTypeError(f"{name} must be a file path (str or os.PathLike){' or None' if allow_none else ''}, "
                                f"got {value!r} ({type(value).__name__})")
    path = os.fspath(value)
    if not isinstance(path, str) or not path.strip():
        raise ValueError(f"{name} must be a non-empty file path, got {value!r}")
    return path


def check_callable(name: str, value: Any, *, probe: str | None = None, allow_none: bool = True) -> Callable | None:
    """``value`` if callable; with ``probe``, also that ``value(probe)`` returns a non-negative int.

    The probe catches a token counter that returns a float, a list of ids or raises, at make time rather
    than on the first observation.
    """
    if value is None and allow_none:
        return None
    if not callable(value):
        raise ArgumentTypeError(f"{name} must be a callable str -> int{' or None' if allow_none else ''}, "
                                f"got {value!r} ({type(value).__name__})")
    if probe is not None:
        try:
            result = value(probe)
        except Exception as err:  # noqa: BLE001 - any failure of a user callable is reported the same way
            raise ValueError(f"{name} must be a callable str -> int; calling it on {probe!r} raised "
                             f"{type(err).__name__}: {err}") from err
        if not _is_int(result) or result < 0:
            raise ValueError(f"{name} must be a callable str -> int (a non-negative token count); on {probe!r} "
                             f"it returned {result!r} ({type(result).__name__})")
    return value
