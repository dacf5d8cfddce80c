"""Adagrad's row rule (docs/semantics.md §3.3)::

acc <- acc + g^2
w   <- w - lr * g / sqrt(acc)
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
from embcore.optimizers import Adagrad

__all__ = ["fused", "hyperparameters", "update"]


def hyperparameters(optimizer: Adagrad, lr: float, step: int) -> list[float]:
    return [lr]


@njit(cache=True, inline="always", error_model="numpy")
def _rows(tables, plan, hp, common, t, first, stop):  # type: ignore[no-untyped-def]
    """The rule on unique rows ``first:stop`` of table ``t``."""
    tab, com, lr = tables[t], common[t], hp[t, 0]
    rows, grads = touched(tables, plan, t)
    w, accumulators = weights(tab), slot(tab, 0)
    for u in range(first, stop):
        prefetch_ahead(tab, rows, u, stop)
        r = rows[u]
        row, acc, g = w[r], accumulators[r], grads[u]
        begin_row(row, g, com)
        for d in range(g.shape[0]):
            a = acc[d] + g[d] * g[d]
            acc[d] = a
            row[d] = row[d] - lr * g[d] / np.sqrt(a)
        end_row(row, com)


@njit(cache=True, nogil=True, error_model="numpy")
def update(tables, plan, hp, common, active, worker, workers):  # type: ignore[no-untyped-def]
    """One Adagrad step on this worker's share of the unique rows of ``plan``."""
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
    """Dedup and Adagrad, table by table (claimed in ``order``); the rule of a table with
    ``fuse[t]`` runs right after its dedup, while its summed gradients are in cache. The
    caller has checked every id first."""
    counter = plan[5]
    while True:
        k = claim(counter)
        if k >= order.shape[0]:
            break
        t = order[k]
        table_gradients(tables, features, first, plan, t)
        if fuse[t]:
            _rows(tables, plan, hp, common, t, 0, plan[2][t])
