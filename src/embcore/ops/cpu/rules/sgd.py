"""SGD's row rule: ``w <- w - lr * g`` (docs/semantics.md §3.2)."""

from __future__ import annotations

from numba import njit

from embcore.ops.cpu._address import claim
from embcore.ops.cpu.rules._rows import (
    begin_row,
    chunk_rows,
    end_row,
    prefetch_ahead,
    row_chunks,
    touched,
    weights,
)
from embcore.optimizers import SGD

__all__ = ["hyperparameters", "update"]


def hyperparameters(optimizer: SGD, lr: float, step: int) -> list[float]:
    return [lr]


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
        tab, com, lr = tables[t], common[t], hp[t, 0]
        rows, grads = touched(tables, plan, t)
        w = weights(tab)
        for u in range(first, stop):
            prefetch_ahead(tab, rows, u, stop)
            row, g = w[rows[u]], grads[u]
            begin_row(row, g, com)
            for d in range(g.shape[0]):
                row[d] = row[d] - lr * g[d]
            end_row(row, com)
