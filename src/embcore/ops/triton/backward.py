"""The update's gradient side: find each table's unique rows and sum their gradients.

Per table, with ``N`` ids in ``B`` bags (all the table's features, :mod:`.jagged`)::

    gains, bags = bag_gains(batch)          (N,) float32, (N,) int64   one program per bag
    order       = argsort(values, stable)   (N,)  ids sorted, equal ids keep input order
    ends[p]     = end of the run of equal sorted ids that position p is in

A rule kernel (:mod:`.rules`) then runs one program per sorted position ``p``; the program at
the head of a run (``p == 0`` or ``sorted[p-1] != sorted[p]``) owns that unique row and sums::

    g[row, :] = sum_{p <= q < ends[p]} gains[order[q]] * grad[bags[order[q]], :]

with :func:`row_gradient`, then applies the optimizer to the row in the same program. The
other programs exit at once. Nothing here waits for the device: the number of unique rows is
never needed on the host. Non-lazy optimizers (Adam) run one program per table row instead and
find their run through ``heads`` (:func:`row_heads`).

Long runs (a Zipf head id seen thousands of times) are split so that no program sums more than
``SPLIT`` positions: the sorted positions are cut into blocks of ``SPLIT``; a first launch
(:func:`partial_sums`) sums, for each block that starts inside a run (not at its head), the
part of that run within the block; the head program sums its own block's part and adds the
partial sums of the blocks its run covers, in block order, so the result is deterministic::

    g[row] = sum(run in the head's block) + partials[b1] + partials[b1 + 1] + ... + partials[bk]
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor

from embcore.ops.triton import launch
from embcore.ops.triton.forward import bag_scale, block_sizes
from embcore.ops.triton.jagged import TableBatch

__all__ = [
    "RowPlan",
    "partial_sums",
    "row_gradient",
    "row_heads",
    "row_plan",
    "run_gradient",
    "run_head",
    "split_length",
]


@dataclass(frozen=True)
class RowPlan:
    """What the rule kernels need to find and sum each unique row's gradient.

    Attributes:
        sorted_ids: ``(N,) int64`` the table's ids, sorted.
        order: ``(N,) int64`` position in the table batch of each sorted id.
        ends: ``(N,) int64`` one past the last position of each position's run.
        gains: ``(N,) float32`` weight times combiner scale of each id (batch order).
        bags: ``(N,) int64`` the bag (gradient row) of each id (batch order).
        block_d, block_l, num_warps: launch shape for the table's dim.
        split: the most sorted positions one program sums (:func:`split_length`).
    """

    sorted_ids: Tensor
    order: Tensor
    ends: Tensor
    gains: Tensor
    bags: Tensor
    block_d: int
    block_l: int
    num_warps: int
    split: int

    @property
    def num_ids(self) -> int:
        return self.sorted_ids.numel()


@triton.jit
def _bag_gains_kernel(
    offsets,  # (S+1,) int64
    weights,  # (N,) float32, unused without HAS_WEIGHTS
    modes,  # (S,) int8, unused unless COMBINER < 0
    gains,  # (N,) float32 out
    bags,  # (N,) int64 out
    COMBINER: tl.constexpr,
    HAS_WEIGHTS: tl.constexpr,
    BLOCK_L: tl.constexpr,
):
    bag = tl.program_id(0).to(tl.int64)
    start = tl.load(offsets + bag)
    end = tl.load(offsets + bag + 1)
    mode = tl.load(modes + bag).to(tl.int32) if COMBINER < 0 else COMBINER
    scale = bag_scale(weights, start, end, mode, HAS_WEIGHTS, BLOCK_L)
    for j in range(start, end, BLOCK_L):
        idx = j + tl.arange(0, BLOCK_L)
        in_bag = idx < end
        w = tl.load(weights + idx, mask=in_bag, other=0.0) if HAS_WEIGHTS else in_bag.to(tl.float32)
        tl.store(gains + idx, w * scale, mask=in_bag)
        tl.store(bags + idx, tl.zeros([BLOCK_L], dtype=tl.int64) + bag, mask=in_bag)


def row_plan(batch: TableBatch, dim: int) -> RowPlan:
    """Sort one table's ids and compute each id's gain and bag (no host synchronization)."""
    n, device = batch.num_ids, batch.values.device
    block_d, block_l, warps = block_sizes(dim, n / max(1, batch.num_bags))
    gains = torch.empty(n, dtype=torch.float32, device=device)
    bags = torch.empty(n, dtype=torch.int64, device=device)
    if n > 0:
        launch.run(
            _bag_gains_kernel,
            batch.num_bags,
            offsets=batch.offsets,
            weights=batch.values if batch.weights is None else batch.weights,
            modes=batch.offsets if batch.modes is None else batch.modes,
            gains=gains,
            bags=bags,
            COMBINER=batch.combiner,
            HAS_WEIGHTS=batch.weights is not None,
            BLOCK_L=block_l,
        )
    # stable: a run lists its occurrences in batch order, the reference's summation order
    sorted_ids, order = torch.sort(batch.values, stable=True)
    ends = torch.searchsorted(sorted_ids, sorted_ids, right=True)
    split = split_length(block_l)
    return RowPlan(sorted_ids, order, ends, gains, bags, block_d, block_l, warps, split)


def split_length(block_l: int) -> int:
    """The most sorted positions one program sums: 16 tiles of ``block_l`` ids, at least 64."""
    return max(64, 16 * block_l)


def row_heads(plan: RowPlan, vocab: int) -> Tensor:
    """``(vocab,) int64``: for each table row, the first sorted position of its run, or -1
    when no id touched it (for kernels that visit every row)."""
    device = plan.sorted_ids.device
    heads = torch.full((vocab,), -1, dtype=torch.int64, device=device)
    starts = torch.searchsorted(plan.sorted_ids, plan.sorted_ids, right=False)
    heads.scatter_(0, plan.sorted_ids, starts)  # duplicates write the same value
    return heads


@triton.jit
def run_head(sorted_ids, p):
    """``(row, is_head)`` of sorted position ``p``: its id, and whether ``p`` starts a run."""
    row = tl.load(sorted_ids + p)
    before = tl.load(sorted_ids + tl.maximum(p - 1, 0))
    return row, (p == 0) | (before != row)


@triton.jit
def run_gradient(grad, order, bags, gains, first, stop, cols, col_mask, dim, BLOCK_L: tl.constexpr):
    """``(BLOCK_D,) float32``: the summed gradient of the run ``[first, stop)`` of sorted
    positions, ``sum_q gains[order[q]] * grad[bags[order[q]], cols]`` (0 for an empty run)."""
    g = tl.zeros(cols.shape, dtype=tl.float32)
    for q in range(first, stop, BLOCK_L):
        idx = q + tl.arange(0, BLOCK_L)
        in_run = idx < stop
        occ = tl.load(order + idx, mask=in_run, other=0)
        bag = tl.load(bags + occ, mask=in_run, other=0)
        gain = tl.load(gains + occ, mask=in_run, other=0.0)
        mask = in_run[:, None] & col_mask[None, :]
        rows = tl.load(grad + bag[:, None] * dim + cols[None, :], mask=mask, other=0.0)
        g += tl.sum(rows * gain[:, None], axis=0)
    return g


@triton.jit
def _partials_kernel(
    grad,  # (S, dim) float32
    sorted_ids,
    order,
    ends,
    gains,
    bags,
    partials,  # (blocks, dim) float32 out, written only for blocks that start inside a run
    dim,
    BLOCK_D: tl.constexpr,
    BLOCK_L: tl.constexpr,
    SPLIT: tl.constexpr,
):
    block = tl.program_id(0).to(tl.int64)
    p = block * SPLIT
    _, head = run_head(sorted_ids, p)
    if not head:
        stop = tl.minimum(tl.load(ends + p), p + SPLIT)
        cols = tl.arange(0, BLOCK_D)
        col_mask = cols < dim
        g = run_gradient(grad, order, bags, gains, p, stop, cols, col_mask, dim, BLOCK_L)
        tl.store(partials + block * dim + cols, g, mask=col_mask)


def partial_sums(plan: RowPlan, grad: Tensor) -> Tensor:
    """``(blocks, dim) float32``: per block of ``plan.split`` sorted positions that starts
    inside a run, the run's summed gradient within the block (other rows are not written).
    One launch when the ids span more than one block; a 1-row placeholder otherwise."""
    dim, n = grad.shape[1], plan.num_ids
    blocks = -(-n // plan.split)
    partials = torch.empty(max(1, blocks), dim, dtype=torch.float32, device=grad.device)
    if blocks > 1:
        launch.run(
            _partials_kernel,
            blocks,
            grad=grad,
            sorted_ids=plan.sorted_ids,
            order=plan.order,
            ends=plan.ends,
            gains=plan.gains,
            bags=plan.bags,
            partials=partials,
            dim=dim,
            BLOCK_D=plan.block_d,
            BLOCK_L=plan.block_l,
            SPLIT=plan.split,
            num_warps=plan.num_warps,
        )
    return partials


@triton.jit
def row_gradient(
    grad, order, bags, gains, partials, first, stop, cols, col_mask, dim,
    BLOCK_L: tl.constexpr, SPLIT: tl.constexpr,
):  # fmt: skip
    """``(BLOCK_D,) float32``: the summed gradient of the run ``[first, stop)``: its part in
    the head's block of ``SPLIT`` positions, then the partial sums of the blocks that start
    inside the run, in order (:func:`partial_sums`)."""
    own_stop = tl.minimum(stop, (first // SPLIT + 1) * SPLIT)
    g = run_gradient(grad, order, bags, gains, first, own_stop, cols, col_mask, dim, BLOCK_L)
    for block in range(first // SPLIT + 1, (stop + SPLIT - 1) // SPLIT):
        g += tl.load(partials + block * dim + cols, mask=col_mask, other=0.0)
    return g
