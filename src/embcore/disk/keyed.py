"""A dynamic table's rows on local disk: the disk tier addressed by key-space row.

The key index (:class:`~embcore.dynamic.keyspace.KeySpace`, in RAM) gives each admitted key a
row ``r``; record ``r + 1`` of the working file holds it, its optimizer slots beside it, and
the bounded row cache of :class:`~embcore.disk.table.DiskTable` holds the rows in use::

    id 0        the sink: what keys without a row read (zeros, the slots' initial values);
                never stored, its changes dropped
    id r + 1    key-space row r

The file starts small and grows (sparse) as the key space hands out rows. A newly admitted
key's row is *born* in the cache: its initial values are held aside (:meth:`bear`) until the
call that admitted it caches them, marked changed, so they reach the file when they leave the
cache; nothing is read for it. A row freed by eviction leaves the cache without being written
(:meth:`discard`): its record is stale until the row of a later key is written there, and
nothing reads it before (a reused row is born again). See docs/disk_tables.md.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from embcore.config import ResolvedTable
from embcore.disk._file import aligned
from embcore.disk.table import _CHUNK, DiskTable, row_shapes
from embcore.storage import DiskStorage

__all__ = ["SINK", "KeyedDiskTable"]

#: the id keys without a row read (and whose gradient is dropped)
SINK = 0
_MIN_ROWS = 1024


class KeyedDiskTable(DiskTable):
    """A dynamic table's rows in ``storage.directory`` by id (key-space row + 1), at most
    ``cache_bytes`` of them in RAM (see the module docstring).

    Args:
        table: a dynamic table (``vocabulary_size=None``).
        storage: where and how; ``seed`` and ``cache_bytes`` as :class:`DiskTable`'s.
    """

    def __init__(
        self, table: ResolvedTable, storage: DiskStorage, seed: int, cache_bytes: int
    ) -> None:
        super().__init__(table, storage, seed, cache_bytes, rows=_MIN_ROWS)
        self._made = np.ones(-(-self.rows // self._block), np.bool_)  # no initializer blocks
        self.touched = None  # a dynamic table's delta compares its records by key
        self._born_ids = np.zeros(0, np.int64)
        self._born = self._empty(0)

    def _empty(self, n: int) -> dict[str, Tensor]:
        return {name: torch.empty((n, *s)) for name, s in row_shapes(self.table).items()}

    def grow(self, rows: int) -> None:
        """Room in the file for ids ``[0, rows)``: it grows by half at least, sparse."""
        if rows <= self.rows:
            return
        rows = max(rows, self.rows + self.rows // 2)
        self.file.grow(rows)
        self.rows = rows
        self._made = np.ones(-(-rows // self._block), np.bool_)

    def sink(self, n: int = 1) -> dict[str, Tensor]:
        """``name -> (n, ...)``: what a key without a row reads (zeros, initial slots)."""
        out = {"weight": torch.zeros((n, self.table.dim))}
        for name, shape in row_shapes(self.table).items():
            if name != "weight":
                out[name] = torch.full((n, *shape), self._init[name])
        return out

    # ------------------------------------------------------------------ rows born, freed
    def bear(self, ids: np.ndarray, weight: Tensor) -> None:
        """Hold the initial rows of newly admitted ids ``(A,) int64`` (``weight: (A, dim)``;
        the slots take their initial values) until a call caches them."""
        if ids.size == 0:
            return
        values = self.sink(ids.size)
        values["weight"] = weight.to(torch.float32)
        keep = ~np.isin(self._born_ids, ids)  # an id born again takes its latest values
        ids = np.concatenate([self._born_ids[keep], ids])
        keep_t = torch.from_numpy(keep)
        values = {n: torch.cat([self._born[n][keep_t], v]) for n, v in values.items()}
        order = np.argsort(ids, kind="stable")
        self._born_ids = ids[order]
        self._born = {n: v.index_select(0, torch.from_numpy(order)) for n, v in values.items()}

    def discard(self, ids: np.ndarray) -> None:
        """Drop the rows of ``ids`` (freed by eviction) from the cache and the born rows,
        writing nothing."""
        self._forget_born(ids)
        with self._lock:
            slots = self.cache.lookup(np.ascontiguousarray(ids, np.int64))
            held = slots[slots >= 0]
            self.cache.changed[held] = False
            self.cache.evict(held)

    def reset_sink(self) -> None:
        """After an update: the sink's cached copy reads zeros and initial slots again."""
        slot = int(self.cache.lookup(np.zeros(1, np.int64))[0])
        if slot >= 0:
            for name, value in self.sink().items():
                self.cache.tensors[name][slot] = value[0]
            self.cache.changed[slot] = False

    def clear(self) -> None:
        """Forget every row (a load replaces them): the cache empties without writing back."""
        self.wait_prefetch()
        with self._lock:
            self.cache.clear(write_back=False)
        self._born_ids, self._born = np.zeros(0, np.int64), self._empty(0)

    # ------------------------------------------------------------------ a call's rows
    def slots(self, ids: np.ndarray, changed: bool) -> np.ndarray:
        """:meth:`DiskTable.slots`; born rows among ``ids`` are cached as changed."""
        born = ids[np.isin(ids, self._born_ids)]
        slots = super().slots(ids, changed)
        if born.size:
            self.cache.changed[slots[np.searchsorted(ids, born)]] = True
            self._forget_born(born)
        return slots

    def _forget_born(self, ids: np.ndarray) -> None:
        keep = ~np.isin(self._born_ids, ids)
        self._born_ids = self._born_ids[keep]
        self._born = {n: v[torch.from_numpy(keep)] for n, v in self._born.items()}

    def _fetch(self, ids: np.ndarray, staged: Any = None) -> dict[str, Tensor]:
        """The rows of ``ids`` (ascending, not cached): the sink's and born rows' values,
        the others read from the file (or prefetched)."""
        out = self._empty(ids.size)
        self._fill_special(ids, out)
        stored = np.flatnonzero((ids != SINK) & ~np.isin(ids, self._born_ids))
        read = super()._fetch(ids[stored], staged)  # also takes the staged prefetch
        index = torch.from_numpy(stored)
        for name, value in read.items():
            out[name].index_copy_(0, index, value)
        return out

    def _fill_special(self, ids: np.ndarray, out: dict[str, Tensor]) -> None:
        """Fill ``out`` at the sink and the born rows among ``ids``."""
        sink = np.flatnonzero(ids == SINK)
        if sink.size:
            for name, value in self.sink(sink.size).items():
                out[name][torch.from_numpy(sink)] = value
        born = np.flatnonzero(np.isin(ids, self._born_ids))
        if born.size:
            at = torch.from_numpy(np.searchsorted(self._born_ids, ids[born]))
            for name, value in self._born.items():
                out[name][torch.from_numpy(born)] = value.index_select(0, at)

    def _write(self, ids: np.ndarray, rows: dict[str, Tensor]) -> None:
        """Write back changed rows, never the sink."""
        keep = ids != SINK
        if not keep.all():
            ids, rows = ids[keep], {n: v[torch.from_numpy(keep)] for n, v in rows.items()}
        if ids.size:
            super()._write(ids, rows)

    # ------------------------------------------------------------------ reading rows
    def values(self, ids: np.ndarray) -> dict[str, Tensor]:
        """``name -> (N, ...)``: the current rows of ``ids: (N,) int64`` (any order, repeats
        allowed), from the cache, the born rows or the file, caching nothing."""
        out = self._empty(ids.size)
        with self._lock:
            slots = self.overlay_cached(ids, out)
        rest = np.flatnonzero(slots < 0)
        self._fill_special_at(ids, rest, out)
        stored = rest[(ids[rest] != SINK) & ~np.isin(ids[rest], self._born_ids)]
        for a in range(0, stored.size, _CHUNK):
            part = stored[a : a + _CHUNK]
            unique, inverse = np.unique(ids[part], return_inverse=True)
            records = aligned(unique.size, self.file.dtype)
            self.file.read(unique, records)
            self._check(unique, records)
            self._unpack(records[inverse.reshape(-1)], out, part)
        return out

    def _fill_special_at(self, ids: np.ndarray, at: np.ndarray, out: dict[str, Tensor]) -> None:
        part = self._empty(at.size)
        self._fill_special(ids[at], part)
        index = torch.from_numpy(at)
        for name, value in part.items():
            out[name].index_copy_(0, index, value)

    def load_rows(self, values: dict[str, Tensor]) -> None:
        """Replace every row: ids ``1 .. N`` take ``values`` (``name -> (N, ...)``), written
        to the file; the cache and the born rows are emptied first."""
        self.clear()
        n = values["weight"].shape[0]
        self.grow(n + 1)
        if n:
            self.write_rows(1, {k: v.to(torch.float32) for k, v in values.items()})
