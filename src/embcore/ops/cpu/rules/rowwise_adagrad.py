"""Row-wise Adagrad's row rule, one accumulator per row::

acc <- acc + mean_j(g_j^2)
w   <- w - lr * g / (sqrt(acc) + epsilon)
"""

from __future__ import annotations

import numpy as np
from numba import njit

from embcore.ops.cpu._address import claim
from embcore.ops.cpu.dedup import table_gradients
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
from embcore.optimizers import RowwiseAdagrad

__all__ = ["fused", "hyperparameters", "update"]


def hyperparameters(optimizer: RowwiseAdagrad, lr: float, step: int) -> list[float]:
    return [lr, optimizer.epsilon]


@njit(cache=True, error_model="numpy", fastmath={"reassoc"})
def _sum_of_squares(g):  # type: ignore[no-untyped-def]
    """``sum(g ** 2)``, reassociated so that it vectorises (a sequential float32 sum would be
    a chain of dependent adds); the reference's ``mean`` sums in its own order too."""
    total = np.float32(0.0)
    for d in range(g.shape[0]):
        total += g[d] * g[d]
    return total


@njit(cache=True, inline="always", error_model="numpy")
def _rows(tables, plan, hp, common, t, first, stop):  # type: ignore[no-untyped-def]
    """The rule on unique rows ``first:stop`` of table ``t``."""
    tab, com, lr, eps = tables[t], common[t], hp[t, 0], hp[t, 1]
    rows, grads = touched(tables, plan, t)
    w, accumulators = weights(tab), slot(tab, 0)
    dim = np.float32(grads.shape[1])
    for u in range(first, stop):
        prefetch_ahead(tab, rows, u, stop)
        r = rows[u]
        row, g = w[r], grads[u]
        begin_row(row, g, com)
        acc = accumulators[r, 0] + _sum_of_squares(g) / dim
        accumulators[r, 0] = acc
        denom = np.sqrt(acc) + eps
        for d in range(g.shape[0]):
            row[d] = row[d] - lr * g[d] / denom
        end_row(row, com)


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
        _rows(tables, plan, hp, common, t, first, stop)


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
            _rows(tables, plan, hp, common, t, 0, plan[2][t])
