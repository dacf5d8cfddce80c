"""What every optimizer kernel shares: work splitting, row views, and the common transforms.

``Optimizer.apply`` (optimizers/base.py) is: gradient clip -> weight decay -> rule -> weight
clip. The kernels of :mod:`embcore.ops.cpu.rules` do the same per row, calling
:func:`begin_row` and :func:`end_row` around their own rule. ``common`` holds one row per
table::

    common[t] = [grad_min, grad_max, decay, weight_min, weight_max]     float32, +-inf = none

``plan`` is what :func:`embcore.ops.cpu.dedup.unique_gradients` filled:
``(base, unique, count, offset, gradients, counter)``; ``counter`` is the ``(1,) int64``
work counter the workers of a call claim chunks from (:func:`.._address.claim`).

Per-row helpers are inlined into the kernels (``inline="always"``) and take arrays already
sliced per table: a call per row with whole-step arrays would cost more than the row's math.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from numba import njit

from embcore.ops.cpu._address import f32_matrix, prefetch
from embcore.ops.cpu.combine import chunk_starts, which_chunk
from embcore.ops.cpu.layout import (
    T_DIM,
    T_SLOT0,
    T_SLOT1,
    T_VOCAB,
    T_WEIGHT,
    T_WIDTH0,
    T_WIDTH1,
)
from embcore.optimizers.base import Optimizer

__all__ = [
    "ROWS_PER_CHUNK",
    "begin_row",
    "chunk_rows",
    "common_row",
    "end_row",
    "float32_rows",
    "prefetch_ahead",
    "row_chunks",
    "slot",
    "touched",
    "weights",
]

#: unique rows per unit of parallel work
ROWS_PER_CHUNK = 64
#: how many unique rows ahead their weights and slots are prefetched
PREFETCH_ROWS = 6

G_MIN, G_MAX, DECAY, W_MIN, W_MAX = range(5)


def common_row(optimizer: Optimizer, lr: float) -> list[float]:
    """The table's ``common`` row for this step's learning rate ``lr``."""
    g_min, g_max = optimizer.clipvalue or (None, None)
    decay = 0.0
    if optimizer.weight_decay_factor:
        scale = lr if optimizer.multiply_weight_decay_factor_by_learning_rate else 1.0
        decay = optimizer.weight_decay_factor * scale
    w_min, w_max = optimizer.clip_weight_min, optimizer.clip_weight_max
    return [
        -math.inf if g_min is None else g_min,
        math.inf if g_max is None else g_max,
        decay,
        -math.inf if w_min is None else w_min,
        math.inf if w_max is None else w_max,
    ]


def float32_rows(rows: Sequence[Sequence[float]], width: int) -> np.ndarray:
    """``(len(rows), width) float32``, for ``common`` and rule hyperparameters."""
    out = np.zeros((len(rows), max(width, 1)), dtype=np.float32)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


@njit(cache=True, error_model="numpy")
def row_chunks(sizes, active):  # type: ignore[no-untyped-def]
    """Chunk prefix sums over ``sizes[t]`` rows of the tables with ``active[t]``."""
    return chunk_starts(sizes * active, ROWS_PER_CHUNK)


@njit(cache=True, error_model="numpy")
def chunk_rows(starts, c, sizes):  # type: ignore[no-untyped-def]
    """``(table, first, stop)``: the rows of chunk ``c``."""
    t = which_chunk(starts, c)
    first = (c - starts[t]) * ROWS_PER_CHUNK
    return t, first, min(first + ROWS_PER_CHUNK, sizes[t])


@njit(cache=True, error_model="numpy")
def touched(tables, plan, t):  # type: ignore[no-untyped-def]
    """Table ``t``'s unique rows ``(count,) int64`` and their gradients ``(count, dim)``."""
    base, unique, count, offset, gradients = plan[0], plan[1], plan[2], plan[3], plan[4]
    n = count[t]
    grads = f32_matrix(gradients.ctypes.data + 4 * offset[t], n, tables[t, T_DIM])
    return unique[base[t] : base[t] + n], grads


@njit(cache=True, error_model="numpy")
def weights(tab):  # type: ignore[no-untyped-def]
    """The table's ``(vocab, dim)`` weights."""
    return f32_matrix(tab[T_WEIGHT], tab[T_VOCAB], tab[T_DIM])


@njit(cache=True, error_model="numpy")
def slot(tab, k):  # type: ignore[no-untyped-def]
    """The table's slot ``k`` as ``(vocab, width)``; width 1 for a row-wise slot."""
    return f32_matrix(tab[T_SLOT0 + 2 * k], tab[T_VOCAB], tab[T_WIDTH0 + 2 * k])


@njit(cache=True, inline="always", error_model="numpy")
def prefetch_ahead(tab, rows, u, stop):  # type: ignore[no-untyped-def]
    """Prefetch the weights and slots of unique row ``u + PREFETCH_ROWS`` (if ``< stop``):
    random rows are latency bound, and this keeps several misses in flight."""
    if u + PREFETCH_ROWS < stop:
        r = rows[u + PREFETCH_ROWS]
        dim_bytes = tab[T_DIM] * 4
        for offset in range(0, dim_bytes, 64):
            prefetch(tab[T_WEIGHT] + r * dim_bytes + offset)
        if tab[T_SLOT0] != 0:
            width = tab[T_WIDTH0] * 4
            for offset in range(0, width, 64):
                prefetch(tab[T_SLOT0] + r * width + offset)
        if tab[T_SLOT1] != 0:
            width = tab[T_WIDTH1] * 4
            for offset in range(0, width, 64):
                prefetch(tab[T_SLOT1] + r * width + offset)


@njit(cache=True, inline="always", error_model="numpy")
def _clamp(v, lo, hi):  # type: ignore[no-untyped-def]
    if lo != -np.inf or hi != np.inf:
        for d in range(v.shape[0]):
            v[d] = min(max(v[d], lo), hi)


@njit(cache=True, inline="always", error_model="numpy")
def begin_row(row, g, com):  # type: ignore[no-untyped-def]
    """Before the rule: clip the gradient, then ``w <- w - decay * w``."""
    _clamp(g, com[G_MIN], com[G_MAX])
    decay = com[DECAY]
    if decay != 0:
        for d in range(row.shape[0]):
            row[d] = row[d] - decay * row[d]


@njit(cache=True, inline="always", error_model="numpy")
def end_row(row, com):  # type: ignore[no-untyped-def]
    """After the rule: clip the weights."""
    _clamp(row, com[W_MIN], com[W_MAX])
