"""CRC-32C (Castagnoli), the checksum of TensorFlow's checkpoint files, over a byte array.

A table-driven loop in Numba (the reflected polynomial 0x82F63B78, as in TensorFlow's
``crc32c.cc``); :mod:`embcore.compat.tf_checkpoint` uses it to verify what it reads, and a
disk table's records carry one each (:mod:`embcore.disk._checksum`).
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
def _crc32c_rows(data, table, out):
    for r in range(data.shape[0]):
        out[r] = _crc32c(data[r], table)


def crc32c_rows(data: np.ndarray) -> np.ndarray:
    """``(N,) uint32``: the CRC-32C of each row of ``data``, a ``(N, M) uint8`` array."""
    out = np.empty(data.shape[0], np.uint32)
    _crc32c_rows(data, _CRC_TABLE, out)
    return out
