"""CRC-32C (Castagnoli), the checksum of TensorFlow's checkpoint files, over a byte array.

Table-driven loops in Numba (the reflected polynomial 0x82F63B78, as in TensorFlow's
``crc32c.cc``): :func:`crc32c` a byte at a time (the reference), :func:`crc32c_rows` eight
bytes at a time ("slicing by 8": eight tables, one lookup per byte, no dependency between
the eight lookups of a word), about three times faster on a disk table's 512-byte records.
:mod:`embcore.compat.tf_checkpoint` uses it to verify what it reads, and a disk table's
records carry one each (:mod:`embcore.disk._checksum`).
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["crc32c", "crc32c_rows"]


def _crc_table() -> np.ndarray:
    table = np.zeros(256, dtype=np.uint32)
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table[i] = c
    return table


_CRC_TABLE = _crc_table()


def _slicing_tables() -> np.ndarray:
    """``(8, 256) uint32``: table ``k`` advances a byte's CRC by ``k`` more zero bytes."""
    tables = np.zeros((8, 256), dtype=np.uint32)
    tables[0] = _CRC_TABLE
    for k in range(1, 8):
        prev = tables[k - 1]
        tables[k] = (prev >> 8) ^ _CRC_TABLE[prev & 0xFF]
    return tables


_SLICING_TABLES = _slicing_tables()


@njit(cache=True, nogil=True)
def _crc32c(data, table):
    crc = np.uint32(0xFFFFFFFF)
    for b in data:
        crc = table[(crc ^ b) & np.uint32(0xFF)] ^ (crc >> np.uint32(8))
    return crc ^ np.uint32(0xFFFFFFFF)


def crc32c(data: np.ndarray) -> int:
    """The CRC-32C of ``data``, a ``(M,) uint8`` array."""
    return int(_crc32c(data, _CRC_TABLE))


@njit(cache=True, nogil=True)
def _crc32c_8(data, t):
    crc = np.uint32(0xFFFFFFFF)
    n, i, m = data.size, 0, np.uint32(0xFF)
    while i + 8 <= n:
        lo = crc ^ (
            np.uint32(data[i])
            | (np.uint32(data[i + 1]) << np.uint32(8))
            | (np.uint32(data[i + 2]) << np.uint32(16))
            | (np.uint32(data[i + 3]) << np.uint32(24))
        )
        crc = t[7, lo & m] ^ t[6, (lo >> np.uint32(8)) & m]
        crc ^= t[5, (lo >> np.uint32(16)) & m] ^ t[4, lo >> np.uint32(24)]
        crc ^= t[3, data[i + 4]] ^ t[2, data[i + 5]] ^ t[1, data[i + 6]] ^ t[0, data[i + 7]]
        i += 8
    while i < n:
        crc = t[0, (crc ^ data[i]) & m] ^ (crc >> np.uint32(8))
        i += 1
    return crc ^ np.uint32(0xFFFFFFFF)


@njit(cache=True, nogil=True)
def _crc32c_rows(data, tables, out):
    for r in range(data.shape[0]):
        out[r] = _crc32c_8(data[r], tables)


def crc32c_rows(data: np.ndarray) -> np.ndarray:
    """``(N,) uint32``: the CRC-32C of each row of ``data``, a ``(N, M) uint8`` array."""
    out = np.empty(data.shape[0], np.uint32)
    _crc32c_rows(data, _SLICING_TABLES, out)
    return out
