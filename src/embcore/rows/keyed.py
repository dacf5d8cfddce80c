"""Keyed rows: a key index in front of growable rows (the kind of every dynamic table).

A :class:`KeyedRows` keeps a table's :class:`~embcore.dynamic.keyspace.KeySpace` and maps
each :class:`~embcore.inputs.FeatureBatch` of the table from keys to rows of its weight and
slot tensors, so that the ordinary lookup kernels and optimizers run on them::

    buffer row 0          the sink: zeros, initial slots; keys without a row read it
    buffer row 1 + r      the key space's row r

The buffers grow by doubling (amortised) before a training lookup could need more rows; new
rows get their initial values and the optimizer's initial slot values when their key is
admitted; the sink is reset after every update, so the gradient of a pending key is dropped.
Persisted as content by key (``"keyed"`` records). See docs/dynamic_tables.md.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor

from embcore.config import ResolvedTable
from embcore.dynamic.batch import Fill, eligible
from embcore.dynamic.boundary import Sink
from embcore.dynamic.index import IndexMemoryError
from embcore.dynamic.init import new_rows, table_salt
from embcore.dynamic.keyspace import KeySpace
from embcore.dynamic.policy import Eviction
from embcore.inputs import FeatureBatch
from embcore.rows._capacity import check_room, hint_of
from embcore.rows._contract import Records, RowEnv, whole_tensor_error
from embcore.rows._key_shard import KeyShard
from embcore.rows._mapped import split_mapped
from embcore.rows._module import RowModule
from embcore.rows._zeros import keyed_buffers as _buffers

__all__ = ["SINK", "KeyedRows"]

#: the buffer row that keys without a row read (zeros) and whose gradient is dropped
SINK = 0
#: training lookups whose row numbers are remembered until their update (one batch of each
#: feature of the table per lookup)
_REMEMBERED = 4
_MIN_CAPACITY = 16
#: on the CPU, the buffers grow within arrays this many times their size (virtual memory:
#: pages are mapped as rows are used), so that most growth copies nothing (falling back to
#: the size needed where so much address space is refused)
_RESERVE = 32


class KeyedRows(KeyShard, RowModule):
    """One dynamic table's key space and the mapping of its batches to rows.

    Args:
        table: the resolved table (``table.dynamic``).
        env: the engine's seed (the default initializer's), device and storage dtype.
        shard: one key shard of a sharded table (:class:`~embcore.rows._key_shard.KeyShard`
            has the owner's side of ``key_hash``): it evicts by ``steps_to_live`` itself,
            while the table's ``max_rows`` is chosen over every shard.
        shards: the table's key shards (its ``initial_capacity`` is shared among them).

    Raises:
        ValueError: the optimizer has a ``slot_variable_creation_fn`` (new rows take the
            slots' initial values).
        IndexMemoryError: the table's ``initial_capacity`` cannot be had.
    """

    kind: ClassVar[str] = "keyed"
    records: ClassVar[Records] = "keyed"

    def __init__(
        self, table: ResolvedTable, env: RowEnv, shard: bool = False, shards: int = 1
    ) -> None:
        super().__init__(table, env.stochastic_rounding)
        if table.optimizer is not None and table.optimizer.slot_variable_creation_fn:
            raise ValueError(
                f"table '{table.name}': slot_variable_creation_fn is not supported for dynamic "
                "tables (vocabulary_size=None): new rows take the slots' initial values"
            )
        cfg = table.config
        self.seed = env.seed
        self.steps_to_live = (cfg.eviction or Eviction()).steps_to_live
        self._eviction = Eviction(steps_to_live=self.steps_to_live) if shard else cfg.eviction
        self.space = KeySpace(table.name, cfg.admission, self._eviction)
        #: the last training lookup's new keys (ascending) and their key-space rows
        self.new = (np.zeros(0, np.int64), np.zeros(0, np.int64))
        #: occurrences whose gradient was dropped (keys pending admission, or evicted between
        #: their lookup and its update)
        self.dropped_gradients = 0
        opt = table.optimizer
        self._slot_init = {s.name: s.initial_value for s in opt.slot_specs()} if opt else {}
        #: the arrays the buffers are the first rows of (CPU growth without copies)
        self._spare = _buffers(table, _MIN_CAPACITY + 1, env.device, env.storage_dtype)
        for name, value in self._spare.items():
            self.put(name, value)
        # (original batch, mapped batch, key-space step at the lookup, occurrences mapped to
        # the sink if known), oldest first: updates come in the order of their lookups (a
        # batch object may be looked up more than once)
        self._trained: deque[tuple[FeatureBatch, FeatureBatch, int, int | None]] = deque()
        #: :meth:`sink` and :meth:`fill`, and the :meth:`state` they were taken for
        self._described: tuple[object, tuple[Sink | None, Fill | None]] | None = None
        #: the keys reserved up front (``initial_capacity``, this shard's part), 0 for none
        self._hint = hint_of(table, shards)
        self._hold()

    @property
    def flush_before_training_lookup(self) -> bool:
        """Whether keys may be evicted (``steps_to_live`` or ``max_rows`` set): then a
        pipelined update must be applied before the next training lookup, whose rows its step
        boundary could free (docs/dynamic_tables.md, "Pipelining")."""
        ev = self.table.config.eviction
        return ev is not None and ev.evicts

    # ------------------------------------------------------------------ lookups
    def map(self, batches: Sequence[FeatureBatch], training: bool) -> list[FeatureBatch]:
        """The batches with keys replaced by buffer rows (sink: no row). A training lookup
        counts, admits (initialising the new rows) and refreshes; one call per table per
        step, with every feature's keys."""
        flat = _keys_of(batches)
        if not training:
            return self._split(batches, self.space.lookup(flat))
        self.reserve(batches)  # a no-op when the store reserved already
        admitted = self.space.train(flat)
        self._initialise(admitted.new_keys, admitted.new_rows)
        return self._trained_as(batches, self._split(batches, admitted.rows), None)

    @property
    def batched(self) -> bool:
        """Whether the step's training lookup takes this table in its one kernel call
        (:mod:`._keyed_lookup`): admission on first sight, rows on the CPU."""
        return eligible(self.space) and self.tensor("weight").device.type == "cpu"

    def fill(self) -> Fill | None:
        """Where that kernel call writes this table's new rows: with the default initializer
        into float32 rows and slots, else ``None`` (:meth:`_initialise` then). Kept while the
        buffers stay (:meth:`state`'s cache), with the sink."""
        return self._sink_and_fill()[1]

    def sink(self) -> Sink | None:
        """The float32 weight and slots with their initial slot values, whose sink rows the
        step boundary's kernel call resets (:func:`embcore.dynamic.boundary.end_many`);
        ``None`` for other dtypes (:meth:`end_step` resets them)."""
        return self._sink_and_fill()[0]

    def _sink_and_fill(self) -> tuple[Sink | None, Fill | None]:
        state = self.state()  # a new object whenever a buffer was replaced
        if self._described is not None and self._described[0] is state:
            return self._described[1]
        slots = tuple((self.tensor(n), v) for n, v in self._slot_init.items())
        sink = fill = None
        tensors = (self.tensor("weight"), *(t for t, _ in slots))
        if all(t.dtype == torch.float32 and t.device.type == "cpu" for t in tensors):
            sink = Sink(self.tensor("weight"), slots)
            if self.table.config.initializer is None:
                fill = Fill(sink.weight, table_salt(self.seed, self.table.name), sink.slots)
        self._described = state, (sink, fill)
        return sink, fill

    def _trained_as(
        self, batches: Sequence[FeatureBatch], out: list[FeatureBatch], sinks: int | None
    ) -> list[FeatureBatch]:
        """Remember a training lookup's mapped batches for their update (``sinks``: the
        occurrences mapped to the sink, if known)."""
        for b, m in zip(batches, out, strict=True):
            self._trained.append((b, m, self.space.step, sinks))
            while len(self._trained) > _REMEMBERED * max(1, len(self.table.features)):
                self._trained.popleft()
        return out

    def reserve(self, batches: Sequence[FeatureBatch]) -> None:
        """Make room for a training lookup of ``batches``: rows and slots (freed rows first),
        index slots and row metadata for each distinct key without a row (repeats of held
        keys need none). Changes no state.

        Raises:
            IndexMemoryError: naming the table and the sizes.
        """
        self._reserve_keys(_keys_of(batches))

    def _reserve_keys(self, keys: np.ndarray) -> None:
        """:meth:`reserve` for ``keys: (N,) int64``."""
        space = self.space
        spare = self.tensor("weight").shape[0] - 1 - space.num_rows + space.num_free
        if keys.size <= spare and space.fits(keys.size):
            return  # room even if every occurrence were a new key: nothing to count
        new = space.count_new(keys)
        self._reserve(space.num_rows + max(0, new - space.num_free))
        space.reserve(new)

    def for_update(self, batches: Sequence[FeatureBatch]) -> list[FeatureBatch]:
        """The batches as their training lookup mapped them. Rows whose key no longer holds
        them (evicted since) map to the sink; a batch never looked up for training reads the
        rows its keys hold now."""
        out = []
        for b in batches:
            i = next((i for i, e in enumerate(self._trained) if e[0] is b), None)
            if i is None:
                out.append(self.map([b], training=False)[0])
                self.dropped_gradients += int((out[-1].values == SINK).sum())
                continue
            _, mapped, step, sinks = self._trained[i]
            del self._trained[i]
            if step != self.space.step:  # an eviction may have freed or reused rows since
                now = self.map([b], training=False)[0].values
                kept = torch.where(now == mapped.values, mapped.values, SINK)
                mapped = dataclasses.replace(mapped, values=kept)
                sinks = None
            out.append(mapped)
            if sinks is None:
                sinks = int((mapped.values == SINK).sum())
            self.dropped_gradients += sinks
        return out

    def end_step(self, evict: int | None = None) -> None:
        """After the step's update: reset the sink, then evict (freed rows are re-initialised
        when a later key takes them). ``evict``: a key shard's part of the table's
        ``max_rows`` eviction, its least used survivors of ``steps_to_live`` (``None``: the
        table's own eviction, one process)."""
        self.reset_sink()
        if evict is None:
            self.space.end_step()
        else:
            self._end_shard_step(evict)

    def reset_sink(self) -> None:
        """The sink row back to zeros and the slots' initial values."""
        self.tensor("weight")[SINK].zero_()
        for name, value in self._slot_init.items():
            self.tensor(name)[SINK].fill_(value)

    # ------------------------------------------------------------------ reading
    def shape(self, name: str) -> tuple[int, ...]:
        return (len(self.space), *self.tensor(name).shape[1:])

    def read(self, name: str) -> Tensor:
        """A copy of ``name``'s rows in ascending key order."""
        return self._values(self.space.keys(), name)

    def write(self, name: str, value: Tensor) -> None:
        raise whole_tensor_error(self.table.name)

    def keys(self) -> Tensor:
        return torch.from_numpy(self.space.keys())

    def rows(self, ids: Tensor) -> Tensor:
        return self._values(ids.cpu().numpy()).to(torch.float32)

    def info(self) -> dict[str, int]:
        pending = self.space.pending
        return {
            "rows": len(self.space),
            "pending": 0 if pending is None else len(pending),
            "dropped_gradients": self.dropped_gradients,
            "step": self.space.step,
        }

    def rows_held(self) -> int:
        return len(self.space)

    def tensors(self) -> list:
        return []

    def _values(self, keys: np.ndarray, name: str = "weight") -> Tensor:
        """``(N, ...)`` values of ``name`` for ``keys`` (zeros / initial slot values for keys
        without a row); inserts nothing."""
        found = self.space.lookup(keys)
        buffer = self.tensor(name)
        index = torch.from_numpy(np.where(found >= 0, found + 1, SINK)).to(buffer.device)
        return buffer.index_select(0, index)

    def content(self) -> dict[str, np.ndarray | Tensor]:
        """The key space's :meth:`~KeySpace.state` (without ``rows``), plus ``weight`` and each
        slot as ``(R, ...)`` tensors in key order: the table's whole content."""
        state: dict[str, np.ndarray | Tensor] = dict(self.space.state())
        rows = torch.from_numpy(state.pop("rows") + 1)
        for name in ("weight", *self._slot_init):
            buffer = self.tensor(name)
            state[name] = buffer.index_select(0, rows.to(buffer.device))
        return state

    def load_content(self, state: dict[str, Any]) -> None:
        """Replace the table's content with a :meth:`content` (key ``keys[i]`` on row ``i``).

        Raises:
            ValueError: a part is missing or of the wrong shape; nothing was changed.
        """
        name = self.table.name
        arrays = {
            k: np.asarray(v.cpu() if isinstance(v, Tensor) else v)
            for k, v in state.items()
            if k not in ("weight", *self._slot_init)
        }
        lacking = [k for k in ("step", "keys", "freq", "last_seen") if k not in arrays]
        if lacking:
            raise ValueError(f"table '{name}': a dynamic table's state needs {lacking}")
        n = arrays["keys"].shape[0] if arrays["keys"].ndim == 1 else -1
        cfg = self.table.config
        space = KeySpace.from_state(name, arrays, cfg.admission, self._eviction)
        values = {}
        for part in ("weight", *self._slot_init):
            if part not in state:
                raise ValueError(f"table '{name}': a dynamic table's state needs '{part}'")
            value = torch.as_tensor(state[part])
            want = self.tensor(part).shape[1:]
            if tuple(value.shape) != (n, *want):
                raise ValueError(
                    f"table '{name}': saved '{part}' must have shape {(n, *want)}, got "
                    f"{tuple(value.shape)}"
                )
            values[part] = value
        fresh = _buffers(self.table, max(n, _MIN_CAPACITY) + 1, self._device, self._dtype)
        for part, value in values.items():
            fresh[part][1 : n + 1] = value.to(fresh[part])
        for part, value in fresh.items():
            self.put(part, value)
        self._spare = fresh
        self.space = space
        self._trained.clear()
        self._hold()

    def _hold(self) -> None:
        """Room for the ``initial_capacity`` keys in the key space, rows and slots, their
        unused rows written (zeros) now: no growth and no first touch of memory in the steps
        until the table holds that many keys (docs/dynamic_tables.md)."""
        if not self._hint:
            return
        per_row = self.tensor("weight")[0].nbytes
        per_row += sum(self.tensor(n)[0].nbytes for n in self._slot_init)
        check_room(self.table, self._hint - len(self.space), per_row)
        self.space.hold(self._hint)
        self._reserve(self._hint)
        used = 1 + self.space.num_rows  # the sink and the rows handed out keep their values
        for name in ("weight", *self._slot_init):
            self.tensor(name)[used:].zero_()

    # ------------------------------------------------------------------ internals
    def _compact(self) -> None:
        """Buffers of their own size, not views of the larger reservation: before a move,
        ``share_memory()``, a copy or pickling, which would otherwise take the whole
        reservation."""
        for key, value in list(self._buffers.items()):  # buffer names: weight, slot_<name>
            if value is not None and value.untyped_storage().nbytes() > value.nbytes:
                self.register_buffer(key, value.clone())
                self._state_cache = None
        self._spare = None

    def _apply(self, fn: Any, recurse: bool = True) -> Any:
        self._compact()
        return super()._apply(fn, recurse)

    def __getstate__(self) -> dict[str, Any]:
        self._compact()  # (a copy describes its own buffers)
        return super().__getstate__() | {"_described": None}

    @property
    def _device(self) -> torch.device:
        return self.tensor("weight").device

    @property
    def _dtype(self) -> torch.dtype:
        return self.tensor("weight").dtype

    def _reserve(self, rows: int) -> None:
        """Room for ``rows`` key-space rows (plus the sink), doubling the capacity. On the
        CPU the buffers are the first rows of arrays ``_RESERVE`` times larger, untouched
        pages until used: growing within them is a longer view (no copy, no allocation);
        past them only the rows handed out so far are copied."""
        have = self.tensor("weight").shape[0] - 1
        if rows <= have:
            return
        size = max(rows, 2 * have, _MIN_CAPACITY) + 1
        names = ("weight", *self._slot_init)
        spare = self._spare
        if spare is not None and all(
            spare[n].shape[0] >= size and spare[n].data_ptr() == self.tensor(n).data_ptr()
            for n in names
        ):
            for name in names:
                self.put(name, spare[name][:size])
            return
        reserved = size * _RESERVE if self._device.type == "cpu" else size
        for attempt in dict.fromkeys((reserved, size)):
            try:
                fresh = _buffers(self.table, attempt, self._device, self._dtype)
                break
            except (MemoryError, RuntimeError) as e:  # torch reports an allocation as either
                error = e
        else:
            dim = self.table.dim
            raise IndexMemoryError(
                f"table '{self.table.name}': could not grow the rows and optimizer slots "
                f"({', '.join(names)}) from {have + 1} to {size} rows of dim {dim} for a "
                f"training lookup ({len(self.space)} keys held); nothing was changed"
            ) from error
        used = 1 + self.space.num_rows  # the sink and every row handed out: the rest is spare
        for name in names:
            fresh[name][:used] = self.tensor(name)[:used]
        for name in names:
            self.put(name, fresh[name][:size])
        self._spare = fresh

    def _initialise(
        self, new_keys: np.ndarray, rows: np.ndarray, drawn: np.ndarray | None = None
    ) -> None:
        """Initial values and optimizer slots of the rows just given to ``new_keys``.

        Args:
            drawn: ``(A,) int64`` ascending keys to call the initializer with, of which
                ``new_keys`` are a part (a key shard: every shard's new keys, so that a user
                initializer draws as one process does); default ``new_keys``.
        """
        if (new_keys if drawn is None else drawn).size == 0:
            return
        cfg = self.table.config
        weight = self.tensor("weight")
        index = torch.from_numpy(rows + 1).to(weight.device)
        for name, value in self._slot_init.items():
            self.tensor(name).index_fill_(0, index, value)
        try:
            values = new_rows(
                new_keys if drawn is None else drawn,
                table=self.table.name,
                dim=cfg.dim,
                seed=self.seed,
                initializer=cfg.initializer,
            )
        except BaseException:
            # the keys are admitted: never leave a reused row with an evicted key's values
            weight.index_fill_(0, index, 0.0)
            raise
        if drawn is not None:
            values = values[np.searchsorted(drawn, new_keys)]
        weight.index_copy_(0, index, torch.from_numpy(values).to(weight))

    def _split(self, batches: Sequence[FeatureBatch], rows: np.ndarray) -> list[FeatureBatch]:
        return split_mapped(batches, np.where(rows >= 0, rows + 1, SINK).astype(np.int64))


def _keys_of(batches: Sequence[FeatureBatch]) -> np.ndarray:
    """``(N,) int64``: the keys of every batch, in order (one batch's own, not a copy)."""
    keys = [b.values.cpu().numpy() for b in batches]
    if len(keys) == 1:
        return keys[0]
    return np.concatenate(keys) if keys else np.zeros(0, np.int64)
