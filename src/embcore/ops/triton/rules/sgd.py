"""SGD's row rule: ``w <- w - lr * g``. No slots."""

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
        w = w - lr * g
        finish(table, offs, mask, w, w_min, w_max, seed, CLIP_W, STORAGE, STOCHASTIC)


def update(state: TableState, plan: RowPlan, grad: Tensor, lr: float, step: int) -> None:
    """One SGD step on the table's unique rows (in place)."""
    launch(_kernel, state, plan, grad, lr, step, {})
