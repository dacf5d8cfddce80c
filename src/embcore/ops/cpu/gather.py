"""The fused forward: every feature of every table gathered and combined in one pass.

Work is cut into chunks of samples across all features (:func:`.combine.chunk_starts`) and
claimed by the workers from a shared counter (:mod:`.threads`), so threads share one big table
as well as many small ones. A sample writes only its own output row, so no synchronisation is
needed.

A chunk of one-id bags copies rows; where every output row is whole 64-byte lines on the
line grid it copies them with non-temporal stores (:func:`.address.stream_line`). Output rows
are written whole and read only after the kernel, and the rows of one feature of a stacked
``(S, F, dim)`` output lie ``F * dim`` floats apart, each on another page, where the hardware
prefetcher cannot fetch ahead: an ordinary store first reads each line into the cache (a miss
per line, one row at a time), a streaming store does not read it at all.
"""

from __future__ import annotations

from numba import njit

from embcore._numba.address import (
    claim,
    f32_matrix,
    f32_vector,
    i64_vector,
    prefetch_l2,
    prefetch_row,
    store_fence,
    stream_line,
)
from embcore.ops.cpu.combine import chunk_starts, gain, sample_scale, which_chunk
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
    T_VOCAB,
    T_WEIGHT,
)

__all__ = ["SAMPLES_PER_CHUNK", "STREAM_BYTES", "pooled_lookup"]

SAMPLES_PER_CHUNK = 128
#: activations of at least this many bytes in all (which no cache level would keep until
#: they are read) are written with non-temporal stores where their rows allow; smaller ones
#: stay in the cache for the model that reads them next
STREAM_BYTES = 16 << 20
#: how many ids ahead rows are prefetched
PREFETCH_IDS = 16
#: bags of several ids prefetch rows ``PREFETCH_IDS`` ahead into the second-level cache only
#: and this many ahead into every level: prefetching all of them into the first level held
#: more misses than a core keeps in flight (rows of dim 128: the pooling took 1.35x as long)
PREFETCH_NEAR = 4


@njit(cache=True, inline="always", error_model="numpy")
def _prefetch_id(weight, r, vocab, dim, far=False):  # type: ignore[no-untyped-def]
    """Prefetch table row ``r`` (if in range) of the table at ``weight``; ``far``: into the
    second-level cache only (:func:`.address.prefetch_l2`), for a row further ahead."""
    if 0 <= r < vocab:
        if far:
            for line in range(0, 4 * dim, 64):
                prefetch_l2(weight + 4 * dim * r + line)
        else:
            prefetch_row(weight, r, 4 * dim)


@njit(cache=True, inline="always", error_model="numpy")
def _in_range(values, j, count, vocab):  # type: ignore[no-untyped-def]
    """Whether ids ``values[j:j + count]`` all lie in ``[0, vocab)``."""
    for i in range(j, j + count):  # noqa: SIM110 (a plain loop compiles to a plain loop)
        if values[i] < 0 or values[i] >= vocab:
            return False
    return True


@njit(cache=True, inline="always", error_model="numpy")
def _one_id_per_bag(offsets, first, last):  # type: ignore[no-untyped-def]
    """Whether every sample of ``first:last`` has exactly one id."""
    for s in range(first, last):  # noqa: SIM110 (a plain loop compiles to a plain loop)
        if offsets[s + 1] - offsets[s] != 1:
            return False
    return True


@njit(cache=True, error_model="numpy")
def _copy_rows(table, values, out_rows, stride, first, last, shift, stop, streaming):  # type: ignore[no-untyped-def]
    """Samples ``first:last`` of one unweighted id each (id ``s + shift`` of sample ``s``):
    ``out[s] = table[id]``, or zeros for an id out of range. Ids below ``stop`` are
    prefetched ``PREFETCH_IDS`` ahead. ``streaming``: output rows are whole 64-byte lines,
    64-byte aligned, and are written with non-temporal stores (see :func:`pooled_lookup`).

    Returns:
        The number of ids out of range.
    """
    vocab, dim = table.shape[0], table.shape[1]
    weight = table.ctypes.data
    bad = 0
    for s in range(first, last):
        j = s + shift
        if j + PREFETCH_IDS < stop:
            _prefetch_id(weight, values[j + PREFETCH_IDS], vocab, dim)
        r = values[j]
        out = f32_matrix(out_rows + 4 * stride * s, 1, dim)
        if streaming and 0 <= r < vocab:
            for line in range(0, 4 * dim, 64):
                stream_line(out_rows + 4 * stride * s + line, weight + 4 * dim * r + line)
        elif 0 <= r < vocab:
            for d in range(dim):
                out[0, d] = table[r, d]
        else:
            bad += 1
            for d in range(dim):
                out[0, d] = 0.0
    return bad


@njit(cache=True, nogil=True, error_model="numpy")
def pooled_lookup(tables, features, counter, stream, worker, workers):  # type: ignore[no-untyped-def]
    """``out[s] = sum_j gain_j * table[id_j]`` for this worker's samples of every feature.

    Args:
        tables: ``(T, TABLE_COLUMNS) int64`` descriptors.
        features: ``(F, FEATURE_COLUMNS) int64`` descriptors; ``F_ROWS`` is the ``(S, dim)``
            output, whose rows are ``F_STRIDE`` floats apart (``dim`` when contiguous; more
            for the features of a stacked ``(S, F, dim)`` output).
        counter: ``(1,) int64``, 0 at the start: workers claim chunks from it.
        stream: whether rows copied whole may be written with non-temporal stores (the
            caller's choice: ``STREAM_BYTES`` of output or more).
        worker, workers: this worker and how many share the work.

    Returns:
        The number of ids outside ``[0, vocab)`` (skipped; the caller raises).
    """
    starts = chunk_starts(features[:, F_SAMPLES], SAMPLES_PER_CHUNK)
    count = features.shape[0]
    # With equal sample counts, chunk c is sample chunk c // count of feature c % count: the
    # features of one block of samples are written together, which keeps the writes of a
    # stacked output (rows count * dim floats apart) within a few pages at a time.
    interleave = count > 1
    for f in range(1, count):
        interleave = interleave and features[f, F_SAMPLES] == features[0, F_SAMPLES]
    bad = 0
    while True:
        c = claim(counter)
        if c >= starts[-1]:
            break
        if interleave:
            f = c % count
            first = (c // count) * SAMPLES_PER_CHUNK
        else:
            f = which_chunk(starts, c)
            first = (c - starts[f]) * SAMPLES_PER_CHUNK
        feat = features[f]
        tab = tables[feat[F_TABLE]]
        vocab, dim = tab[T_VOCAB], tab[T_DIM]
        table = f32_matrix(tab[T_WEIGHT], vocab, dim)
        samples, combiner, weights = feat[F_SAMPLES], feat[F_COMBINER], feat[F_WEIGHTS]
        values = i64_vector(feat[F_VALUES], feat[F_IDS])
        offsets = i64_vector(feat[F_OFFSETS], samples + 1)
        out_rows, stride = feat[F_ROWS], feat[F_STRIDE]
        last = min(first + SAMPLES_PER_CHUNK, samples)
        # the chunk's ids are offsets[first]:offsets[last]; rows are prefetched PREFETCH_IDS
        # ids ahead, within the chunk (the next chunk a worker claims is often another
        # feature's); output rows are not prefetched: every line of them is overwritten
        lo, hi = offsets[first], offsets[last]
        for j in range(lo, min(lo + PREFETCH_IDS, hi)):
            _prefetch_id(tab[T_WEIGHT], values[j], vocab, dim)
        if weights == 0 and _one_id_per_bag(offsets, first, last):
            streaming = stream and dim % 16 == 0 and out_rows % 64 == 0 and stride % 16 == 0
            bad += _copy_rows(
                table, values, out_rows, stride, first, last, lo - first, hi, streaming
            )
            continue
        for s in range(first, last):
            lo, hi = offsets[s], offsets[s + 1]
            row = f32_vector(out_rows + 4 * stride * s, dim)
            for j in range(lo, hi):
                if j + PREFETCH_IDS < offsets[last]:
                    _prefetch_id(tab[T_WEIGHT], values[j + PREFETCH_IDS], vocab, dim, True)
                if j + PREFETCH_NEAR < offsets[last]:
                    _prefetch_id(tab[T_WEIGHT], values[j + PREFETCH_NEAR], vocab, dim)
            if weights == 0 and hi - lo == 1 and 0 <= values[lo] < vocab:
                src = table[values[lo]]  # one unweighted id: gain 1 whatever the combiner
                for d in range(dim):
                    row[d] = src[d]
                continue
            for d in range(dim):
                row[d] = 0.0
            scale = sample_scale(weights, lo, hi, combiner)
            address = tab[T_WEIGHT]
            j = lo
            while j < hi:
                if j + 4 <= hi and _in_range(values, j, 4, vocab):
                    # four ids in one pass over the row, added in the same order as one by one
                    g0, g1 = (
                        gain(weights, j, scale, combiner),
                        gain(weights, j + 1, scale, combiner),
                    )
                    g2, g3 = (
                        gain(weights, j + 2, scale, combiner),
                        gain(weights, j + 3, scale, combiner),
                    )
                    s0 = f32_vector(address + 4 * dim * values[j], dim)
                    s1 = f32_vector(address + 4 * dim * values[j + 1], dim)
                    s2 = f32_vector(address + 4 * dim * values[j + 2], dim)
                    s3 = f32_vector(address + 4 * dim * values[j + 3], dim)
                    for d in range(dim):
                        row[d] = (((row[d] + g0 * s0[d]) + g1 * s1[d]) + g2 * s2[d]) + g3 * s3[d]
                    j += 4
                    continue
                r = values[j]
                if 0 <= r < vocab:
                    g, src = (
                        gain(weights, j, scale, combiner),
                        f32_vector(address + 4 * dim * r, dim),
                    )
                    for d in range(dim):
                        row[d] += g * src[d]
                else:
                    bad += 1
                j += 1
    store_fence()  # the streamed rows are visible to the caller
    return bad
