"""AdagradMomentum's row rule (docs/semantics.md §3.4)::

acc <- acc + g^2  (beta2 == 1)   or   beta2 * acc + (1 - beta2) * g^2
s   <- g * (acc + epsilon)^(-1/exponent)
m   <- momentum * m + s
w   <- w - lr * (momentum * m + s if use_nesterov else m)
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
def _rows(rows, grads, w, accumulators, momenta, lay, com, params, first, stop):  # type: ignore[no-untyped-def]
    """The rule on unique rows ``first:stop``: ``rows[u]`` is row ``u``'s index in ``w``
    and the slots, ``grads[u]`` its summed gradient; ``params`` the table's ``hp`` row."""
    lr, momentum, nesterov, power = params[0], params[1], params[2] != 0, params[3]
    beta2, one_minus_beta2, eps = params[4], params[5], params[6]
    for u in range(first, stop):
        if u + PREFETCH_ROWS < rows.shape[0]:
            prefetch_state(lay, rows[u + PREFETCH_ROWS])
        r = rows[u]
        for d in range(grads.shape[1]):
            g = clip_gradient(grads[u, d], com)
            row = decayed(w[r, d], com)
            if beta2 == 1:
                a = accumulators[r, d] + g * g
            else:
                a = beta2 * accumulators[r, d] + one_minus_beta2 * g * g
            accumulators[r, d] = a
            if power == -0.5:
                scaled = g * (np.float32(1.0) / np.sqrt(a + eps))
            else:
                scaled = g * (a + eps) ** power
            m = momentum * momenta[r, d] + scaled
            momenta[r, d] = m
            row = row - lr * (momentum * m + scaled if nesterov else m)
            w[r, d] = clip_weight(row, com)


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
        rows, grads = touched(tables, plan, t)
        lay, com, params = layout(tables, t), transforms(common, t), _params(hp, t)
        w, accumulators, momenta = weights(tables, t), slot(tables, t, 0), slot(tables, t, 1)
        _rows(rows, grads, w, accumulators, momenta, lay, com, params, first, stop)


@njit(cache=True, error_model="numpy")
def _params(hp, t):  # type: ignore[no-untyped-def]
    """Table ``t``'s seven hyperparameters as a tuple of scalars."""
    return (hp[t, 0], hp[t, 1], hp[t, 2], hp[t, 3], hp[t, 4], hp[t, 5], hp[t, 6])
