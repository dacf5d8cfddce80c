"""What the lookup statistics (:mod:`embcore.stats`) count of a disk table: its cache's hits
and misses and its working file's reads and writes, over every step (docs/disk_tables.md,
"Statistics")."""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["CACHE_COUNTERS", "added", "counters"]

#: what a disk table's statistics count: the steps ended, then cache hits and misses
#: (distinct ids of lookups) and the records its working file read and wrote
CACHE_COUNTERS = ("steps", "hits", "misses", "rows_read", "bytes_read", "rows_written",
                  "bytes_written")  # fmt: skip


def added(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    """Counters ``a + b`` (a counter missing from one counts 0 there)."""
    return {k: a.get(k, 0) + b.get(k, 0) for k in {**a, **b}}


def counters(read: Callable[[], dict[str, int]] | None) -> dict[str, int] | None:
    """The :data:`CACHE_COUNTERS` ``read()`` gives now (``None`` without a reader)."""
    if read is None:
        return None
    values = read()
    return {k: int(values[k]) for k in CACHE_COUNTERS}
