"""The engine's reads of its tables' rows: ``table_keys``, ``table_rows``, ``table_info``,
``snapshot``.

:class:`DynamicTablesAPI` gives :class:`embcore.EmbeddingEngine` these methods; they read the
store's rows (and keys, for tables persisted by key) and never insert, count or refresh a
key. See docs/dynamic_tables.md and docs/serving.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from embcore.config import ResolvedTable

if TYPE_CHECKING:
    from embcore.engine._store import TableStore

__all__ = ["DynamicTablesAPI", "TableSnapshot"]


@dataclass(frozen=True, eq=False)
class TableSnapshot:
    """One table's rows as a lookup-only copy reads them (:meth:`DynamicTablesAPI.snapshot`).

    Attributes:
        table: the resolved table.
        weight: ``(R, dim)``: a fixed table's rows by id, or a keyed table's by ascending key.
        keys: ``(R,) int64`` ascending, the key of each row of a keyed (dynamic) table;
            ``None`` when ids are row numbers.
    """

    table: ResolvedTable
    weight: Tensor
    keys: Tensor | None


class DynamicTablesAPI:
    """``table_keys`` / ``table_rows`` / ``table_info`` of :class:`EmbeddingEngine`."""

    _tables: list[ResolvedTable]
    _pipeline: Any
    store: TableStore

    def table_keys(self, table: str) -> Tensor:
        """The keys of dynamic table ``table`` that hold a row now: ``(R,) int64``, ascending.

        Raises:
            ValueError: no dynamic table has that name.
        """
        t = self._dynamic_table(table, "table_keys")
        self._pipeline.wait()
        return self.store.table_keys(t.index)

    def table_rows(self, table: str, keys: Any) -> Tensor:
        """The rows of ``keys`` in dynamic table ``table``: ``(len(keys), dim) float32``, zeros
        for keys without a row. Inserts, counts and refreshes nothing.

        Args:
            keys: ``(N,)`` integer keys (a tensor, array or list).

        Raises:
            ValueError: no dynamic table has that name, or ``keys`` is not 1-D.
            TypeError: ``keys`` are not integers.
        """
        t = self._dynamic_table(table, "table_rows")
        keys = torch.as_tensor(keys)
        if keys.dtype.is_floating_point or keys.dtype.is_complex or keys.dtype == torch.bool:
            raise TypeError(
                f"EmbeddingEngine.table_rows: keys of table '{table}' must be integers, got "
                f"dtype {keys.dtype}"
            )
        if keys.dim() != 1:
            raise ValueError(
                f"EmbeddingEngine.table_rows: keys of table '{table}' must be 1-D, got shape "
                f"{tuple(keys.shape)}"
            )
        self._pipeline.wait()
        return self.store.table_rows(t.index, keys.to(torch.int64))

    def table_info(self, table: str) -> dict[str, int]:
        """Counters of dynamic table ``table``: ``rows`` (keys holding a row), ``pending``
        (keys counted but not admitted yet), ``dropped_gradients`` (occurrences whose
        gradient was dropped because their key had no row at the update) and ``step``
        (step boundaries the key space has passed). For a table in ``DiskStorage``: its
        cache's ``hits``, ``misses``, ``rows_cached``, ``cache_capacity``, ``evicted_rows``,
        ``overflow_rows``, and ``rows_read`` / ``rows_written`` / ``bytes_read`` /
        ``bytes_written`` of its file, ``prefetched_rows``, ``prefetch_used``, ``ram_bytes``
        and ``disk_bytes`` (docs/disk_tables.md), all since the engine was made."""
        disk = [t for t in self._tables if t.name == table and t.storage is not None]
        if disk:
            self._pipeline.wait()
            return self.store.table_info(disk[0].index)
        t = self._dynamic_table(table, "table_info")
        self._pipeline.wait()
        return self.store.table_info(t.index)

    def snapshot(self) -> list[TableSnapshot]:
        """Every table's rows (and keys) in table order, as serving reads them: copies for
        keyed and sharded tables, the live tensors of a one-process fixed table (a collective
        for a sharded engine: every rank must call it)."""
        weights = self.embedding_tables  # type: ignore[attr-defined]
        keyed = [self.store.records(t.index) == "keyed" for t in self._tables]
        return [
            TableSnapshot(t, weights[t.name], self.table_keys(t.name) if k else None)
            for t, k in zip(self._tables, keyed, strict=True)
        ]

    def _dynamic_table(self, name: str, what: str) -> ResolvedTable:
        for t in self._tables:
            if t.name == name and t.dynamic:
                return t
        dynamic = [t.name for t in self._tables if t.dynamic]
        kind = "a fixed table" if any(t.name == name for t in self._tables) else "no table"
        raise ValueError(
            f"EmbeddingEngine.{what}: '{name}' is {kind}; the dynamic tables "
            f"(vocabulary_size=None) are {dynamic}"
        )
