"""The Triton backend: fused GPU kernels for lookups and optimizer updates.

Forward (:mod:`.forward`): per table, one launch over all its features' bags (features
concatenated by :mod:`.jagged`), one program per bag, float32 accumulation.

Update: per table, the ids are sorted on the device and each id's gain and bag computed
(:mod:`.backward`); then one launch of the optimizer's kernel (:mod:`.rules`) runs one program
per unique row that sums the row's gradient and applies gradient clip, weight decay, the rule
and weight clip once, writing the row and its slots in place (runs longer than a few tiles are
split across programs and combined, :mod:`.backward`). Non-lazy Adam runs one program per
table row. Nothing waits for the device. :func:`non_finite` checks gradients on the device and
reads one flag buffer back (:mod:`.finite`).

Tables may be stored as float32, float16 or bfloat16 (:mod:`.storage`); activations,
gradients, slots and all optimizer math are float32. Results match
:mod:`embcore.ops.reference` to float32 rounding (the summation order within a bag or a row
differs); rows no id touched are never written.

Tensors must be on a CUDA device. With ``TRITON_INTERPRET=1`` set before this package is
imported, the same kernels run on CPU tensors in Triton's interpreter (slowly; for tests).
Ids are not range-checked here (that would synchronize); the engine validates them
(``embcore.inputs``). See docs/gpu_backend.md.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
from torch import Tensor

from embcore.inputs import FeatureBatch
from embcore.ops.state import TableState, check_updatable
from embcore.ops.triton import backward, forward, jagged, launch
from embcore.ops.triton.finite import non_finite
from embcore.ops.triton.rules import RULES
from embcore.ops.triton.storage import STORAGE_CODES

__all__ = [
    "LOOKUP_WRITES_OUT",
    "MAX_DIM",
    "NAME",
    "STORAGE_DTYPES",
    "UPDATE_CHECKS_FINITE",
    "lookup",
    "non_finite",
    "update",
]

NAME = "triton"
STORAGE_DTYPES = tuple(STORAGE_CODES)
#: ``lookup`` returns fresh activations (the dispatch copies them into ``out=``)
LOOKUP_WRITES_OUT = False
#: ``update`` takes no ``check_finite=``: the dispatch checks with ``non_finite`` first
UPDATE_CHECKS_FINITE = False

#: the widest row a program holds in registers
MAX_DIM = 4096


def _check_table(op: str, state: TableState) -> None:
    weight = state.weight
    where = f"embcore.ops.{op}: backend 'triton', table '{state.name}'"
    on_device = weight.device.type == "cuda" or triton.knobs.runtime.interpret
    if not on_device and not launch.is_recording():
        raise NotImplementedError(
            f"{where}: tensors must be on a CUDA device, got {weight.device}; use "
            "backend='cpu' or 'reference' on the CPU (or set TRITON_INTERPRET=1 before "
            "importing embcore.ops.triton to run the kernels in Triton's interpreter)"
        )
    if weight.dtype not in STORAGE_CODES:
        raise NotImplementedError(
            f"{where}: weight dtype {weight.dtype} is not supported; expected one of "
            f"{sorted(str(d) for d in STORAGE_CODES)}"
        )
    if not weight.is_contiguous():
        raise NotImplementedError(f"{where}: the weight must be contiguous")
    if weight.shape[1] > MAX_DIM:
        raise NotImplementedError(
            f"{where}: dim {weight.shape[1]} is wider than the supported {MAX_DIM}; use "
            "backend='reference' or split the table column-wise"
        )
    for name, slot in state.slots.items():
        if slot.dtype != torch.float32 or not slot.is_contiguous() or slot.device != weight.device:
            raise NotImplementedError(
                f"{where}: slot '{name}' must be a contiguous float32 tensor on "
                f"{weight.device}, got {slot.dtype} on {slot.device}"
            )


def lookup(
    states: Sequence[TableState], features: Sequence[Sequence[FeatureBatch]]
) -> list[list[Tensor]]:
    """Every table's lookups: for table ``t``, one ``(S_f, dim) float32`` activation per
    feature in ``features[t]`` (one launch per table)."""
    out = []
    for state, batches in zip(states, features, strict=True):
        _check_table("lookup", state)
        if not batches:
            out.append([])
            continue
        out.append(forward.pooled_lookup(state.weight, jagged.table_batch(batches)))
    return out


def update(
    states: Sequence[TableState],
    features: Sequence[Sequence[FeatureBatch]],
    grads: Sequence[Sequence[Tensor]],
    lrs: Sequence[float],
    step: int,
) -> None:
    """One optimizer step for every table, on the rows its features touched (in place).

    Args:
        states: the tables, updated in place.
        features: per table, its features of this step.
        grads: per table, one ``(S_f, dim) float32`` activation gradient per feature.
        lrs: per table, this step's learning rate.
        step: 1-based count of updates of the tables, this one included.
    """
    check_updatable("triton", states, RULES)
    for state in states:
        _check_table("update", state)
    for state, batches, table_grads, lr in zip(states, features, grads, lrs, strict=True):
        if not batches:  # a table always has features in the engine; nothing to do
            continue
        batch = jagged.table_batch(batches)
        plan = backward.row_plan(batch, state.weight.shape[1])
        grad = jagged.concat_gradients(table_grads)
        RULES[type(state.optimizer)].update(state, plan, grad, lr, step)
