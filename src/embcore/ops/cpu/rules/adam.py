"""Adam's row rule, no bias correction unless asked (docs/semantics.md §3.6)::

    m <- beta_1 * m + (1 - beta_1) * g
    v <- beta_2 * v + (1 - beta_2) * g^2
    w <- w - lr * m / sqrt(v + epsilon^2)     (sum_inside_sqrt)
    w <- w - lr * m / (sqrt(v) + epsilon)     (otherwise)

Lazy Adam updates the unique rows (:func:`update`); non-lazy Adam every row of the table, the
untouched ones with ``g = 0`` (:func:`update_all`), in place, with no ``(vocab, dim)``
temporary.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from embcore.ops.cpu._address import claim, i32_vector
from embcore.ops.cpu.layout import T_DIM, T_POSITIONS, T_VOCAB
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
from embcore.optimizers import Adam

__all__ = ["hyperparameters", "update", "update_all"]


def hyperparameters(optimizer: Adam, lr: float, step: int) -> list[float]:
    b1, b2, eps = optimizer.beta_1, optimizer.beta_2, optimizer.epsilon
    if optimizer.bias_correction:
        lr = lr * math.sqrt(1 - b2**step) / (1 - b1**step)
    inside = optimizer.sum_inside_sqrt
    return [lr, b1, 1.0 - b1, b2, 1.0 - b2, eps * eps if inside else eps, float(inside)]


@njit(cache=True, inline="always", error_model="numpy")
def _rule(row, m, v, g, hp):  # type: ignore[no-untyped-def]
    lr, b1, one_minus_b1, b2, one_minus_b2 = hp[0], hp[1], hp[2], hp[3], hp[4]
    eps, inside = hp[5], hp[6] != 0
    for d in range(row.shape[0]):
        md = b1 * m[d] + one_minus_b1 * g[d]
        vd = b2 * v[d] + one_minus_b2 * g[d] * g[d]
        m[d], v[d] = md, vd
        denom = np.sqrt(vd + eps) if inside else np.sqrt(vd) + eps
        row[d] = row[d] - lr * md / denom


@njit(cache=True, nogil=True, error_model="numpy")
def update(tables, plan, hp, common, active, worker, workers):  # type: ignore[no-untyped-def]
    """One lazy Adam step on this worker's share of the unique rows of ``plan``."""
    count = plan[2]
    starts = row_chunks(count, active)
    counter = plan[5]
    while True:
        c = claim(counter)
        if c >= starts[-1]:
            break
        t, first, stop = chunk_rows(starts, c, count)
        tab, com, params = tables[t], common[t], hp[t]
        rows, grads = touched(tables, plan, t)
        w, momenta, velocities = weights(tab), slot(tab, 0), slot(tab, 1)
        for u in range(first, stop):
            prefetch_ahead(tab, rows, u, stop)
            r = rows[u]
            row, g = w[r], grads[u]
            begin_row(row, g, com)
            _rule(row, momenta[r], velocities[r], g, params)
            end_row(row, com)


@njit(cache=True, nogil=True, error_model="numpy")
def update_all(tables, plan, hp, common, active, worker, workers):  # type: ignore[no-untyped-def]
    """One non-lazy Adam step on this worker's share of every row of the active tables
    (``g = 0`` where untouched)."""
    count, vocab = plan[2], tables[:, T_VOCAB]
    starts = row_chunks(vocab, active)
    counter = plan[5]
    while True:
        c = claim(counter)
        if c >= starts[-1]:
            break
        t, first, stop = chunk_rows(starts, c, vocab)
        tab, com, params = tables[t], common[t], hp[t]
        rows, grads = touched(tables, plan, t)
        w, momenta, velocities = weights(tab), slot(tab, 0), slot(tab, 1)
        pos = i32_vector(tab[T_POSITIONS], tab[T_VOCAB])
        zero = np.empty(tab[T_DIM], dtype=np.float32)
        for r in range(first, stop):
            u = pos[r]
            if 0 <= u < count[t] and rows[u] == r:
                g = grads[u]
            else:
                for d in range(zero.shape[0]):
                    zero[d] = 0.0  # begin_row clips it in place
                g = zero
            row = w[r]
            begin_row(row, g, com)
            _rule(row, momenta[r], velocities[r], g, params)
            end_row(row, com)
