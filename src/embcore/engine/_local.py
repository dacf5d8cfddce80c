"""Every table in this process: the store of a single-process engine.

Each table's weight and slots are buffers of this module (so ``.to(device)`` and
``share_memory()`` move them with the model); the backend works on :class:`ops.TableState`
views of them. A dynamic table's buffers grow, and its batches are mapped from keys to rows
by :class:`embcore.dynamic.store.DynamicRows` before the kernels see them. See
docs/architecture.md and docs/dynamic_tables.md.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import Tensor, nn

from embcore import ops
from embcore.config import ResolvedTable
from embcore.engine._store import Chunks, StoreConfig, stored_names
from embcore.initializers import initial_rows, initial_slots
from embcore.inputs import FeatureBatch
from embcore.stats import StatsCollector, StatsTable

if TYPE_CHECKING:
    from embcore.disk.rows import DiskRows
    from embcore.dynamic.store import DynamicRows
    from embcore.sharding.comm import Comm

__all__ = ["LocalStore", "LocalTensor"]


class LocalTensor:
    """A stored tensor of a local store: one chunk at offset 0, loaded in place."""

    def __init__(self, key: str, tensor: Tensor) -> None:
        self.key = key
        self.shape = tuple(tensor.shape)
        self.dtype = tensor.dtype
        self._tensor = tensor

    def chunks(self) -> Chunks:
        return [((0,) * len(self.shape), self._tensor)]

    def load_chunks(self) -> Chunks:
        return self.chunks()

    def finish_load(self, chunks: Chunks) -> None:
        """Nothing to move: the load wrote into the table itself."""


class LocalStore(nn.Module):
    """The tables of one process, as buffers ``w{t}`` (weight) and ``s{t}_{slot}``.

    Module-wide dtype casts (``model.half()``, ``model.double()``, ``.to(torch.float64)``)
    leave the tables and slots in their configured dtypes; device moves apply.
    """

    name: ClassVar[str] = "local"
    engine_name: ClassVar[str] = "EmbeddingEngine"

    def __init__(self, config: StoreConfig, plan: Any = None, process_group: Any = None) -> None:
        super().__init__()
        if plan is not None or process_group is not None:
            raise ValueError("LocalStore: plan= and process_group= are for the sharded store")
        self.tables = config.tables
        self.backend = config.backend
        self.stochastic_rounding = config.stochastic_rounding
        #: table index -> its key space and row mapping, for dynamic tables
        self.dynamic: dict[int, DynamicRows] = {}
        #: table index -> its rows on disk behind a RAM cache, for tables in DiskStorage
        self.disk: dict[int, DiskRows] = {}
        self._device = config.device
        for table in self.tables:
            cfg = table.config
            if table.storage is not None:
                self._add_disk(table, config)
                continue
            if table.dynamic:
                self._add_dynamic(table, config)
                continue
            weight = initial_rows(
                table.name, cfg.vocabulary_size, cfg.dim, cfg.initializer, config.seed
            ).to(device=config.device, dtype=config.storage_dtype)
            self.register_buffer(f"w{table.index}", weight)
            for name, value in initial_slots(table, weight).items():
                self.register_buffer(f"s{table.index}_{name}", value)
        self._states_cache: tuple[tuple[Tensor, ...], list[ops.TableState]] | None = None

    def _add_dynamic(self, table: ResolvedTable, config: StoreConfig) -> None:
        from embcore.dynamic.store import DynamicRows  # loads the index kernels: only if used

        if table.optimizer is not None and table.optimizer.slot_variable_creation_fn:
            raise ValueError(
                f"table '{table.name}': slot_variable_creation_fn is not supported for dynamic "
                "tables (vocabulary_size=None): new rows take the slots' initial values"
            )
        for name, value in DynamicRows.initial_buffers(
            table, config.device, config.storage_dtype
        ).items():
            self.register_buffer(
                f"w{table.index}" if name == "weight" else f"s{table.index}_{name}", value
            )
        t, store = table.index, weakref.ref(self)  # no cycle: a dropped store frees at once
        self.dynamic[t] = DynamicRows(
            table,
            config.seed,
            lambda name: store()._tensor(t, name),  # type: ignore[union-attr]
            lambda name, value: setattr(
                store(), f"w{t}" if name == "weight" else f"s{t}_{name}", value
            ),
        )

    def _add_disk(self, table: ResolvedTable, config: StoreConfig) -> None:
        from embcore.disk.rows import DiskRows  # only engines with disk tables load it

        if config.device.type != "cpu" or config.storage_dtype != torch.float32:
            raise ValueError(
                f"table '{table.name}': DiskStorage needs a CPU engine with float32 rows, got "
                f"device={config.device}, storage_dtype={config.storage_dtype}"
            )
        storage = table.storage
        self.disk[table.index] = DiskRows(table, storage, config.seed, storage.cache_bytes)

    # ----------------------------------------------------------------------------- state
    def _tensor(self, table: int, name: str) -> Tensor:
        return getattr(self, f"w{table}" if name == "weight" else f"s{table}_{name}")

    def _states(self) -> list[ops.TableState]:
        """Every table's state, rebuilt only when a buffer was replaced (``.to()``, assignment):
        backends cache per-state work (descriptors, checks) on these objects."""
        buffers = tuple(self._buffers.values())
        cached = self._states_cache
        if (
            cached is None
            or len(cached[0]) != len(buffers)
            or any(a is not b for a, b in zip(cached[0], buffers, strict=True))
        ):
            states = [
                ops.TableState(
                    t.name,
                    self._tensor(t.index, "weight"),
                    {n: self._tensor(t.index, n) for n in stored_names(t)[1:]},
                    t.optimizer,
                    self.stochastic_rounding,
                )
                if t.index not in self.disk
                else None
                for t in self.tables
            ]
            cached = self._states_cache = (buffers, states)
        if self.disk:  # a disk table's cache tensors are replaced when it grows or empties
            return [s or self.disk[i].state() for i, s in enumerate(cached[1])]
        return cached[1]

    def _apply(self, fn: Callable[[Tensor], Tensor], recurse: bool = True) -> nn.Module:
        # Module-wide casts must not change how tables are stored: a cast (seen on an empty
        # probe) becomes a plain move of the original, lossless; other functions (device
        # moves, share_memory) apply as they are.
        def keep_dtype(t: Tensor) -> Tensor:
            probe = fn(t.new_empty(0))
            if probe.dtype == t.dtype:
                return fn(t)
            return t.to(device=probe.device)

        return super()._apply(keep_dtype, recurse)

    def _save_to_state_dict(self, destination: dict, prefix: str, keep_vars: bool) -> None:
        """Nothing: the engine writes the tables under its own keys."""

    def _load_from_state_dict(self, *args: Any, **kwargs: Any) -> None:
        """Nothing: the engine loads the tables from its own keys."""

    @property
    def device(self) -> torch.device:
        return next(iter(self._buffers.values())).device if self._buffers else self._device

    @property
    def comm(self) -> Comm:
        from embcore.sharding.comm import Comm  # the sharding package loads on first use

        return Comm(None, self.device)

    @property
    def plan(self) -> None:
        return None

    @property
    def background_updates(self) -> bool:
        return self.device.type == "cpu"  # the CPU kernels release the GIL

    # ------------------------------------------------------------------------ the step
    def lookup(
        self,
        features: Sequence[Sequence[FeatureBatch]],
        out: Sequence[Sequence[Tensor]] | None,
        training: bool = False,
    ) -> list[list[Tensor]]:
        if self.dynamic and training:  # room in every table before any table changes
            for t, rows in self.dynamic.items():
                rows.reserve(sum(b.values.numel() for b in features[t]))
        if self.dynamic or self.disk:
            features = [
                self._rows(t).map(b, training) if self._rows(t) else b
                for t, b in enumerate(features)
            ]
        return ops.lookup(self.backend, self._states(), features, out=out)

    def _rows(self, t: int) -> Any:
        """The row mapping of table ``t`` (dynamic or disk), or ``None`` (in memory)."""
        return self.dynamic.get(t) or self.disk.get(t)

    def prefetch(self, features: Sequence[Sequence[FeatureBatch]]) -> None:
        """Start reading the disk tables' rows for a batch prepared ahead."""
        for t, rows in self.disk.items():
            if features[t]:
                rows.prefetch(torch.cat([b.values for b in features[t]]).cpu().numpy())

    def update(
        self,
        features: Sequence[Sequence[FeatureBatch]],
        grads: Sequence[Sequence[Tensor]],
        rates: Sequence[float],
        step: int,
    ) -> None:
        if self.dynamic or self.disk:
            features = [
                self._rows(t).for_update(b) if self._rows(t) else b for t, b in enumerate(features)
            ]
        ops.update(self.backend, self._states(), features, grads, rates, step)
        for rows in (*self.dynamic.values(), *self.disk.values()):
            rows.end_step()

    def agree(self, error: Exception | None, non_finite: bool) -> Sequence[int]:
        if error is not None:
            raise error
        return (0,) if non_finite else ()

    # ---------------------------------------------------------------- whole tensors
    def gather(self, items: Sequence[tuple[int, str]]) -> list[Tensor]:
        """Live tensors; for a dynamic table a copy of its rows in ascending key order."""
        return [
            self.dynamic[t].rows(self.dynamic[t].keys(), name)
            if t in self.dynamic
            else torch.cat([self.disk[t].read_range(a, b)[name] for a, b in self.disk[t].ranges()])
            if t in self.disk
            else self._tensor(t, name)
            for t, name in items
        ]

    def load_full(self, items: Sequence[tuple[int, str, Tensor]]) -> None:
        for t, name, value in items:
            if t in self.dynamic:
                raise ValueError(
                    f"table '{self.tables[t].name}' is dynamic: its rows are loaded with "
                    "their keys (load_dynamic_state), not as a whole tensor"
                )
            if t in self.disk:
                self.disk[t].load_part(name, value)
                continue
            self._tensor(t, name).copy_(value)

    def shape(self, table: int, name: str) -> tuple[int, ...]:
        if table in self.dynamic:
            return (len(self.dynamic[table].space), *self._tensor(table, name).shape[1:])
        if table in self.disk:
            return self.disk[table].shape(name)
        return tuple(self._tensor(table, name).shape)

    # ---------------------------------------------------------------- dynamic tables
    def table_keys(self, table: int) -> Tensor:
        """``(R,) int64`` ascending: the keys of dynamic table ``table`` holding a row."""
        return torch.from_numpy(self.dynamic[table].keys())

    def table_rows(self, table: int, keys: Tensor) -> Tensor:
        """``(N, dim)`` rows of ``keys`` (``(N,) int64``), zeros without a row; inserts nothing."""
        return self.dynamic[table].rows(keys.cpu().numpy()).to(torch.float32)

    def table_info(self, table: int) -> dict[str, int]:
        """Dynamic table ``table``'s counters (``EmbeddingEngine.table_info``); a disk
        table's cache and I/O counters."""
        if table in self.disk:
            return self.disk[table].info()
        rows = self.dynamic[table]
        pending = rows.space.pending
        return {
            "rows": len(rows.space),
            "pending": 0 if pending is None else len(pending),
            "dropped_gradients": rows.dropped_gradients,
            "step": rows.space.step,
        }

    def dynamic_state(self, table: int) -> dict[str, Any]:
        """Dynamic table ``table``'s whole content: :meth:`KeySpace.state` (``step``, ``keys``,
        ``freq``, ``last_seen``, ``pending/...`` NumPy arrays, by ascending key) plus
        ``weight`` and each slot as ``(R, ...)`` tensors in key order."""
        return self.dynamic[table].state()

    def load_dynamic_state(self, table: int, state: dict[str, Any]) -> None:
        """Replace dynamic table ``table``'s content with a :meth:`dynamic_state`."""
        self.dynamic[table].load_state(state)

    def tensors(self) -> list[LocalTensor]:
        """The fixed tables' tensors; a checkpoint stores dynamic tables by key, through
        :meth:`dynamic_state` and :meth:`load_dynamic_state`."""
        return [
            self.disk[t.index].stored(name)
            if t.index in self.disk
            else LocalTensor(f"{t.name}.{name}", self._tensor(t.index, name))
            for t in self.tables
            if t.index not in self.dynamic
            for name in stored_names(t)
        ]

    # -------------------------------------------------------------------- statistics
    def stats_tables(self) -> list[StatsTable]:
        return [
            StatsTable(
                t.name,
                t.vocabulary_size,
                t.dim,
                len(t.features),
                rows_held=(lambda rows=self.dynamic[t.index]: len(rows.space))
                if t.index in self.dynamic
                else None,
            )
            for t in self.tables
        ]

    def write_statistics(self, stats: StatsCollector) -> list[Path]:
        return stats.flush()

    def describe(self, tables: str) -> str:
        return tables
