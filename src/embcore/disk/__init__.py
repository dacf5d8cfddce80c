"""Tables larger than memory: rows on local disk behind a bounded RAM cache of rows
(docs/disk_tables.md). ``ec.DiskStorage`` (:mod:`embcore.storage`) is the config."""

from embcore.disk.rows import DiskRows

__all__ = ["DiskRows"]
