"""The reference backend: plain PyTorch, written to be read, and the yardstick of every kernel.

Forward (docs/semantics.md §2.3): ``activation[s] = sum_j gain_j * table[id_j]`` over the ids
of sample ``s``, with ``gain_j = w_j * scale(s)`` and ``scale`` 1 for sum, ``1/sum(w)`` for
mean and ``1/sqrt(sum(w^2))`` for sqrtn (0 when the denominator is 0).

Update (docs/semantics.md §3.1, §7): every occurrence of a row, over all features of the table,
adds ``gain_j * dL/dactivation[s]`` to that row's gradient; then the optimizer runs once per
touched row (every row for non-lazy optimizers). Rows nobody touched are not written.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from embcore.inputs import FeatureBatch
from embcore.ops._math import gains
from embcore.ops.state import TableState

__all__ = [
    "LOOKUP_WRITES_OUT",
    "NAME",
    "STORAGE_DTYPES",
    "UPDATE_CHECKS_FINITE",
    "gains",
    "lookup",
    "lookup_table",
    "non_finite",
    "update",
    "update_table",
]

NAME = "reference"
STORAGE_DTYPES = (torch.float32,)
#: ``lookup`` returns fresh activations (the dispatch copies them into ``out=``)
LOOKUP_WRITES_OUT = False
#: ``update`` takes no ``check_finite=``: the dispatch checks with ``non_finite`` first
UPDATE_CHECKS_FINITE = False


def non_finite(tensors: Sequence[Tensor]) -> list[bool]:
    """For each tensor, whether it holds a NaN or an Inf (``aminmax`` propagates both)."""
    flags = []
    for t in tensors:
        if t.numel() == 0:
            flags.append(False)
            continue
        lo, hi = torch.aminmax(t)
        flags.append(not (math.isfinite(float(lo)) and math.isfinite(float(hi))))
    return flags


def lookup_table(state: TableState, features: Sequence[FeatureBatch]) -> list[Tensor]:
    """Pooled lookups of every feature of one table.

    Returns:
        One ``(S_f, dim) float32`` activation per feature.
    """
    out = []
    for batch in features:
        rows = state.weight[batch.values]  # (N, dim)
        act = torch.zeros(
            batch.num_samples, state.weight.shape[1], dtype=torch.float32, device=rows.device
        )
        act.index_add_(0, batch.segments(), rows * gains(batch)[:, None])
        out.append(act)
    return out


def update_table(
    state: TableState,
    features: Sequence[FeatureBatch],
    grads: Sequence[Tensor],
    lr: float,
    step: int,
) -> None:
    """Sum per-row gradients over every feature of the table, then update each row once.

    Args:
        state: the table, updated in place.
        features: the table's features of this step.
        grads: one ``(S_f, dim) float32`` activation gradient per feature.
        lr: this step's learning rate.
        step: 1-based count of updates of this table, this one included.
    """
    optimizer = state.optimizer
    if optimizer is None:
        raise RuntimeError(f"table '{state.name}' has no optimizer and cannot be updated")
    vocab, dim = state.weight.shape
    ids = torch.cat([b.values for b in features])
    contrib = torch.cat(
        [g[b.segments()] * gains(b)[:, None] for b, g in zip(features, grads, strict=True)]
    )  # (N_total, dim)
    if optimizer.lazy:
        rows, inverse = torch.unique(ids, return_inverse=True)
        if rows.numel() == 0:
            return
        grad = torch.zeros(rows.numel(), dim, dtype=torch.float32, device=ids.device)
        grad.index_add_(0, inverse, contrib)
    else:  # every row is updated; untouched rows see a zero gradient (non-lazy Adam)
        rows = torch.arange(vocab, device=ids.device)
        grad = torch.zeros(vocab, dim, dtype=torch.float32, device=ids.device)
        grad.index_add_(0, ids, contrib)
    slot_rows = {name: s[rows] for name, s in state.slots.items()}
    new_rows, new_slots = optimizer.apply(state.weight[rows], slot_rows, grad, lr, step)
    state.weight[rows] = new_rows
    for name, value in new_slots.items():
        state.slots[name][rows] = value


def lookup(
    states: Sequence[TableState], features: Sequence[Sequence[FeatureBatch]]
) -> list[list[Tensor]]:
    """Every table's lookups: for table ``t``, one activation per feature in ``features[t]``."""
    return [lookup_table(s, f) for s, f in zip(states, features, strict=True)]


def update(
    states: Sequence[TableState],
    features: Sequence[Sequence[FeatureBatch]],
    grads: Sequence[Sequence[Tensor]],
    lrs: Sequence[float],
    step: int,
) -> None:
    """One update of every table, as :func:`update_table`."""
    for s, f, g, lr in zip(states, features, grads, lrs, strict=True):
        update_table(s, f, g, lr, step)
