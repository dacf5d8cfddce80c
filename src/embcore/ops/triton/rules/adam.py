"""Adam's row rule, no bias correction unless asked (docs/semantics.md §3.6)::

    m <- beta_1 * m + (1 - beta_1) * g
    v <- beta_2 * v + (1 - beta_2) * g^2
    w <- w - lr * m / sqrt(v + epsilon^2)     (sum_inside_sqrt)
    w <- w - lr * m / (sqrt(v) + epsilon)     (otherwise)

Lazy Adam runs one program per unique row; non-lazy Adam one per table row, the untouched ones
with ``g = 0`` (their moments decay and the weights keep moving), in place.
"""

from __future__ import annotations

import math

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
    momenta, velocities,  # (vocab, dim) float32
    beta_1, one_minus_beta_1, beta_2, one_minus_beta_2, epsilon,
    INSIDE: tl.constexpr,
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
        m = beta_1 * tl.load(momenta + offs, mask=mask, other=0.0) + one_minus_beta_1 * g
        v = beta_2 * tl.load(velocities + offs, mask=mask, other=0.0) + one_minus_beta_2 * g * g
        # with INSIDE, epsilon holds epsilon^2
        denom = tl.sqrt_rn(v + epsilon) if INSIDE else tl.sqrt_rn(v) + epsilon
        w = w - tl.div_rn(lr * m, denom)
        tl.store(momenta + offs, m, mask=mask)
        tl.store(velocities + offs, v, mask=mask)
        finish(table, offs, mask, w, w_min, w_max, seed, CLIP_W, STORAGE, STOCHASTIC)


def update(state: TableState, plan: RowPlan, grad: Tensor, lr: float, step: int) -> None:
    """One Adam step on the table's unique rows, or on every row when not lazy (in place)."""
    opt = state.optimizer
    b1, b2, eps = opt.beta_1, opt.beta_2, opt.epsilon
    if opt.bias_correction:
        lr = lr * math.sqrt(1 - b2**step) / (1 - b1**step)
    launch(
        _kernel,
        state,
        plan,
        grad,
        lr,
        step,
        {"momenta": state.slots["momenta"], "velocities": state.slots["velocities"]},
        beta_1=b1,
        one_minus_beta_1=1 - b1,
        beta_2=b2,
        one_minus_beta_2=1 - b2,
        epsilon=eps * eps if opt.sum_inside_sqrt else eps,
        INSIDE=opt.sum_inside_sqrt,
    )
