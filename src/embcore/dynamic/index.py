"""A growable CPU hash index from int64 keys to row numbers, for dynamic tables.

Every int64 is a valid key (both extremes included): emptiness is a control byte per slot,
never a reserved key. Keys, row numbers and control bytes live in separate arrays (13 bytes a
slot with int32 rows); the table grows by 1.5x when its load passes 0.85, so it holds between
about 15 and 23 bytes per key. New keys take rows freed by :meth:`KeyIndex.remove` (smallest
first), else fresh rows at the end. Lookups run on several threads (read-only, so the result
is the same for any thread count); inserts and removals run on one. An insert that needs
memory that cannot be had raises :class:`IndexMemoryError` naming the sizes, before any change.
See docs/dynamic_tables.md.
"""

from __future__ import annotations

import math

import numpy as np

from embcore._numba import threads
from embcore.dynamic import _kernels

__all__ = ["GROWTH", "MAX_LOAD", "ROW_LIMIT", "IndexMemoryError", "KeyIndex", "check_keys"]

#: the table grows when its load (keys / slots) would pass this
MAX_LOAD = 0.85
#: by this factor (or more, if one insert needs more)
GROWTH = 1.5
_MIN_SLOTS = 16
_MAX_SLOTS = (1 << 32) - 1  # the home slot is computed from 32 hash bits
#: the largest row number of each row dtype (``np.iinfo`` is slow for a per-lookup check)
ROW_LIMIT = {np.dtype(np.int32): (1 << 31) - 1, np.dtype(np.int64): (1 << 63) - 1}


class IndexMemoryError(MemoryError):
    """The index could not get the memory a batch of new keys needs; nothing was changed."""


def grown(array: np.ndarray, size: int, what: str) -> np.ndarray:
    """``array`` with room for ``size`` entries (grown by half at least, zero-filled), or
    ``array`` itself when it has that room.

    Raises:
        IndexMemoryError: the memory cannot be had (``what`` says for what); ``array`` is
            unchanged.
    """
    if size <= array.size:
        return array
    new_size = max(size, int(array.size * 1.5) + 16)
    try:
        out = np.zeros(new_size, array.dtype)
    except MemoryError as e:
        raise IndexMemoryError(
            f"{what}: could not allocate {new_size} entries ({new_size * array.itemsize} "
            "bytes); nothing was changed"
        ) from e
    out[: array.size] = array
    return out


def _empty(shape: int, dtype: type) -> np.ndarray:
    """Allocation point of the index (one place, so a test can make it fail)."""
    return np.empty(shape, dtype)


def check_keys(keys: np.ndarray, table: str, op: str) -> np.ndarray:
    """``keys`` as a contiguous 1-D int64 array, or ``TypeError`` naming the table and ``op``."""
    if not isinstance(keys, np.ndarray) or keys.dtype != np.int64 or keys.ndim != 1:
        got = (
            f"{keys.dtype} array of shape {keys.shape}"
            if isinstance(keys, np.ndarray)
            else type(keys).__name__
        )
        raise TypeError(f"table '{table}': {op} takes a 1-D int64 array of keys, got {got}")
    return np.ascontiguousarray(keys)


class KeyIndex:
    """Maps int64 keys to row numbers ``0 .. num_rows - 1`` of a table's row storage.

    Args:
        table: the table's name, for error messages.
        capacity: keys to make room for up front (the index grows past it as needed).
        row_dtype: ``np.int32`` (4 bytes a slot; up to 2**31 - 1 rows) or ``np.int64``.
    """

    def __init__(self, table: str, capacity: int = 0, row_dtype: type = np.int32) -> None:
        if np.dtype(row_dtype) not in (np.dtype(np.int32), np.dtype(np.int64)):
            raise ValueError(
                f"table '{table}': KeyIndex row_dtype must be int32 or int64, got {row_dtype}"
            )
        if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity < 0:
            raise ValueError(
                f"table '{table}': KeyIndex capacity must be an int >= 0, got {capacity!r}"
            )
        self.table = table
        self.row_dtype = np.dtype(row_dtype)
        slots = self._slots_for(capacity)
        self._ctrl, self._keys, self._rows = self._allocate(slots, len_now=0)
        self._size = 0
        self._next_row = 0
        self._free = np.empty(0, self.row_dtype)  # a stack: the smallest free row on top
        self._n_free = 0

    # ---------------------------------------------------------------- sizes

    def __len__(self) -> int:
        """The number of keys held."""
        return self._size

    @property
    def capacity(self) -> int:
        """The number of slots (keys held before the next growth: ``MAX_LOAD * capacity``)."""
        return int(self._ctrl.size)

    @property
    def num_rows(self) -> int:
        """Rows handed out so far, held or free: the row storage needs this many rows."""
        return self._next_row

    @property
    def num_free(self) -> int:
        """Rows freed by removals and not yet reused."""
        return self._n_free

    @property
    def nbytes(self) -> int:
        """Bytes of the slot arrays and the free list."""
        arrays = (self._ctrl, self._keys, self._rows, self._free)
        return sum(int(a.nbytes) for a in arrays)

    def bytes_per_key(self) -> float:
        """``nbytes / len(self)`` (``nan`` when empty)."""
        return self.nbytes / self._size if self._size else math.nan

    # ---------------------------------------------------------------- operations

    def find(self, keys: np.ndarray) -> np.ndarray:
        """``keys: (N,) int64`` -> ``(N,) int64``: each key's row, or -1 if it has none."""
        keys = check_keys(keys, self.table, "KeyIndex.find")
        out = np.empty(keys.size, np.int64)
        workers = threads.num_workers(keys.size)
        threads.run(_kernels.find, self._ctrl, self._keys, self._rows, keys, out, workers=workers)
        return out

    def insert(self, keys: np.ndarray) -> np.ndarray:
        """``keys: (N,) int64`` -> ``(N,) int64`` rows, giving a row to every key without one."""
        return self.insert_new(keys)[0]

    def insert_new(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Like :meth:`insert`, also returning ``new: (N,) bool``, true at the first occurrence
        of each key this call gave a row. New keys get rows in order of first occurrence.

        Raises:
            IndexMemoryError: the slot arrays could not grow, or the rows would pass what
                ``row_dtype`` holds; the index is unchanged.
        """
        keys = check_keys(keys, self.table, "KeyIndex.insert")
        rows = np.empty(keys.size, np.int64)
        new = np.empty(keys.size, np.bool_)
        saved = (self._n_free, self._next_row, self._size)
        limit = ROW_LIMIT[self.row_dtype]
        done = 0
        while True:
            done, self._n_free, self._next_row, self._size = _kernels.insert(
                self._ctrl, self._keys, self._rows, keys, done, rows, new, self._free,
                self._n_free, self._next_row, self._size, self._max_size(), limit,
            )  # fmt: skip
            if done == keys.size:
                return rows, new
            try:
                if self._n_free == 0 and self._next_row > limit:
                    raise IndexMemoryError(
                        f"table '{self.table}': a new key would need row {self._next_row}, "
                        f"past the {self.row_dtype} row limit {limit} ({self._size} keys held); "
                        "use row_dtype=np.int64; the index is unchanged"
                    )
                self._grow(math.ceil(self.capacity * GROWTH))
            except IndexMemoryError:
                # undo this call's inserts: the same keys map to the same rows as before
                added = keys[:done][new[:done]]
                _kernels.remove(self._ctrl, self._keys, self._rows, added, rows[: added.size])
                self._n_free, self._next_row, self._size = saved
                raise

    def reserve(self, new_keys: int) -> None:
        """Make room for ``new_keys`` more keys now, so that inserting that many allocates
        nothing. Raises :class:`IndexMemoryError` (index unchanged) if it cannot."""
        if not self._fits(new_keys):
            self._reserve(new_keys)

    def write_empty(self) -> None:
        """Write zeros into every empty slot's key and row, so that their pages are mapped now
        (a capacity reserved up front), not by the inserts that take them. Changes no entry."""
        empty = self._ctrl == 0
        np.copyto(self._keys, 0, where=empty)
        np.copyto(self._rows, 0, where=empty)

    def fits(self, new_keys: int) -> bool:
        """Whether inserting ``new_keys`` more keys allocates nothing."""
        return self._fits(new_keys)

    def remove(self, keys: np.ndarray) -> np.ndarray:
        """Remove the keys that have a row; returns their freed rows ``(F,) int64`` in the
        order the keys were given (absent keys are skipped). Freed rows are reused by later
        inserts, smallest first."""
        keys = check_keys(keys, self.table, "KeyIndex.remove")
        freed = np.empty(keys.size, self.row_dtype)
        n = _kernels.remove(self._ctrl, self._keys, self._rows, keys, freed)
        if n:
            self._size -= n
            stack = np.concatenate([self._free[: self._n_free], freed[:n]])
            self._free = np.sort(stack)[::-1].copy()  # pop from the end: smallest first
            self._n_free = self._free.size
        return freed[:n].astype(np.int64)

    def items(self, ordered: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """``(keys, rows)``: every key held ``(R,) int64`` and its row ``(R,) int64``, sorted
        by key (or in slot order, without the sort, when ``ordered`` is false)."""
        held = self._ctrl != 0
        keys, rows = self._keys[held], self._rows[held].astype(np.int64)
        if not ordered:
            return keys, rows
        order = np.argsort(keys, kind="stable")
        return keys[order], rows[order]

    # ---------------------------------------------------------------- growth

    @staticmethod
    def _slots_for(keys: int) -> int:
        return max(_MIN_SLOTS, math.ceil(keys / MAX_LOAD) + 1)

    def _allocate(self, slots: int, len_now: int) -> tuple[np.ndarray, ...]:
        per_slot = 1 + 8 + self.row_dtype.itemsize
        if slots > _MAX_SLOTS:
            raise IndexMemoryError(
                f"table '{self.table}': the key index cannot grow to {slots} slots for "
                f"{len_now} keys (at most {_MAX_SLOTS} slots)"
            )
        try:
            ctrl = _empty(slots, np.uint8)
            keys = _empty(slots, np.int64)
            rows = _empty(slots, self.row_dtype)
        except MemoryError as e:
            raise IndexMemoryError(
                f"table '{self.table}': could not allocate the key index's {slots} slots "
                f"({slots * per_slot} bytes) for {len_now} keys; the index is unchanged"
            ) from e
        ctrl.fill(0)
        return ctrl, keys, rows

    def _fits(self, new_keys: int) -> bool:
        """Whether ``new_keys`` more keys fit in the slots and row numbers now."""
        fresh_rows = max(0, new_keys - self._n_free)
        return (
            self._size + new_keys <= self._max_size()
            and self._next_row + fresh_rows - 1 <= ROW_LIMIT[self.row_dtype]
        )

    def _reserve(self, new_keys: int) -> None:
        """Make room for ``new_keys`` more keys (slots and row numbers), or raise unchanged."""
        fresh_rows = max(0, new_keys - self._n_free)
        limit = ROW_LIMIT[self.row_dtype]
        if self._next_row + fresh_rows - 1 > limit:
            raise IndexMemoryError(
                f"table '{self.table}': {self._size} keys + {new_keys} new need row "
                f"{self._next_row + fresh_rows - 1}, past the {self.row_dtype} row limit "
                f"{limit}; use row_dtype=np.int64"
            )
        wanted = self._size + new_keys
        if wanted > self._max_size():
            self._grow(max(self._slots_for(wanted), math.ceil(self.capacity * GROWTH)))

    def _max_size(self) -> int:
        """Keys the slots hold before the table must grow."""
        return min(int(MAX_LOAD * self.capacity), self.capacity - 1)

    def _grow(self, slots: int) -> None:
        """Rehash into ``slots`` slots, or raise :class:`IndexMemoryError` unchanged."""
        ctrl, keys, rows = self._allocate(slots, len_now=self._size)
        _kernels.rehash(self._ctrl, self._keys, self._rows, ctrl, keys, rows)
        self._ctrl, self._keys, self._rows = ctrl, keys, rows
