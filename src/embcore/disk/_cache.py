"""The RAM cache of one disk table: which rows it holds, in which slots, and which to evict.

The cache holds whole rows (weight and optimizer slots), not pages: a slot of the cache is a
row of the tensors the fused kernels read and write. A :class:`~embcore.dynamic.index.KeyIndex`
maps a row's id to its slot (freed slots are reused, smallest first); per slot the cache keeps
the row's id, the number of the last call that used it (least recently used rows leave
first) and whether it changed since it was read. Eviction writes changed rows back before it
frees their slots, so the file and the cache together always hold the table exactly.

A call's rows are never evicted by that call. When one call needs more rows than the cache
holds, the cache grows to hold them for that call (counted in ``overflow_rows``) and empties
itself at the end of the step, writing its rows back, so that it holds ``capacity`` rows again.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor

from embcore.dynamic.index import KeyIndex

__all__ = ["RowCache"]

#: an eviction frees at least this fraction of the capacity, so that choosing victims
#: (linear in the capacity) is paid once per many misses
_EVICT_FRACTION = 1 / 32


class RowCache:
    """Up to ``capacity`` rows of one table in RAM.

    Args:
        table: the table's name (messages).
        capacity: rows held between steps, >= 1.
        shapes: ``name -> per-row shape`` of ``weight`` (``(dim,)``) and each optimizer slot
            (``(dim,)`` or ``()``), all float32.
        fill: ``fill(name) -> float``: the value an unused slot of new tensors holds (0 for
            the weight, a slot's initial value).
        write_back: ``write_back(ids, rows)``: store changed rows (``ids: (N,) int64``
            ascending, ``rows: name -> (N, ...) tensor``); raises to keep them cached.
    """

    def __init__(
        self,
        table: str,
        capacity: int,
        shapes: dict[str, tuple[int, ...]],
        fill: Callable[[str], float],
        write_back: Callable[[np.ndarray, dict[str, Tensor]], None],
    ) -> None:
        self.table, self.capacity = table, capacity
        self._shapes, self._fill, self._write_back = shapes, fill, write_back
        self.tensors = self._allocate(capacity)
        self.index = KeyIndex(table, capacity)
        self.ids = np.full(capacity, -1, np.int64)  # slot -> id held (-1: free)
        self.used = np.zeros(capacity, np.int64)  # slot -> the call that last used it
        self.changed = np.zeros(capacity, np.bool_)
        self.call = 0
        self.stats = {"hits": 0, "misses": 0, "evicted_rows": 0, "overflow_rows": 0}

    def _allocate(self, rows: int) -> dict[str, Tensor]:
        return {
            name: torch.full((rows, *shape), self._fill(name), dtype=torch.float32)
            for name, shape in self._shapes.items()
        }

    @property
    def held(self) -> int:
        return len(self.index)

    @property
    def nbytes(self) -> int:
        """RAM the cache holds now: row tensors, bookkeeping and index."""
        values = sum(t.numel() * 4 for t in self.tensors.values())
        return values + self.index.nbytes + self.ids.size * 17

    # ------------------------------------------------------------------ one call's rows
    def begin(self, ids: np.ndarray, count: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """Start a call over ``ids: (N,) int64`` (unique): ``(slots, missing)``, the slot of
        each id (``-1`` where not cached) and the ids not cached (ascending). The ids held
        are marked as used by this call, so that :meth:`insert` does not evict them.
        ``count``: add to the hits and misses (lookups do; an update's second pass not)."""
        self.call += 1
        slots = self.index.find(ids)
        hit = slots >= 0
        self.used[slots[hit]] = self.call
        missing = np.sort(ids[~hit])
        if count:
            self.stats["hits"] += int(hit.sum())
            self.stats["misses"] += int(missing.size)
        return slots, missing

    def insert(self, ids: np.ndarray, rows: dict[str, Tensor]) -> np.ndarray:
        """Cache ``rows`` (``name -> (N, ...)``) of ``ids: (N,) int64`` (not cached), evicting
        the least recently used rows of earlier calls (written back if changed); returns their
        slots ``(N,) int64``. On an error (a write-back failed) nothing changed."""
        if ids.size == 0:
            return np.zeros(0, np.int64)
        self._make_room(ids.size)
        slots = self.index.insert(ids)
        if slots.size and int(slots.max()) >= self.ids.size:  # past the capacity: overflow
            self._grow(int(slots.max()) + 1)
        index = torch.from_numpy(slots)
        for name, tensor in self.tensors.items():
            tensor.index_copy_(0, index, rows[name])
        self.ids[slots] = ids
        self.used[slots] = self.call
        self.changed[slots] = False
        return slots

    def _make_room(self, n: int) -> None:
        free = self.capacity - self.held
        if n <= free:
            return
        evictable = np.flatnonzero((self.ids >= 0) & (self.used < self.call))
        want = min(evictable.size, max(n - free, int(self.capacity * _EVICT_FRACTION)))
        if want < evictable.size:
            order = np.argpartition(self.used[evictable], want - 1)[:want]
            evictable = evictable[order]
        self.evict(evictable)
        short = n - (self.capacity - self.held)
        if short > 0:
            self.stats["overflow_rows"] += short

    def evict(self, slots: np.ndarray) -> None:
        """Write back the changed rows of ``slots`` (``(K,) int64``, held), then free them."""
        if slots.size == 0:
            return
        dirty = slots[self.changed[slots]]
        if dirty.size:
            order = np.argsort(self.ids[dirty])
            dirty = dirty[order]
            index = torch.from_numpy(dirty)
            self._write_back(
                self.ids[dirty], {n: t.index_select(0, index) for n, t in self.tensors.items()}
            )
        self.index.remove(self.ids[slots])  # the freed slots keep stale values: no id maps
        self.ids[slots] = -1  # to them until insert() overwrites them
        self.changed[slots] = False
        self.stats["evicted_rows"] += int(slots.size)

    def _grow(self, rows: int) -> None:
        fresh = self._allocate(rows)
        for name, tensor in self.tensors.items():
            fresh[name][: tensor.shape[0]] = tensor
        self.tensors = fresh
        extra = rows - self.ids.size
        self.ids = np.concatenate([self.ids, np.full(extra, -1, np.int64)])
        self.used = np.concatenate([self.used, np.zeros(extra, np.int64)])
        self.changed = np.concatenate([self.changed, np.zeros(extra, np.bool_)])

    def end_step(self) -> bool:
        """After a step: a cache grown past its capacity writes its rows back and empties
        to ``capacity`` rows. Returns whether the tensors were replaced."""
        if self.ids.size <= self.capacity:
            return False
        self.clear(write_back=True)
        return True

    def clear(self, write_back: bool) -> None:
        """Empty the cache (writing changed rows back first when ``write_back``)."""
        if write_back:
            self.evict(np.flatnonzero(self.ids >= 0))
        self.tensors = self._allocate(self.capacity)
        self.index = KeyIndex(self.table, self.capacity)
        self.ids = np.full(self.capacity, -1, np.int64)
        self.used = np.zeros(self.capacity, np.int64)
        self.changed = np.zeros(self.capacity, np.bool_)

    def lookup(self, ids: np.ndarray) -> np.ndarray:
        """``(N,) int64`` slots of ``ids`` (``-1``: not cached), changing nothing."""
        return self.index.find(ids)
