"""FTRL-Proximal's row rule, both of TensorFlow's forms (docs/semantics.md §3.7).

With ``p = -power``::

    acc_new = acc + g^2
    lin    <- lin + g - (acc_new^p - acc^p) / lr * w                    (standard)
    w      <- (clamp(lin, -l1, l1) - lin) / ((acc_new^p + beta) / lr + 2 * l2)

    lin    <- lin + lr * g - (acc_new^p - acc^p) * w                    (multiply_linear_...)
    w      <- (clamp(lin, -lr * l1, lr * l1) - lin) / (acc_new^p + beta + 2 * lr * l2)

``w = 0`` wherever the clamp leaves ``lin`` unchanged, even when the denominator is 0.
"""

from __future__ import annotations

import triton
import triton.language as tl
from torch import Tensor

from embcore.ops.state import TableState
from embcore.ops.triton.backward import RowPlan
from embcore.ops.triton.rules._common import begin, finish, launch, locate, power, power_mode

__all__ = ["update"]


@triton.jit(do_not_specialize=["seed"])
def _kernel(
    table, grad, sorted_ids, order, ends, gains, bags, partials, heads, dim, lr, seed,
    g_min, g_max, decay, w_min, w_max,
    accumulators, linears,  # (vocab, dim) float32
    p, limit, beta, quad_extra,
    MULTIPLY: tl.constexpr, POWER: tl.constexpr,
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
        acc = tl.load(accumulators + offs, mask=mask, other=1.0)
        lin = tl.load(linears + offs, mask=mask, other=0.0)
        acc_new = acc + g * g
        acc_pow_new = power(acc_new, p, POWER)
        grown = acc_pow_new - power(acc, p, POWER)
        if MULTIPLY:
            lin = lin + lr * g - grown * w
            quad = acc_pow_new + beta + quad_extra
        else:
            lin = lin + g - tl.div_rn(grown, lr) * w
            quad = tl.div_rn(acc_pow_new + beta, lr) + quad_extra
        numer = tl.minimum(tl.maximum(lin, -limit), limit) - lin
        keep = numer == 0.0  # |lin| <= limit, also when quad is 0 (0 / 0 would be NaN)
        w = tl.where(keep, 0.0, tl.div_rn(numer, tl.where(keep, 1.0, quad)))
        tl.store(accumulators + offs, acc_new, mask=mask)
        tl.store(linears + offs, lin, mask=mask)
        finish(table, offs, mask, w, w_min, w_max, seed, CLIP_W, STORAGE, STOCHASTIC)


def update(state: TableState, plan: RowPlan, grad: Tensor, lr: float, step: int) -> None:
    """One FTRL step on the table's unique rows (in place)."""
    opt = state.optimizer
    l1, l2 = opt.l1_regularization_strength, opt.l2_regularization_strength
    multiply = opt.multiply_linear_by_learning_rate
    p = -opt.learning_rate_power
    launch(
        _kernel,
        state,
        plan,
        grad,
        lr,
        step,
        {"accumulators": state.slots["accumulators"], "linears": state.slots["linears"]},
        p=p,
        limit=lr * l1 if multiply else l1,
        beta=opt.beta,
        quad_extra=2 * lr * l2 if multiply else 2 * l2,
        MULTIPLY=multiply,
        POWER=power_mode(p),
    )
