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
from dataclasses import dataclass, field

import numpy as np
import torch

from embcore.dynamic import _train_kernels as k
from embcore.dynamic.index import ROW_LIMIT, IndexMemoryError
from embcore.dynamic.init import _HI, _LO
from embcore.dynamic.keyspace import Admitted, KeySpace

__all__ = ["Fill", "address_of", "check_eligible", "described_rows", "eligible", "train_many"]

_WIDTH = _HI - _LO  # as default_rows' kernel computes it
#: the new keys :func:`_grow_ahead` makes room for in an index holding none
_AHEAD_MIN = 16


@dataclass(frozen=True, eq=False)
class Fill:
    """Where a table's new rows go, initialised in the lookup's kernel call.

    Attributes:
        weight: ``(capacity, dim) float32`` C-contiguous CPU array (or tensor): key-space row
            ``r`` is its row ``r + base``; gets the default initializer's values.
        salt: :func:`embcore.dynamic.init.table_salt` of the engine's seed and the table.
        slots: ``(array, value)`` per optimizer slot, each ``(capacity, width) float32``
            C-contiguous: the new rows take ``value``.
        columns, floats: the kernel's descriptor columns ``D_WEIGHT ..`` and floats of these,
            taken once here (a row storage keeps its ``Fill`` while its buffers stay).

    Raises:
        ValueError: rows or slots that are not C-contiguous float32 CPU arrays of one height.
    """

    weight: object
    salt: int
    slots: tuple[tuple[object, float], ...] = ()
    columns: np.ndarray = field(init=False, repr=False)
    floats: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        address, shape, slots, values = described_rows(
            self.weight, self.slots, "train_many: a Fill"
        )
        columns = [address, shape[0], shape[1], np.uint64(self.salt).view(np.int64), *slots]
        floats = [1.0 / math.sqrt(shape[1]), _LO, _WIDTH, *values]
        object.__setattr__(self, "columns", np.array(columns, np.int64))
        object.__setattr__(self, "floats", np.array(floats, np.float64))


def described_rows(
    weight: object, slots: Sequence[tuple[object, float]], what: str
) -> tuple[int, tuple[int, ...], list[int], list[float]]:
    """``weight``'s address and shape ``(rows, dim)``, then ``address, width`` of each slot and
    ``MAX_SLOTS`` pairs in all (zeros after the slots), and each slot's value (``MAX_SLOTS``).

    Raises:
        ValueError: ``what`` takes C-contiguous float32 CPU rows and slots of one height.
    """
    address, shape = address_of(weight)
    error = ValueError(f"{what} takes C-contiguous float32 CPU rows and slots")
    if not address or len(shape) != 2 or len(slots) > k.MAX_SLOTS:
        raise error
    columns, values = [0] * (2 * k.MAX_SLOTS), [0.0] * k.MAX_SLOTS
    for s, (slot, value) in enumerate(slots):
        slot_address, slot_shape = address_of(slot)
        if not slot_address or not slot_shape or slot_shape[0] != shape[0]:
            raise error
        columns[2 * s], columns[2 * s + 1] = slot_address, math.prod(slot_shape[1:])
        values[s] = float(value)
    return address, shape, columns, values


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
    queries = [np.ascontiguousarray(q, dtype=np.int64) for q in keys]
    if len(queries) != len(spaces):
        raise ValueError(f"train_many: {len(spaces)} key spaces but {len(queries)} key arrays")
    if not spaces:
        return []
    sizes = [q.size for q in queries]
    desc = np.zeros((len(spaces), k.COLUMNS), np.int64)
    floats = np.zeros((len(spaces), 3 + k.MAX_SLOTS), np.float64)
    results = np.zeros((len(spaces), 5), np.int64)
    results[:, k.R_FAILED] = 1  # every table is to be staged
    # the outputs of every table in two blocks: the rows, and the scratch of new keys
    starts = np.cumsum([0, *sizes])
    out = np.empty(max(1, int(starts[-1])), np.int64)
    scratch = np.empty((len(_SCRATCH), out.size), np.int64)
    desc[:, k.D_QUERY] = [q.ctypes.data for q in queries]
    desc[:, k.D_N], desc[:, k.D_BASE] = sizes, base
    desc[:, k.D_OUT] = out.ctypes.data + 8 * starts[:-1]
    for column, row in zip(_SCRATCH, scratch, strict=True):
        desc[:, column] = row.ctypes.data + 8 * starts[:-1]
    for space, n in zip(spaces, sizes, strict=True):
        _grow_ahead(space, n)
    desc[:, _INDEX] = [_index_columns(space) for space in spaces]
    k.stage_tables(desc, results)
    try:
        while results[:, k.R_FAILED].any():  # an index without room: count, grow, stage again
            for t in np.flatnonzero(results[:, k.R_FAILED]):
                space = spaces[t]
                space._index.reserve(space.count_new(queries[t]))
                desc[t, _INDEX] = _index_columns(space)
            k.stage_tables(desc, results)
        staged = results.tolist()
        for t, space in enumerate(spaces):
            index = space._index
            top = index.num_rows + max(0, staged[t][k.R_NEW] - index.num_free)
            if top - 1 > ROW_LIMIT[index.row_dtype]:
                raise IndexMemoryError(
                    f"table '{space.table}': {len(space)} keys + {staged[t][k.R_NEW]} new "
                    f"need row {top - 1}, past the {index.row_dtype} row limit"
                )
            space.reserve_rows(top)
            if new := staged[t][k.R_NEW]:  # the order pass 2 hands out their rows in
                a = starts[t]
                scratch[-1, a : a + new] = np.argsort(scratch[0, a : a + new])
            fill = prepare(t, top) if prepare is not None else None
            if fill is not None:
                desc[t, k.D_WEIGHT :] = fill.columns
                floats[t] = fill.floats
        desc[:, _META] = [[*space.addresses()[4:], space._key.size, space.step] for space in spaces]
    except BaseException:
        k.unstage_tables(desc, results)
        raise
    k.finish_tables(desc, floats, results)
    got = []
    new_keys, _, _, new_rows, _ = scratch
    ends = starts.tolist()
    for t, (space, r) in enumerate(zip(spaces, results.tolist(), strict=True)):
        index, a, b = space._index, ends[t], ends[t + 1]
        index._n_free, index._next_row = r[k.R_N_FREE], r[k.R_NEXT_ROW]
        index._size, m = r[k.R_SIZE], r[k.R_NEW]
        got.append(Admitted(out[a:b], new_keys[a : a + m].copy(), new_rows[a : a + m].copy()))
    return got


#: the descriptor columns of the per-key scratch, in the order of their block's rows: the new
#: keys first, their argsort last
_SCRATCH = (k.D_NEW_KEYS, k.D_NEW_SLOTS, k.D_MULT, k.D_NEW_ROWS, k.D_ORDER)
#: the descriptor columns of a key index (:func:`_index_columns`)
_INDEX = [k.D_CTRL, k.D_KEYS, k.D_ROWS, k.D_FREE, k.D_CAP, k.D_MAX_SIZE, k.D_N_FREE]
_INDEX += [k.D_NEXT_ROW, k.D_SIZE]
#: the descriptor columns of the row metadata: its four arrays, their size, the step
_META = [k.D_KEY, k.D_FREQ, k.D_LAST, k.D_LIVE, k.D_META, k.D_STEP]


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


def _index_columns(space: KeySpace) -> list[int]:
    """The :data:`_INDEX` columns of ``space``'s key index."""
    index = space._index
    sizes = [index.capacity, index._max_size(), index._n_free, index._next_row, index._size]
    return space.addresses()[:4] + sizes


def address_of(array: object) -> tuple[int, tuple[int, ...]]:
    """The data address and shape of a C-contiguous float32 CPU array or tensor."""
    if isinstance(array, np.ndarray):
        ok = array.dtype == np.float32 and array.flags.c_contiguous
        return (array.ctypes.data if ok else 0), array.shape
    if not isinstance(array, torch.Tensor):
        return 0, ()
    ok = array.dtype == torch.float32 and array.is_contiguous() and array.device.type == "cpu"
    return (array.data_ptr() if ok else 0), tuple(array.shape)
