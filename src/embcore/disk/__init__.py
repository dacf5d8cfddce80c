"""Tables larger than memory: the disk tier under the ``"disk"`` row storage
(:mod:`embcore.rows.disk`): a working file of fixed-size records (:mod:`._file`), a bounded RAM
cache of rows (:mod:`._cache`) and the table over both (:mod:`.table`). ``ec.DiskStorage``
(:mod:`embcore.storage`) is the config; docs/disk_tables.md the guide."""

from embcore.disk._file import DiskTableError

__all__ = ["DiskTableError"]
