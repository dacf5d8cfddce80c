"""The backward's first pass: per table, the unique rows of the step and their summed gradient.

For table ``t`` (features ``first[t]:first[t+1]``) one pass over its ids, in feature order,
finds the ``count[t]`` distinct rows, stored at ``unique[base[t]:base[t] + count[t]]`` in
order of first occurrence, and sums ``gain * dL/dact[sample]`` of every occurrence into
row ``u`` of the table's gradient block::

    ids (feature order)  7  3  7  9        gradient block (count[t], dim), float32
    unique               7  3  9           u=0: g(7) = c0 + c2   (c = gain * dL/dact)
                                           u=1: g(3) = c1
                                           u=2: g(9) = c3

Occurrences are added in the reference's order, so the sums agree to the last bit. Every
gradient row is checked for NaN and Inf on its way in (empty bags' rows too): ``plan[6][t]``
says whether table ``t``'s gradients hold one, so a caller can drop the step before any rule
writes a table, without a separate pass over the gradients. The
activation gradients are read sequentially and new rows are appended, so the pass streams;
the block lives in a workspace reused across steps. Dedup uses the table's persistent
sparse-set index (:func:`.layout.positions`), never an allocation proportional to the
vocabulary; a table with few ids for its vocabulary (a hash table of at most ``HASH_SLOTS``
slots, smaller than the index) uses a batch-sized open-addressing hash table instead, which
stays in cache where the index costs a miss per id. Workers claim tables, biggest first; the
per-row optimizer pass (:mod:`.rules`) then runs over unique rows.
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
from embcore.ops.cpu.layout import (
    F_COMBINER,
    F_IDS,
    F_OFFSETS,
    F_ROWS,
    F_SAMPLES,
    F_STRIDE,
    F_TABLE,
    F_VALUES,
    F_WEIGHTS,
    T_DIM,
    T_POSITIONS,
    T_VOCAB,
)

__all__ = ["gradient_row_not_finite", "out_of_range", "table_gradients", "unique_gradients"]

#: how many ids ahead the sparse-set entry is prefetched
PREFETCH_IDS = 16
#: how many samples ahead the activation-gradient row is prefetched
PREFETCH_SAMPLES = 4
#: the largest hash table (slots of 12 bytes) used instead of the per-table index
HASH_SLOTS = 1 << 15
#: Fibonacci hashing: the top bits of ``id * 2^64 / golden ratio`` (wrapping int64 product)
HASH_MULTIPLIER = -7046029254386353131


@njit(cache=True, inline="always", error_model="numpy")
def gradient_row_not_finite(grads, stride, s, samples, dim):  # type: ignore[no-untyped-def]
    """Whether gradient row ``s`` (of ``samples`` rows ``stride`` floats apart at address
    ``grads``) holds a NaN or an Inf; prefetches the row ``PREFETCH_SAMPLES`` ahead."""
    src = f32_vector(grads + 4 * stride * s, dim)
    non_finite = False
    for d in range(dim):  # x - x is NaN exactly for NaN and +-inf (an integer OR)
        non_finite |= (src[d] - src[d]) != np.float32(0.0)
    if s + PREFETCH_SAMPLES < samples:  # strided rows defeat the hardware prefetcher
        ahead = grads + 4 * stride * (s + PREFETCH_SAMPLES)
        for line in range(0, 4 * dim, 64):
            prefetch(ahead + line)
    return non_finite


@njit(cache=True, inline="always", error_model="numpy")
def table_gradients(tables, features, first, plan, t):  # type: ignore[no-untyped-def]
    """Table ``t``'s unique rows and summed gradients into ``plan`` (see
    :func:`unique_gradients`).

    Returns:
        The number of the table's ids outside ``[0, vocab)`` (skipped).
    """
    base, unique, count, offset, gradients = plan[0], plan[1], plan[2], plan[3], plan[4]
    bad = 0
    non_finite = False
    vocab, dim = tables[t, T_VOCAB], tables[t, T_DIM]
    pos = i32_vector(tables[t, T_POSITIONS], vocab)
    rows = unique[base[t] :]
    block = f32_matrix(gradients.ctypes.data + 4 * offset[t], base[t + 1] - base[t], dim)
    n = 0  # distinct rows so far
    # a batch-sized hash table (open addressing) when it is smaller than the index: its
    # lines stay in cache, where the index costs a cache miss per id
    size = base[t + 1] - base[t]
    bits = 1
    while (1 << bits) < 2 * size:
        bits += 1
    hashed = (1 << bits) <= HASH_SLOTS and 12 * (1 << bits) < 4 * vocab
    mask = (1 << bits) - 1 if hashed else 0
    keys = np.full(mask + 1, -1, dtype=np.int64)
    slots = np.empty(mask + 1, dtype=np.int32)
    for f in range(first[t], first[t + 1]):
        feat = features[f]
        samples, combiner, weights = feat[F_SAMPLES], feat[F_COMBINER], feat[F_WEIGHTS]
        ids = feat[F_IDS]
        values = i64_vector(feat[F_VALUES], ids)
        offsets = i64_vector(feat[F_OFFSETS], samples + 1)
        grads, stride = feat[F_ROWS], feat[F_STRIDE]
        for s in range(samples):
            lo, hi = offsets[s], offsets[s + 1]
            scale = sample_scale(weights, lo, hi, combiner)
            src = f32_vector(grads + 4 * stride * s, dim)
            non_finite |= gradient_row_not_finite(grads, stride, s, samples, dim)
            for j in range(lo, hi):
                if not hashed and j + PREFETCH_IDS < ids:
                    ahead = values[j + PREFETCH_IDS]
                    if 0 <= ahead < vocab:
                        prefetch(tables[t, T_POSITIONS] + 4 * ahead)
                r = values[j]
                if r < 0 or r >= vocab:
                    bad += 1
                    continue
                g = gain(weights, j, scale, combiner)
                if hashed:
                    h = ((r * HASH_MULTIPLIER) >> (64 - bits)) & mask
                    while keys[h] != r and keys[h] != -1:
                        h = (h + 1) & mask
                    new = keys[h] == -1
                    if new:
                        keys[h], slots[h] = r, n
                    u = slots[h]
                else:
                    u = pos[r]
                    new = u < 0 or u >= n or rows[u] != r
                    if new:
                        pos[r] = n
                if new:  # first occurrence: a new row
                    u = n
                    rows[u] = r
                    n += 1
                    out = block[u]
                    for d in range(dim):
                        out[d] = g * src[d]
                else:
                    out = block[u]
                    for d in range(dim):
                        out[d] += g * src[d]
    count[t] = n
    plan[6][t] = 1 if non_finite else 0
    return bad


@njit(cache=True, nogil=True, error_model="numpy")
def unique_gradients(  # type: ignore[no-untyped-def]
    tables, features, first, plan, order, worker, workers
):
    """Fill ``plan = (base, unique, count, offset, gradients, counter, non_finite)``: table
    ``t``'s unique rows at ``unique[base[t]:]``, their gradients as a ``(count[t], dim)``
    block at ``gradients[offset[t]:]``, and ``non_finite[t]`` 1 if any of its gradient rows
    holds a NaN or an Inf (else 0). Workers claim tables from ``counter`` in ``order`` (biggest
    first, so the last ones claimed are small).

    Returns:
        The number of ids outside ``[0, vocab)`` (no table is written; the caller raises).
    """
    counter = plan[5]
    bad = 0
    while True:
        k = claim(counter)
        if k >= order.shape[0]:
            break
        bad += table_gradients(tables, features, first, plan, order[k])
    return bad


@njit(cache=True, nogil=True, error_model="numpy")
def out_of_range(tables, features, worker, workers):  # type: ignore[no-untyped-def]
    """How many ids of features ``worker, worker + workers, ...`` lie outside their table's
    ``[0, vocab)``: checked before a fused update writes any table."""
    bad = 0
    for f in range(worker, features.shape[0], workers):
        feat = features[f]
        vocab = tables[feat[F_TABLE], T_VOCAB]
        values = i64_vector(feat[F_VALUES], feat[F_IDS])
        for j in range(values.shape[0]):
            r = values[j]
            bad += (r < 0) | (r >= vocab)
    return bad
