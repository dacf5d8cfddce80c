"""Numba kernels of the keyed-record digests that checkpoints of dynamic tables keep
(:mod:`embcore.checkpoint._records`): two 64-bit lanes per record, each an iterated
bijection of the record's key and words. See docs/dynamic_tables.md.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from embcore._numba.mix import mix64

__all__ = ["fold", "start"]

_SEED_A = np.uint64(0x6A09E667F3BCC908)
_SEED_B = np.uint64(0xBB67AE8584CAA73B)
_K = np.uint64(0x9FB21C651E98DF25)
_CHUNK = 1024  # records a thread takes at a time


@njit(cache=True)
def start(keys, a, b):  # type: ignore[no-untyped-def]
    for i in range(keys.size):
        k = np.uint64(keys[i])
        a[i] = mix64(_SEED_A ^ k)
        b[i] = mix64((_SEED_B + k) * _K)


@njit(cache=True, nogil=True)
def fold(words, a, b, worker, workers):  # type: ignore[no-untyped-def]
    """Fold ``words: (K, W) uint32`` into the two lanes of each record (chunks
    ``worker::workers`` of the records). Each lane is an iterated bijection, so records
    differing in exactly one word always differ."""
    n = words.shape[0]
    for start in range(worker * _CHUNK, n, workers * _CHUNK):
        for i in range(start, min(start + _CHUNK, n)):
            x, y = a[i], b[i]
            for j in range(words.shape[1]):
                w = np.uint64(words[i, j])
                x = mix64(x ^ w)
                y = mix64((y + w) * _K)
            a[i], b[i] = x, y
