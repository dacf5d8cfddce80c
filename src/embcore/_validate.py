"""Small checks shared by the frozen configs.

Each raises ``ValueError`` (as TensorFlow's configs do, docs/semantics.md §1) naming the object, the
field, the bad value and what was expected.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

__all__ = ["check_bool", "check_int", "check_real", "describe"]


def describe(value: Any) -> str:
    """``repr`` of a value with its type when the type is surprising (``np.float32(1.0)``)."""
    text = repr(value)
    if isinstance(value, (bool, int, float, str, type(None))):
        return text
    return f"{text} ({type(value).__name__})"


def check_int(owner: str, field: str, value: Any, *, minimum: int) -> int:
    """An integral value (Python or NumPy int, not bool) that is at least ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{owner}: {field} must be an int >= {minimum}, got {describe(value)}")
    if value < minimum:
        raise ValueError(f"{owner}: {field} must be an int >= {minimum}, got {value}")
    return int(value)


def check_real(
    owner: str,
    field: str,
    value: Any,
    *,
    minimum: float | None = None,
    strict_minimum: bool = False,
    below: float | None = None,
) -> float:
    """A finite real number (not bool), optionally ``>= minimum`` (or ``>``) and ``< below``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{owner}: {field} must be a real number, got {describe(value)}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{owner}: {field} must be finite, got {value}")
    if minimum is not None and (value <= minimum if strict_minimum else value < minimum):
        op = ">" if strict_minimum else ">="
        raise ValueError(f"{owner}: {field} must be {op} {minimum}, got {value}")
    if below is not None and value >= below:
        raise ValueError(f"{owner}: {field} must be < {below}, got {value}")
    return value


def check_bool(owner: str, field: str, value: Any) -> bool:
    """A real ``bool``: ``1`` and ``"yes"`` are rejected so a typo cannot flip a mode."""
    if not isinstance(value, bool):
        raise ValueError(f"{owner}: {field} must be True or False, got {describe(value)}")
    return value
