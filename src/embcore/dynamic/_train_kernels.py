"""Numba kernel of the training lookup of every admit-on-first-sight key space of a step
(:mod:`embcore.dynamic.batch`): find-or-insert, row metadata, default initial rows.

Two calls cover every table: a descriptor row per table (``int64`` addresses and sizes, see
the ``D_*`` columns) locates its keys, its key index's arrays, its row metadata and, when the
table's rows take the default initializer, its weight and optimizer slots.

* Pass 1 (:func:`stage_tables`), over each table's keys in order (hashed 64 ahead, home slots
  prefetched): a key with a row gets ``out = row + base``; a key without one is inserted into
  the index at once with a provisional row (its rank among the call's new keys, stored
  negative), so its later occurrences find it and count. The new keys are now counted: the
  caller makes room for them (row metadata, rows), or undoes pass 1 (:func:`unstage_tables`:
  each insert took an empty slot) when it cannot, so that no table changes.
* Pass 2 (:func:`finish_tables`): the new keys, sorted (the caller's ``argsort`` of them:
  NumPy's sorts 22,000 keys in 26 tables in half the time of Numba's), take their rows in
  ascending key order (freed rows first, smallest first, then new rows at the end), exactly as
  :meth:`KeySpace.train` assigns them; their index entries, metadata and outputs get the
  final rows; held keys get ``freq += 1`` per occurrence and ``last = step``; new weight rows
  get the default initializer's values (bit for bit :func:`._init_kernels.normal_rows`) and
  their slots the optimizer's initial values.

The readable reference is :meth:`KeySpace.train` followed by
:func:`embcore.dynamic.init.default_rows`; tests/dynamic/test_batch.py compares the two.
"""

from __future__ import annotations

import numpy as np
from numba import njit
from numba.np.numpy_support import carray

from embcore._numba.address import _voidptr
from embcore.dynamic._init_kernels import draw_row
from embcore.dynamic._kernels import _fingerprint, _hash_ahead, _probe

__all__ = ["COLUMNS", "MAX_SLOTS", "finish_tables", "stage_tables", "unstage_tables"]

# descriptor columns (int64)
(D_QUERY, D_N, D_CTRL, D_KEYS, D_ROWS, D_CAP, D_MAX_SIZE, D_FREE, D_N_FREE, D_NEXT_ROW,
 D_SIZE, D_KEY, D_FREQ, D_LAST, D_LIVE, D_META, D_STEP, D_OUT, D_BASE, D_NEW_KEYS,
 D_NEW_SLOTS, D_MULT, D_NEW_ROWS, D_ORDER, D_WEIGHT, D_BUFFER_ROWS, D_DIM, D_SALT,
 D_SLOTS) = range(29)  # fmt: skip
#: optimizer slots a fused initialisation fills (address and floats per row each)
MAX_SLOTS = 4
COLUMNS = D_SLOTS + 2 * MAX_SLOTS
# result columns (int64): the index's new free count, next row and size, and the new keys
R_N_FREE, R_NEXT_ROW, R_SIZE, R_NEW, R_FAILED = range(5)
_AHEAD = 64


@njit(cache=True, inline="always")
def _vector(address, size, dtype):  # type: ignore[no-untyped-def]
    return carray(_voidptr(address), (size,), dtype)


@njit(cache=True, nogil=True, error_model="numpy")
def _stage(d, result):  # type: ignore[no-untyped-def]
    """Pass 1 of one table (descriptor ``d``): rows of held keys into ``out``, new keys
    inserted with provisional rows; ``result[R_NEW]`` new keys, ``result[R_SIZE]`` keys."""
    n = d[D_N]
    query = _vector(d[D_QUERY], n, np.int64)
    cap = d[D_CAP]
    ctrl = _vector(d[D_CTRL], cap, np.uint8)
    ikeys = _vector(d[D_KEYS], cap, np.int64)
    irows = _vector(d[D_ROWS], cap, np.int32)
    out = _vector(d[D_OUT], n, np.int64)
    base = d[D_BASE]
    size, max_size = d[D_SIZE], d[D_MAX_SIZE]
    # the call's new keys, in order of first occurrence: key, index slot, occurrences
    new_key = _vector(d[D_NEW_KEYS], n, np.int64)
    new_slot = _vector(d[D_NEW_SLOTS], n, np.int64)
    mult = _vector(d[D_MULT], n, np.int64)
    m = 0
    hashes = np.empty(_AHEAD, np.uint64)
    for start in range(0, n, _AHEAD):
        stop = min(start + _AHEAD, n)
        _hash_ahead(ctrl, ikeys, irows, query, start, stop, hashes)
        for i in range(start, stop):
            key = query[i]
            h = hashes[i - start]
            p = _probe(ctrl, ikeys, cap, key, h)
            if p >= 0:
                r = np.int64(irows[p])
                if r >= 0:  # (its metadata is refreshed in pass 2, once nothing can fail)
                    out[i] = r + base
                else:  # a new key of this call, seen again
                    mult[-1 - r] += 1
                    out[i] = r
                continue
            if size >= max_size:  # the index needs room: undo this table's inserts
                result[R_NEW] = m
                _unstage(d, result)
                result[R_FAILED] = 1
                return
            p = -1 - p
            ctrl[p] = _fingerprint(h)
            ikeys[p] = key
            irows[p] = np.int32(-1 - m)
            new_key[m] = key
            new_slot[m] = p
            mult[m] = 1
            out[i] = -1 - m
            m += 1
            size += 1
    result[R_NEW] = m
    result[R_SIZE] = size
    result[R_FAILED] = 0


@njit(cache=True, nogil=True, error_model="numpy")
def _unstage(d, result):  # type: ignore[no-untyped-def]
    """Undo :func:`_stage`'s inserts: each took a slot that was empty, so clearing them
    leaves the index as it was."""
    ctrl = _vector(d[D_CTRL], d[D_CAP], np.uint8)
    new_slot = _vector(d[D_NEW_SLOTS], d[D_N], np.int64)
    for j in range(result[R_NEW]):
        ctrl[new_slot[j]] = 0
    result[R_NEW] = 0


@njit(cache=True, nogil=True, error_model="numpy")
def _finish(d, f, result):  # type: ignore[no-untyped-def]
    """Pass 2 of one staged table: new keys sorted take their rows (freed rows, smallest
    first, then new ones), index entries, metadata and outputs get them; held keys' metadata
    is refreshed; new rows initialised when ``d`` has a weight."""
    n = d[D_N]
    cap = d[D_CAP]
    irows = _vector(d[D_ROWS], cap, np.int32)
    meta = d[D_META]
    mkey = _vector(d[D_KEY], meta, np.int64)
    mfreq = _vector(d[D_FREQ], meta, np.int64)
    mlast = _vector(d[D_LAST], meta, np.int64)
    mlive = _vector(d[D_LIVE], meta, np.bool_)
    out = _vector(d[D_OUT], n, np.int64)
    step, base = d[D_STEP], d[D_BASE]
    new_key = _vector(d[D_NEW_KEYS], n, np.int64)
    new_slot = _vector(d[D_NEW_SLOTS], n, np.int64)
    mult = _vector(d[D_MULT], n, np.int64)
    new_rows = _vector(d[D_NEW_ROWS], n, np.int64)
    m = result[R_NEW]
    free = _vector(d[D_FREE], max(d[D_N_FREE], 1), np.int32)
    n_free, next_row = d[D_N_FREE], d[D_NEXT_ROW]
    order = _vector(d[D_ORDER], max(m, 1), np.int64)  # argsort of new_key[:m], by the caller
    row_of = np.empty(m, np.int64)
    sorted_keys = np.empty(m, np.int64)
    for k in range(m):
        j = order[k]
        if n_free > 0:
            n_free -= 1
            r = np.int64(free[n_free])
        else:
            r = next_row
            next_row += 1
        row_of[j] = r
        irows[new_slot[j]] = np.int32(r)
        mkey[r] = new_key[j]
        mfreq[r] = mult[j]
        mlast[r] = step
        mlive[r] = True
        sorted_keys[k] = new_key[j]
        new_rows[k] = r
    new_key[:m] = sorted_keys
    for i in range(n):
        if out[i] < 0:
            out[i] = row_of[-1 - out[i]] + base
        else:  # a key held before: one more use per occurrence
            r = out[i] - base
            mfreq[r] += 1
            mlast[r] = step
    if d[D_WEIGHT] != 0:
        _initialise(d, f, new_key, new_rows, m, base)
    result[R_N_FREE] = n_free
    result[R_NEXT_ROW] = next_row


@njit(cache=True, nogil=True, error_model="numpy")
def _initialise(d, f, keys, rows, m, base):  # type: ignore[no-untyped-def]
    """Default initial values of the ``m`` new rows (weight ``(rows, dim) float32``) and the
    optimizer's initial slot values; ``f``: ``std, lo, width`` then each slot's value."""
    dim, top = d[D_DIM], d[D_BUFFER_ROWS]
    weight = carray(_voidptr(d[D_WEIGHT]), (top, dim), np.float32)
    salt = np.uint64(d[D_SALT])
    for k in range(m):
        draw_row(weight, rows[k] + base, keys[k], salt, f[1], f[2], f[0])
    for s in range(MAX_SLOTS):
        address = d[D_SLOTS + 2 * s]
        width = d[D_SLOTS + 2 * s + 1]
        if address == 0:
            continue
        slot = carray(_voidptr(address), (top, width), np.float32)
        value = np.float32(f[3 + s])
        for k in range(m):
            for c in range(width):
                slot[rows[k] + base, c] = value


@njit(cache=True, nogil=True, error_model="numpy")
def stage_tables(desc, results):  # type: ignore[no-untyped-def]
    """Pass 1 of every table ``t`` with ``results[t, R_FAILED]`` set (the caller sets it
    for all at first): ``R_FAILED`` stays set, with nothing inserted, where the index
    lacked room."""
    for t in range(desc.shape[0]):
        if results[t, R_FAILED]:
            _stage(desc[t], results[t])


@njit(cache=True, nogil=True, error_model="numpy")
def unstage_tables(desc, results):  # type: ignore[no-untyped-def]
    """Undo pass 1 of every staged table (the index as it was before)."""
    for t in range(desc.shape[0]):
        if not results[t, R_FAILED]:
            _unstage(desc[t], results[t])


@njit(cache=True, nogil=True, error_model="numpy")
def finish_tables(desc, floats, results):  # type: ignore[no-untyped-def]
    """Pass 2 of every staged table, once the row metadata (and the rows written) have
    room for ``results[t, R_NEW]`` new keys."""
    for t in range(desc.shape[0]):
        _finish(desc[t], floats[t], results[t])
