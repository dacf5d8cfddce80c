"""The backward of a multi-id table by occurrence lists: its unique rows and, for each, where
its gradients are, instead of a block of summed gradients.

A table whose bags hold several ids each has more unique rows than samples (8 tables of 1M
rows, bags of 1-39 ids, batch 2048: about 27,000 unique rows a table), so its summed
gradient block ``(unique, dim)`` (14 MB at dim 128) is many times the activation gradient
it sums (``(2048, dim)``, 1 MB). :mod:`.dedup` writes that block and the rule reads it back:
two passes of it through memory, beside the rows themselves. Here, per table:

1. one pass over the ids (bag by bag, as :mod:`.dedup`) finds the unique rows with the
   sparse-set index of :mod:`.dedup` and counts each row's ids; the unique rows are then
   sorted (a radix sort), so the rule visits them in ascending order: neighbouring rows
   (the many of a Zipf head) share pages and DRAM rows, and the hardware prefetcher runs;
2. a second pass lists every occurrence, its activation-gradient row's address and its
   gain, grouped by unique row and in id order within a row (a stable counting sort), and
   checks every gradient row for NaN and Inf as :mod:`.dedup` does (``plan[6][t]``).

A rule kernel (``update_listed`` of :mod:`.rules`) then sums a chunk of rows at a time from
the lists (:func:`sum_rows`) into a scratch block that stays in cache and applies the rule
to it. The sums are the dedup's, operation for operation (``g * src`` for a row's first
occurrence, then ``+= g * src`` in id order), and each row's rule does not depend on the
order rows are visited in, so results are the same to the bit.

``occ = (uid, starts, sources, gains, cursor)``, table ``t``'s part from ``base[t]``:
``uid`` ``(ids,) int32``, each id's row in order of first occurrence (-1: out of range);
``starts`` ``(ids + 2 T,) int64``: the ``v``-th row in ascending order has occurrences
``starts[base[t] + 2 t + v]`` up to the next entry (table-relative); ``sources``
``(ids,) int64`` and ``gains`` ``(ids,) float32``: the occurrences; ``cursor``
``(ids,) int64``: where the next occurrence of each row goes while they are listed.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from embcore._numba.address import (
    claim,
    f32_matrix,
    f32_vector,
    i32_vector,
    i64_vector,
    prefetch,
)
from embcore.ops.cpu.combine import gain, sample_scale
from embcore.ops.cpu.dedup import PREFETCH_IDS, gradient_row_not_finite, table_gradients
from embcore.ops.cpu.layout import (
    F_COMBINER,
    F_IDS,
    F_OFFSETS,
    F_ROWS,
    F_SAMPLES,
    F_STRIDE,
    F_VALUES,
    F_WEIGHTS,
    T_DIM,
    T_POSITIONS,
    T_VOCAB,
)

__all__ = ["listed_rows", "occurrence_buffers", "sum_rows", "unique_occurrences"]

#: the radix sort of unique rows: bits per pass, buckets
RADIX_BITS = 11
RADIX = 1 << RADIX_BITS
#: how many occurrences ahead :func:`sum_rows` prefetches the gradient row
PREFETCH_SOURCES = 8


_buffers: list[np.ndarray] = []


def occurrence_buffers(ids: int, tables: int) -> tuple[np.ndarray, ...]:
    """``occ`` for a step of ``ids`` ids in ``tables`` tables (see the module docstring):
    views of buffers grown as needed and reused across steps, so their pages are not
    faulted in again every step. The caller holds the update's workspace lock."""
    sizes = (ids, ids + 2 * tables, ids, ids, ids)
    kinds = (np.int32, np.int64, np.int64, np.float32, np.int64)
    if not _buffers or _buffers[1].size < sizes[1]:
        grown = int(1.25 * sizes[1])
        _buffers[:] = [np.empty(grown, dtype=kind) for kind in kinds]
    return tuple(buffer[:size] for buffer, size in zip(_buffers, sizes, strict=True))


@njit(cache=True, error_model="numpy")
def _ascending(rows, n, vocab):  # type: ignore[no-untyped-def]
    """``(n,) int64``: the indices of ``rows[:n]`` (distinct, in ``[0, vocab)``) in
    ascending order of row (a least-significant-digit radix sort, 11 bits a pass)."""
    order, spare = np.arange(n), np.empty(n, dtype=np.int64)
    counts = np.empty(RADIX + 1, dtype=np.int64)
    shift = 0
    while shift == 0 or (vocab - 1) >> shift > 0:
        counts[:] = 0
        for i in range(n):
            counts[((rows[order[i]] >> shift) & (RADIX - 1)) + 1] += 1
        for b in range(RADIX):
            counts[b + 1] += counts[b]
        for i in range(n):
            b = (rows[order[i]] >> shift) & (RADIX - 1)
            spare[counts[b]] = order[i]
            counts[b] += 1
        order, spare = spare, order
        shift += RADIX_BITS
    return order


@njit(cache=True, error_model="numpy")
def _first_pass(tables, features, first, plan, occ, t):  # type: ignore[no-untyped-def]
    """Table ``t``'s unique rows into ``plan``, in ascending order of row; each id's unique
    row (in order of first occurrence; -1 when out of range) into ``occ[0]``; where each
    such row's occurrences go into ``occ[4]`` and where each row's start, in ascending
    order of row, into ``occ[1]``.

    Returns:
        The number of ids outside ``[0, vocab)``.
    """
    base, unique = plan[0], plan[1]
    vocab = tables[t, T_VOCAB]
    pos = i32_vector(tables[t, T_POSITIONS], vocab)
    size = base[t + 1] - base[t]
    rows = i64_vector(unique.ctypes.data + 8 * base[t], size)
    uid = i32_vector(occ[0].ctypes.data + 4 * base[t], size)
    cursor = i64_vector(occ[4].ctypes.data + 8 * base[t], size)
    n, bad, k = 0, 0, 0
    for f in range(first[t], first[t + 1]):
        feat = features[f]
        ids, samples = feat[F_IDS], feat[F_SAMPLES]
        values = i64_vector(feat[F_VALUES], ids)
        offsets = i64_vector(feat[F_OFFSETS], samples + 1)
        for j in range(offsets[0], offsets[samples]):  # the dedup's order: bag by bag
            if j + PREFETCH_IDS < ids:
                ahead = values[j + PREFETCH_IDS]
                if 0 <= ahead < vocab:
                    prefetch(tables[t, T_POSITIONS] + 4 * ahead)
            r = values[j]
            if r < 0 or r >= vocab:
                bad += 1
                uid[k + j] = -1
                continue
            u = pos[r]
            if u < 0 or u >= n or rows[u] != r:  # first occurrence: a new row
                u = n
                pos[r], rows[u] = u, r
                cursor[u] = 0
                n += 1
            cursor[u] += 1
            uid[k + j] = u
        k += ids
    plan[2][t] = n
    # the rule visits rows in ascending order: neighbouring rows (the many of a Zipf head)
    # then share pages and DRAM rows, and the hardware prefetcher runs ahead
    order = _ascending(rows, n, vocab)
    starts = i64_vector(occ[1].ctypes.data + 8 * (base[t] + 2 * t), n + 1)
    at = 0
    for v in range(n):
        u = order[v]
        starts[v] = at
        at += cursor[u]
        cursor[u] = starts[v]
    starts[n] = at
    for v in range(n):  # the rows themselves, sorted (pos[] entries go stale: harmless)
        order[v] = rows[order[v]]
    rows[:n] = order
    return bad


@njit(cache=True, error_model="numpy")
def _second_pass(tables, features, first, plan, occ, t):  # type: ignore[no-untyped-def]
    """List table ``t``'s occurrences by unique row (see the module docstring) and set
    ``plan[6][t]`` to 1 if one of its gradient rows holds a NaN or an Inf."""
    base = plan[0]
    dim = tables[t, T_DIM]
    size = base[t + 1] - base[t]
    uid = i32_vector(occ[0].ctypes.data + 4 * base[t], size)
    cursor = i64_vector(occ[4].ctypes.data + 8 * base[t], size)
    sources = i64_vector(occ[2].ctypes.data + 8 * base[t], size)
    gains = f32_vector(occ[3].ctypes.data + 4 * base[t], size)
    non_finite = False
    k = 0
    for f in range(first[t], first[t + 1]):
        feat = features[f]
        samples, combiner, weights = feat[F_SAMPLES], feat[F_COMBINER], feat[F_WEIGHTS]
        offsets = i64_vector(feat[F_OFFSETS], samples + 1)
        grads, stride = feat[F_ROWS], feat[F_STRIDE]
        for s in range(samples):
            lo, hi = offsets[s], offsets[s + 1]
            scale = sample_scale(weights, lo, hi, combiner)
            address = grads + 4 * stride * s
            non_finite |= gradient_row_not_finite(grads, stride, s, samples, dim)
            for j in range(lo, hi):
                u = uid[k + j]
                if u < 0:
                    continue
                at = cursor[u]
                cursor[u] = at + 1
                sources[at] = address
                gains[at] = gain(weights, j, scale, combiner)
        k += feat[F_IDS]
    plan[6][t] = 1 if non_finite else 0


@njit(cache=True, nogil=True, error_model="numpy")
def unique_occurrences(  # type: ignore[no-untyped-def]
    tables, features, first, plan, occ, order, listed, worker, workers
):
    """For every table, claimed in ``order``: its unique rows and occurrence lists into
    ``plan`` and ``occ`` where ``listed[t]``, else its summed gradients as
    :func:`.dedup.unique_gradients` does; ``plan[6][t]`` 1 if its gradients are not finite.

    Returns:
        The number of ids outside ``[0, vocab)`` (no table is written; the caller raises).
    """
    counter = plan[5]
    bad = 0
    while True:
        c = claim(counter)
        if c >= order.shape[0]:
            break
        t = order[c]
        if listed[t]:
            bad += _first_pass(tables, features, first, plan, occ, t)
            _second_pass(tables, features, first, plan, occ, t)
        else:
            bad += table_gradients(tables, features, first, plan, t)
    return bad


@njit(cache=True, nogil=True, error_model="numpy")
def sum_rows(starts, sources, gains, block, first, stop):  # type: ignore[no-untyped-def]
    """``block[u - first] = sum_k gains[k] * row(sources[k])`` over row ``u``'s occurrences
    ``starts[u]:starts[u + 1]`` in order, for ``u`` in ``first:stop`` (the dedup's sums)."""
    dim = block.shape[1]
    end = starts[stop]
    for u in range(first, stop):
        out = block[u - first]
        lo, hi = starts[u], starts[u + 1]
        for k in range(lo, hi):
            if k + PREFETCH_SOURCES < end:
                ahead = sources[k + PREFETCH_SOURCES]
                for line in range(0, 4 * dim, 64):
                    prefetch(ahead + line)
            src, g = f32_vector(sources[k], dim), gains[k]
            if k == lo:
                for d in range(dim):
                    out[d] = g * src[d]
            else:
                for d in range(dim):
                    out[d] += g * src[d]


@njit(cache=True, error_model="numpy")
def listed_rows(tables, plan, occ, scratch, t, first, stop):  # type: ignore[no-untyped-def]
    """Table ``t``'s unique rows from ``first`` on ``(count - first,) int64`` and the summed
    gradients of rows ``first:stop`` as a ``(stop - first, dim)`` block at ``scratch``."""
    base, n, dim = plan[0][t], plan[2][t], tables[t, T_DIM]
    rows = i64_vector(plan[1].ctypes.data + 8 * (base + first), n - first)
    starts = i64_vector(occ[1].ctypes.data + 8 * (base + 2 * t), n + 1)
    size = plan[0][t + 1] - base
    sources = i64_vector(occ[2].ctypes.data + 8 * base, size)
    gains = f32_vector(occ[3].ctypes.data + 4 * base, size)
    block = f32_matrix(scratch, stop - first, dim)
    sum_rows(starts, sources, gains, block, first, stop)
    return rows, block
