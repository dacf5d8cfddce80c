"""Where a table's rows live: the storage configs a :class:`~embcore.TableConfig` accepts.

``storage=None`` (the default) keeps the rows and optimizer slots in memory.
:class:`DiskStorage` keeps them in a file on local disk behind a RAM cache of rows bounded by
``cache_bytes``; the numbers are those of the in-memory table, bit for bit
(docs/disk_tables.md).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from embcore._validate import check_bool, check_int, describe

__all__ = ["ROW_OVERHEAD", "DiskStorage", "cached_row_bytes"]

#: bytes of bookkeeping a cached row costs besides its values: its id (8), last use (8),
#: changed flag (1) and its entry in the cache's key index (about 23 at its fullest)
ROW_OVERHEAD = 40


def cached_row_bytes(dim: int, slot_floats: int) -> int:
    """RAM one cached row costs: ``dim`` weights and ``slot_floats`` optimizer values
    (float32), plus :data:`ROW_OVERHEAD`."""
    return 4 * (dim + slot_floats) + ROW_OVERHEAD


@dataclass(frozen=True)
class DiskStorage:
    """Rows and optimizer slots on local disk, behind a RAM cache of at most ``cache_bytes``.

    Args:
        directory: where the table's working file (``<table>.rows``) and its lock file go;
            created (mode 0700) if missing. Use local disk; one engine at a time may use a
            directory. The working file is not a checkpoint: a new engine starts it afresh.
            In a sharded engine each rank uses its subdirectory ``rank<r>``, or the path with
            ``{rank}`` replaced by its rank when the path contains ``{rank}``.
        cache_bytes: RAM for cached rows (weights, slots and their bookkeeping; see
            docs/disk_tables.md for the bytes a row costs). As an engine-wide default
            (``EmbeddingEngine(storage=...)``), the budget of all its disk tables together,
            split between them by size. In a sharded engine, each rank's for its piece.
        direct_io: read and write with ``O_DIRECT`` (no page cache, so memory stays bounded);
            ``None`` uses it where the file system supports it and otherwise reads through
            the page cache, dropping the pages it read (``posix_fadvise``).
        io_threads: requests kept in flight while reading or writing rows (the disk's queue
            depth), >= 1.
    """

    #: the row storage kind it selects (``embcore.rows.ROWS``): fixed tables', dynamic ones'
    kind: ClassVar[str] = "disk"
    keyed_kind: ClassVar[str] = "disk_keyed"

    directory: str | os.PathLike[str]
    cache_bytes: int
    direct_io: bool | None = None
    io_threads: int = 16

    def __post_init__(self) -> None:
        owner = f"DiskStorage(directory={self.directory!r})"
        if not isinstance(self.directory, (str, os.PathLike)) or not os.fspath(self.directory):
            raise ValueError(
                f"DiskStorage: directory must be a non-empty path (str or os.PathLike), got "
                f"{describe(self.directory)}"
            )
        object.__setattr__(self, "directory", Path(self.directory))
        object.__setattr__(
            self, "cache_bytes", check_int(owner, "cache_bytes", self.cache_bytes, minimum=1)
        )
        if self.direct_io is not None:
            check_bool(owner, "direct_io", self.direct_io)
        object.__setattr__(
            self, "io_threads", check_int(owner, "io_threads", self.io_threads, minimum=1)
        )
