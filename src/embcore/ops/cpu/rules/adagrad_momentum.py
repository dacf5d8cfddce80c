"""AdagradMomentum's row rule (docs/semantics.md §3.4)::

acc <- acc + g^2  (beta2 == 1)   or   beta2 * acc + (1 - beta2) * g^2
s   <- g * (acc + epsilon)^(-1/exponent)
m   <- momentum * m + s
w   <- w - lr * (momentum * m + s if use_nesterov else m)
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
from embcore.optimizers import AdagradMomentum

__all__ = ["hyperparameters", "update"]


def hyperparameters(optimizer: AdagradMomentum, lr: float, step: int) -> list[float]:
    return [
        lr,
        optimizer.momentum,
        float(optimizer.use_nesterov),
        -1.0 / optimizer.exponent,
        optimizer.beta2,
        1.0 - optimizer.beta2,
        optimizer.epsilon,
    ]


@njit(cache=True, nogil=True, error_model="numpy")
def update(tables, plan, hp, common, active, worker, workers):  # type: ignore[no-untyped-def]
    """One AdagradMomentum step on this worker's share of the unique rows of ``plan``."""
    count = plan[2]
    starts = row_chunks(count, active)
    counter = plan[5]
    while True:
        c = claim(counter)
        if c >= starts[-1]:
            break
        t, first, stop = chunk_rows(starts, c, count)
        tab, com = tables[t], common[t]
        lr, momentum, nesterov, power = hp[t, 0], hp[t, 1], hp[t, 2] != 0, hp[t, 3]
        beta2, one_minus_beta2, eps = hp[t, 4], hp[t, 5], hp[t, 6]
        rows, grads = touched(tables, plan, t)
        w, accumulators, momenta = weights(tab), slot(tab, 0), slot(tab, 1)
        for u in range(first, stop):
            prefetch_ahead(tab, rows, u, stop)
            r = rows[u]
            row, acc, mom, g = w[r], accumulators[r], momenta[r], grads[u]
            begin_row(row, g, com)
            for d in range(g.shape[0]):
                if beta2 == 1:
                    a = acc[d] + g[d] * g[d]
                else:
                    a = beta2 * acc[d] + one_minus_beta2 * g[d] * g[d]
                acc[d] = a
                if power == -0.5:
                    scaled = g[d] * (np.float32(1.0) / np.sqrt(a + eps))
                else:
                    scaled = g[d] * (a + eps) ** power
                m = momentum * mom[d] + scaled
                mom[d] = m
                row[d] = row[d] - lr * (momentum * m + scaled if nesterov else m)
            end_row(row, com)
