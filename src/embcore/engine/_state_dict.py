"""The engine's ``state_dict`` layout: ``step``, ``{table}.weight``, ``{table}.{slot}``.

Keys and shapes are the logical tables' whatever the store (a sharded engine's state dict
equals the single-process one's), so state dicts move between stores. See
docs/architecture.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from torch import Tensor

from embcore.config import ResolvedTable
from embcore.engine._store import stored_names

__all__ = ["check_state_dict", "state_items"]


def state_items(tables: Sequence[ResolvedTable]) -> dict[str, tuple[int, str]]:
    """State-dict key (without prefix) -> ``(table index, tensor name)``, in order."""
    return {f"{t.name}.{n}": (t.index, n) for t in tables for n in stored_names(t)}


def check_state_dict(
    state_dict: Mapping[str, Any], prefix: str, expected: Mapping[str, tuple[int, ...]]
) -> tuple[list[str], list[str], list[str]]:
    """The ``expected`` keys (with their shapes) that ``state_dict`` lacks, its keys under
    ``prefix`` that are not expected, and one message per value of the wrong shape or type."""
    errors, missing = [], []
    for key, shape in expected.items():
        if key not in state_dict:
            missing.append(key)
            continue
        value = state_dict[key]
        if not isinstance(value, Tensor) or tuple(value.shape) != shape:
            got = tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__
            errors.append(f"{key}: expected shape {shape}, got {got}")
    unexpected = [k for k in state_dict if k.startswith(prefix) and k not in expected]
    return missing, unexpected, errors
