"""The step boundaries of several key spaces in one kernel call (one per step, not per table).

:func:`end_many` does for every table what :meth:`KeySpace.end_step` does for one, for key
spaces that :func:`embcore.dynamic.batch.eligible` takes (admission on first sight, so no
pending counts to expire): the same victims, removed from the index in the same order, the
same freed rows and free stack. It can also reset each table's sink row (row 0 of its weight
and optimizer slots, which the row storage's keys without a row read) in the same call
(:class:`Sink`). Kernel in :mod:`._evict_kernels`; tests/dynamic/test_boundary.py compares
the two. See docs/dynamic_tables.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from embcore.dynamic import _evict_kernels as k
from embcore.dynamic.batch import address_of, check_eligible
from embcore.dynamic.keyspace import Evicted, KeySpace

__all__ = ["Sink", "end_many"]


@dataclass(frozen=True)
class Sink:
    """A table's sink row, reset at its step boundary: row 0 of ``weight`` to zeros and of
    each slot to its value.

    Attributes:
        weight: ``(rows, dim) float32`` C-contiguous CPU array or tensor.
        slots: ``(array, value)`` per optimizer slot, each ``(rows, width) float32``
            C-contiguous.
    """

    weight: object
    slots: tuple[tuple[object, float], ...] = ()


def end_many(spaces: Sequence[KeySpace], sinks: Sequence[Sink | None] | None = None) -> list:
    """:meth:`KeySpace.end_step` of every ``spaces[t]`` (each :func:`eligible`) in one kernel
    call, resetting ``sinks[t]`` where given.

    Returns:
        Per table, the :class:`Evicted` keys (ascending) and their freed rows.
    """
    check_eligible(spaces, "end_many")
    t_count = len(spaces)
    desc = np.zeros((t_count, k.COLUMNS), np.int64)
    values = np.zeros((t_count, k.MAX_SLOTS), np.float64)
    results = np.zeros((t_count, 2), np.int64)
    total = 0
    for t, space in enumerate(spaces):
        d = desc[t]
        ev, index = space.eviction, space._index
        d[k.E_TTL] = -1 if ev.steps_to_live is None else ev.steps_to_live
        d[k.E_MAX_ROWS] = -1 if ev.max_rows is None else ev.max_rows
        if d[k.E_TTL] >= 0 or d[k.E_MAX_ROWS] >= 0:
            d[k.E_N], d[k.E_SIZE], d[k.E_STEP] = index.num_rows, len(index), space.step
            d[k.E_KEY], d[k.E_FREQ] = space._key.ctypes.data, space._freq.ctypes.data
            d[k.E_LAST], d[k.E_LIVE] = space._last.ctypes.data, space._live.ctypes.data
            d[k.E_CTRL], d[k.E_KEYS], d[k.E_ROWS] = (
                index._ctrl.ctypes.data, index._keys.ctypes.data, index._rows.ctypes.data,
            )  # fmt: skip
            d[k.E_CAP], d[k.E_FREE], d[k.E_N_FREE] = (
                index.capacity, index._free.ctypes.data, index._n_free,
            )  # fmt: skip
            d[k.E_OUT] = total
            total += index.num_rows
        sink = sinks[t] if sinks is not None else None
        if sink is not None:
            _describe_sink(d, values[t], sink)
    out_keys, out_rows = np.empty(total, np.int64), np.empty(total, np.int64)
    free_out = np.empty(total, np.int32)
    k.end_tables(desc, values, results, out_keys, out_rows, free_out)
    got = []
    for t, space in enumerate(spaces):
        space.step += 1
        m, o = int(results[t, k.R_REMOVED]), int(desc[t, k.E_OUT])
        if m:
            index = space._index
            index._size -= m
            index._n_free = int(results[t, k.R_N_FREE])
            index._free = free_out[o : o + index._n_free].copy()
        got.append(Evicted(out_keys[o : o + m], out_rows[o : o + m]))
    return got


def _describe_sink(d: np.ndarray, values: np.ndarray, sink: Sink) -> None:
    address, shape = address_of(sink.weight)
    if not address or len(shape) != 2 or len(sink.slots) > k.MAX_SLOTS:
        raise ValueError("end_many: a Sink takes C-contiguous float32 CPU rows and slots")
    d[k.E_WEIGHT], d[k.E_DIM] = address, shape[1]
    for s, (slot, value) in enumerate(sink.slots):
        address, slot_shape = address_of(slot)
        if not address or not slot_shape:
            raise ValueError("end_many: a Sink takes C-contiguous float32 CPU rows and slots")
        width = int(np.prod(slot_shape[1:])) if len(slot_shape) > 1 else 1
        d[k.E_SLOTS + 2 * s], d[k.E_SLOTS + 2 * s + 1] = address, width
        values[s] = value
