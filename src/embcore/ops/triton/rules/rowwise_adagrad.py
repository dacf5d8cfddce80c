"""Row-wise Adagrad's row rule: one accumulator per row (docs/semantics.md §3.4)::

acc[r] <- acc[r] + mean_j(g[r, j]^2)
w[r]   <- w[r] - lr * g[r] / (sqrt(acc[r]) + epsilon)
"""

from __future__ import annotations

import triton
import triton.language as tl
from torch import Tensor

from embcore.ops.state import TableState
from embcore.ops.triton.backward import RowPlan
from embcore.ops.triton.rules._common import begin, finish, launch, locate

__all__ = ["update"]


@triton.jit(do_not_specialize=["seed"])
def _kernel(
    table, grad, sorted_ids, order, ends, gains, bags, partials, heads, dim, lr, seed,
    g_min, g_max, decay, w_min, w_max,
    accumulators,  # (vocab,) float32
    epsilon, width,  # width: float(dim)
    LAZY: tl.constexpr, STORAGE: tl.constexpr, STOCHASTIC: tl.constexpr,
    CLIP_G: tl.constexpr, DECAY: tl.constexpr, CLIP_W: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_L: tl.constexpr, SPLIT: tl.constexpr,
):  # fmt: skip
    row, active, first, stop = locate(sorted_ids, ends, heads, LAZY)
    if active:
        offs, mask, g, w = begin(
            table, grad, order, bags, gains, partials, row, first, stop, dim, g_min, g_max,
            decay, CLIP_G, DECAY, BLOCK_D, BLOCK_L, SPLIT,
        )  # fmt: skip
        mean_sq = tl.div_rn(tl.sum(g * g, axis=0), width)  # masked lanes hold 0
        acc = tl.load(accumulators + row) + mean_sq
        denom = tl.sqrt_rn(acc) + epsilon
        w = w - tl.div_rn(lr * g, denom)
        tl.store(accumulators + row, acc)
        finish(table, offs, mask, w, w_min, w_max, seed, CLIP_W, STORAGE, STOCHASTIC)


def update(state: TableState, plan: RowPlan, grad: Tensor, lr: float, step: int) -> None:
    """One row-wise Adagrad step on the table's unique rows (in place)."""
    slots = {"accumulators": state.slots["accumulators"]}
    epsilon, width = state.optimizer.epsilon, float(state.weight.shape[1])
    launch(_kernel, state, plan, grad, lr, step, slots, epsilon=epsilon, width=width)
