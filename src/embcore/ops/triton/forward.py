"""Pooled (and sequence) forward lookups: one launch per table, one program per bag.

For bag ``s`` with ids ``j`` in ``[offsets[s], offsets[s+1])`` (docs/semantics.md §2.1)::

    out[s, :] = sum_j gain_j * table[values[j], :]      gain_j = w_j * scale(s)
    scale(s)  = 1 | 1 / sum_j w_j | 1 / sqrt(sum_j w_j^2)   for sum | mean | sqrtn (0 if 0)

A program first sums the bag's weights (only for mean / sqrtn), then walks the bag
``BLOCK_L`` ids at a time, loading a ``(BLOCK_L, BLOCK_D)`` tile of rows (``BLOCK_D`` = the
dim rounded up to a power of two, the tail masked) so several rows are in flight at once, and
accumulates in float32 whatever the storage dtype. Sequence features are bags of one id.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from embcore.ops.triton import launch
from embcore.ops.triton.jagged import TableBatch
from embcore.ops.triton.storage import load_row

__all__ = ["bag_scale", "block_sizes", "pooled_lookup"]


def block_sizes(dim: int, ids_per_bag: float) -> tuple[int, int, int]:
    """``(BLOCK_D, BLOCK_L, num_warps)`` for rows of ``dim`` and bags of about
    ``ids_per_bag`` ids: a tile of at most 4096 elements, wide enough for the row."""
    block_d = max(16, triton.next_power_of_2(dim))
    per_tile = max(2, 4096 // block_d)
    block_l = min(per_tile, max(2, triton.next_power_of_2(max(1, round(ids_per_bag)))))
    tile = block_d * block_l
    num_warps = 1 if tile <= 256 else 2 if tile <= 1024 else 4
    return block_d, block_l, num_warps


@triton.jit
def bag_scale(weights, start, end, mode, HAS_WEIGHTS: tl.constexpr, BLOCK_L: tl.constexpr):
    """The combiner scale of the bag ``[start, end)``: 1 (sum, ``mode`` 0), 1/sum(w) (mean, 1)
    or 1/sqrt(sum(w^2)) (sqrtn, 2); 0 when the denominator is 0 (an empty bag). ``mode`` is a
    constexpr or a runtime value; every branch yields float32, so both compile."""
    if HAS_WEIGHTS:
        acc = tl.zeros([BLOCK_L], dtype=tl.float32)
        if mode != 0:
            for j in range(start, end, BLOCK_L):
                idx = j + tl.arange(0, BLOCK_L)
                w = tl.load(weights + idx, mask=idx < end, other=0.0)
                acc += tl.where(mode == 1, w, w * w)
        denom = tl.sum(acc, axis=0)
    else:
        denom = (end - start).to(tl.float32)
    denom = tl.where(mode == 2, tl.sqrt_rn(tl.abs(denom)), denom)  # sqrtn: denom >= 0
    empty = denom == 0.0
    scale = tl.where(empty, 0.0, tl.div_rn(1.0, tl.where(empty, 1.0, denom)))
    return tl.where(mode == 0, 1.0, scale)


@triton.jit
def _pooled_kernel(
    table,  # (vocab, dim) float32 / float16 / bfloat16
    values,  # (N,) int64
    offsets,  # (S+1,) int64
    weights,  # (N,) float32, unused without HAS_WEIGHTS
    modes,  # (S,) int8, unused unless COMBINER < 0
    out,  # (S, dim) float32
    dim,
    COMBINER: tl.constexpr,
    HAS_WEIGHTS: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_L: tl.constexpr,
):
    bag = tl.program_id(0).to(tl.int64)
    start = tl.load(offsets + bag)
    end = tl.load(offsets + bag + 1)
    mode = tl.load(modes + bag).to(tl.int32) if COMBINER < 0 else COMBINER
    scale = bag_scale(weights, start, end, mode, HAS_WEIGHTS, BLOCK_L)
    cols = tl.arange(0, BLOCK_D)
    col_mask = cols < dim
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for j in range(start, end, BLOCK_L):
        idx = j + tl.arange(0, BLOCK_L)
        in_bag = idx < end
        ids = tl.load(values + idx, mask=in_bag, other=0)
        w = tl.load(weights + idx, mask=in_bag, other=0.0) if HAS_WEIGHTS else in_bag.to(tl.float32)
        gain = w * scale
        mask = in_bag[:, None] & col_mask[None, :]
        rows = load_row(table, ids[:, None] * dim + cols[None, :], mask)  # (BLOCK_L, BLOCK_D)
        acc += tl.sum(rows * gain[:, None], axis=0)
    tl.store(out + bag * dim + cols, acc, mask=col_mask)


def pooled_lookup(table: Tensor, batch: TableBatch) -> list[Tensor]:
    """Every feature's pooled activations of one table, in one launch.

    Args:
        table: ``(vocab, dim)`` float32, float16 or bfloat16, contiguous.
        batch: the table's features (:func:`embcore.ops.triton.jagged.table_batch`).

    Returns:
        One ``(S_f, dim) float32`` activation per feature (views of one buffer).
    """
    dim = table.shape[1]
    out = torch.empty(batch.num_bags, dim, dtype=torch.float32, device=table.device)
    if batch.num_bags > 0:
        block_d, block_l, warps = block_sizes(dim, batch.num_ids / batch.num_bags)
        launch.run(
            _pooled_kernel,
            batch.num_bags,
            table=table,
            values=batch.values,
            offsets=batch.offsets,
            weights=batch.values if batch.weights is None else batch.weights,
            modes=batch.offsets if batch.modes is None else batch.modes,
            out=out,
            dim=dim,
            COMBINER=batch.combiner,
            HAS_WEIGHTS=batch.weights is not None,
            BLOCK_D=block_d,
            BLOCK_L=block_l,
            num_warps=warps,
        )
    return list(torch.split(out, list(batch.splits)))
