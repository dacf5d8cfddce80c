"""Adagrad-with-momentum's row rule (docs/semantics.md §3.5)::

acc <- acc + g^2                          if beta2 == 1
acc <- beta2 * acc + (1 - beta2) * g^2    otherwise
s   <- g * (acc + epsilon)^(-1/exponent)
m   <- momentum * m + s
w   <- w - lr * (momentum * m + s if use_nesterov else m)
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
    accumulators, momenta,  # (vocab, dim) float32
    momentum, beta2, one_minus_beta2, epsilon, neg_inv_exponent,
    PLAIN_SUM: tl.constexpr, NESTEROV: tl.constexpr, POWER: tl.constexpr,
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
        acc = acc + g * g if PLAIN_SUM else beta2 * acc + one_minus_beta2 * g * g
        scaled = g * power(acc + epsilon, neg_inv_exponent, POWER)
        m = momentum * tl.load(momenta + offs, mask=mask, other=0.0) + scaled
        w = w - lr * (momentum * m + scaled) if NESTEROV else w - lr * m
        tl.store(accumulators + offs, acc, mask=mask)
        tl.store(momenta + offs, m, mask=mask)
        finish(table, offs, mask, w, w_min, w_max, seed, CLIP_W, STORAGE, STOCHASTIC)


def update(state: TableState, plan: RowPlan, grad: Tensor, lr: float, step: int) -> None:
    """One Adagrad-momentum step on the table's unique rows (in place)."""
    opt = state.optimizer
    p = -1.0 / opt.exponent
    launch(
        _kernel,
        state,
        plan,
        grad,
        lr,
        step,
        {"accumulators": state.slots["accumulators"], "momenta": state.slots["momenta"]},
        momentum=opt.momentum,
        beta2=opt.beta2,
        one_minus_beta2=1 - opt.beta2,
        epsilon=opt.epsilon,
        neg_inv_exponent=p,
        PLAIN_SUM=opt.beta2 == 1,
        NESTEROV=opt.use_nesterov,
        POWER=power_mode(p),
    )
