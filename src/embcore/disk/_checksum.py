"""Per-record checksums of a disk table's working file.

Each record keeps, in the 4 bytes of its header after the magic number, the CRC-32C
(Castagnoli, :mod:`embcore._numba.crc32c`) of its id and values: written with the record,
checked whenever it is read, so that a damaged byte anywhere in a row is found before the row
is used (docs/disk_tables.md, "Faults").
"""

from __future__ import annotations

import numpy as np

from embcore._numba.crc32c import crc32c_rows

__all__ = ["damaged", "seal"]

#: the checked bytes start at the record's id (after the magic number and the checksum)
_START = 8


def _checksums(records: np.ndarray) -> np.ndarray:
    """``(N,) uint32``: the CRC-32C of each record's id and values (not its padding)."""
    fields = records.dtype.fields
    stop = max(offset + dtype.itemsize for dtype, offset, *_ in fields.values())
    raw = records.view(np.uint8).reshape(records.size, records.dtype.itemsize)
    return crc32c_rows(raw[:, _START:stop])


def seal(records: np.ndarray) -> None:
    """Store each record's checksum in its header (after its id and values are set)."""
    records["spare"] = _checksums(records)


def damaged(records: np.ndarray) -> np.ndarray:
    """``(N,) bool``: the records whose checksum does not match their id and values."""
    return records["spare"] != _checksums(records)
