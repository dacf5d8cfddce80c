"""Per-sample combiner math and work splitting, shared by the forward and backward kernels.

The combiner is linear (docs/semantics.md §2.1): id ``j`` of sample ``s`` contributes
``gain_j * table[id_j]`` with ``gain_j = w_j`` for sum and ``w_j * scale(s)`` for mean
(``1 / sum w``) and sqrtn (``1 / sqrt(sum w^2)``), ``scale = 0`` when the denominator is 0.
Everything is float32 and summed in id order, as the reference does, so results agree to the
last bit or nearly.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from embcore._numba.address import f32_vector

__all__ = ["chunk_starts", "gain", "sample_scale", "which_chunk"]

SUM, MEAN, SQRTN = 0, 1, 2
_ONE = np.float32(1.0)
_ZERO = np.float32(0.0)


@njit(cache=True, error_model="numpy")
def sample_scale(weights_address, lo, hi, combiner):  # type: ignore[no-untyped-def]
    """``scale(s)`` of the sample whose ids are ``lo:hi``."""
    if combiner == SUM:
        return _ONE
    if weights_address == 0:
        denom = np.float32(hi - lo)
    else:
        w = f32_vector(weights_address, hi)
        denom = _ZERO
        for j in range(lo, hi):
            denom += w[j] if combiner == MEAN else w[j] * w[j]
    if combiner == SQRTN:
        denom = np.sqrt(denom)
    if denom == _ZERO:
        return _ZERO
    return _ONE / denom


@njit(cache=True, error_model="numpy")
def gain(weights_address, j, scale, combiner):  # type: ignore[no-untyped-def]
    """The multiplier of id ``j``: its weight, times ``scale`` unless the combiner is sum."""
    if weights_address == 0:
        return scale
    w = f32_vector(weights_address, j + 1)[j]
    return w if combiner == SUM else w * scale


@njit(cache=True, error_model="numpy")
def chunk_starts(sizes, chunk):  # type: ignore[no-untyped-def]
    """``(len(sizes)+1,)``: prefix sums of ``ceil(size / chunk)``, to cut work into chunks."""
    starts = np.zeros(sizes.shape[0] + 1, dtype=np.int64)
    for i in range(sizes.shape[0]):
        starts[i + 1] = starts[i] + (sizes[i] + chunk - 1) // chunk
    return starts


@njit(cache=True, error_model="numpy")
def which_chunk(starts, c):  # type: ignore[no-untyped-def]
    """The item whose chunks include global chunk ``c`` (the last ``i`` with
    ``starts[i] <= c``), by bisection."""
    lo, hi = 0, starts.shape[0] - 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if starts[mid] <= c:
            lo = mid
        else:
            hi = mid
    return lo
