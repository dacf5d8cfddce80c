"""Row-wise Adagrad's row rule, one accumulator per row::

acc <- acc + mean_j(g_j^2)
w   <- w - lr * g / (sqrt(acc) + epsilon)
"""

from __future__ import annotations

import numpy as np
from numba import njit

from embcore._numba.address import claim, f32_vector
from embcore.ops.cpu.dedup import table_gradients
from embcore.ops.cpu.layout import T_DIM
from embcore.ops.cpu.occurrences import listed_rows
from embcore.ops.cpu.rules._rows import (
    PREFETCH_ROWS,
    ROWS_PER_CHUNK,
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
from embcore.optimizers import RowwiseAdagrad

__all__ = ["fused", "hyperparameters", "update", "update_listed"]

#: rows ``PREFETCH_ROWS`` ahead are prefetched into the second-level cache only, rows this
#: many ahead into every level: prefetching all of them into the first level held more
#: misses than a core keeps in flight (rows of dim 128: the rule took 1.5x as long)
PREFETCH_NEAR = 6


def hyperparameters(optimizer: RowwiseAdagrad, lr: float, step: int) -> list[float]:
    return [lr, optimizer.epsilon]


@njit(cache=True, error_model="numpy", fastmath={"reassoc"})
def _sum_of_squares(address, dim):  # type: ignore[no-untyped-def]
    """``sum(g ** 2)`` of the ``dim`` floats at ``address``, reassociated so that it
    vectorises (a sequential float32 sum would be a chain of dependent adds); the
    reference's ``mean`` sums in its own order too."""
    g = f32_vector(address, dim)
    total = np.float32(0.0)
    for d in range(dim):
        total += g[d] * g[d]
    return total


@njit(cache=True, nogil=True, error_model="numpy")
def _rows(rows, grads, w, accumulators, lay, com, lr, eps, first, stop):  # type: ignore[no-untyped-def]
    """The rule on unique rows ``first:stop``: ``rows[u]`` is row ``u``'s index in ``w``
    and ``accumulators``, ``grads[u]`` its summed gradient (clipped in place)."""
    dim = grads.shape[1]
    for u in range(first, stop):
        if u + PREFETCH_ROWS < rows.shape[0]:
            prefetch_state(lay, rows[u + PREFETCH_ROWS], True)
        if u + PREFETCH_NEAR < rows.shape[0]:
            prefetch_state(lay, rows[u + PREFETCH_NEAR])
        r = rows[u]
        for d in range(dim):
            grads[u, d] = clip_gradient(grads[u, d], com)
        address = grads.ctypes.data + 4 * dim * u
        acc = accumulators[r, 0] + _sum_of_squares(address, dim) / np.float32(dim)
        accumulators[r, 0] = acc
        denom = np.sqrt(acc) + eps
        for d in range(dim):
            w[r, d] = clip_weight(decayed(w[r, d], com) - lr * grads[u, d] / denom, com)


@njit(cache=True, inline="always", error_model="numpy")
def _table(tables, plan, hp, common, t, first, stop):  # type: ignore[no-untyped-def]
    """The rule on unique rows ``first:stop`` of table ``t``."""
    rows, grads = touched(tables, plan, t)
    lay, com, lr, eps = layout(tables, t), transforms(common, t), hp[t, 0], hp[t, 1]
    _rows(rows, grads, weights(tables, t), slot(tables, t, 0), lay, com, lr, eps, first, stop)


@njit(cache=True, nogil=True, error_model="numpy")
def update(tables, plan, hp, common, active, worker, workers):  # type: ignore[no-untyped-def]
    """One row-wise Adagrad step on this worker's share of the unique rows of ``plan``."""
    count = plan[2]
    starts = row_chunks(count, active)
    counter = plan[5]
    while True:
        c = claim(counter)
        if c >= starts[-1]:
            break
        t, first, stop = chunk_rows(starts, c, count)
        _table(tables, plan, hp, common, t, first, stop)


@njit(cache=True, nogil=True, error_model="numpy")
def fused(tables, features, first, plan, order, fuse, hp, common, worker, workers):  # type: ignore[no-untyped-def]
    """Dedup and row-wise Adagrad, table by table (claimed in ``order``); the rule of a
    table with ``fuse[t]`` runs right after its dedup, while its summed gradients are in
    cache. The caller has checked every id first."""
    counter = plan[5]
    while True:
        k = claim(counter)
        if k >= order.shape[0]:
            break
        t = order[k]
        table_gradients(tables, features, first, plan, t)
        if fuse[t]:
            _table(tables, plan, hp, common, t, 0, plan[2][t])


@njit(cache=True, nogil=True, error_model="numpy")
def update_listed(tables, plan, occ, hp, common, active, worker, workers):  # type: ignore[no-untyped-def]
    """:func:`update` for tables deduplicated into occurrence lists
    (:mod:`embcore.ops.cpu.occurrences`): each chunk's rows are summed into a scratch block
    that stays in cache, then updated."""
    count = plan[2]
    starts = row_chunks(count, active)
    counter = plan[5]
    scratch = np.empty(ROWS_PER_CHUNK * max(1, (tables[:, T_DIM] * active).max()), np.float32)
    while True:
        c = claim(counter)
        if c >= starts[-1]:
            break
        t, first, stop = chunk_rows(starts, c, count)
        rows, grads = listed_rows(tables, plan, occ, scratch.ctypes.data, t, first, stop)
        lay, com, lr, eps = layout(tables, t), transforms(common, t), hp[t, 0], hp[t, 1]
        w, acc = weights(tables, t), slot(tables, t, 0)
        _rows(rows, grads, w, acc, lay, com, lr, eps, 0, stop - first)
