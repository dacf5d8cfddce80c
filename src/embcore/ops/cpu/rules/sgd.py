"""SGD's row rule: ``w <- w - lr * g`` (docs/semantics.md §3.2)."""

from __future__ import annotations

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
    touched,
    transforms,
    weights,
)
from embcore.optimizers import SGD

__all__ = ["hyperparameters", "update"]


def hyperparameters(optimizer: SGD, lr: float, step: int) -> list[float]:
    return [lr]


@njit(cache=True, nogil=True, error_model="numpy")
def _rows(rows, grads, w, lay, com, lr, first, stop):  # type: ignore[no-untyped-def]
    """The rule on unique rows ``first:stop``: ``rows[u]`` is row ``u``'s index in ``w``,
    ``grads[u]`` its summed gradient."""
    for u in range(first, stop):
        if u + PREFETCH_ROWS < rows.shape[0]:
            prefetch_state(lay, rows[u + PREFETCH_ROWS])
        r = rows[u]
        for d in range(grads.shape[1]):
            g = clip_gradient(grads[u, d], com)
            w[r, d] = clip_weight(decayed(w[r, d], com) - lr * g, com)


@njit(cache=True, nogil=True, error_model="numpy")
def update(tables, plan, hp, common, active, worker, workers):  # type: ignore[no-untyped-def]
    """One SGD step on this worker's share of the unique rows of ``plan``."""
    count = plan[2]
    starts = row_chunks(count, active)
    counter = plan[5]
    while True:
        c = claim(counter)
        if c >= starts[-1]:
            break
        t, first, stop = chunk_rows(starts, c, count)
        rows, grads = touched(tables, plan, t)
        lay, com = layout(tables, t), transforms(common, t)
        _rows(rows, grads, weights(tables, t), lay, com, hp[t, 0], first, stop)
