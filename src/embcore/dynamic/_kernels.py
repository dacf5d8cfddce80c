"""Numba kernels of the key index (:mod:`embcore.dynamic.index`): hashing, probing, rehashing.

The table is open addressing with linear probing over three parallel arrays of ``cap`` slots::

    ctrl  uint8   0 = empty, else 0x80 | 7 hash bits (the slot's fingerprint)
    keys  int64   the key held by an occupied slot (any int64; never read for an empty slot)
    rows  int32 / int64   the key's row number

A key's home slot comes from the high 32 bits of its 64-bit hash (``(h >> 32) * cap >> 32``,
so ``cap`` need not be a power of two), its fingerprint from the low 7 bits, so the two are
independent. A probe walks the control bytes and reads a key only where the fingerprint
matches (1 in 128 for a foreign key). Removal shifts the following entries of the run back,
so there are no tombstones and probes stay as short as at insertion. See docs/dynamic_tables.md.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from embcore._numba.address import prefetch
from embcore._numba.mix import mix64

__all__ = ["find", "insert", "rehash", "remove"]

_S32 = np.uint64(32)
_LOW7 = np.uint64(0x7F)
_OCCUPIED = np.uint64(0x80)
#: keys hashed and prefetched ahead of the probes (keeps several cache misses in flight)
_AHEAD = 64


@njit(cache=True, inline="always")
def _home(h, cap):  # type: ignore[no-untyped-def]
    return np.int64(((h >> _S32) * np.uint64(cap)) >> _S32)


@njit(cache=True, inline="always")
def _fingerprint(h):  # type: ignore[no-untyped-def]
    return np.uint8(_OCCUPIED | (h & _LOW7))


@njit(cache=True, inline="always")
def _probe(ctrl, keys, cap, key, h):  # type: ignore[no-untyped-def]
    """The slot holding ``key``, or ``-1 - s`` where ``s`` is the empty slot ending its run."""
    fp = _fingerprint(h)
    p = _home(h, cap)
    while True:
        c = ctrl[p]
        if c == 0:
            return -1 - p
        if c == fp and keys[p] == key:
            return p
        p += 1
        if p == cap:
            p = 0


@njit(cache=True, inline="always")
def _hash_ahead(ctrl, keys, rows, query, start, stop, hashes):  # type: ignore[no-untyped-def]
    """Hash ``query[start:stop]`` into ``hashes`` and prefetch each key's home slot."""
    cap = ctrl.size
    for i in range(start, stop):
        h = mix64(np.uint64(query[i]))
        hashes[i - start] = h
        p = _home(h, cap)
        prefetch(ctrl.ctypes.data + p)
        prefetch(keys.ctypes.data + 8 * p)
        prefetch(rows.ctypes.data + rows.itemsize * p)


@njit(cache=True, nogil=True, error_model="numpy")
def find(ctrl, keys, rows, query, out, worker, workers):  # type: ignore[no-untyped-def]
    """``out[i]`` = the row of ``query[i]``, or -1; chunks ``worker::workers`` of the query.

    Read-only, so the result does not depend on how the query is split across threads.
    """
    cap = ctrl.size
    n = query.size
    hashes = np.empty(_AHEAD, np.uint64)
    for start in range(worker * _AHEAD, n, workers * _AHEAD):
        stop = min(start + _AHEAD, n)
        _hash_ahead(ctrl, keys, rows, query, start, stop, hashes)
        for i in range(start, stop):
            p = _probe(ctrl, keys, cap, query[i], hashes[i - start])
            out[i] = rows[p] if p >= 0 else -1


@njit(cache=True, nogil=True, error_model="numpy")
def insert(
    ctrl, keys, rows, query, first, out, new, free, n_free, next_row, size, max_size, row_limit
):  # type: ignore[no-untyped-def]
    """Insert the keys ``query[first:]`` not present; ``out[i]`` = the key's row, ``new[i]`` =
    whether this call gave it its row (first occurrence only). New rows come from the top of
    the ``free[:n_free]`` stack, then ``next_row, next_row + 1, ...``.

    Stops before a new key that would take the table past ``max_size`` keys or need a row past
    ``row_limit``. Returns ``(i, n_free, next_row, size)``: ``i`` is where it stopped
    (``query.size`` when done) and the rest the new state.
    """
    n = query.size
    hashes = np.empty(_AHEAD, np.uint64)
    for start in range(first, n, _AHEAD):
        stop = min(start + _AHEAD, n)
        _hash_ahead(ctrl, keys, rows, query, start, stop, hashes)
        for i in range(start, stop):
            key = query[i]
            h = hashes[i - start]
            p = _probe(ctrl, keys, ctrl.size, key, h)
            if p >= 0:
                out[i] = rows[p]
                new[i] = False
                continue
            if size >= max_size or (n_free == 0 and next_row > row_limit):
                return i, n_free, next_row, size
            p = -1 - p
            if n_free > 0:
                n_free -= 1
                r = np.int64(free[n_free])
            else:
                r = next_row
                next_row += 1
            ctrl[p] = _fingerprint(h)
            keys[p] = key
            rows[p] = r
            out[i] = r
            new[i] = True
            size += 1
    return n, n_free, next_row, size


@njit(cache=True, nogil=True, error_model="numpy")
def remove(ctrl, keys, rows, query, freed):  # type: ignore[no-untyped-def]
    """Remove every key of ``query`` present; their rows go to ``freed[:n]`` in query order.
    Returns ``n``. The entries after a removed one shift back into its place when their home
    slot allows (backward-shift deletion), so no tombstone is left."""
    cap = ctrl.size
    n = 0
    for q in range(query.size):
        key = query[q]
        i = _probe(ctrl, keys, cap, key, mix64(np.uint64(key)))
        if i < 0:
            continue
        freed[n] = rows[i]
        n += 1
        j = i
        while True:
            j += 1
            if j == cap:
                j = 0
            if ctrl[j] == 0:
                break
            home = _home(mix64(np.uint64(keys[j])), cap)
            # the entry at j may move back to i unless its home lies cyclically in (i, j]
            stays = (i < home <= j) if i <= j else (home > i or home <= j)
            if stays:
                continue
            ctrl[i] = ctrl[j]
            keys[i] = keys[j]
            rows[i] = rows[j]
            i = j
        ctrl[i] = 0
    return n


@njit(cache=True, nogil=True, error_model="numpy")
def rehash(ctrl, keys, rows, new_ctrl, new_keys, new_rows):  # type: ignore[no-untyped-def]
    """Move every entry into the (empty, larger) new arrays."""
    cap = new_ctrl.size
    for s in range(ctrl.size):
        if ctrl[s] == 0:
            continue
        key = keys[s]
        h = mix64(np.uint64(key))
        p = _home(h, cap)
        while new_ctrl[p] != 0:
            p += 1
            if p == cap:
                p = 0
        new_ctrl[p] = ctrl[s]
        new_keys[p] = key
        new_rows[p] = rows[s]
