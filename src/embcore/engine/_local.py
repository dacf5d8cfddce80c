"""Every table in this process: the store of a single-process engine.

Each table's rows are one row storage (:mod:`embcore.rows`: dense, keyed, or a registered
kind), a submodule, so that ``.to(device)`` and ``share_memory()`` move their tensors with
the model. A step maps each table's batches to row slots, runs the backend once on every
table's :class:`ops.TableState`, and ends each row storage's step. See
docs/architecture.md.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from embcore import ops
from embcore._comm import Comm
from embcore._table_store import StoreConfig
from embcore.inputs import FeatureBatch
from embcore.rows import Records, RowEnv, RowStore, StoredTensor, close_rows, make_rows
from embcore.rows._keyed_lookup import end_steps, map_training
from embcore.stats import StatsCollector, StatsTable

__all__ = ["LocalStore"]


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
        env = RowEnv(config.seed, config.device, config.storage_dtype, config.stochastic_rounding)
        #: each table's row storage, in table order
        self.rows = nn.ModuleList([make_rows(t, env) for t in self.tables])  # type: ignore[misc]
        #: :meth:`update` takes ``check_finite=True`` (checked within the backend's own pass
        #: over the gradients) where the backend can and every table has dense rows, whose
        #: ``for_update`` changes nothing: a step the check drops leaves nothing to undo
        self.folds_finite_check = self.backend.UPDATE_CHECKS_FINITE and all(
            r.kind == "dense" for r in self.rows
        )

    def _row(self, table: int) -> RowStore:
        return self.rows[table]  # type: ignore[return-value]

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
        return self._row(0).state().weight.device

    @property
    def comm(self) -> Comm:
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
        rows = list(self.rows)
        if training:  # room in every table before any changes; keyed tables in one call
            mapped = map_training(rows, features)
        else:
            mapped = [r.map(b, training) for r, b in zip(rows, features, strict=True)]
        return ops.lookup(self.backend, [r.state() for r in rows], mapped, out=out)

    def update(
        self,
        features: Sequence[Sequence[FeatureBatch]],
        grads: Sequence[Sequence[Tensor]],
        rates: Sequence[float],
        step: int,
        check_finite: bool = False,
    ) -> bool:
        rows = list(self.rows)
        mapped = [r.for_update(b) for r, b in zip(rows, features, strict=True)]
        states = [r.state() for r in rows]
        if not ops.update(self.backend, states, mapped, grads, rates, step, check_finite):
            return False
        end_steps(rows)  # keyed tables' evictions in one call
        return True

    def prefetch(self, features: Sequence[Sequence[FeatureBatch]]) -> None:
        """A batch prepared ahead (``EmbeddingEngine.prepare``): row storages that read rows
        from a slower tier (disk) start reading them now."""
        for r, b in zip(self.rows, features, strict=True):
            prefetch = getattr(r, "prefetch", None)
            if prefetch is not None:
                prefetch(b)

    def agree(self, error: Exception | None, non_finite: bool) -> Sequence[int]:
        if error is not None:
            raise error
        return (0,) if non_finite else ()

    # ---------------------------------------------------------------- whole tensors
    def gather(self, items: Sequence[tuple[int, str]]) -> list[Tensor]:
        """Each row storage's whole tensor: live for dense rows, a copy in ascending key
        order for keyed rows."""
        return [self._row(t).read(name) for t, name in items]

    def load_full(self, items: Sequence[tuple[int, str, Tensor]]) -> None:
        for t, name, value in items:
            self._row(t).write(name, value)

    def shape(self, table: int, name: str) -> tuple[int, ...]:
        return self._row(table).shape(name)

    def records(self, table: int) -> Records:
        return self._row(table).records

    def flush_before_training_lookup(self) -> bool:
        return any(r.flush_before_training_lookup for r in self.rows)

    # ---------------------------------------------------------------- keyed rows
    def table_keys(self, table: int) -> Tensor:
        return self._row(table).keys()  # type: ignore[return-value]

    def table_rows(self, table: int, keys: Tensor) -> Tensor:
        return self._row(table).rows(keys)

    def table_info(self, table: int) -> dict[str, int]:
        return self._row(table).info()

    def dynamic_state(self, table: int) -> dict[str, Any]:
        return self._row(table).content()

    def load_dynamic_state(self, table: int, state: dict[str, Any]) -> None:
        self._row(table).load_content(state)

    def tensors(self) -> list[StoredTensor]:
        return [x for r in self.rows for x in r.tensors()]

    # -------------------------------------------------------------------- statistics
    def stats_tables(self) -> list[StatsTable]:
        return [
            StatsTable(
                t.name,
                t.vocabulary_size,
                t.dim,
                len(t.features),
                rows_held=_held(self._row(t.index)),
                cache_counters=getattr(self._row(t.index), "cache_counters", None),
            )
            for t in self.tables
        ]

    def write_statistics(self, stats: StatsCollector) -> list[Path]:
        return stats.flush()

    def describe(self, tables: str) -> str:
        return tables

    def close(self) -> None:
        close_rows(self.rows)


def _held(rows: RowStore) -> Callable[[], int | None] | None:
    """The rows held now, as statistics read them (``None``: a fixed vocabulary)."""
    return None if rows.rows_held() is None else rows.rows_held
