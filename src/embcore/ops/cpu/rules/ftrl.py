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

from embcore.ops.cpu._address import claim
from embcore.ops.cpu.rules._rows import (
    begin_row,
    chunk_rows,
    end_row,
    prefetch_ahead,
    row_chunks,
    slot,
    touched,
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
        tab, com = tables[t], common[t]
        lr, p, limit, beta, quad_extra = hp[t, 0], hp[t, 1], hp[t, 2], hp[t, 3], hp[t, 4]
        multiply = hp[t, 5] != 0
        rows, grads = touched(tables, plan, t)
        w, accumulators, linears = weights(tab), slot(tab, 0), slot(tab, 1)
        for u in range(first, stop):
            prefetch_ahead(tab, rows, u, stop)
            r = rows[u]
            row, acc, lin, g = w[r], accumulators[r], linears[r], grads[u]
            begin_row(row, g, com)
            for d in range(g.shape[0]):
                acc_new = acc[d] + g[d] * g[d]
                grown = _power(acc_new, p) - _power(acc[d], p)
                if multiply:
                    ln = lin[d] + lr * g[d] - grown * row[d]
                    quad = _power(acc_new, p) + beta + quad_extra
                else:
                    ln = lin[d] + g[d] - grown / lr * row[d]
                    quad = (_power(acc_new, p) + beta) / lr + quad_extra
                lin[d], acc[d] = ln, acc_new
                numer = min(max(ln, -limit), limit) - ln
                # 0 where |lin| <= limit, also when quad is 0 (zero accumulator and gradient)
                row[d] = numer / quad if numer != 0 else np.float32(0.0)
            end_row(row, com)
