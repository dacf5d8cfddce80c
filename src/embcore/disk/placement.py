"""Where a disk table's rows go in a sharded engine, and the memory a piece of it takes.

Each rank keeps its piece of a table in its own directory: ``DiskStorage.directory`` with
``{rank}`` replaced by the rank when the path holds it (to put ranks on different disks),
else the subdirectory ``rank<r>`` of it. A piece holds whole rows of a contiguous range, so a
plan may place a disk table table-wise or row-wise with the ``div`` map (:data:`PLACEMENTS`).

:func:`planned_memory` is what the sharding planner counts per tier for a piece (see
docs/disk_tables.md, "Memory"): in RAM the cache (its capacity in rows, each costing
:func:`~embcore.storage.cached_row_bytes`) plus :func:`fixed_overhead`; on disk the file once
every row was written.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from embcore.config import ResolvedTable
from embcore.disk import table as disk_table
from embcore.disk._file import RecordLayout
from embcore.disk.table import row_bytes, row_shapes
from embcore.initializers import BLOCK_ROWS
from embcore.storage import DiskStorage

__all__ = [
    "PLACEMENTS",
    "fixed_overhead",
    "piece_fits",
    "planned_memory",
    "rank_storage",
    "record_bytes",
]

#: the placements of a sharding plan a disk table takes, as the planner's overrides name them
PLACEMENTS = ("table_wise", "row_wise:div")


def rank_storage(storage: DiskStorage, rank: int, sharded: bool) -> DiskStorage:
    """``storage`` with rank ``rank``'s directory: ``{rank}`` in the path replaced, else (a
    sharded engine) its subdirectory ``rank<r>``; a one-process engine's as it is."""
    text = os.fspath(storage.directory)
    if "{rank}" in text:
        return dataclasses.replace(storage, directory=Path(text.replace("{rank}", str(rank))))
    if not sharded:
        return storage
    return dataclasses.replace(storage, directory=Path(text) / f"rank{rank}")


def piece_fits(piece: Any, table: ResolvedTable) -> bool:
    """Whether a sharded engine's piece (:class:`embcore.rows.Piece`) is whole rows of a
    contiguous range, as a disk table holds them."""
    return piece.row_start is not None and tuple(piece.cols) == (0, table.dim)


def record_bytes(table: ResolvedTable) -> int:
    """Bytes of one record of ``table``'s working file (header, values, padding)."""
    shapes = row_shapes(table)
    slots = tuple((n, s) for n, s in shapes.items() if n != "weight")
    return RecordLayout(table.dim, slots).dtype.itemsize


def fixed_overhead(table: ResolvedTable, rows: int) -> int:
    """RAM a disk table holds besides its cache: one initializer block's values while it is
    drawn (:data:`~embcore.initializers.BLOCK_ROWS` rows), the records of one box being
    written (8,192), one flag per block, and one bit per row (the rows touched since the last
    checkpoint, for deltas)."""
    values = sum(4 * (s[0] if s else 1) for s in row_shapes(table).values())
    blocks = -(-rows // BLOCK_ROWS)
    box = min(rows, disk_table._CHUNK) * record_bytes(table)  # read now: tests may shrink it
    return min(rows, BLOCK_ROWS) * values + box + blocks + -(-rows // 8)


def planned_memory(table: ResolvedTable, rows: int) -> dict[str, int]:
    """``{"ram": ..., "disk": ...}`` bytes of ``rows`` rows of ``table`` in its
    ``DiskStorage``: the cache's capacity (at least one row, at most ``rows``) and
    :func:`fixed_overhead` in RAM; every row's record on disk."""
    size = row_bytes(table)
    capacity = max(1, min(rows, table.storage.cache_bytes // size))
    ram = capacity * size + fixed_overhead(table, rows)
    return {"ram": ram, "disk": rows * record_bytes(table)}
