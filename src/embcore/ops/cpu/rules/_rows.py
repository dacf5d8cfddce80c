"""What every optimizer kernel shares: work splitting, table layouts, and the common transforms.

``Optimizer.apply`` (optimizers/base.py) is: gradient clip -> weight decay -> rule -> weight
clip. The kernels of :mod:`embcore.ops.cpu.rules` do the same per element, calling
:func:`clip_gradient`, :func:`decayed` and :func:`clip_weight` around their own rule.
``common`` holds one row per table::

    common[t] = [grad_min, grad_max, decay, weight_min, weight_max]     float32, +-inf = none

``plan`` is what :func:`embcore.ops.cpu.dedup.unique_gradients` filled:
``(base, unique, count, offset, gradients, counter)``; ``counter`` is the ``(1,) int64``
work counter the workers of a call claim chunks from (:func:`.._address.claim`).

Each rule's per-row loop is its own kernel, ``_rows``, called once per table (or chunk of
rows) with scalars, tuples of scalars and views made from raw addresses (no NumPy owner).
Nothing in it takes a view of an owned array: Numba would count references to such a view
around every inlined call, and those locked increments, one per row, serialise the row
stores (tests/ops/test_rule_codegen.py checks the compiled loops for them).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from numba import njit

from embcore._numba.address import f32_matrix, i64_vector, prefetch, prefetch_l2
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
    "PREFETCH_ROWS",
    "ROWS_PER_CHUNK",
    "chunk_rows",
    "clip_gradient",
    "clip_weight",
    "common_row",
    "decayed",
    "float32_rows",
    "layout",
    "prefetch_state",
    "row_chunks",
    "slot",
    "touched",
    "transforms",
    "weights",
]

#: unique rows per unit of parallel work
ROWS_PER_CHUNK = 64
#: how many unique rows ahead their weights and slots are prefetched (across chunk borders:
#: the table's next rows, which one worker usually takes next)
PREFETCH_ROWS = 16

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
    if rows and width > 0 and all(len(r) == width for r in rows):
        return np.array(rows, dtype=np.float32)  # one call (the usual case)
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
    base, count, offset = plan[0], plan[2], plan[3]
    n = count[t]
    rows = i64_vector(plan[1].ctypes.data + 8 * base[t], n)
    grads = f32_matrix(plan[4].ctypes.data + 4 * offset[t], n, tables[t, T_DIM])
    return rows, grads


@njit(cache=True, error_model="numpy")
def weights(tables, t):  # type: ignore[no-untyped-def]
    """Table ``t``'s ``(vocab, dim)`` weights."""
    return f32_matrix(tables[t, T_WEIGHT], tables[t, T_VOCAB], tables[t, T_DIM])


@njit(cache=True, error_model="numpy")
def slot(tables, t, k):  # type: ignore[no-untyped-def]
    """Table ``t``'s slot ``k`` as ``(vocab, width)``; width 1 for a row-wise slot."""
    return f32_matrix(tables[t, T_SLOT0 + 2 * k], tables[t, T_VOCAB], tables[t, T_WIDTH0 + 2 * k])


@njit(cache=True, error_model="numpy")
def layout(tables, t):  # type: ignore[no-untyped-def]
    """Table ``t``'s ``(weight address, row bytes, slot0 address, its row bytes, slot1
    address, its row bytes)``, for :func:`prefetch_state` (address 0: no such slot)."""
    return (
        tables[t, T_WEIGHT],
        4 * tables[t, T_DIM],
        tables[t, T_SLOT0],
        4 * tables[t, T_WIDTH0],
        tables[t, T_SLOT1],
        4 * tables[t, T_WIDTH1],
    )


@njit(cache=True, inline="always", error_model="numpy")
def _prefetch_line(address, far):  # type: ignore[no-untyped-def]
    if far:
        prefetch_l2(address)
    else:
        prefetch(address)


@njit(cache=True, inline="always", error_model="numpy")
def prefetch_state(lay, r, far=False):  # type: ignore[no-untyped-def]
    """Prefetch row ``r``'s weights and slots (``lay`` from :func:`layout`): random rows are
    latency bound, and prefetching ahead keeps several misses in flight. ``far``: into the
    second-level cache only (:func:`.address.prefetch_l2`), for a row further ahead."""
    weight, row_bytes, slot0, bytes0, slot1, bytes1 = lay
    for offset in range(0, row_bytes, 64):
        _prefetch_line(weight + r * row_bytes + offset, far)
    if slot0 != 0:
        for offset in range(0, bytes0, 64):
            _prefetch_line(slot0 + r * bytes0 + offset, far)
    if slot1 != 0:
        for offset in range(0, bytes1, 64):
            _prefetch_line(slot1 + r * bytes1 + offset, far)


@njit(cache=True, error_model="numpy")
def transforms(common, t):  # type: ignore[no-untyped-def]
    """``common[t]`` as a tuple of five float32 scalars."""
    return (
        common[t, G_MIN],
        common[t, G_MAX],
        common[t, DECAY],
        common[t, W_MIN],
        common[t, W_MAX],
    )


@njit(cache=True, inline="always", error_model="numpy")
def clip_gradient(g, com):  # type: ignore[no-untyped-def]
    """One gradient element, clipped to ``[grad_min, grad_max]`` (first of the transforms)."""
    lo, hi = com[G_MIN], com[G_MAX]
    if lo != -np.inf or hi != np.inf:
        return min(max(g, lo), hi)
    return g


@njit(cache=True, inline="always", error_model="numpy")
def decayed(w, com):  # type: ignore[no-untyped-def]
    """One weight after ``w <- w - decay * w`` (before the rule)."""
    decay = com[DECAY]
    if decay != 0:
        return w - decay * w
    return w


@njit(cache=True, inline="always", error_model="numpy")
def clip_weight(w, com):  # type: ignore[no-untyped-def]
    """One weight after the rule, clipped to ``[weight_min, weight_max]``."""
    lo, hi = com[W_MIN], com[W_MAX]
    if lo != -np.inf or hi != np.inf:
        return min(max(w, lo), hi)
    return w
