"""Numba kernel of the default initializer of dynamic tables (:mod:`embcore.dynamic.init`).

Value ``(key, column)`` of a new row is drawn from a counter-based stream: the key's hash,
salted by the seed and the table name, seeds a SplitMix64 sequence whose ``column``-th output
is a 53-bit uniform number, mapped onto a truncated normal by the inverse normal CDF. Each
value depends on nothing else, so rows are the same whatever the batch, order or threads.
See docs/dynamic_tables.md.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from embcore._numba.mix import mix64

__all__ = ["TAIL_BOUND", "draw_row", "normal_rows", "uniform53"]

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_S11 = np.uint64(11)
_A = (-3.969683028665376e01, 2.209460984245205e02, -2.759285104469687e02,
      1.383577518672690e02, -3.066479806614716e01, 2.506628277459239e00)  # fmt: skip
_B = (-5.447609879822406e01, 1.615858368580409e02, -1.556989798598866e02,
      6.680131188771972e01, -1.328068155288572e01)  # fmt: skip
_C = (-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e00,
      -2.549732539343734e00, 4.374664141464968e00, 2.938163982698783e00)  # fmt: skip
_D = (7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e00,
      3.754408661907416e00)  # fmt: skip
_P_LOW = 0.02425
#: every ``p`` beyond ``_P_LOW`` maps beyond this many standard deviations (the central
#: branch is -1.9727 at ``_P_LOW`` and monotone; tests/dynamic/test_batch.py checks it)
TAIL_BOUND = 1.97
_CHUNK = 64  # rows per hand-out to a thread


@njit(cache=True, inline="always")
def uniform53(h):  # type: ignore[no-untyped-def]
    """A uint64 hash as a float64 in (0, 1): its top 53 bits, centred in their interval."""
    return (np.float64(h >> _S11) + 0.5) * (1.0 / 9007199254740992.0)


@njit(cache=True, error_model="numpy")
def _ndtri(p):  # type: ignore[no-untyped-def]
    """The standard normal quantile of ``p`` in (0, 1): Acklam's rational approximation,
    relative error below 1.2e-9, far below a float32's resolution (6e-8) that the values are
    stored in (a refinement step on ``erfc`` would cost several times the whole draw)."""
    if p < _P_LOW or p > 1.0 - _P_LOW:
        q = math.sqrt(-2.0 * math.log(p if p < _P_LOW else 1.0 - p))
        x = (((((_C[0] * q + _C[1]) * q + _C[2]) * q + _C[3]) * q + _C[4]) * q + _C[5]) / (
            (((_D[0] * q + _D[1]) * q + _D[2]) * q + _D[3]) * q + 1.0
        )
        if p > 1.0 - _P_LOW:
            x = -x
    else:
        q = p - 0.5
        r = q * q
        x = (
            (((((_A[0] * r + _A[1]) * r + _A[2]) * r + _A[3]) * r + _A[4]) * r + _A[5])
            * q
            / (((((_B[0] * r + _B[1]) * r + _B[2]) * r + _B[3]) * r + _B[4]) * r + 1.0)
        )
    return x


@njit(cache=True, inline="always")
def _central(p):  # type: ignore[no-untyped-def]
    """:func:`_ndtri`'s central branch (``_P_LOW <= p <= 1 - _P_LOW``), the same operations
    in the same order, without a branch, so that a loop over a row's values vectorises."""
    q = p - 0.5
    r = q * q
    return (
        (((((_A[0] * r + _A[1]) * r + _A[2]) * r + _A[3]) * r + _A[4]) * r + _A[5])
        * q
        / (((((_B[0] * r + _B[1]) * r + _B[2]) * r + _B[3]) * r + _B[4]) * r + 1.0)
    )


@njit(cache=True, inline="always")
def _uniform_at(state, j, lo, width):  # type: ignore[no-untyped-def]
    """``lo + width * U`` for the ``j``-th output of the stream at ``state``."""
    return lo + width * uniform53(mix64(state + np.uint64(j) * _GOLDEN))


@njit(cache=True, inline="always", error_model="numpy")
def draw_row(out, i, key, salt, lo, width, std):  # type: ignore[no-untyped-def]
    """``out[i, :]`` = the default initial row of ``key``, bit for bit what
    :func:`normal_rows` draws: value ``j`` from the stream's ``j``-th state
    ``state + j * golden``, every value through the central branch first (a loop the
    compiler vectorises); then only values beyond ``TAIL_BOUND`` standard deviations are
    looked at again (a tail ``p``, beyond ``_P_LOW`` of either end, gives ``|x| > 1.9727``
    through either branch), and those whose ``p`` is in a tail drawn through :func:`_ndtri`."""
    row = out[i]
    state = mix64(mix64(np.uint64(key)) ^ salt)
    for j in range(row.size):
        row[j] = np.float32(std * _central(_uniform_at(state, j, lo, width)))
    limit = np.float32(TAIL_BOUND * std)
    beyond = 0
    for j in range(row.size):  # (a count, not a branch: this loop vectorises too)
        beyond += np.int64(abs(row[j]) > limit)
    if beyond == 0:
        return
    for j in range(row.size):
        if abs(row[j]) > limit:
            p = _uniform_at(state, j, lo, width)
            if p < _P_LOW or p > 1.0 - _P_LOW:
                row[j] = np.float32(std * _ndtri(p))


@njit(cache=True, nogil=True, error_model="numpy")
def normal_rows(keys, salt, lo, hi, std, out, worker, workers):  # type: ignore[no-untyped-def]
    """``out[i, j]`` = ``std * ndtri(lo + (hi - lo) * U(key_i, j))`` for rows
    ``worker::workers`` (in chunks), where ``U`` is the ``j``-th uniform of key ``i``'s stream."""
    dim = out.shape[1]
    width = hi - lo
    n = keys.size
    for start in range(worker * _CHUNK, n, workers * _CHUNK):
        for i in range(start, min(start + _CHUNK, n)):
            state = mix64(mix64(np.uint64(keys[i])) ^ salt)  # SplitMix64: state, state + g, ...
            for j in range(dim):
                out[i, j] = np.float32(std * _ndtri(lo + width * uniform53(mix64(state))))
                state += _GOLDEN
