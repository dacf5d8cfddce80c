"""FTRL-Proximal's row rule, both of TensorFlow's forms (docs/semantics.md §3.7).
With ``p = -power``::

    acc_new = acc + g^2
    lin    <- lin + g - (acc_new^p - acc^p) / lr * w                    (standard)
    w      <- (clamp(lin, -l1, l1) - lin) / ((acc_new^p + beta) / lr + 2 * l2)

    lin    <- lin + lr * g - (acc_new^p - acc^p) * w                    (multiply_linear_...)
    w      <- (clamp(lin, -lr * l1, lr * l1) - lin) / (acc_new^p + beta + 2 * lr * l2)

``w = 0`` wherever the clamp leaves ``lin`` unchanged, even when the denominator is 0.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from embcore._numba.address import claim
from embcore.ops.cpu.rules._rows import (
    PREFETCH_ROWS,
    chunk_rows,
    clip_gradient,
    clip_weight,
    decayed,
    layout,
    prefetch_state,
    row_chunks,
    slot,
    touched,
    transforms,
    weights,
)
from embcore.optimizers import FTRL

__all__ = ["hyperparameters", "update"]


def hyperparameters(optimizer: FTRL, lr: float, step: int) -> list[float]:
    l1, l2 = optimizer.l1_regularization_strength, optimizer.l2_regularization_strength
    if optimizer.multiply_linear_by_learning_rate:
        limit, quad_extra = lr * l1, 2 * lr * l2
    else:
        limit, quad_extra = l1, 2 * l2
    multiply = float(optimizer.multiply_linear_by_learning_rate)
    return [lr, -optimizer.learning_rate_power, limit, optimizer.beta, quad_extra, multiply]


@njit(cache=True, inline="always", error_model="numpy")
def _power(x, p):  # type: ignore[no-untyped-def]
    return np.sqrt(x) if p == 0.5 else x**p


@njit(cache=True, nogil=True, error_model="numpy")
def _rows(rows, grads, w, accumulators, linears, lay, com, params, first, stop):  # type: ignore[no-untyped-def]
    """The rule on unique rows ``first:stop``: ``rows[u]`` is row ``u``'s index in ``w``
    and the slots, ``grads[u]`` its summed gradient; ``params`` the table's ``hp`` row."""
    lr, p, limit, beta, quad_extra = params[0], params[1], params[2], params[3], params[4]
    multiply = params[5] != 0
    for u in range(first, stop):
        if u + PREFETCH_ROWS < rows.shape[0]:
            prefetch_state(lay, rows[u + PREFETCH_ROWS])
        r = rows[u]
        for d in range(grads.shape[1]):
            g = clip_gradient(grads[u, d], com)
            row = decayed(w[r, d], com)
            acc = accumulators[r, d]
            acc_new = acc + g * g
            grown = _power(acc_new, p) - _power(acc, p)
            if multiply:
                ln = linears[r, d] + lr * g - grown * row
                quad = _power(acc_new, p) + beta + quad_extra
            else:
                ln = linears[r, d] + g - grown / lr * row
                quad = (_power(acc_new, p) + beta) / lr + quad_extra
            linears[r, d], accumulators[r, d] = ln, acc_new
            numer = min(max(ln, -limit), limit) - ln
            # 0 where |lin| <= limit, also when quad is 0 (zero accumulator and gradient)
            row = numer / quad if numer != 0 else np.float32(0.0)
            w[r, d] = clip_weight(row, com)


@njit(cache=True, nogil=True, error_model="numpy")
def update(tables, plan, hp, common, active, worker, workers):  # type: ignore[no-untyped-def]
    """One FTRL step on this worker's share of the unique rows of ``plan``."""
    count = plan[2]
    starts = row_chunks(count, active)
    counter = plan[5]
    while True:
        c = claim(counter)
        if c >= starts[-1]:
            break
        t, first, stop = chunk_rows(starts, c, count)
        rows, grads = touched(tables, plan, t)
        lay, com, params = layout(tables, t), transforms(common, t), _params(hp, t)
        w, accumulators, linears = weights(tables, t), slot(tables, t, 0), slot(tables, t, 1)
        _rows(rows, grads, w, accumulators, linears, lay, com, params, first, stop)


@njit(cache=True, error_model="numpy")
def _params(hp, t):  # type: ignore[no-untyped-def]
    """Table ``t``'s six hyperparameters as a tuple of scalars."""
    return (hp[t, 0], hp[t, 1], hp[t, 2], hp[t, 3], hp[t, 4], hp[t, 5])
