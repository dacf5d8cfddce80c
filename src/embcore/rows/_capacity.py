"""A dynamic table's ``initial_capacity``: the memory it reserves up front, checked against
the memory the machine has before any page is written (an over-committed allocation would
otherwise end the process when its pages are touched). See docs/dynamic_tables.md."""

from __future__ import annotations

import math

from embcore.config import ResolvedTable
from embcore.dynamic.index import MAX_LOAD, IndexMemoryError

__all__ = ["check_room", "hint_of"]

#: bytes per index slot (control byte, int64 key, int32 row) and per row of row metadata
#: (key, frequency, last-seen step, live flag)
_SLOT_BYTES, _META_BYTES = 13, 25


def hint_of(table: ResolvedTable, shards: int) -> int:
    """The keys one row storage of ``table`` reserves: ``initial_capacity`` (0 for none),
    its share ``ceil(initial_capacity / shards)`` in a table of ``shards`` key shards."""
    hint = table.config.initial_capacity
    return 0 if hint is None else -(-hint // max(1, shards))


def check_room(table: ResolvedTable, keys: int, row_bytes: int) -> None:
    """Refuse a reservation of ``keys`` keys (with ``row_bytes`` bytes of rows and slots per
    key in memory) larger than the memory available now.

    Raises:
        IndexMemoryError: naming the table, the hint, the bytes it needs and those available.
    """
    need = keys * (math.ceil(_SLOT_BYTES / MAX_LOAD) + _META_BYTES + row_bytes)
    have = available_memory()
    if have is not None and need > have:
        raise IndexMemoryError(
            f"table '{table.name}': initial_capacity={table.config.initial_capacity} reserves "
            f"{need:,} bytes for {keys:,} keys (key index, row metadata, rows and slots), more "
            f"than the {have:,} bytes of memory available; give a smaller initial_capacity or "
            "None (the table then grows as keys arrive)"
        )


def available_memory() -> int | None:
    """Bytes of memory available to new allocations (Linux ``MemAvailable``), else ``None``."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None
