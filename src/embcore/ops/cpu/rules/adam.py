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

from embcore._numba.address import claim, i32_vector
from embcore.ops.cpu.layout import T_POSITIONS, T_VOCAB
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
from embcore.optimizers import Adam

__all__ = ["hyperparameters", "update", "update_all"]


def hyperparameters(optimizer: Adam, lr: float, step: int) -> list[float]:
    b1, b2, eps = optimizer.beta_1, optimizer.beta_2, optimizer.epsilon
    if optimizer.bias_correction:
        lr = lr * math.sqrt(1 - b2**step) / (1 - b1**step)
    inside = optimizer.sum_inside_sqrt
    return [lr, b1, 1.0 - b1, b2, 1.0 - b2, eps * eps if inside else eps, float(inside)]


@njit(cache=True, error_model="numpy")
def _params(hp, t):  # type: ignore[no-untyped-def]
    """Table ``t``'s seven hyperparameters as a tuple of scalars."""
    return (hp[t, 0], hp[t, 1], hp[t, 2], hp[t, 3], hp[t, 4], hp[t, 5], hp[t, 6])


@njit(cache=True, inline="always", error_model="numpy")
def _rule(w, m, v, g, com, params):  # type: ignore[no-untyped-def]
    """One element's ``(w, m, v)`` after the transforms and Adam's rule, for gradient ``g``."""
    lr, b1, one_minus_b1, b2, one_minus_b2 = params[0], params[1], params[2], params[3], params[4]
    eps, inside = params[5], params[6] != 0
    g = clip_gradient(g, com)
    m = b1 * m + one_minus_b1 * g
    v = b2 * v + one_minus_b2 * g * g
    denom = np.sqrt(v + eps) if inside else np.sqrt(v) + eps
    return clip_weight(decayed(w, com) - lr * m / denom, com), m, v


@njit(cache=True, nogil=True, error_model="numpy")
def _rows(rows, grads, w, m, v, lay, com, params, first, stop):  # type: ignore[no-untyped-def]
    """Lazy Adam on unique rows ``first:stop``: ``rows[u]`` is row ``u``'s index in ``w``
    and the slots, ``grads[u]`` its summed gradient; ``params`` the table's ``hp`` row."""
    for u in range(first, stop):
        if u + PREFETCH_ROWS < rows.shape[0]:
            prefetch_state(lay, rows[u + PREFETCH_ROWS])
        r = rows[u]
        for d in range(grads.shape[1]):
            w[r, d], m[r, d], v[r, d] = _rule(w[r, d], m[r, d], v[r, d], grads[u, d], com, params)


@njit(cache=True, nogil=True, error_model="numpy")
def _rows_all(rows, grads, pos, w, m, v, com, params, first, stop):  # type: ignore[no-untyped-def]
    """Non-lazy Adam on rows ``first:stop`` of the table (``g = 0`` where no id touched
    the row: ``pos`` is the dedup index, valid where it points back at the row)."""
    zero = np.float32(0.0)
    for r in range(first, stop):
        u = pos[r]
        hit = 0 <= u < rows.shape[0] and rows[u] == r
        for d in range(w.shape[1]):
            g = grads[u, d] if hit else zero
            w[r, d], m[r, d], v[r, d] = _rule(w[r, d], m[r, d], v[r, d], g, com, params)


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
        rows, grads = touched(tables, plan, t)
        lay, com, params = layout(tables, t), transforms(common, t), _params(hp, t)
        w, m, v = weights(tables, t), slot(tables, t, 0), slot(tables, t, 1)
        _rows(rows, grads, w, m, v, lay, com, params, first, stop)


@njit(cache=True, nogil=True, error_model="numpy")
def update_all(tables, plan, hp, common, active, worker, workers):  # type: ignore[no-untyped-def]
    """One non-lazy Adam step on this worker's share of every row of the active tables
    (``g = 0`` where untouched)."""
    vocab = tables[:, T_VOCAB]
    starts = row_chunks(vocab, active)
    counter = plan[5]
    while True:
        c = claim(counter)
        if c >= starts[-1]:
            break
        t, first, stop = chunk_rows(starts, c, vocab)
        rows, grads = touched(tables, plan, t)
        pos = i32_vector(tables[t, T_POSITIONS], tables[t, T_VOCAB])
        com, params = transforms(common, t), _params(hp, t)
        w, m, v = weights(tables, t), slot(tables, t, 0), slot(tables, t, 1)
        _rows_all(rows, grads, pos, w, m, v, com, params, first, stop)
