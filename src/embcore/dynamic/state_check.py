"""Checks of a dynamic table's saved state, before anything is loaded from it.

A state (``KeyedRows.content()``, a state dict's ``{table}.*`` entries, a checkpoint's
replayed records) is a dict of arrays; see :meth:`.KeySpace.state`::

    step                                   () int64 >= 0: steps completed
    keys                                   (R,) int64, strictly ascending (no key twice)
    freq, last_seen                        (R,) int64: >= 0, and 0 <= last_seen <= step
    weight, <slot>                         (R, dim) / (R,) floating
    pending/keys                           (P,) int64, strictly ascending, none held
    pending/counts, pending/last_seen      (P,) int64: >= 0, and 0 <= last_seen <= step
    pending/sketch, pending/sketched       the count-min sketch, both or neither

:func:`problems` lists what breaks these rules (naming the table, the entry and the key), so
that a loader refuses a state before the first copy instead of failing half-way. See
docs/reliability.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from embcore.config import ResolvedTable
from embcore.dynamic.pending import EXACT_LIMIT, PendingCounts

__all__ = ["CORE", "PENDING", "SKETCH", "has_pending", "problems", "row_parts"]

#: what every state holds
CORE = ("step", "keys", "freq", "last_seen")
#: what a table with admission (``min_count > 1``) holds besides
PENDING = ("pending/keys", "pending/counts", "pending/last_seen")
#: held once the pending counts overflowed into the sketch
SKETCH = ("pending/sketch", "pending/sketched")


def row_parts(table: ResolvedTable) -> list[str]:
    """``weight`` and the table's optimizer slots: the ``(R, ...)`` values stored per key."""
    opt = table.optimizer
    return ["weight", *(s.name for s in opt.slot_specs())] if opt else ["weight"]


def has_pending(table: ResolvedTable) -> bool:
    """Whether the table counts keys pending admission (its state holds :data:`PENDING`)."""
    admission = table.config.admission
    return admission is not None and admission.min_count > 1


def _describe(value: Any) -> str:
    if isinstance(value, (torch.Tensor, np.ndarray)):
        dtype = str(value.dtype).replace("torch.", "")
        return f"shape {tuple(value.shape)} {dtype}"
    return type(value).__name__


def _int64(value: Any) -> np.ndarray | None:
    """``value`` as an int64 NumPy array, or ``None`` when it is not an int64 tensor/array."""
    if isinstance(value, torch.Tensor) and value.dtype == torch.int64:
        return value.detach().cpu().numpy()
    if isinstance(value, np.ndarray) and value.dtype == np.int64:
        return value
    return None


def _floating(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return value.dtype.is_floating_point
    return isinstance(value, np.ndarray) and np.issubdtype(value.dtype, np.floating)


class _Checker:
    """Collects the problems of one table's state (see the module docstring)."""

    def __init__(self, table: ResolvedTable, state: Mapping[str, Any]) -> None:
        self.name, self.state, self.out = table.name, state, []

    def say(self, part: str, message: str) -> None:
        self.out.append(f"table '{self.name}': '{part}' {message}")

    def ints(self, part: str, shape: tuple[int, ...] | None) -> np.ndarray | None:
        """The int64 array ``part`` of ``shape`` (``None``: 1-D of any length), else a
        problem and ``None``."""
        value = self.state[part]
        array = _int64(value)
        want = "(N,)" if shape is None else str(shape)
        ok = array is not None and (array.ndim == 1 if shape is None else array.shape == shape)
        if not ok:
            self.say(part, f"must be {want} int64, got {_describe(value)}")
            return None
        return array

    def ascending(self, part: str, keys: np.ndarray) -> bool:
        bad = np.flatnonzero(keys[1:] <= keys[:-1])
        if bad.size:
            i = int(bad[0])
            a, b = int(keys[i]), int(keys[i + 1])
            why = f"holds key {a} twice" if a == b else f"is not ascending ({a} before {b})"
            self.say(part, f"{why}; keys are distinct and in ascending order")
        return not bad.size

    def counts(self, part: str, keys: np.ndarray, array: np.ndarray) -> None:
        bad = np.flatnonzero(array < 0)
        if bad.size:
            i = int(bad[0])
            self.say(part, f"of key {int(keys[i])} is {int(array[i])}; counts are never negative")

    def steps(self, part: str, keys: np.ndarray, array: np.ndarray, step: int | None) -> None:
        if step is None:
            return
        bad = np.flatnonzero((array < 0) | (array > step))
        if bad.size:
            i = int(bad[0])
            self.say(
                part,
                f"of key {int(keys[i])} is step {int(array[i])}, outside [0, {step}] (the "
                "table's step: no key was seen after it)",
            )

    def group(self, names: tuple[str, ...], step: int | None, rows: tuple = ()) -> np.ndarray:
        """Check one keyed group (``keys``, counts, last-seen steps, ``rows`` of values);
        returns its keys (empty when unusable)."""
        keys_name, count_name, last_name = names
        keys = self.ints(keys_name, None)
        if keys is None:
            return np.zeros(0, np.int64)
        n = keys.size
        ok = self.ascending(keys_name, keys)
        freq, last = self.ints(count_name, (n,)), self.ints(last_name, (n,))
        if freq is not None:
            self.counts(count_name, keys, freq)
        if last is not None:
            self.steps(last_name, keys, last, step)
        for part, tail in rows:
            value = self.state[part]
            shape = tuple(getattr(value, "shape", ()))
            if not _floating(value) or shape != (n, *tail):
                self.say(part, f"must be {(n, *tail)} floating point, got {_describe(value)}")
        return keys if ok else np.zeros(0, np.int64)


def problems(table: ResolvedTable, state: Mapping[str, Any]) -> list[str]:
    """What makes ``state`` (tensors or NumPy arrays) unfit for the dynamic table ``table``,
    one message per problem naming the table, the entry and the offending key or value;
    empty when it fits. Entries it lacks are the caller's business (they are skipped here),
    except that a group is checked only whole."""
    c = _Checker(table, state)
    step = None
    if "step" in state:
        array = c.ints("step", ())
        if array is not None and int(array) < 0:
            c.say("step", f"is {int(array)}; steps are never negative")
        step = None if array is None or int(array) < 0 else int(array)
    dim = table.dim
    opt = table.optimizer
    tails = {"weight": (dim,)} | {
        s.name: s.shape(0, dim)[1:] for s in (opt.slot_specs() if opt else ())
    }
    rows = tuple((p, tails[p]) for p in row_parts(table) if p in state)
    held = np.zeros(0, np.int64)
    if all(p in state for p in CORE[1:]):
        held = c.group(("keys", "freq", "last_seen"), step, rows)
    if all(p in state for p in PENDING):
        pending = c.group(PENDING, step)
        both = np.intersect1d(held, pending)
        if both.size:
            c.say(
                "pending/keys",
                f"holds key {int(both[0])}, which also holds a row ('keys'): a key is "
                f"either pending or held ({both.size} such keys)",
            )
        if pending.size > EXACT_LIMIT:
            c.say("pending/keys", f"holds {pending.size} keys, more than {EXACT_LIMIT}")
    _sketch(c, state)
    return c.out


def _sketch(c: _Checker, state: Mapping[str, Any]) -> None:
    present = [p for p in SKETCH if p in state]
    if not present:
        return
    if len(present) == 1:
        other = next(p for p in SKETCH if p not in present)
        c.say(present[0], f"comes without '{other}' (the sketch is saved with both)")
        return
    sketch = c.ints("pending/sketch", PendingCounts(c.name).sketch_shape)
    if sketch is not None and (sketch < 0).any():
        c.say("pending/sketch", "holds negative counters")
    sketched = c.ints("pending/sketched", ())
    if sketched is not None and int(sketched) < 0:
        c.say("pending/sketched", f"is {int(sketched)}; counts are never negative")
