"""One fixed table's rows on local disk behind a bounded RAM cache: the disk tier.

Rows and optimizer slots live in one working file of fixed-size records
(:mod:`embcore.disk._file`); a :class:`~embcore.disk._cache.RowCache` of at most
``cache_bytes`` holds the rows in use. :meth:`DiskTable.slots` brings a call's rows into the
cache (reading those not cached, writing back the changed rows they displace) and returns
their cache slots, on which the row storage (:mod:`embcore.rows.disk`) runs the ordinary
fused kernels::

    ids of a call --slots()--> cache slots --ops.lookup / ops.update--> cache tensors
                                  ^   | evict (write back changed rows)
                          read    |   v
                           working file: record i = row i and its slots

Creating a table writes nothing: the file is sparse, and the rows of an initializer block
(:data:`embcore.initializers.BLOCK_ROWS` rows) are drawn and written when one of them is
first needed, from the same deterministic initializer as the in-memory table. Rows handed to
:meth:`DiskTable.prefetch` are read on a background thread; copies that a later write-back
made stale are dropped. See docs/disk_tables.md.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import torch
from torch import Tensor

from embcore._numba import threads
from embcore.config import ResolvedTable
from embcore.disk._cache import RowCache
from embcore.disk._checksum import damaged, seal
from embcore.disk._file import RECORD_MAGIC, DiskTableError, RecordLayout, RowFile, aligned
from embcore.disk._touched import TouchedRows
from embcore.initializers import BLOCK_ROWS, initial_rows, slot_values
from embcore.storage import DiskStorage, cached_row_bytes

__all__ = ["DiskTable", "row_bytes", "row_shapes"]

#: rows per request when a whole block or range is read or written (a 4-8 MiB buffer)
_CHUNK = 8192
#: rows drawn and written together on first touch: the initializer's block (drawing part of
#: a block costs the whole block's draw)
_MAKE_ROWS = BLOCK_ROWS
#: prefetches kept for lookups to come
_MAX_STAGED = 4
_prefetcher = ThreadPoolExecutor(1, thread_name_prefix="embcore-disk-prefetch")


def row_shapes(table: ResolvedTable) -> dict[str, tuple[int, ...]]:
    opt, dim = table.optimizer, table.dim
    shapes = {"weight": (dim,)}
    for spec in opt.slot_specs() if opt else ():
        shapes[spec.name] = () if spec.rowwise else (dim,)
    return shapes


def row_bytes(table: ResolvedTable) -> int:
    """RAM one cached row of ``table`` costs: its values and the cache's bookkeeping."""
    floats = sum(s[0] if s else 1 for n, s in row_shapes(table).items() if n != "weight")
    return cached_row_bytes(table.dim, floats)


class DiskTable:
    """Table ``table``'s rows in ``storage.directory``, at most ``cache_bytes`` of them in RAM.

    Args:
        table: a fixed table (``vocabulary_size`` set).
        storage: where and how (its ``cache_bytes`` is not read: see ``cache_bytes``).
        seed: the engine's seed (the default initializer's).
        cache_bytes: this table's cache budget (at least one row is cached).
        rows, first: the rows held, ``[first, first + rows)`` of the table (a sharded
            engine's piece); ``rows=None``: the whole table. Local row ``i`` is row
            ``first + i`` of the table, with its initial values. A dynamic table's file
            starts small and grows (:mod:`embcore.disk.keyed`).
    """

    def __init__(
        self,
        table: ResolvedTable,
        storage: DiskStorage,
        seed: int,
        cache_bytes: int,
        rows: int | None = None,
        first: int = 0,
    ) -> None:
        opt = table.optimizer
        if opt is not None and opt.slot_variable_creation_fn is not None:
            raise ValueError(
                f"table '{table.name}': slot_variable_creation_fn is not supported for tables "
                "in DiskStorage (it takes the whole table in memory); new rows take the "
                "slots' initial values"
            )
        if opt is not None and not opt.lazy:
            raise ValueError(
                f"table '{table.name}': {type(opt).__name__} with lazy_adam=False updates every "
                "row at every step, which a table in DiskStorage cannot do without reading and "
                "writing all of it; use lazy_adam=True, or keep the table in memory"
            )
        self.table, self.seed, self.storage = table, seed, storage
        self.rows = int(table.vocabulary_size if rows is None else rows)
        self.first = first
        shapes = row_shapes(table)
        self._init = {s.name: s.initial_value for s in opt.slot_specs()} if opt else {}
        layout = RecordLayout(table.dim, tuple((n, s) for n, s in shapes.items() if n != "weight"))
        self.file = RowFile(
            table.name, storage.directory, layout, self.rows, storage.direct_io, storage.io_threads
        )
        self.capacity = max(1, cache_bytes // row_bytes(table))
        if table.vocabulary_size is not None:
            self.capacity = min(self.capacity, self.rows)
        self.cache = RowCache(
            table.name, self.capacity, shapes, lambda n: self._init.get(n, 0.0), self._write
        )
        self._block = _MAKE_ROWS
        self._made = np.zeros(-(-self.rows // self._block), np.bool_)  # blocks written once
        #: rows written since a checkpoint, for deltas (``None``: a dynamic table's, by key)
        self.touched: TouchedRows | None = TouchedRows(self.rows)
        self._user_rows: Tensor | None = None
        self._drawn: tuple[int, Tensor] | None = None  # the last initializer block drawn
        self.io = {"rows_read": 0, "rows_written": 0, "prefetched_rows": 0, "prefetch_used": 0}
        self.io["deferred_write_backs"] = 0
        self._lock = threading.RLock()  # guards the index against the prefetch thread
        self._staged: list[Future] = []
        self._writes: list[np.ndarray] = []  # ids written back while a prefetch is pending

    # ------------------------------------------------------------------ a call's rows
    def slots(self, ids: np.ndarray, changed: bool) -> np.ndarray:
        """``(N,) int64`` cache slots of ``ids: (N,) int64`` (unique), reading the rows not
        cached; none of them is evicted before the next call. ``changed``: an update will
        write them (and the call is not counted as a lookup in the hit statistics). A cache
        that an earlier call grew past its capacity (an evaluation lookup has no step end)
        empties itself first."""
        if self.cache.ids.size > self.capacity:
            self.end_step()
        with self._lock:  # a lookup takes the oldest prefetch, used or not (they stay in step)
            staged = self._staged.pop(0) if self._staged and not changed else None
        slots, missing = self.cache.begin(ids, count=not changed)
        if missing.size == 0 and staged is not None:
            self._use_prefetched(staged, missing, {}, np.zeros(0, np.bool_))
        if missing.size:
            rows = self._fetch(missing, staged)
            with self._lock:  # the prefetch thread reads the index
                new = self.cache.insert(missing, rows)
            slots[np.searchsorted(ids, missing)] = new
        if changed:
            self.cache.changed[slots] = True
            if self.touched is not None:
                self.touched.mark(ids)
        return slots

    def end_step(self) -> None:
        """After the update: a cache that grew for an oversized step empties itself. If its
        rows cannot be written back now (a full disk), it keeps them, over its budget: the
        next lookup that must write raises, before it changes anything."""
        with self._lock:
            try:
                self.cache.end_step()
            except DiskTableError:
                self.io["deferred_write_backs"] += 1

    # ------------------------------------------------------------------ reading rows
    def _fetch(self, ids: np.ndarray, staged: Future | None = None) -> dict[str, Tensor]:
        """``name -> (N, ...)`` values of ``ids`` (ascending, not cached): prefetched (by
        ``staged``), read from the file, or drawn for a block never written (written now)."""
        out = {n: torch.empty((ids.size, *s)) for n, s in row_shapes(self.table).items()}
        blocks = ids // self._block
        for block in np.unique(blocks[~self._made[blocks]]).tolist():
            self._make_block(block)
        todo = np.ones(ids.size, np.bool_)
        if staged is not None:
            self._use_prefetched(staged, ids, out, todo)
        if todo.any():
            want = ids[todo]
            records = aligned(want.size, self.file.dtype)
            self.file.read(want, records)
            self._check(want, records)
            self._unpack(records, out, np.flatnonzero(todo))
            self.io["rows_read"] += int(want.size)
        return out

    def _check(self, ids: np.ndarray, records: np.ndarray) -> None:
        bad = (records["magic"] != RECORD_MAGIC) | (records["id"] != ids) | damaged(records)
        if bad.any():
            raise self.file.unreadable(ids[bad])

    def _unpack(self, records: np.ndarray, out: dict[str, Tensor], at: np.ndarray) -> None:
        index = torch.from_numpy(at)
        for name, tensor in out.items():
            field = "weight" if name == "weight" else f"slot_{name}"
            tensor.index_copy_(0, index, torch.from_numpy(np.ascontiguousarray(records[field])))

    def _write(self, ids: np.ndarray, rows: dict[str, Tensor]) -> None:
        """Write back changed rows (``ids`` ascending); logged so that a prefetch that read
        them before drops its stale copies."""
        records = aligned(ids.size, self.file.dtype)
        records["magic"], records["id"] = RECORD_MAGIC, ids
        for name, value in rows.items():
            records["weight" if name == "weight" else f"slot_{name}"] = value.numpy()
        seal(records)
        with self._lock:
            if self._staged:
                self._writes.append(ids)
        self.file.write(ids, records)
        self.io["rows_written"] += int(ids.size)

    # ------------------------------------------------------------------ initial rows
    def initial(self, start: int, stop: int) -> dict[str, Tensor]:
        """``name -> (stop - start, ...)``: the initial values of rows ``[start, stop)``,
        those of the in-memory table."""
        cfg, vocab = self.table.config, int(self.table.vocabulary_size)
        a, b = self.first + start, self.first + stop  # the rows of the whole table
        if cfg.initializer is None:
            weight = self._default_rows(a, b)
        else:  # a user initializer draws the whole table at once: keep it until all is written
            if self._user_rows is None:
                self._user_rows = initial_rows(
                    self.table.name, vocab, cfg.dim, cfg.initializer, self.seed
                )
            weight = self._user_rows[a:b]
        return {"weight": weight, **slot_values(self.table.optimizer, stop - start, cfg.dim)}

    def _default_rows(self, a: int, b: int) -> Tensor:
        """Rows ``[a, b)`` of the whole table from the default initializer. Drawing part of
        an initializer block draws all of it, so the last block drawn is kept: the boxes of
        a save or load that fall in one block draw it once."""
        t, vocab, lo = self.table, int(self.table.vocabulary_size), a - a % BLOCK_ROWS
        if b > lo + BLOCK_ROWS:
            return initial_rows(t.name, vocab, t.dim, None, self.seed, a, b)
        if self._drawn is None or self._drawn[0] != lo:
            hi = min(lo + BLOCK_ROWS, vocab)
            self._drawn = (lo, initial_rows(t.name, vocab, t.dim, None, self.seed, lo, hi))
        return self._drawn[1][a - lo : b - lo].clone()

    def _make_block(self, block: int) -> None:
        """Draw block ``block``'s initial rows and write them (records, not the cache)."""
        start, stop = block * self._block, min((block + 1) * self._block, self.rows)
        self.write_rows(start, self.initial(start, stop))
        self._made[block] = True
        if self._user_rows is not None and self._made.all():
            self._user_rows = None

    def write_rows(self, start: int, values: dict[str, Tensor]) -> None:
        """Write rows ``[start, start + N)`` of ``values`` (``name -> (N, ...)``) to the file,
        in chunks, bypassing the cache (the caller keeps the cache coherent)."""
        n = values["weight"].shape[0]
        records = aligned(min(n, _CHUNK), self.file.dtype)
        records["magic"] = RECORD_MAGIC
        for a in range(0, n, _CHUNK):
            b = min(n, a + _CHUNK)
            part = records[: b - a]
            part["id"] = np.arange(start + a, start + b)
            for name, value in values.items():
                part["weight" if name == "weight" else f"slot_{name}"] = value[a:b].numpy()
            seal(part)
            self.file.write(np.arange(start + a, start + b), part)
        self.io["rows_written"] += n

    # ------------------------------------------------------------------ prefetch
    def prefetch(self, ids: np.ndarray) -> None:
        """Start reading the rows of ``ids`` (any order, repeats allowed) that are neither
        cached nor in a block never written, on a background thread; the next :meth:`map`
        uses them, except copies that a later write-back made stale."""
        with self._lock:
            if len(self._staged) >= _MAX_STAGED:  # never consumed (lookups without prefetch)
                self._staged.pop(0)
            self._staged.append(_prefetcher.submit(self._read_ahead, np.unique(ids)))

    def _read_ahead(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
        with self._lock, threads.budget(1):
            found = self.cache.lookup(ids)
            writes = len(self._writes)  # rows written back from here on may be stale below
        ids = ids[(found < 0) & self._made[ids // self._block]]
        records = aligned(ids.size, self.file.dtype)
        self.file.read(ids, records)
        return ids, records, writes

    def _use_prefetched(
        self, staged: Future, ids: np.ndarray, out: dict[str, Tensor], todo: np.ndarray
    ) -> None:
        """Fill ``out`` at the ``ids`` (ascending) that ``staged`` read and no write-back
        changed since; clear ``todo`` there. A failed prefetch is ignored (the rows are read
        now, and an error raised then)."""
        if staged.exception() is not None:
            return
        have, records, writes = staged.result()
        with self._lock:
            later = self._writes[writes:]
            if not self._staged:
                self._writes.clear()
        self.io["prefetched_rows"] += int(have.size)  # read ahead: counted as read
        self.io["rows_read"] += int(have.size)
        if have.size == 0:
            return
        at = np.searchsorted(have, ids).clip(max=have.size - 1)
        ok = (have[at] == ids) & (records["magic"][at] == RECORD_MAGIC)
        ok &= (records["id"][at] == ids) & ~damaged(records)[at]
        if later:
            ok &= ~np.isin(ids, np.concatenate(later))
        if ok.any():
            self._unpack(records[at[ok]], out, np.flatnonzero(ok))
            todo[ok] = False
            self.io["prefetch_used"] += int(ok.sum())

    def wait_prefetch(self) -> None:
        """Drop the prefetches not used yet, once they finished (before a load or close)."""
        with self._lock:
            staged, self._staged = self._staged, []
            self._writes.clear()
        for future in staged:
            future.exception()

    # ------------------------------------------------------------------ whole table
    def ranges(self) -> Iterator[tuple[int, int]]:
        """``[start, stop)`` row ranges covering the table, :data:`_CHUNK` rows each."""
        for start in range(0, self.rows, _CHUNK):
            yield start, min(self.rows, start + _CHUNK)

    def read_range(self, start: int, stop: int) -> dict[str, Tensor]:
        """``name -> (stop - start, ...)``: the table's current rows ``[start, stop)`` (file,
        initial values of blocks never written, and the cache's rows over them)."""
        ids = np.arange(start, stop)
        out = self.initial(start, stop) if not self._made[ids // self._block].all() else None
        if out is None:
            out = {n: torch.empty((ids.size, *s)) for n, s in row_shapes(self.table).items()}
        written = np.flatnonzero(self._made[ids // self._block])
        if written.size:
            records = aligned(written.size, self.file.dtype)
            self.file.read(ids[written], records)
            self._check(ids[written], records)
            self._unpack(records, out, written)
        self.overlay_cached(ids, out)
        return out

    def overlay_cached(self, ids: np.ndarray, out: dict[str, Tensor]) -> np.ndarray:
        """Copy the cached rows among ``ids: (N,) int64`` into ``out`` (``name -> (N, ...)``)
        at their positions; returns each id's cache slot (-1: not cached)."""
        slots = self.cache.lookup(ids)
        held = np.flatnonzero(slots >= 0)
        if held.size:
            index, at = torch.from_numpy(slots[held]), torch.from_numpy(held)
            for name, tensor in self.cache.tensors.items():
                out[name].index_copy_(0, at, tensor.index_select(0, index))
        return slots

    def peek(self, ids: np.ndarray) -> dict[str, Tensor]:
        """``name -> (N, ...)``: the current rows of ``ids: (N,) int64`` (any order, repeats
        allowed), cached or not, caching nothing.

        Raises:
            ValueError: an id is outside ``[0, rows)``.
        """
        ids = np.asarray(ids, np.int64).reshape(-1)
        if ids.size and (ids.min() < 0 or ids.max() >= self.rows):
            bad = ids[(ids < 0) | (ids >= self.rows)][:5].tolist()
            raise ValueError(f"table '{self.table.name}': ids {bad} are outside [0, {self.rows})")
        out = {n: torch.empty((ids.size, *s)) for n, s in row_shapes(self.table).items()}
        blocks = ids // self._block
        made = self._made[blocks]
        for block in np.unique(blocks[~made]).tolist():
            at = np.flatnonzero(blocks == block)
            start = int(ids[at].min())
            drawn = self.initial(start, int(ids[at].max()) + 1)
            index = torch.from_numpy(ids[at] - start)
            for name, tensor in out.items():
                tensor[torch.from_numpy(at)] = drawn[name].index_select(0, index)
        if made.any():
            unique, inverse = np.unique(ids[made], return_inverse=True)
            records = aligned(unique.size, self.file.dtype)
            self.file.read(unique, records)
            self._check(unique, records)
            self._unpack(records[inverse.reshape(-1)], out, np.flatnonzero(made))
        self.overlay_cached(ids, out)
        return out

    def load_range(self, start: int, values: dict[str, Tensor]) -> None:
        """Replace rows ``[start, start + N)`` with ``values``; cached copies are dropped."""
        stop = start + values["weight"].shape[0]
        ids = np.arange(start, stop)
        blocks = np.unique(ids // self._block)
        for block in blocks[~self._made[blocks]].tolist():
            if block * self._block < start or min((block + 1) * self._block, self.rows) > stop:
                self._make_block(block)  # the rest of the block holds its initial rows
        self.write_rows(start, values)
        self._made[blocks] = True
        if self.touched is not None:
            self.touched.mark_range(start, stop)
        slots = self.cache.lookup(ids)
        held = slots[slots >= 0]
        self.cache.changed[held] = False
        with self._lock:
            self.cache.evict(held)

    def shape(self, name: str) -> tuple[int, ...]:
        """The logical shape of ``weight`` or a slot: ``(rows, ...)``."""
        return (self.rows, *row_shapes(self.table)[name])

    def load_part(self, name: str, value: Tensor, start: int = 0) -> None:
        """Replace ``name`` (``weight`` or a slot) of rows ``[start, start + N)`` with
        ``value: (N, ...)``, keeping the rows' other parts."""
        for a in range(0, value.shape[0], _CHUNK):
            b = min(value.shape[0], a + _CHUNK)
            rows = self.read_range(start + a, start + b)
            rows[name] = value[a:b].to(torch.float32)
            self.load_range(start + a, rows)

    def make_all(self) -> None:
        """Write every block never written (the file then takes its full size)."""
        for block in np.flatnonzero(~self._made).tolist():
            self._make_block(block)

    # ------------------------------------------------------------------ reporting
    def info(self) -> dict[str, Any]:
        """Counters: cache hits and misses, rows and bytes read and written, rows cached,
        capacity, RAM and disk bytes."""
        size = self.file.record_bytes
        return {
            **self.cache.stats,
            **self.io,
            "bytes_read": self.io["rows_read"] * size,
            "bytes_written": self.io["rows_written"] * size,
            "rows_cached": self.cache.held,
            "cache_capacity": self.capacity,
            "ram_bytes": self.cache.nbytes,
            "disk_bytes": self.file.disk_bytes,
        }

    def __reduce__(self) -> Any:
        raise TypeError(
            f"table '{self.table.name}': a table in DiskStorage cannot be copied or pickled (its "
            f"rows are in {self.file.path}, which this engine holds); save a checkpoint instead "
            "(ec.checkpoint.save) and load it into a new engine"
        )

    def close(self) -> None:
        """Release the file and its lock (the engine is done with the table)."""
        self.wait_prefetch()
        self.file.close()
