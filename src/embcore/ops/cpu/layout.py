"""Descriptor tables: what a kernel needs to find every table and feature of a step.

Each row is ``int64``: addresses (``tensor.data_ptr()``) and sizes. Building them costs a few
microseconds per feature and copies no data; the part of the feature rows that depends only on
the batches is built once for the lookup and the update of a step::

    tables   (T, TABLE_COLUMNS)    weight, vocab, dim, slot0, width0, slot1, width1, positions
    features (F, FEATURE_COLUMNS)  table, values, offsets, weights (0: none), samples, ids,
                                   combiner, rows (activation out / gradient in) and their
                                   row stride in floats

Features are listed table by table, so table ``t`` owns features ``first[t]:first[t+1]``.
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from embcore.inputs import FeatureBatch
from embcore.ops.cpu.hugepages import prefer_huge_pages
from embcore.ops.state import TableState
from embcore.optimizers.base import Optimizer

__all__ = [
    "COMBINERS",
    "FEATURE_COLUMNS",
    "TABLE_COLUMNS",
    "feature_descriptors",
    "positions",
    "table_descriptors",
]

# table columns
T_WEIGHT, T_VOCAB, T_DIM, T_SLOT0, T_WIDTH0, T_SLOT1, T_WIDTH1, T_POSITIONS = range(8)
TABLE_COLUMNS = 8
# feature columns
F_TABLE, F_VALUES, F_OFFSETS, F_WEIGHTS, F_SAMPLES, F_IDS, F_COMBINER, F_ROWS, F_STRIDE = range(9)
FEATURE_COLUMNS = 9

#: combiner name -> the code kernels branch on
COMBINERS = {"sum": 0, "mean": 1, "sqrtn": 2}

_BACKEND = "cpu"

# One int32 "position" array per table, the sparse-set index of the backward dedup: row r was
# seen this step iff 0 <= pos[r] < count and unique[pos[r]] == r. Its contents never need
# resetting, so it is allocated once per table (np.empty: pages are only made resident where
# ids land) and reused every step, never per step.
_POSITIONS: dict[int, tuple[weakref.ref, np.ndarray]] = {}


def positions(weight: Tensor) -> np.ndarray:
    """The table's persistent ``(vocab,) int32`` dedup index (see above)."""
    key = id(weight)
    entry = _POSITIONS.get(key)
    if entry is not None and entry[0]() is weight and entry[1].shape[0] == weight.shape[0]:
        return entry[1]
    array = np.empty(weight.shape[0], dtype=np.int32)
    prefer_huge_pages(array)
    _POSITIONS[key] = (weakref.ref(weight, lambda _: _POSITIONS.pop(key, None)), array)
    return array


def _check_tensor(op: str, what: str, t: Tensor, dtype: torch.dtype) -> None:
    if not t.is_cpu or t.dtype != dtype:
        raise NotImplementedError(
            f"embcore.ops.{op}: backend {_BACKEND!r} supports {dtype} tensors on the CPU; "
            f"{what} is {t.dtype} on {t.device} (use backend='reference')"
        )


@functools.lru_cache(maxsize=1024)
def _slot_names(optimizer: Optimizer) -> tuple[str, ...]:
    """The optimizer's slot names, in the order kernels index them (cached: called per table
    per step)."""
    return tuple(spec.name for spec in optimizer.slot_specs())


# (state, with_positions) -> (addresses, descriptor row), built and checked once: a TableState
# is frozen, so its tensors stay the same objects; their addresses are rechecked every step
# (``share_memory_()`` moves a tensor's storage in place)
_TABLE_ROWS: dict[bool, weakref.WeakKeyDictionary] = {
    False: weakref.WeakKeyDictionary(),
    True: weakref.WeakKeyDictionary(),
}


#: the last descriptor table per ``with_positions``: its states (by weak reference), their
#: tensors' addresses and the table (a step's lookup and update pass the same states)
_LAST_TABLES: dict[bool, tuple[tuple, tuple[int, ...], np.ndarray]] = {}


def table_descriptors(op: str, states: Sequence[TableState], with_positions: bool) -> np.ndarray:
    """``(T, TABLE_COLUMNS) int64`` descriptors; slot ``k`` is the optimizer's k-th slot
    (the same array again while the states and their addresses are: do not write to it)."""
    addresses = tuple(
        p for state in states for p in (state.weight.data_ptr(), *_slot_addresses(state))
    )
    last = _LAST_TABLES.get(with_positions)
    if (
        last is not None
        and last[1] == addresses
        and len(last[0]) == len(states)
        and all(r() is s for r, s in zip(last[0], states, strict=True))
    ):
        return last[2]
    rows = np.empty((len(states), TABLE_COLUMNS), dtype=np.int64)
    cache = _TABLE_ROWS[with_positions]
    for t, state in enumerate(states):
        mine = (state.weight.data_ptr(), *_slot_addresses(state))
        entry = cache.get(state)
        if entry is None or entry[0] != mine:
            entry = cache[state] = (mine, _table_row(op, state, with_positions))
        rows[t] = entry[1]
    _LAST_TABLES[with_positions] = (tuple(weakref.ref(s) for s in states), addresses, rows)
    return rows


def _slot_addresses(state: TableState) -> list[int]:
    return [s.data_ptr() for s in state.slots.values()]


def _table_row(op: str, state: TableState, with_positions: bool) -> np.ndarray:
    row = np.zeros(TABLE_COLUMNS, dtype=np.int64)
    w = state.weight
    _check_tensor(op, f"table '{state.name}' weight", w, torch.float32)
    if w.dim() != 2 or not w.is_contiguous():
        raise NotImplementedError(
            f"embcore.ops.{op}: backend {_BACKEND!r} needs a contiguous (vocab, dim) weight; "
            f"table '{state.name}' has shape {tuple(w.shape)}, stride {w.stride()}"
        )
    prefer_huge_pages(w)
    row[T_WEIGHT], row[T_VOCAB], row[T_DIM] = w.data_ptr(), w.shape[0], w.shape[1]
    if with_positions:
        row[T_POSITIONS] = positions(w).ctypes.data
        for k, name in enumerate(_slot_names(state.optimizer)):
            slot = state.slots[name]
            _check_tensor(op, f"table '{state.name}' slot '{name}'", slot, torch.float32)
            if not slot.is_contiguous() or slot.shape[0] != w.shape[0]:
                raise NotImplementedError(
                    f"embcore.ops.{op}: backend {_BACKEND!r} needs contiguous slots of "
                    f"{w.shape[0]} rows; table '{state.name}' slot '{name}' has shape "
                    f"{tuple(slot.shape)}"
                )
            prefer_huge_pages(slot)
            row[T_SLOT0 + 2 * k] = slot.data_ptr()
            row[T_WIDTH0 + 2 * k] = 1 if slot.dim() == 1 else slot.shape[1]
    return row


#: the batch part of the last few steps' feature descriptors (the lookup and the update of
#: one step share their batches, and an input pipeline may hand the same prepared batch again)
_BATCH_ROWS: dict[tuple[int, ...], tuple[tuple, np.ndarray, np.ndarray, list[Tensor]]] = {}
_BATCH_ROWS_KEPT = 4
_batch_rows_lock = threading.Lock()


def _batch_rows(
    op: str, features: Sequence[Sequence[FeatureBatch]]
) -> tuple[np.ndarray, np.ndarray, list[Tensor]]:
    """The columns of the feature descriptors that depend only on the batches (everything
    but ``F_ROWS`` and ``F_STRIDE``), the first-feature offsets, and the tensors made
    contiguous for them; built and checked once per list of batches (held by weak
    reference, so a dropped batch is never matched again)."""
    flat = [b for batches in features for b in batches]
    key = (*map(id, flat), *map(len, features))
    with _batch_rows_lock:
        entry = _BATCH_ROWS.get(key)
    if entry is not None and all(r() is b for r, b in zip(entry[0], flat, strict=True)):
        return entry[1], entry[2], entry[3]
    table = np.zeros((len(flat), FEATURE_COLUMNS), dtype=np.int64)
    first = np.zeros(len(features) + 1, dtype=np.int64)
    copies: list[Tensor] = []
    f = 0
    for t, batches in enumerate(features):
        for batch in batches:
            values, offsets, weights = batch.values, batch.offsets, batch.weights
            _check_tensor(op, "feature values", values, torch.int64)
            _check_tensor(op, "feature offsets", offsets, torch.int64)
            values, offsets = values.contiguous(), offsets.contiguous()
            row = table[f]
            row[F_TABLE], row[F_VALUES], row[F_OFFSETS] = t, values.data_ptr(), offsets.data_ptr()
            if weights is not None:
                _check_tensor(op, "feature weights", weights, torch.float32)
                weights = weights.contiguous()
                row[F_WEIGHTS] = weights.data_ptr()
            copies += [
                x for x, y in ((values, batch.values), (offsets, batch.offsets)) if x is not y
            ]
            if weights is not None and weights is not batch.weights:
                copies.append(weights)
            row[F_SAMPLES], row[F_IDS] = offsets.numel() - 1, values.numel()
            row[F_COMBINER] = COMBINERS[batch.combiner]
            f += 1
        first[t + 1] = f
    with _batch_rows_lock:
        _BATCH_ROWS[key] = (tuple(weakref.ref(b) for b in flat), table, first, copies)
        while len(_BATCH_ROWS) > _BATCH_ROWS_KEPT:
            del _BATCH_ROWS[next(iter(_BATCH_ROWS))]
    return table, first, copies


def feature_descriptors(
    op: str,
    features: Sequence[Sequence[FeatureBatch]],
    rows: Sequence[Sequence[Tensor]],
    keep: list,
) -> tuple[np.ndarray, np.ndarray]:
    """``(F, FEATURE_COLUMNS) int64`` descriptors and ``(T+1,)`` first-feature offsets.

    ``rows[t][i]`` is feature ``i`` of table ``t``'s ``(samples, dim) float32`` activation
    (written by the lookup: its columns must be contiguous) or gradient (read by the update).
    Tensors made contiguous here are appended to ``keep`` so they outlive the kernel call.
    """
    batch_rows, first, copies = _batch_rows(op, features)
    table = batch_rows.copy()
    keep += copies
    addresses, strides = [], []
    for per_table, tensors in zip(features, rows, strict=True):
        for _, r in zip(per_table, tensors, strict=True):
            _check_tensor(op, "feature rows", r, torch.float32)
            stride = r.stride()
            if len(stride) != 2 or (stride[1] != 1 and r.shape[1] > 1):
                if op == "lookup":
                    raise NotImplementedError(
                        "embcore.ops.lookup: backend 'cpu' writes outputs whose columns are "
                        f"contiguous; got shape {tuple(r.shape)}, stride {stride}"
                    )
                r = r.contiguous()  # rows may be strided (e.g. slices of a stacked gradient)
                keep.append(r)
                stride = r.stride()
            addresses.append(r.data_ptr())
            strides.append(stride[0] if len(stride) == 2 else 0)
    table[:, F_ROWS], table[:, F_STRIDE] = addresses, strides
    return table, first
