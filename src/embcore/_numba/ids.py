"""``copy_checked_ids``: many features' one-id inputs copied into one block, each id
range-checked as it is copied (one read of the ids).

The engine converts a DLRM's categorical fields, one ``(B,) int64`` tensor of ids per feature,
into rows of one ``(F, B)`` block it owns (``embcore.engine._dense_batch``). Copying and
checking them in one pass reads every id once, where a stack and a row-wise minimum and maximum
read them twice and take several tensor calls each.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from embcore._numba.address import i64_vector

__all__ = ["copy_checked_ids"]


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
