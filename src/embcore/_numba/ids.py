"""``copy_checked_ids``: many features' one-id inputs copied into one block, each id
range-checked as it is copied (one read of the ids); ``copy_checked_ragged``: the same for
ragged inputs, their row splits checked on the way.

The engine converts a DLRM's categorical fields, one ``(B,) int64`` tensor of ids per feature,
into rows of one ``(F, B)`` block it owns (``embcore.engine._dense_batch``). Copying and
checking them in one pass reads every id once, where a stack and a row-wise minimum and maximum
read them twice and take several tensor calls each.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from embcore._numba.address import i64_vector

__all__ = ["copy_checked_ids", "copy_checked_ragged"]


@njit(cache=True, nogil=True, error_model="numpy")
def copy_checked_ids(sources, limits, out):  # type: ignore[no-untyped-def]
    """Copy feature ``f``'s ids into ``out[f]``, checking each is in ``[0, limits[f])``.

    Args:
        sources: ``(F, 2) int64``: the address of feature ``f``'s ``(B,) int64`` ids and their
            stride in elements (``>= 0``: a column of a ``(B, F)`` tensor has stride ``F``).
        limits: ``(F,) int64``, positive: feature ``f``'s ids must be below ``limits[f]``.
        out: ``(F, B) int64``, C-contiguous.

    Returns:
        The first feature holding an id out of range (its row and the later ones are then not
        all written), or -1 when every id is in range.
    """
    features, samples = out.shape
    if samples == 0:
        return -1
    for f in range(features):
        address, stride, limit = sources[f, 0], sources[f, 1], np.uint64(limits[f])
        row = out[f]
        bad = False
        if stride == 1:  # contiguous: a loop LLVM vectorizes
            ids = i64_vector(address, samples)
            for s in range(samples):
                row[s] = ids[s]
                bad |= np.uint64(ids[s]) >= limit  # a negative id wraps to >= 2**63
        else:
            ids = i64_vector(address, (samples - 1) * stride + 1)
            for s in range(samples):
                row[s] = ids[s * stride]
                bad |= np.uint64(ids[s * stride]) >= limit
        if bad:
            return f
    return -1


@njit(cache=True, nogil=True, error_model="numpy")
def copy_checked_ragged(sources, limits, values_out, splits_out):  # type: ignore[no-untyped-def]
    """Copy feature ``f``'s ragged ids and row splits into its part of ``values_out`` and
    ``splits_out``, checking every id is in ``[0, limits[f])`` and the splits run from 0 to
    the feature's id count without decreasing.

    Args:
        sources: ``(F, 4) int64``: the address of feature ``f``'s contiguous ``(N_f,) int64``
            ids, ``N_f``, the address of its contiguous ``(B_f + 1,) int64`` row splits, and
            ``B_f``.
        limits: ``(F,) int64``, positive: feature ``f``'s ids must be below ``limits[f]``.
        values_out: ``(sum N_f,) int64``: feature ``f``'s ids follow feature ``f - 1``'s.
        splits_out: ``(sum (B_f + 1),) int64``, likewise.

    Returns:
        The first feature whose splits or ids are bad (its part and the later ones are then
        not all written), or -1 when every feature's are good.
    """
    at_value, at_split = 0, 0
    for f in range(sources.shape[0]):
        count, rows, limit = sources[f, 1], sources[f, 3], np.uint64(limits[f])
        splits = i64_vector(sources[f, 2], rows + 1)
        bad = splits[0] != 0 or splits[rows] != count
        for r in range(rows + 1):
            splits_out[at_split + r] = splits[r]
        for r in range(rows):
            bad |= splits[r + 1] < splits[r]
        if count > 0:
            ids = i64_vector(sources[f, 0], count)
            for i in range(count):  # a loop LLVM vectorizes
                values_out[at_value + i] = ids[i]
                bad |= np.uint64(ids[i]) >= limit  # a negative id wraps to >= 2**63
        if bad:
            return f
        at_value += count
        at_split += rows + 1
    return -1
