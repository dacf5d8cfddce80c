"""The engine's reads of dynamic tables: ``table_keys``, ``table_rows``, ``table_info``.

:class:`DynamicTablesAPI` gives :class:`embcore.EmbeddingEngine` these methods; they read the
store's key space and rows and never insert, count or refresh a key. See
docs/dynamic_tables.md.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from embcore.config import ResolvedTable

__all__ = ["DynamicTablesAPI", "evicting"]


def evicting(tables: list[ResolvedTable]) -> bool:
    """Whether a dynamic table may evict keys (``steps_to_live`` or ``max_rows`` set): then a
    pipelined update must be applied before the next training lookup, whose rows its step
    boundary could free (docs/dynamic_tables.md, "Pipelining")."""
    for t in tables:
        ev = t.config.eviction if t.dynamic else None
        if ev is not None and (ev.steps_to_live is not None or ev.max_rows is not None):
            return True
    return False


class DynamicTablesAPI:
    """``table_keys`` / ``table_rows`` / ``table_info`` of :class:`EmbeddingEngine`."""

    _tables: list[ResolvedTable]
    _pipeline: Any
    store: Any

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
