"""Adagrad's row rule (docs/semantics.md §3.3)::

acc <- acc + g^2
w   <- w - lr * g / sqrt(acc)
"""

from __future__ import annotations

import numpy as np
from numba import njit

from embcore._numba.address import claim
from embcore.ops.cpu.dedup import table_gradients
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
from embcore.optimizers import Adagrad

__all__ = ["fused", "hyperparameters", "update"]


def hyperparameters(optimizer: Adagrad, lr: float, step: int) -> list[float]:
    return [lr]


@njit(cache=True, nogil=True, error_model="numpy")
def _rows(rows, grads, w, accumulators, lay, com, lr, first, stop):  # type: ignore[no-untyped-def]
    """The rule on unique rows ``first:stop``: ``rows[u]`` is row ``u``'s index in ``w``
    and ``accumulators``, ``grads[u]`` its summed gradient."""
    for u in range(first, stop):
        if u + PREFETCH_ROWS < rows.shape[0]:
            prefetch_state(lay, rows[u + PREFETCH_ROWS])
        r = rows[u]
        for d in range(grads.shape[1]):
            g = clip_gradient(grads[u, d], com)
            a = accumulators[r, d] + g * g
            accumulators[r, d] = a
            w[r, d] = clip_weight(decayed(w[r, d], com) - lr * g / np.sqrt(a), com)


@njit(cache=True, inline="always", error_model="numpy")
def _table(tables, plan, hp, common, t, first, stop):  # type: ignore[no-untyped-def]
    """The rule on unique rows ``first:stop`` of table ``t``."""
    rows, grads = touched(tables, plan, t)
    lay, com, lr = layout(tables, t), transforms(common, t), hp[t, 0]
    _rows(rows, grads, weights(tables, t), slot(tables, t, 0), lay, com, lr, first, stop)


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
        _table(tables, plan, hp, common, t, first, stop)


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
            _table(tables, plan, hp, common, t, 0, plan[2][t])
