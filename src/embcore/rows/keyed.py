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
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor

from embcore.config import ResolvedTable
from embcore.dynamic.index import IndexMemoryError
from embcore.dynamic.init import new_rows
from embcore.dynamic.keyspace import KeySpace
from embcore.dynamic.policy import Eviction
from embcore.initializers import slot_values
from embcore.inputs import FeatureBatch
from embcore.rows._contract import Records, RowEnv
from embcore.rows._key_shard import KeyShard
from embcore.rows._module import RowModule

__all__ = ["SINK", "KeyedRows"]

#: the buffer row that keys without a row read (zeros) and whose gradient is dropped
SINK = 0
#: training lookups whose row numbers are remembered until their update (one batch of each
#: feature of the table per lookup)
_REMEMBERED = 4
_MIN_CAPACITY = 16


class KeyedRows(KeyShard, RowModule):
    """One dynamic table's key space and the mapping of its batches to rows.

    Args:
        table: the resolved table (``table.dynamic``).
        env: the engine's seed (the default initializer's), device and storage dtype.
        shard: one key shard of a sharded table (:class:`~embcore.rows._key_shard.KeyShard`
            has the owner's side of ``key_hash``): it evicts by ``steps_to_live`` itself,
            while the table's ``max_rows`` is chosen over every shard.

    Raises:
        ValueError: the optimizer has a ``slot_variable_creation_fn`` (new rows take the
            slots' initial values).
    """

    kind: ClassVar[str] = "keyed"
    records: ClassVar[Records] = "keyed"

    def __init__(self, table: ResolvedTable, env: RowEnv, shard: bool = False) -> None:
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
        for name, value in _buffers(
            table, _MIN_CAPACITY + 1, env.device, env.storage_dtype
        ).items():
            self.put(name, value)
        # (original batch, mapped batch, key-space step at the lookup), oldest first: updates
        # come in the order of their lookups (a batch object may be looked up more than once)
        self._trained: deque[tuple[FeatureBatch, FeatureBatch, int]] = deque()

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
            rows = self.space.lookup(flat)
        else:
            self.reserve(batches)  # a no-op when the store reserved already
            admitted = self.space.train(flat)
            rows = admitted.rows
            self._initialise(admitted.new_keys, admitted.new_rows)
        out = self._split(batches, rows)
        if training:
            for b, m in zip(batches, out, strict=True):
                self._trained.append((b, m, self.space.step))
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
                continue
            _, mapped, step = self._trained[i]
            del self._trained[i]
            if step != self.space.step:  # an eviction may have freed or reused rows since
                now = self.map([b], training=False)[0].values
                kept = torch.where(now == mapped.values, mapped.values, SINK)
                mapped = dataclasses.replace(mapped, values=kept)
            out.append(mapped)
        self.dropped_gradients += sum(int((m.values == SINK).sum()) for m in out)
        return out

    def end_step(self, evict: int | None = None) -> None:
        """After the step's update: reset the sink, then evict (freed rows are re-initialised
        when a later key takes them). ``evict``: a key shard's part of the table's
        ``max_rows`` eviction, its least used survivors of ``steps_to_live`` (``None``: the
        table's own eviction, one process)."""
        self.tensor("weight")[SINK].zero_()
        for name, value in self._slot_init.items():
            self.tensor(name)[SINK].fill_(value)
        if evict is None:
            self.space.end_step()
            return
        keep = len(self.survivors()[0]) - evict if evict > 0 else None
        self.space.eviction = _StepLimits(self.steps_to_live, keep)  # type: ignore[assignment]
        try:
            self.space.end_step()
        finally:
            self.space.eviction = self._eviction

    # ------------------------------------------------------------------ reading
    def shape(self, name: str) -> tuple[int, ...]:
        return (len(self.space), *self.tensor(name).shape[1:])

    def read(self, name: str) -> Tensor:
        """A copy of ``name``'s rows in ascending key order."""
        return self._values(self.space.keys(), name)

    def write(self, name: str, value: Tensor) -> None:
        raise ValueError(
            f"table '{self.table.name}' is dynamic: its rows are loaded with their keys "
            "(load_dynamic_state), not as a whole tensor"
        )

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
        self.space = space
        self._trained.clear()

    # ------------------------------------------------------------------ internals
    @property
    def _device(self) -> torch.device:
        return self.tensor("weight").device

    @property
    def _dtype(self) -> torch.dtype:
        return self.tensor("weight").dtype

    def _reserve(self, rows: int) -> None:
        """Room for ``rows`` key-space rows (plus the sink), doubling the capacity."""
        have = self.tensor("weight").shape[0] - 1
        if rows <= have:
            return
        size = max(rows, 2 * have, _MIN_CAPACITY) + 1
        names = ("weight", *self._slot_init)
        try:
            fresh = _buffers(self.table, size, self._device, self._dtype)
        except (MemoryError, RuntimeError) as e:  # torch reports an allocation as either
            dim = self.table.dim
            raise IndexMemoryError(
                f"table '{self.table.name}': could not grow the rows and optimizer slots "
                f"({', '.join(names)}) from {have + 1} to {size} rows of dim {dim} for a "
                f"training lookup ({len(self.space)} keys held); nothing was changed"
            ) from e
        for name in names:
            old = self.tensor(name)
            fresh[name][: old.shape[0]] = old
        for name in names:
            self.put(name, fresh[name])

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
        mapped = np.where(rows >= 0, rows + 1, SINK).astype(np.int64)
        out, start = [], 0
        for b in batches:
            n = b.values.numel()
            values = torch.from_numpy(mapped[start : start + n]).to(b.values.device)
            out.append(dataclasses.replace(b, values=values))
            start += n
        return out


@dataclass(frozen=True)
class _StepLimits:
    """What :meth:`KeySpace.end_step` reads of an eviction, for one step of a key shard: the
    table's ``steps_to_live`` and this shard's part of the table's ``max_rows`` eviction
    (which may be 0: every survivor of this shard goes)."""

    steps_to_live: int | None
    max_rows: int | None


def _keys_of(batches: Sequence[FeatureBatch]) -> np.ndarray:
    """``(N,) int64``: the keys of every batch, in order."""
    keys = [b.values.cpu().numpy() for b in batches]
    return np.concatenate(keys) if keys else np.zeros(0, np.int64)


def _buffers(
    table: ResolvedTable, size: int, device: torch.device, dtype: torch.dtype
) -> dict[str, Tensor]:
    """``weight`` (zeros) and every slot (its initial value) of ``size`` rows."""
    weight = torch.zeros((size, table.dim), dtype=dtype, device=device)
    return {"weight": weight, **slot_values(table.optimizer, size, table.dim, device)}
