"""Numba kernel of the step boundary of every admit-on-first-sight key space of a step
(:mod:`embcore.dynamic.boundary`): sink reset, eviction, free rows.

One call covers every table: a descriptor row per table (``int64`` addresses and sizes, see
the ``E_*`` columns) locates its row metadata, its key index's arrays and, where given, the
sink row of its weight and optimizer slots. Per table, exactly what
:meth:`KeySpace.end_step` does:

* the keys whose ``steps_to_live`` is up go (live rows with ``last <= step - steps_to_live``);
* then, while more than ``max_rows`` keys would remain, the ``count`` least used of the
  others go: lowest ``freq``, then lowest ``last``, then smallest key. The set is found by
  three cuts rather than a sort of every key: the ``count``-th smallest frequency, then,
  among the keys at that frequency, the last-seen step that completes the count, then,
  among the keys at both, the key that does (keys are distinct, so the set is the first
  ``count`` of :func:`embcore.dynamic.policy.least_used`'s order);
* the victims' keys, sorted, are removed from the index in that order (the index's own
  removal kernel), their rows are the freed rows in key order, no longer live, and join the
  free stack (sorted, the smallest on top).

The readable reference is :meth:`KeySpace.end_step`; tests/dynamic/test_boundary.py compares
the two.
"""

from __future__ import annotations

import numpy as np
from numba import njit
from numba.np.numpy_support import carray

from embcore._numba.address import _voidptr
from embcore.dynamic._kernels import remove

__all__ = ["COLUMNS", "MAX_SLOTS", "end_tables"]

# descriptor columns (int64); E_TTL / E_MAX_ROWS are -1 for no limit, E_WEIGHT 0 for no sink
(E_N, E_SIZE, E_STEP, E_TTL, E_MAX_ROWS, E_KEY, E_FREQ, E_LAST, E_LIVE, E_CTRL, E_KEYS,
 E_ROWS, E_CAP, E_FREE, E_N_FREE, E_OUT, E_WEIGHT, E_DIM, E_SLOTS) = range(19)  # fmt: skip
#: optimizer slots whose sink row is reset (address and floats per row each)
MAX_SLOTS = 4
COLUMNS = E_SLOTS + 2 * MAX_SLOTS
# result columns (int64): keys removed, the index's new free count
R_REMOVED, R_N_FREE = range(2)


@njit(cache=True, inline="always")
def _vector(address, size, dtype):  # type: ignore[no-untyped-def]
    return carray(_voidptr(address), (size,), dtype)


@njit(cache=True, nogil=True, error_model="numpy")
def _reset_sink(d, values):  # type: ignore[no-untyped-def]
    """Row 0 of the weight to zeros, of each slot to its initial value ``values[s]``."""
    weight = _vector(d[E_WEIGHT], d[E_DIM], np.float32)
    for c in range(weight.size):
        weight[c] = np.float32(0.0)
    for s in range(MAX_SLOTS):
        address = d[E_SLOTS + 2 * s]
        if address == 0:
            continue
        slot = _vector(address, d[E_SLOTS + 2 * s + 1], np.float32)
        value = np.float32(values[s])
        for c in range(slot.size):
            slot[c] = value


@njit(cache=True, nogil=True, error_model="numpy")
def _cut(values, count):  # type: ignore[no-untyped-def]
    """The ``count``-th smallest of ``values`` (``1 <= count <= values.size``; ``values`` is
    reordered) and how many are below it. A quickselect with three-way partitions: linear on
    the many equal values of frequencies and steps (where a sort's quicksort is quadratic)."""
    lo, hi = 0, values.size  # the answer lies in values[lo:hi]
    k = count - 1
    while True:
        a, b, c = values[lo], values[(lo + hi - 1) // 2], values[hi - 1]
        pivot = max(min(a, b), min(max(a, b), c))  # the median of three
        lt, i, gt = lo, lo, hi  # [lo, lt) < pivot, [lt, i) == pivot, [gt, hi) > pivot
        while i < gt:
            v = values[i]
            if v < pivot:
                values[i], values[lt] = values[lt], v
                lt += 1
                i += 1
            elif v > pivot:
                gt -= 1
                values[i], values[gt] = values[gt], v
            else:
                i += 1
        if k < lt:
            hi = lt
        elif k >= gt:
            lo = gt
        else:
            below = 0
            for v in values:
                below += np.int64(v < pivot)
            return pivot, below


@njit(cache=True, nogil=True, error_model="numpy")
def _least_used(rest, key, freq, last, count, gone):  # type: ignore[no-untyped-def]
    """Mark in ``gone`` the ``count`` rows of ``rest`` first in ``(freq, last, key)`` order
    (``1 <= count <= rest.size``)."""
    f_cut, f_below = _cut(freq[rest], count)
    tied = rest[freq[rest] == f_cut]
    l_cut, l_below = _cut(last[tied], count - f_below)
    k_cut, _ = _cut(key[tied[last[tied] == l_cut]], count - f_below - l_below)
    for r in rest:
        f = freq[r]
        if f < f_cut or (
            f == f_cut and (last[r] < l_cut or (last[r] == l_cut and key[r] <= k_cut))
        ):
            gone[r] = True


@njit(cache=True, nogil=True, error_model="numpy")
def _end(d, values, result, out_keys, out_rows, free_out):  # type: ignore[no-untyped-def]
    """One table's step boundary (see the module docstring): the removed keys ascending and
    their rows into ``out_keys`` / ``out_rows`` from ``d[E_OUT]``, the new free stack into
    ``free_out`` from the same place."""
    if d[E_WEIGHT] != 0:
        _reset_sink(d, values)
    result[R_REMOVED], result[R_N_FREE] = 0, d[E_N_FREE]
    ttl, max_rows = d[E_TTL], d[E_MAX_ROWS]
    if ttl < 0 and max_rows < 0:
        return
    n = d[E_N]
    key = _vector(d[E_KEY], n, np.int64)
    freq = _vector(d[E_FREQ], n, np.int64)
    last = _vector(d[E_LAST], n, np.int64)
    live = _vector(d[E_LIVE], n, np.bool_)
    gone = np.zeros(n, np.bool_)
    m = 0
    if ttl >= 0:
        limit = d[E_STEP] - ttl
        for r in range(n):
            if live[r] and last[r] <= limit:
                gone[r] = True
                m += 1
    left = d[E_SIZE] - m
    if max_rows >= 0 and left > max_rows:
        rest = np.empty(left, np.int64)
        j = 0
        for r in range(n):
            if live[r] and not gone[r]:
                rest[j] = r
                j += 1
        _least_used(rest, key, freq, last, left - max_rows, gone)
        m += left - max_rows
    if m == 0:
        return
    rows = np.empty(m, np.int64)  # ascending
    j = 0
    for r in range(n):
        if gone[r]:
            rows[j] = r
            j += 1
    victims = np.sort(key[rows])
    freed = np.empty(m, np.int32)
    cap = d[E_CAP]
    remove(
        _vector(d[E_CTRL], cap, np.uint8),
        _vector(d[E_KEYS], cap, np.int64),
        _vector(d[E_ROWS], cap, np.int32),
        victims,
        freed,
    )  # every victim is held: its row, in key order
    o = d[E_OUT]
    for i in range(m):
        out_keys[o + i] = victims[i]
        out_rows[o + i] = freed[i]
        live[freed[i]] = False
    # the free stack (descending, the smallest on top) merged with the freed rows
    n_free = d[E_N_FREE]
    free = _vector(d[E_FREE], max(n_free, 1), np.int32)
    i, j = 0, m - 1
    for s in range(n_free + m):
        if j < 0 or (i < n_free and free[i] > rows[j]):
            free_out[o + s] = free[i]
            i += 1
        else:
            free_out[o + s] = rows[j]
            j -= 1
    result[R_REMOVED], result[R_N_FREE] = m, n_free + m


@njit(cache=True, nogil=True, error_model="numpy")
def end_tables(desc, values, results, out_keys, out_rows, free_out):  # type: ignore[no-untyped-def]
    """The step boundary of every table ``t`` (descriptor ``desc[t]``, slot values
    ``values[t]``); ``results[t]``: keys removed and the new free count."""
    for t in range(desc.shape[0]):
        _end(desc[t], values[t], results[t], out_keys, out_rows, free_out)
