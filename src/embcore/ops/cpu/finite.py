"""Which of a step's activation gradients hold a NaN or an Inf, in one threaded pass.

The engine checks every gradient before any table is written (``non_finite_gradients``).
``x - x`` is ``0`` for a finite ``x`` and NaN for NaN and +-inf, and NaN compares unequal to
everything, so ``(x - x) != 0`` flags exactly the non-finite elements. OR-ing the flags is an
integer reduction, which the compiler vectorizes (a float sum would have to keep its order),
read straight from the tensors' memory. Tensors are dealt to the workers round robin.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from embcore._numba.address import f32_vector

__all__ = ["non_finite_flags"]


@njit(cache=True, nogil=True, error_model="numpy")
def non_finite_flags(tensors, flags, worker, workers):  # type: ignore[no-untyped-def]
    """``flags[i] = 1`` if tensor ``i`` holds a NaN or an Inf, else 0, for ``i = worker,
    worker + workers, ...``.

    Args:
        tensors: ``(n, 4) int64``: address, rows, columns, row stride (in floats) of each
            ``float32`` tensor, seen as rows of contiguous columns.
    """
    for i in range(worker, tensors.shape[0], workers):
        address, rows, cols, stride = tensors[i, 0], tensors[i, 1], tensors[i, 2], tensors[i, 3]
        bad = False
        for r in range(rows):
            x = f32_vector(address + 4 * stride * r, cols)
            for j in range(cols):
                bad |= (x[j] - x[j]) != np.float32(0.0)
        flags[i] = 1 if bad else 0
