"""What ``load_state_dict`` checks before its first copy: every entry of every table.

A fixed table's entries need their shape and a floating dtype, ``step`` a non-negative
integer; a dynamic table's entries are taken whole (its keys, counts, rows and slots, and
its pending-admission counts when it has admission) and must be a state the table could
have reached (:mod:`embcore.dynamic.state_check`). A load that finds any problem loads
nothing. See docs/reliability.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from embcore.config import ResolvedTable
from embcore.dynamic.state_check import CORE, PENDING, SKETCH, has_pending, problems, row_parts

__all__ = ["DynamicEntries", "dynamic_entries", "fixed_problems"]


@dataclass
class DynamicEntries:
    """One dynamic table's entries of a state dict.

    Attributes:
        given: ``{name: value}`` of its entries present (names without the table prefix).
        lacking: the full keys of the entries it needs and lacks.
        errors: why nothing may be loaded (a partial table, broken invariants).
    """

    given: dict[str, Any] = field(default_factory=dict)
    lacking: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def dynamic_entries(
    table: ResolvedTable, state_dict: Mapping[str, Any], prefix: str, strict: bool
) -> DynamicEntries:
    """The entries of dynamic table ``table`` in ``state_dict`` and what is wrong with them.

    Required: ``step``, ``keys``, ``freq``, ``last_seen``, ``weight`` and every slot, and,
    for a table with admission, ``pending/keys``, ``pending/counts``, ``pending/last_seen``
    (the sketch's two entries are optional, together). A non-strict load takes a table
    whole or not at all, except that its pending counts may be left out as a group (the
    table then starts with none); a strict one needs every required entry.
    """
    head = f"{prefix}{table.name}."
    required = [*CORE, *row_parts(table)]
    pending = list(PENDING) if has_pending(table) else []
    known = set(required + pending + (list(SKETCH) if pending else []))
    out = DynamicEntries()
    out.given = {
        k[len(head) :]: v
        for k, v in state_dict.items()
        if k.startswith(head) and k[len(head) :] in known
    }
    out.lacking = [head + n for n in required + pending if n not in out.given]
    if not out.given:
        return out
    core = [n for n in required if n not in out.given]
    in_pending = [n for n in out.given if n.startswith("pending/")]
    partial = in_pending and any(n not in out.given for n in pending)
    if not strict and (core or partial):  # keys and rows only make sense together
        out.errors.append(f"{table.name}: a dynamic table loads whole, lacking {out.lacking}")
    given_tensors = {k: v for k, v in out.given.items() if _dense(v)}
    out.errors += [
        f"{head}{k}: expected a dense tensor holding data, got {_kind(v)}"
        for k, v in out.given.items()
        if k not in given_tensors
    ]
    out.errors += problems(table, given_tensors)
    return out


def fixed_problems(state_dict: Mapping[str, Any], keys: list[str], step_key: str) -> list[str]:
    """Entries of ``keys`` (fixed tables' weights and slots) that are not floating point,
    and a ``step`` that is not a non-negative integer (shapes are checked elsewhere)."""
    out = []
    for key in [*keys, step_key]:
        value = state_dict.get(key)
        if isinstance(value, Tensor) and not _dense(value):
            out.append(f"{key}: expected a dense tensor holding data, got {_kind(value)}")
        elif key != step_key and isinstance(value, Tensor) and not value.dtype.is_floating_point:
            out.append(f"{key}: expected a floating-point tensor, got {value.dtype}")
    if out:
        return out
    step = state_dict.get(step_key)
    if isinstance(step, Tensor) and step.shape == ():
        if step.dtype.is_floating_point or step.dtype.is_complex or step.dtype == torch.bool:
            out.append(f"{step_key}: expected an integer tensor, got {step.dtype}")
        elif int(step) < 0:
            out.append(f"{step_key}: the step is {int(step)}, expected >= 0")
    return out


def _dense(value: Any) -> bool:
    """A strided tensor whose values exist (not sparse, not on the ``meta`` device): what
    can be copied into a table."""
    return (
        isinstance(value, Tensor) and value.layout == torch.strided and value.device.type != "meta"
    )


def _kind(value: Any) -> str:
    if isinstance(value, Tensor):
        return f"a {str(value.layout).removeprefix('torch.')} tensor on {value.device}"
    return type(value).__name__
