"""The training lookups of several key spaces in one kernel call (one per step, not per table).

:func:`train_many` does for every table what :meth:`KeySpace.train` does for one, for key
spaces that admit on first sight (no pending counts): each key found or inserted in one pass,
no sort of the step's keys (only the new keys are sorted, to take their rows in ascending key
order), and, for a table whose rows take the default initializer, the new rows' values and
optimizer slots written in the same call (:class:`Fill`). Rows, new keys, row metadata and
initial values are exactly those of :meth:`KeySpace.train` and
:func:`embcore.dynamic.init.default_rows`, its readable reference (tests/dynamic/test_batch.py).
See docs/dynamic_tables.md ("How the engine stores a dynamic table").
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from embcore.dynamic import _train_kernels as k
from embcore.dynamic.index import IndexMemoryError
from embcore.dynamic.init import _HI, _LO
from embcore.dynamic.keyspace import Admitted, KeySpace

__all__ = ["Fill", "address_of", "check_eligible", "eligible", "train_many"]

_WIDTH = _HI - _LO  # as default_rows' kernel computes it
#: the new keys :func:`_grow_ahead` makes room for in an index holding none
_AHEAD_MIN = 16


@dataclass(frozen=True)
class Fill:
    """Where a table's new rows go, initialised in the lookup's kernel call.

    Attributes:
        weight: ``(capacity, dim) float32`` C-contiguous CPU array (or tensor): key-space row
            ``r`` is its row ``r + base``; gets the default initializer's values.
        salt: :func:`embcore.dynamic.init.table_salt` of the engine's seed and the table.
        slots: ``(array, value)`` per optimizer slot, each ``(capacity, width) float32``
            C-contiguous: the new rows take ``value``.
    """

    weight: object
    salt: int
    slots: tuple[tuple[object, float], ...] = ()


def eligible(space: KeySpace) -> bool:
    """Whether :func:`train_many` takes this key space: admission on first sight (no pending
    counts) and ``int32`` rows in its index."""
    return space.pending is None and space._index.row_dtype == np.int32


def check_eligible(spaces: Sequence[KeySpace], op: str) -> None:
    """``ValueError`` naming the first key space that :func:`eligible` refuses."""
    for space in spaces:
        if not eligible(space):
            raise ValueError(
                f"table '{space.table}': {op} takes key spaces that admit on first sight"
            )


def train_many(
    spaces: Sequence[KeySpace],
    keys: Sequence[np.ndarray],
    base: int = 0,
    prepare: Callable[[int, int], Fill | None] | None = None,
) -> list[Admitted]:
    """Training lookups of ``keys[t]: (N_t,) int64`` in ``spaces[t]`` (each
    :func:`eligible`), in two kernel calls for all tables.

    Args:
        base: added to every row returned.
        prepare: called as ``prepare(t, rows)`` once table ``t``'s new keys are counted,
            ``rows`` the key-space rows it will then have handed out: makes room for them in
            the caller's row storage and returns where its new rows are initialised (``None``:
            they are not). It may raise: then no table has changed.

    Returns:
        Per table, :meth:`KeySpace.train`'s result with ``rows + base`` (every key has a
        row: first sight admits).

    Raises:
        IndexMemoryError: a table's index or row metadata could not grow; no table changed.
    """
    check_eligible(spaces, "train_many")
    t_count = len(spaces)
    desc = np.zeros((t_count, k.COLUMNS), np.int64)
    floats = np.zeros((t_count, 3 + k.MAX_SLOTS), np.float64)
    results = np.zeros((t_count, 5), np.int64)
    results[:, k.R_FAILED] = 1  # every table is to be staged
    outs = []
    for t, (space, q) in enumerate(zip(spaces, keys, strict=True)):
        q = np.ascontiguousarray(q, dtype=np.int64)
        out = tuple(np.empty(q.size, np.int64) for _ in range(5))
        outs.append((q, *out))
        d = desc[t]
        d[k.D_QUERY], d[k.D_N], d[k.D_OUT], d[k.D_BASE] = (
            q.ctypes.data,
            q.size,
            out[0].ctypes.data,
            base,
        )
        d[k.D_NEW_KEYS], d[k.D_NEW_SLOTS] = out[1].ctypes.data, out[2].ctypes.data
        d[k.D_MULT], d[k.D_NEW_ROWS] = out[3].ctypes.data, out[4].ctypes.data
        _grow_ahead(space, q.size)
        _describe_index(d, space)
    k.stage_tables(desc, results)
    try:
        while results[:, k.R_FAILED].any():  # an index without room: count, grow, stage again
            for t in np.flatnonzero(results[:, k.R_FAILED]):
                space = spaces[t]
                space._index.reserve(space.count_new(outs[t][0]))
                _describe_index(desc[t], space)
            k.stage_tables(desc, results)
        for t, space in enumerate(spaces):
            index = space._index
            top = index.num_rows + max(0, int(results[t, k.R_NEW]) - index.num_free)
            if top - 1 > np.iinfo(index.row_dtype).max:
                raise IndexMemoryError(
                    f"table '{space.table}': {len(space)} keys + {int(results[t, k.R_NEW])} new "
                    f"need row {top - 1}, past the {index.row_dtype} row limit"
                )
            space.reserve_rows(top)
            _describe_meta(desc[t], space)
            fill = prepare(t, top) if prepare is not None else None
            if fill is not None:
                _describe_fill(desc[t], floats[t], fill)
    except BaseException:
        k.unstage_tables(desc, results)
        raise
    k.finish_tables(desc, floats, results)
    got = []
    for t, space in enumerate(spaces):
        index = space._index
        index._n_free, index._next_row = int(results[t, k.R_N_FREE]), int(results[t, k.R_NEXT_ROW])
        index._size = int(results[t, k.R_SIZE])
        q, out, new_keys, _, _, new_rows = outs[t]
        m = int(results[t, k.R_NEW])
        got.append(Admitted(out, new_keys[:m], new_rows[:m]))
    return got


def _grow_ahead(space: KeySpace, n: int) -> None:
    """Room in ``space``'s index, before pass 1, for the new keys a lookup of ``n`` keys may
    bring, up to as many keys as it holds (so a batch repeating held keys does not grow the
    index by its length): then pass 1 rarely stops for room and its new keys need no count
    (:meth:`KeySpace.count_new`). Where that is not enough or is refused (memory, the row
    limit), the count decides as before."""
    index = space._index
    n = min(n, len(index) + _AHEAD_MIN)
    if not index.fits(n):
        with contextlib.suppress(IndexMemoryError):
            index.reserve(n)


def _describe_index(d: np.ndarray, space: KeySpace) -> None:
    index = space._index
    d[k.D_CTRL], d[k.D_KEYS], d[k.D_ROWS] = (
        index._ctrl.ctypes.data, index._keys.ctypes.data, index._rows.ctypes.data,
    )  # fmt: skip
    d[k.D_CAP], d[k.D_MAX_SIZE] = index.capacity, index._max_size()
    d[k.D_FREE], d[k.D_N_FREE] = index._free.ctypes.data, index._n_free
    d[k.D_NEXT_ROW], d[k.D_SIZE] = index._next_row, index._size


def _describe_meta(d: np.ndarray, space: KeySpace) -> None:
    d[k.D_KEY], d[k.D_FREQ] = space._key.ctypes.data, space._freq.ctypes.data
    d[k.D_LAST], d[k.D_LIVE] = space._last.ctypes.data, space._live.ctypes.data
    d[k.D_META], d[k.D_STEP] = space._key.size, space.step


def address_of(array: object) -> tuple[int, tuple[int, ...]]:
    """The data address and shape of a C-contiguous float32 CPU array or tensor."""
    if isinstance(array, np.ndarray):
        ok = array.dtype == np.float32 and array.flags.c_contiguous
        return (array.ctypes.data if ok else 0), array.shape
    if not isinstance(array, torch.Tensor):
        return 0, ()
    ok = array.dtype == torch.float32 and array.is_contiguous() and array.device.type == "cpu"
    return (array.data_ptr() if ok else 0), tuple(array.shape)


def _describe_fill(d: np.ndarray, f: np.ndarray, fill: Fill) -> None:
    address, shape = address_of(fill.weight)
    if not address or len(shape) != 2 or len(fill.slots) > k.MAX_SLOTS:
        raise ValueError("train_many: a Fill takes C-contiguous float32 CPU rows and slots")
    d[k.D_WEIGHT], d[k.D_BUFFER_ROWS], d[k.D_DIM] = address, shape[0], shape[1]
    d[k.D_SALT] = np.uint64(fill.salt).view(np.int64)
    f[0], f[1], f[2] = 1.0 / math.sqrt(shape[1]), _LO, _WIDTH
    for s, (slot, value) in enumerate(fill.slots):
        address, slot_shape = address_of(slot)
        if not address or slot_shape[0] != shape[0]:
            raise ValueError("train_many: a Fill takes C-contiguous float32 CPU rows and slots")
        width = int(np.prod(slot_shape[1:])) if len(slot_shape) > 1 else 1
        d[k.D_SLOTS + 2 * s], d[k.D_SLOTS + 2 * s + 1] = address, width
        f[3 + s] = value
