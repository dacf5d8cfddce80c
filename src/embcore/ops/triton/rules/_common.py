"""What every rule kernel shares: finding its row, the common transforms, and the launch.

``Optimizer.apply`` (optimizers/base.py) is: gradient clip -> weight decay -> rule -> weight
clip. A rule kernel runs, in one program per unique row (lazy) or per table row (non-lazy)::

    row, active, first, stop = locate(...)      # its row and its run of sorted ids
    if active:
        offs, mask, g, w = begin(...)           # summed (split runs combined), clipped g;
                                                # float32 w after decay
        ... the optimizer's own rule on w and its slots (float32) ...
        finish(table, offs, mask, w, ...)       # clip w, store in the storage dtype

Rows no id touched are never written by lazy kernels. Hyperparameters travel as float32
scalars (as ``float * float32 tensor`` does in PyTorch); products of hyperparameters such as
``1 - beta`` are formed in double on the host first, as the reference does. Kernels are
launched with ``enable_fp_fusion=False`` so ``w - lr * g`` rounds twice, as in PyTorch, instead
of being contracted into one fused multiply-add.
"""

from __future__ import annotations

import math
import zlib
from typing import Any

import torch
import triton
import triton.language as tl
from torch import Tensor
from triton.language.extra import libdevice

from embcore.ops.state import TableState
from embcore.ops.triton import launch as launcher
from embcore.ops.triton.backward import RowPlan, partial_sums, row_gradient, row_heads, run_head
from embcore.ops.triton.storage import STORAGE_CODES, load_row, store_row
from embcore.optimizers.base import Optimizer

__all__ = ["begin", "finish", "launch", "locate", "power", "power_mode"]


@triton.jit
def locate(sorted_ids, ends, heads, LAZY: tl.constexpr):
    """``(row, active, first, stop)`` of this program: its table row, whether it updates it,
    and the sorted positions ``[first, stop)`` of the row's ids (empty for an untouched row).

    Lazy: program ``p`` is sorted position ``p`` and is active at the head of a run.
    Non-lazy: program ``r`` is table row ``r`` and is always active."""
    pid = tl.program_id(0).to(tl.int64)
    if LAZY:
        row, active = run_head(sorted_ids, pid)
        first = pid
        stop = tl.load(ends + pid)
    else:
        row = pid
        head = tl.load(heads + pid)
        active = head >= 0
        first = tl.maximum(head, 0)
        stop = tl.load(ends + first, mask=active, other=0)
        stop = tl.where(active, stop, first)
        active = pid >= 0  # every row moves
    return row, active, first, stop


@triton.jit
def begin(
    table,
    grad,
    order,
    bags,
    gains,
    partials,
    row,
    first,
    stop,
    dim,
    g_min,
    g_max,
    decay,
    CLIP_G: tl.constexpr,
    DECAY: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_L: tl.constexpr,
    SPLIT: tl.constexpr,
):
    """``(offs, mask, g, w)`` of a row before its rule: the element offsets of the row, the
    dim mask, the summed gradient clipped to ``[g_min, g_max]`` and the float32 row after
    ``w <- w - decay * w``, all ``(BLOCK_D,)``."""
    cols = tl.arange(0, BLOCK_D)
    mask = cols < dim
    offs = row * dim + cols
    g = row_gradient(
        grad, order, bags, gains, partials, first, stop, cols, mask, dim, BLOCK_L, SPLIT
    )
    w = load_row(table, offs, mask)
    if CLIP_G:
        g = tl.minimum(tl.maximum(g, g_min), g_max)
    if DECAY:
        w = w - decay * w
    return offs, mask, g, w


@triton.jit
def finish(
    table,
    offs,
    mask,
    w,
    w_min,
    w_max,
    seed,
    CLIP_W: tl.constexpr,
    STORAGE: tl.constexpr,
    STOCHASTIC: tl.constexpr,
):
    """After the rule: clip the row to ``[w_min, w_max]`` and store it in the table's dtype."""
    if CLIP_W:
        w = tl.minimum(tl.maximum(w, w_min), w_max)
    store_row(table, offs, mask, w, seed, STORAGE, STOCHASTIC)


@triton.jit
def power(x, p, MODE: tl.constexpr):
    """``x ** p`` element-wise: MODE 0 ``sqrt(x)`` (p = 0.5), 1 ``1 / sqrt(x)`` (p = -0.5),
    2 libdevice ``pow`` (GPU), 3 ``exp2(p * log2(x))`` (the interpreter, which has no
    libdevice; ``x = 0`` gives ``0 ** p`` without taking ``log2(0)``)."""
    if MODE == 0:
        y = tl.sqrt_rn(x)
    elif MODE == 1:
        y = tl.div_rn(1.0, tl.sqrt_rn(x))
    elif MODE == 2:
        y = libdevice.pow(x, p)
    else:
        positive = x > 0
        y = tl.exp2(p * tl.log2(tl.where(positive, x, 1.0)))
        zero_pow = tl.where(p > 0, 0.0, tl.where(p < 0, float("inf"), 1.0))
        y = tl.where(positive, y, zero_pow)
    return y


def power_mode(p: float) -> int:
    """The :func:`power` MODE for exponent ``p`` on this Triton runtime."""
    if p == 0.5:
        return 0
    if p == -0.5:
        return 1
    return 3 if triton.knobs.runtime.interpret else 2


def _seed(name: str, step: int) -> int:
    """The stochastic-rounding seed of a table at a step (reproducible across runs)."""
    return (zlib.crc32(name.encode()) * 1_000_003 + step) % (2**31 - 1)


def _common(optimizer: Optimizer, lr: float) -> dict[str, Any]:
    g_min, g_max = optimizer.clipvalue or (None, None)
    decay = 0.0
    if optimizer.weight_decay_factor:
        scale = lr if optimizer.multiply_weight_decay_factor_by_learning_rate else 1.0
        decay = optimizer.weight_decay_factor * scale
    w_min, w_max = optimizer.clip_weight_min, optimizer.clip_weight_max
    return {
        "g_min": -math.inf if g_min is None else g_min,
        "g_max": math.inf if g_max is None else g_max,
        "decay": decay,
        "w_min": -math.inf if w_min is None else w_min,
        "w_max": math.inf if w_max is None else w_max,
        "CLIP_G": optimizer.clipvalue is not None,
        "DECAY": decay != 0.0,
        "CLIP_W": w_min is not None or w_max is not None,
    }


def launch(
    kernel: Any,
    state: TableState,
    plan: RowPlan,
    grad: Tensor,
    lr: float,
    step: int,
    slots: dict[str, Tensor],
    **rule_args: Any,
) -> None:
    """Run a rule kernel over one table's unique rows (or every row, non-lazy).

    Args:
        kernel: the rule's ``@triton.jit`` kernel; it takes the arguments built here by name.
        state: the table; its weight and ``slots`` are updated in place.
        plan: the table's :class:`~embcore.ops.triton.backward.RowPlan`.
        grad: ``(S, dim) float32`` the table's activation gradients, bag after bag.
        lr, step: this step's rate and 1-based update count.
        slots: kernel argument name -> slot tensor.
        rule_args: the rule's own hyperparameters and constexprs.
    """
    optimizer = state.optimizer
    vocab, dim = state.weight.shape
    lazy = optimizer.lazy
    programs = plan.num_ids if lazy else vocab
    if programs == 0:
        return
    heads = plan.sorted_ids if lazy else row_heads(plan, vocab)
    launcher.run(
        kernel,
        programs,
        table=state.weight,
        grad=grad,
        sorted_ids=plan.sorted_ids,
        order=plan.order,
        ends=plan.ends,
        gains=plan.gains,
        bags=plan.bags,
        partials=partial_sums(plan, grad),
        heads=heads,
        dim=dim,
        lr=lr,
        seed=_seed(state.name, step),
        LAZY=lazy,
        STORAGE=STORAGE_CODES[state.weight.dtype],
        STOCHASTIC=state.stochastic_rounding and state.weight.dtype != torch.float32,
        BLOCK_D=plan.block_d,
        BLOCK_L=plan.block_l,
        SPLIT=plan.split,
        num_warps=plan.num_warps,
        enable_fp_fusion=False,
        **slots,
        **_common(optimizer, lr),
        **rule_args,
    )
