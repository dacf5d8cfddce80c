"""Which rows of a disk table were written since a checkpoint: one bit per row.

A delta checkpoint of a fixed disk table holds only the rows touched since its base
(docs/disk_tables.md, "Checkpoints"). :class:`TouchedRows` records them: an update marks its
rows when it takes their cache slots (before it writes them, so a row changed and then
evicted is marked too), a load marks the rows it replaces. ``since`` names the checkpoint
(the sha256 of its manifest) the table equalled when the bits were last cleared; ``None``:
no checkpoint is known to equal it, and a delta writes the table whole. Rows drawn from the
initializer on first touch are not marked: they equal what any checkpoint holds for them.

Memory: ``ceil(rows / 8)`` bytes (25 MB for 200M rows).
"""

from __future__ import annotations

import numpy as np

__all__ = ["TouchedRows"]

#: bytes of the bitmap unpacked at a time when listing the touched rows (8M rows)
_SCAN_BYTES = 1 << 20


class TouchedRows:
    """A bitmap over rows ``[0, rows)`` and the checkpoint it is relative to."""

    def __init__(self, rows: int) -> None:
        self.rows = rows
        self.bits = np.zeros(-(-rows // 8), np.uint8)
        self.since: str | None = None

    @property
    def nbytes(self) -> int:
        return self.bits.nbytes

    def mark(self, ids: np.ndarray) -> None:
        """Mark ``ids: (N,) int64``, ascending (repeats allowed)."""
        if ids.size == 0:
            return
        byte = ids >> 3
        bit = np.left_shift(1, ids & 7).astype(np.uint8)
        starts = np.flatnonzero(np.r_[True, byte[1:] != byte[:-1]])
        self.bits[byte[starts]] |= np.bitwise_or.reduceat(bit, starts)

    def mark_range(self, start: int, stop: int) -> None:
        """Mark rows ``[start, stop)``."""
        self.mark(np.arange(start, stop, dtype=np.int64))

    def ids(self) -> np.ndarray:
        """``(K,) int64`` ascending: the rows marked, unpacked a slice of the bitmap at a time."""
        found = []
        for a in range(0, self.bits.size, _SCAN_BYTES):
            part = self.bits[a : a + _SCAN_BYTES]
            if part.any():
                at = np.flatnonzero(np.unpackbits(part, bitorder="little"))
                found.append(at.astype(np.int64) + 8 * a)
        ids = np.concatenate(found) if found else np.zeros(0, np.int64)
        return ids[ids < self.rows]

    def reset(self, since: str | None) -> None:
        """The table now equals the checkpoint ``since`` (``None``: no known checkpoint):
        no row is marked."""
        self.bits[:] = 0
        self.since = since
