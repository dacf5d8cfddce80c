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
from dataclasses import dataclass, field

import numpy as np

from embcore.dynamic import _evict_kernels as k
from embcore.dynamic.batch import check_eligible, described_rows
from embcore.dynamic.keyspace import Evicted, KeySpace

__all__ = ["Sink", "end_many"]


@dataclass(frozen=True, eq=False)
class Sink:
    """A table's sink row, reset at its step boundary: row 0 of ``weight`` to zeros and of
    each slot to its value.

    Attributes:
        weight: ``(rows, dim) float32`` C-contiguous CPU array or tensor.
        slots: ``(array, value)`` per optimizer slot, each ``(rows, width) float32``
            C-contiguous.
        columns, values: the kernel's descriptor columns ``E_WEIGHT ..`` and slot values of
            these, taken once here (a row storage keeps its ``Sink`` while its buffers stay).

    Raises:
        ValueError: rows or slots that are not C-contiguous float32 CPU arrays of one height.
    """

    weight: object
    slots: tuple[tuple[object, float], ...] = ()
    columns: np.ndarray = field(init=False, repr=False)
    values: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        address, shape, slots, values = described_rows(self.weight, self.slots, "end_many: a Sink")
        object.__setattr__(self, "columns", np.array([address, shape[1], *slots], np.int64))
        object.__setattr__(self, "values", np.array(values, np.float64))


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
            ctrl, keys, rows, free, key, freq, last, live = space.addresses()
            d[k.E_KEY], d[k.E_FREQ], d[k.E_LAST], d[k.E_LIVE] = key, freq, last, live
            d[k.E_CTRL], d[k.E_KEYS], d[k.E_ROWS], d[k.E_FREE] = ctrl, keys, rows, free
            d[k.E_CAP], d[k.E_N_FREE] = index.capacity, index._n_free
            d[k.E_OUT] = total
            total += index.num_rows
        sink = sinks[t] if sinks is not None else None
        if sink is not None:
            d[k.E_WEIGHT :] = sink.columns
            values[t] = sink.values
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
