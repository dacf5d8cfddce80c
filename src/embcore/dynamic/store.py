"""The row storage of one dynamic table in a local store: keys to rows, rows that grow.

A :class:`DynamicRows` keeps a table's :class:`~embcore.dynamic.keyspace.KeySpace` and maps
each :class:`~embcore.inputs.FeatureBatch` of the table from keys to rows of the store's
weight and slot tensors, so that the ordinary lookup kernels and optimizers run on them::

    buffer row 0          the sink: zeros, initial slots; keys without a row read it
    buffer row 1 + r      the key space's row r

The buffers grow by doubling (amortised) before a training lookup could need more rows; new
rows get their initial values and the optimizer's initial slot values when their key is
admitted; the sink is reset after every update, so the gradient of a pending key is dropped.
The store owns the tensors (module buffers); this class reads and replaces them through the
two callables it is given. See docs/dynamic_tables.md.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import Tensor

from embcore.config import ResolvedTable
from embcore.dynamic.index import IndexMemoryError
from embcore.dynamic.init import new_rows
from embcore.dynamic.keyspace import KeySpace
from embcore.inputs import FeatureBatch

__all__ = ["SINK", "DynamicRows"]

#: the buffer row that keys without a row read (zeros) and whose gradient is dropped
SINK = 0
#: training lookups whose row numbers are remembered until their update (one batch of each
#: feature of the table per lookup)
_REMEMBERED = 4
_MIN_CAPACITY = 16


class DynamicRows:
    """One dynamic table's key space and the mapping of its batches to buffer rows.

    Args:
        table: the resolved table (``table.dynamic``).
        seed: the engine's seed (the default initializer's).
        get: ``get(name) -> Tensor``: the store's ``weight`` or slot tensor of this table.
        put: ``put(name, tensor)``: replace it (after growing).
    """

    def __init__(
        self,
        table: ResolvedTable,
        seed: int,
        get: Callable[[str], Tensor],
        put: Callable[[str, Tensor], None],
    ) -> None:
        cfg = table.config
        self.table = table
        self.seed = seed
        self.space = KeySpace(table.name, cfg.admission, cfg.eviction)
        #: occurrences whose gradient was dropped (keys pending admission, or evicted between
        #: their lookup and its update)
        self.dropped_gradients = 0
        self._get, self._put = get, put
        opt = table.optimizer
        self._slot_init = {s.name: s.initial_value for s in opt.slot_specs()} if opt else {}
        # (original batch, mapped batch, key-space step at the lookup), oldest first: updates
        # come in the order of their lookups (a batch object may be looked up more than once)
        self._trained: deque[tuple[FeatureBatch, FeatureBatch, int]] = deque()

    @staticmethod
    def initial_buffers(
        table: ResolvedTable, device: torch.device, dtype: torch.dtype
    ) -> dict[str, Tensor]:
        """``weight`` and slots of an empty table: the sink and a few free rows."""
        return _buffers(table, _MIN_CAPACITY + 1, device, dtype)

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
        space = self.space
        keys = _keys_of(batches)
        spare = self._get("weight").shape[0] - 1 - space.num_rows + space.num_free
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

    def end_step(self) -> None:
        """After the step's update: reset the sink, then evict (freed rows are re-initialised
        when a later key takes them)."""
        self._get("weight")[SINK].zero_()
        for name, value in self._slot_init.items():
            self._get(name)[SINK].fill_(value)
        self.space.end_step()

    # ------------------------------------------------------------------ reading
    def keys(self) -> np.ndarray:
        """``(R,) int64`` ascending: the keys holding a row."""
        return self.space.keys()

    def rows(self, keys: np.ndarray, name: str = "weight") -> Tensor:
        """``(N, ...)`` values of ``name`` for ``keys`` (zeros / initial slot values for keys
        without a row); inserts nothing."""
        found = self.space.lookup(keys)
        buffer = self._get(name)
        index = torch.from_numpy(np.where(found >= 0, found + 1, SINK)).to(buffer.device)
        return buffer.index_select(0, index)

    def state(self) -> dict[str, np.ndarray | Tensor]:
        """The key space's :meth:`~KeySpace.state` (without ``rows``), plus ``weight`` and each
        slot as ``(R, ...)`` tensors in key order: the table's whole content."""
        state: dict[str, np.ndarray | Tensor] = dict(self.space.state())
        rows = torch.from_numpy(state.pop("rows") + 1)
        for name in ("weight", *self._slot_init):
            buffer = self._get(name)
            state[name] = buffer.index_select(0, rows.to(buffer.device))
        return state

    def load_state(self, state: dict[str, np.ndarray | Tensor]) -> None:
        """Replace the table's content with a :meth:`state` (key ``keys[i]`` on row ``i``).

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
        space = KeySpace.from_state(name, arrays, cfg.admission, cfg.eviction)
        values = {}
        for part in ("weight", *self._slot_init):
            if part not in state:
                raise ValueError(f"table '{name}': a dynamic table's state needs '{part}'")
            value = torch.as_tensor(state[part])
            want = self._get(part).shape[1:]
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
            self._put(part, value)
        self.space = space
        self._trained.clear()

    # ------------------------------------------------------------------ internals
    @property
    def _device(self) -> torch.device:
        return self._get("weight").device

    @property
    def _dtype(self) -> torch.dtype:
        return self._get("weight").dtype

    def _reserve(self, rows: int) -> None:
        """Room for ``rows`` key-space rows (plus the sink), doubling the capacity."""
        have = self._get("weight").shape[0] - 1
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
            old = self._get(name)
            fresh[name][: old.shape[0]] = old
        for name in names:
            self._put(name, fresh[name])

    def _initialise(self, new_keys: np.ndarray, rows: np.ndarray) -> None:
        """Initial values and optimizer slots of the rows just given to ``new_keys``."""
        if new_keys.size == 0:
            return
        cfg = self.table.config
        weight = self._get("weight")
        index = torch.from_numpy(rows + 1).to(weight.device)
        for name, value in self._slot_init.items():
            self._get(name).index_fill_(0, index, value)
        try:
            values = new_rows(
                new_keys,
                table=self.table.name,
                dim=cfg.dim,
                seed=self.seed,
                initializer=cfg.initializer,
            )
        except BaseException:
            # the keys are admitted: never leave a reused row with an evicted key's values
            weight.index_fill_(0, index, 0.0)
            raise
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


def _keys_of(batches: Sequence[FeatureBatch]) -> np.ndarray:
    """``(N,) int64``: the keys of every batch, in order."""
    keys = [b.values.cpu().numpy() for b in batches]
    return np.concatenate(keys) if keys else np.zeros(0, np.int64)


def _buffers(
    table: ResolvedTable, size: int, device: torch.device, dtype: torch.dtype
) -> dict[str, Tensor]:
    """``weight`` (zeros) and every slot (its initial value) of ``size`` rows."""
    out = {"weight": torch.zeros((size, table.dim), dtype=dtype, device=device)}
    opt = table.optimizer
    for spec in opt.slot_specs() if opt else ():
        shape = spec.shape(size, table.dim)
        out[spec.name] = torch.full(shape, spec.initial_value, dtype=torch.float32, device=device)
    return out
