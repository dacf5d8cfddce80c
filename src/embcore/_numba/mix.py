"""``mix64``: SplitMix64's finalizer, the 64-bit hash the key index, the dynamic tables'
initializer and the keyed-record digests are built on (inlined into their kernels)."""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["mix64"]

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_C1 = np.uint64(0xBF58476D1CE4E5B9)
_C2 = np.uint64(0x94D049BB133111EB)
_S30 = np.uint64(30)
_S27 = np.uint64(27)
_S31 = np.uint64(31)


@njit(cache=True, inline="always")
def mix64(x):  # type: ignore[no-untyped-def]
    """SplitMix64's finalizer of ``x + golden``: a bijection of uint64 with full avalanche."""
    z = x + _GOLDEN
    z = (z ^ (z >> _S30)) * _C1
    z = (z ^ (z >> _S27)) * _C2
    return z ^ (z >> _S31)
