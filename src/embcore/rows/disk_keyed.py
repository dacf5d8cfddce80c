"""A dynamic table on local disk: the key index in RAM, rows behind a bounded row cache.

A dynamic table (``vocabulary_size=None``) with ``storage=ec.DiskStorage(...)`` gets this
kind (``"disk_keyed"``). It composes the in-memory dynamic table's key state
(:class:`~embcore.dynamic.keyspace.KeySpace`: admission, counts, eviction, the freed rows it
hands to new keys) with the disk tier (:class:`~embcore.disk.keyed.KeyedDiskTable`: the rows
and optimizer slots in the working file, at most ``cache_bytes`` of them in RAM). Each call::

    keys --KeySpace.train / lookup--> key-space rows r (-1: no row)
         --id r + 1 (0: the sink)---> cache slots --ops.lookup / ops.update--> cache tensors

A key admitted in a training lookup gets its initial row (the in-memory table's, a function of
the key) in the cache; a key evicted at a step's end frees its row, which leaves the cache
unwritten and is reused by a later key. The numbers are those of the in-memory dynamic table,
bit for bit, whatever the cache size. Persisted by key (``"keyed"`` records), as the
in-memory dynamic table.

In a sharded engine each rank holds one key shard (``shard=True``, the owner's side of
``key_hash``: the :class:`~embcore.rows._key_shard.KeyShard` methods, with :meth:`read_rows`
and :meth:`slots_of` through the cache) in its own directory
(:func:`~embcore.disk.placement.rank_storage`). See docs/disk_tables.md.
"""

from __future__ import annotations

import errno
import threading
from collections import deque
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor, nn

from embcore import ops
from embcore.config import ResolvedTable
from embcore.disk._file import DiskTableError
from embcore.disk.keyed import SINK, KeyedDiskTable
from embcore.disk.placement import rank_storage, record_bytes
from embcore.disk.table import _CHUNK, row_bytes, row_shapes
from embcore.dynamic import state_check
from embcore.dynamic.init import new_rows
from embcore.dynamic.keyspace import KeySpace
from embcore.dynamic.policy import Eviction
from embcore.inputs import FeatureBatch
from embcore.rows._capacity import check_room, hint_of
from embcore.rows._contract import Records, RowEnv, whole_tensor_error
from embcore.rows._key_shard import KeyShard
from embcore.rows._mapped import split_mapped
from embcore.rows.disk import cache_state, closed_error, disk_counters

__all__ = ["DiskKeyedRows", "key_space_bytes"]

#: training lookups whose ids are remembered until their update (per feature of the table)
_REMEMBERED = 4


def key_space_bytes(space: KeySpace) -> int:
    """RAM of a key space: its index, per-row metadata and pending counts (every NumPy
    array it and its parts hold)."""
    parts = [space, getattr(space, "_index", None), getattr(space, "pending", None)]
    pending = getattr(space, "pending", None)
    parts.append(getattr(pending, "_index", None))
    seen: set[int] = set()
    total = 0
    for part in parts:
        for value in vars(part).values() if part is not None else ():
            if isinstance(value, np.ndarray) and id(value) not in seen:
                seen.add(id(value))
                total += int(value.nbytes)
    return total


class DiskKeyedRows(KeyShard, nn.Module):
    """A dynamic table's key space in RAM, its rows in its ``DiskStorage`` directory.

    The cache's tensors are not buffers (as :class:`~embcore.rows.disk.DiskRows`': disk
    tables live on the CPU, in float32); nothing goes through ``state_dict``.

    Args:
        table: the resolved table (``table.dynamic``, ``table.storage`` a ``DiskStorage``).
        env: the engine's seed, device and storage dtype (the CPU, float32) and its rank.
        shard: one key shard of a sharded table, in this rank's directory: it evicts by
            ``steps_to_live`` itself, while the table's ``max_rows`` is chosen over every
            shard (as :class:`~embcore.rows.keyed.KeyedRows`).
        shards: the table's key shards (its ``initial_capacity`` is shared among them).
    """

    kind: ClassVar[str] = "disk_keyed"
    records: ClassVar[Records] = "keyed"

    def __init__(
        self, table: ResolvedTable, env: RowEnv, shard: bool = False, shards: int = 1, **part: Any
    ) -> None:
        super().__init__()
        if part or env.device.type != "cpu" or env.storage_dtype != torch.float32:
            raise ValueError(
                f"table '{table.name}': a dynamic table in DiskStorage is held whole by one "
                "process or by key shard (key_hash) of a CPU engine with float32 rows; got "
                f"device={env.device}, storage_dtype={env.storage_dtype}, part={sorted(part)}"
            )
        cfg = table.config
        self.table, self.seed = table, env.seed
        self.steps_to_live = (cfg.eviction or Eviction()).steps_to_live
        self._eviction = Eviction(steps_to_live=self.steps_to_live) if shard else cfg.eviction
        self.space = KeySpace(table.name, cfg.admission, self._eviction)
        #: ``initial_capacity`` (this shard's part) held by the key space (rows are on disk)
        self._hint = hint_of(table, shards)
        if self._hint:
            check_room(table, self._hint, 0)
            self.space.hold(self._hint)
        storage = rank_storage(table.storage, env.rank, sharded=shard)
        self.disk = KeyedDiskTable(table, storage, env.seed, storage.cache_bytes)
        #: a key shard's last training lookup: its new keys (ascending) and their rows
        self.new = (np.zeros(0, np.int64), np.zeros(0, np.int64))
        self._counted = False  # a key shard's training lookup counted keys: reply to it
        self.dropped_gradients = 0
        self._state: ops.TableState | None = None
        # (original batch, its ids as looked up, key-space step at the lookup), oldest first
        self._trained: deque[tuple[FeatureBatch, np.ndarray, int]] = deque()
        self._lock = threading.Lock()  # the key space against the prefetch thread
        self._broken: str | None = None  # why the table refuses steps until a load
        self.steps = 0  #: training steps ended (the lookup statistics' denominator)
        self.closed = False

    @classmethod
    def planned_memory(cls, table: ResolvedTable, rows: int, cols: int) -> dict[str, int]:
        """:meth:`memory` of a table or key shard holding ``rows`` rows, before it is built,
        without its key index (the planner counts it per key): the cache at its capacity in
        RAM, a record per row on disk once every row was written."""
        size = row_bytes(table)
        capacity = max(1, table.storage.cache_bytes // size)
        return {"ram": capacity * size, "disk": rows * record_bytes(table)}

    @property
    def flush_before_training_lookup(self) -> bool:
        """As the in-memory dynamic table: when keys may be evicted, a pipelined update is
        applied before the next training lookup."""
        ev = self.table.config.eviction
        return ev is not None and ev.evicts

    # ------------------------------------------------------------------ the step
    def reserve(self, batches: Sequence[FeatureBatch]) -> None:
        """Index slots and row metadata for the batches' new keys, and room in the file."""
        with self._lock:
            self._reserve_keys(_keys(batches))

    def _reserve_keys(self, keys: np.ndarray) -> None:
        space = self.space
        if space.fits(keys.size) and space.num_rows + keys.size < self.disk.rows:
            return
        new = space.count_new(keys)
        space.reserve(new)
        self.disk.grow(space.num_rows + max(0, new - space.num_free) + 1)

    def map(self, batches: Sequence[FeatureBatch], training: bool) -> list[FeatureBatch]:
        """The batches with keys replaced by cache slots (the sink's: no row). A training
        lookup counts, admits (new rows born in the cache) and refreshes."""
        self._check_usable()
        flat = _keys(batches)
        with self._lock:  # the key space only: the prefetch thread reads it, not the I/O
            if training:
                self._reserve_keys(flat)
                admitted = self.space.train(flat)
                rows = admitted.rows
            else:
                rows = self.space.lookup(flat)
        if training:
            self._initialise(admitted.new_keys, admitted.new_rows)
        ids = np.where(rows >= 0, rows + 1, SINK)
        out = self._slots(batches, ids, changed=False, training=training)
        if training:
            start = 0
            for b in batches:
                n = b.values.numel()
                self._trained.append((b, ids[start : start + n], self.space.step))
                start += n
            while len(self._trained) > _REMEMBERED * max(1, len(self.table.features)):
                self._trained.popleft()
        return out

    def for_update(self, batches: Sequence[FeatureBatch]) -> list[FeatureBatch]:
        """The cache slots of the ids the batches' training lookup gave them; an id whose key
        no longer holds it (evicted since) is the sink's (gradient dropped); a batch never
        looked up for training takes the rows its keys hold now."""
        self._check_usable()
        with self._lock:
            parts = []
            for b in batches:
                i = next((i for i, e in enumerate(self._trained) if e[0] is b), None)
                if i is None:
                    parts.append(self._ids_now(b))
                    continue
                _, ids, step = self._trained[i]
                del self._trained[i]
                if step != self.space.step:  # an eviction may have freed or reused rows since
                    ids = np.where(self._ids_now(b) == ids, ids, SINK)
                parts.append(ids)
        ids = np.concatenate(parts) if parts else np.zeros(0, np.int64)
        self.dropped_gradients += int((ids == SINK).sum())
        return self._slots(batches, ids, changed=True, training=True)

    def _ids_now(self, batch: FeatureBatch) -> np.ndarray:
        rows = self.space.lookup(_keys([batch]))
        return np.where(rows >= 0, rows + 1, SINK)

    def state(self) -> ops.TableState:
        self._state = cache_state(self.table, self.disk, self._state)
        return self._state

    def end_step(self, evict: int | None = None) -> None:
        """Reset the sink, evict (the freed rows leave the cache unwritten), step += 1; a
        cache that grew for an oversized step empties itself. ``evict``: a key shard's part
        of the table's ``max_rows`` eviction (``None``: the table's own eviction, one
        process)."""
        self.disk.reset_sink()
        with self._lock:
            evicted = self.space.end_step() if evict is None else self._end_shard_step(evict)
        if evicted.rows.size:
            self.disk.discard(evicted.rows + 1)
        self.disk.end_step()
        self.steps += 1

    def cache_counters(self) -> dict[str, int]:
        """Counts since the engine was made, for the lookup statistics (:func:`disk_counters`)."""
        return disk_counters(self.disk, self.steps)

    def close(self) -> None:
        """Release the working file and its lock now (``EmbeddingEngine.close``); the rows
        and keys are gone: save a checkpoint first."""
        if not self.closed:
            self.closed = True
            self.disk.close()

    def prefetch(self, batches: Sequence[FeatureBatch]) -> None:
        """Start reading the held rows of a batch prepared ahead (``EmbeddingEngine.prepare``)."""
        if not batches:
            return
        with self._lock:
            rows = self.space.lookup(_keys(batches))
        self.disk.prefetch(rows[rows >= 0] + 1)

    def _initialise(
        self, keys: np.ndarray, rows: np.ndarray, drawn: np.ndarray | None = None
    ) -> None:
        """The initial rows of the keys just admitted (``keys`` ascending), born in the cache
        by the lookup's own call (a failing user initializer leaves them at zero, as the
        in-memory table does). ``drawn``: ``(A,) int64`` ascending keys to call the
        initializer with, of which ``keys`` are a part (a key shard: every shard's new keys)."""
        drawn = keys if drawn is None else drawn
        if drawn.size == 0:
            return
        cfg = self.table.config
        try:
            weight = new_rows(drawn, table=self.table.name, dim=cfg.dim, seed=self.seed,
                              initializer=cfg.initializer)  # fmt: skip
        except BaseException:
            self.disk.bear(rows + 1, torch.zeros((keys.size, cfg.dim)))
            raise
        weight = weight[np.searchsorted(drawn, keys)] if drawn is not keys else weight
        self.disk.bear(rows + 1, torch.from_numpy(weight))

    def _check_usable(self) -> None:
        if self.closed:
            raise closed_error(self.table.name, self.disk)
        if self._broken is not None:
            raise DiskTableError(errno.EIO, self._broken)

    def _slots(
        self, batches: Sequence[FeatureBatch], ids: np.ndarray, changed: bool, training: bool
    ) -> list[FeatureBatch]:
        """Cache slots of ``ids`` split by batch. A training step whose rows cannot be read or
        written (a full disk) has counted and admitted its keys already: the table then
        refuses further steps until a checkpoint is loaded."""
        if ids.size == 0:
            return list(batches)
        return split_mapped(batches, self._cached(ids, changed, training))

    def _cached(self, ids: np.ndarray, changed: bool, training: bool) -> np.ndarray:
        """``(N,) int64`` cache slots of ``ids: (N,) int64`` (repeats allowed; see
        :meth:`_slots` for a failing training step)."""
        unique, inverse = np.unique(ids, return_inverse=True)
        try:
            return self.disk.slots(unique, changed)[inverse.reshape(-1)]
        except DiskTableError as e:
            if training:
                self._broken = (
                    f"{e} -- table '{self.table.name}' is dynamic: the failed training step had "
                    "counted and admitted its keys already, so the table refuses further steps: "
                    "restore the engine from a checkpoint (ec.checkpoint.load)"
                )
                raise DiskTableError(e.errno or errno.EIO, self._broken) from e
            raise

    # ------------------------------------------------------------------ a key shard
    _device = torch.device("cpu")  #: where a key shard's row numbers go

    def train_keys(self, keys: Tensor, mult: Tensor, defer: bool = False) -> Tensor:
        """:meth:`KeyShard.train_keys`; the new keys' initial rows are held aside until
        :meth:`read_rows`, which the owner calls next, caches them (a read that fails then
        leaves the table refusing steps, as a failing training lookup does)."""
        self._check_usable()
        rows = super().train_keys(keys, mult, defer)
        self._counted = True
        return rows

    def read_rows(self, rows: Tensor, name: str = "weight") -> Tensor:
        """``name``'s values of key-space ``rows: (K,) int64`` (-1: zeros, a slot's initial
        value), brought into the cache as a lookup's rows (counted in its hit rate)."""
        self._check_usable()
        training, self._counted = self._counted, False
        at = rows.cpu().numpy()
        out = self.disk.sink(at.size)[name]
        held = np.flatnonzero(at >= 0)
        if held.size:
            slots = torch.from_numpy(self._cached(at[held] + 1, False, training))
            out[torch.from_numpy(held)] = self.disk.cache.tensors[name].index_select(0, slots)
        return out

    def slots_of(self, rows: Tensor) -> Tensor:  # type: ignore[override]
        """The cache slots of key-space ``rows: (K,) int64`` (all ``>= 0``, repeats allowed),
        read again if evicted since the lookup, marked changed: one call for every row of an
        update, so that none leaves the cache before the update ran on :meth:`state`."""
        if rows.numel() == 0:
            return rows.clone()
        self._check_usable()
        ids = rows.cpu().numpy() + 1
        return torch.from_numpy(self._cached(ids, True, True)).to(rows.device)

    # ------------------------------------------------------------------ reading
    def shape(self, name: str) -> tuple[int, ...]:
        return (len(self.space), *row_shapes(self.table)[name])

    def read(self, name: str) -> Tensor:
        """A copy of ``name``'s rows in ascending key order."""
        return self._by_key(self.space.keys(), (name,))[name]

    def write(self, name: str, value: Tensor) -> None:
        raise whole_tensor_error(self.table.name)

    def keys(self) -> Tensor:
        return torch.from_numpy(self.space.keys())

    def rows(self, ids: Tensor) -> Tensor:
        keys = np.ascontiguousarray(ids.cpu().numpy(), np.int64)
        return self._by_key(keys, ("weight",))["weight"]

    def _by_key(self, keys: np.ndarray, names: Sequence[str]) -> dict[str, Tensor]:
        """``name -> (N, ...)`` of ``keys`` (zeros / initial slots for keys without a row),
        read :data:`~embcore.disk.table._CHUNK` rows at a time."""
        with self._lock:
            rows = self.space.lookup(keys)
        ids = np.where(rows >= 0, rows + 1, SINK)
        shapes = row_shapes(self.table)
        out = {n: torch.empty((ids.size, *shapes[n])) for n in names}
        for a in range(0, ids.size, _CHUNK):
            part = self.disk.values(ids[a : a + _CHUNK])
            for n in names:
                out[n][a : a + _CHUNK] = part[n]
        return out

    def info(self) -> dict[str, int]:
        """The in-memory dynamic table's counters (``rows``, ``pending``,
        ``dropped_gradients``, ``step``), the disk tier's, and ``index_bytes`` (the key
        space's RAM, besides ``cache_bytes``)."""
        pending = self.space.pending
        return {
            "rows": len(self.space),
            "pending": 0 if pending is None else len(pending),
            "dropped_gradients": self.dropped_gradients,
            "step": self.space.step,
            **self.disk.info(),
            "index_bytes": key_space_bytes(self.space),
        }

    def rows_held(self) -> int:
        return len(self.space)

    def memory(self) -> dict[str, int]:
        ram = self.disk.cache.nbytes + key_space_bytes(self.space)
        return {"ram": ram, "disk": self.disk.file.disk_bytes}

    # ------------------------------------------------------------------ persisting
    def tensors(self) -> list:
        return []

    def content(self) -> dict[str, np.ndarray | Tensor]:
        """The key space's state (without ``rows``), plus ``weight`` and each slot as
        ``(R, ...)`` tensors in key order: the table's whole content (read from the cache and
        the file; the keyed checkpoint records hold it in memory once)."""
        with self._lock:
            state: dict[str, np.ndarray | Tensor] = dict(self.space.state())
        state.pop("rows")  # read by key below
        state |= self._by_key(np.asarray(state["keys"]), tuple(row_shapes(self.table)))
        return state

    def load_content(self, state: dict[str, Any]) -> None:
        """Replace the table's content with a :meth:`content` (key ``keys[i]`` on row ``i``).

        Raises:
            ValueError: the state is malformed (named); nothing was changed.
        """
        name, cfg = self.table.name, self.table.config
        problems = state_check.problems(self.table, state)
        if problems:
            raise ValueError(f"table '{name}': cannot load its state: " + "; ".join(problems))
        arrays = {
            k: np.asarray(v.cpu() if isinstance(v, Tensor) else v)
            for k, v in state.items()
            if k not in row_shapes(self.table)
        }
        space = KeySpace.from_state(name, arrays, cfg.admission, self._eviction)
        space.hold(self._hint)
        values = {k: torch.as_tensor(state[k]) for k in row_shapes(self.table)}
        with self._lock:
            try:
                self.disk.load_rows(values)
            except DiskTableError as e:
                self._broken = f"{e} -- the table was being loaded: load a checkpoint again"
                raise
            self.space = space
            self._trained.clear()
            self._broken = None


def _keys(batches: Sequence[FeatureBatch]) -> np.ndarray:
    """``(N,) int64``: the keys of every batch, in order."""
    keys = [b.values.cpu().numpy() for b in batches]
    return np.ascontiguousarray(np.concatenate(keys) if keys else np.zeros(0, np.int64))
