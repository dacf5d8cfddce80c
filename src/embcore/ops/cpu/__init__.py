"""The fused CPU backend: Numba kernels over every table of a step at once.

Forward (:mod:`.gather`): one pass, split across threads, gathers and combines every feature
of every table into freshly allocated activations.

Update: one pass per table (workers claim tables, biggest first) finds the step's unique rows
and sums their gradients (:mod:`.dedup`, with a persistent per-table sparse-set index, so nothing
proportional to the vocabulary is allocated per step); then, per optimizer, one pass over the
unique rows, split across threads, applies gradient clip, weight decay, the optimizer's rule
(:mod:`.rules`) and weight clip once per row, in place. Non-lazy Adam sweeps every row instead.
When every table has the same lazy optimizer and its rule has a ``fused`` kernel (Adagrad,
row-wise Adagrad), every id is range-checked first and the rule of each table whose summed
gradients fit in ``FUSE_BYTES`` runs right after its own dedup, while they are in cache.
With ``check_finite`` the dedup also checks every gradient for NaN and Inf as it reads it,
and every table's dedup runs before any rule, so a bad gradient changes nothing
(``UPDATE_CHECKS_FINITE``): the engine then needs no separate pass over the gradients.
A table with at least twice as many ids as samples, when its rule has an ``update_listed``
kernel (row-wise Adagrad), is deduplicated into occurrence lists instead of summed
gradients (:mod:`.occurrences`): its rule sums each chunk of rows in cache.

Results match :mod:`embcore.ops.reference` to float32 rounding (the same sums in the same
order), and rows no id touched are never written. Tensors must be float32 / int64 on the CPU
(made contiguous here if needed); anything else raises ``NotImplementedError`` naming the
tensor. Kernels are compiled once and cached on disk (``cache=True``, in a directory keyed by
the contents of this package's sources and of the shared helpers they inline:
:mod:`embcore._numba.cache`) and use ``torch.get_num_threads()`` threads
(:mod:`embcore._numba.threads`). See docs/cpu_backend.md.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from embcore._numba import threads
from embcore._numba.cache import kernels_cached_in, package_cache_dir
from embcore.inputs import FeatureBatch
from embcore.ops import reference
from embcore.ops.state import TableState, check_updatable

# Every kernel module is first imported here, so every kernel caches its compiled code in a
# directory keyed by the contents of all of this package's sources and of the shared helpers
# (embcore._numba.cache).
with kernels_cached_in(package_cache_dir("cpu", Path(__file__).resolve().parent)):
    from embcore.ops.cpu import dedup, finite, gather, occurrences
    from embcore.ops.cpu.layout import (
        F_IDS,
        F_SAMPLES,
        F_TABLE,
        T_DIM,
        T_VOCAB,
        feature_descriptors,
        positions,
        table_descriptors,
    )
    from embcore.ops.cpu.rules import RULES
    from embcore.ops.cpu.rules._rows import common_row, float32_rows

__all__ = [
    "LOOKUP_WRITES_OUT",
    "NAME",
    "STORAGE_DTYPES",
    "UPDATE_CHECKS_FINITE",
    "lookup",
    "non_finite",
    "update",
]

NAME = "cpu"
STORAGE_DTYPES = (torch.float32,)


def _raise_bad_ids(
    op: str, states: Sequence[TableState], features: Sequence[Sequence[FeatureBatch]]
) -> None:
    for state, batches in zip(states, features, strict=True):
        vocab = state.weight.shape[0]
        for batch in batches:
            bad = (batch.values < 0) | (batch.values >= vocab)
            if bool(bad.any()):
                i = int(bad.nonzero()[0])
                raise IndexError(
                    f"embcore.ops.{op}: id {int(batch.values[i])} at position {i} is out of range "
                    f"for table '{state.name}' with {vocab} rows; ids must be in [0, {vocab})"
                )
    raise IndexError(f"embcore.ops.{op}: an id is out of range")  # unreachable in practice


#: ``lookup`` writes into caller-provided outputs (see :func:`embcore.ops.lookup`)
LOOKUP_WRITES_OUT = True
#: ``update`` takes ``check_finite=`` and checks within its dedup (see :func:`update`)
UPDATE_CHECKS_FINITE = True


def lookup(
    states: Sequence[TableState],
    features: Sequence[Sequence[FeatureBatch]],
    out: Sequence[Sequence[Tensor]] | None = None,
) -> list[list[Tensor]]:
    """Every table's lookups: for table ``t``, one ``(S_f, dim)`` activation per feature,
    written into ``out`` when given (rows may be strided; columns must be contiguous)."""
    outs = out
    if outs is None:
        outs = [
            [torch.empty(b.num_samples, s.weight.shape[1], dtype=torch.float32) for b in batches]
            for s, batches in zip(states, features, strict=True)
        ]
    keep: list[Tensor] = []
    tables = table_descriptors("lookup", states, with_positions=False)
    feats, _ = feature_descriptors("lookup", features, outs, keep)
    workers = threads.num_workers(int(feats[:, F_IDS].sum()))
    counter = np.zeros(1, dtype=np.int64)
    dims = tables[feats[:, F_TABLE], T_DIM]
    stream = 4 * int((feats[:, F_SAMPLES] * dims).sum()) >= gather.STREAM_BYTES
    if sum(threads.run(gather.pooled_lookup, tables, feats, counter, stream, workers=workers)):
        _raise_bad_ids("lookup", states, features)
    return outs


def _as_rows(t: Tensor) -> tuple[int, int, int, int] | None:
    """``(address, rows, columns, row stride)`` of a CPU float32 tensor whose elements are
    rows of contiguous columns (contiguous, or a slice of a stacked output), else ``None``."""
    if not t.is_cpu or t.dtype != torch.float32 or t.numel() == 0:
        return None
    if t.is_contiguous():
        return t.data_ptr(), 1, t.numel(), 0
    if t.dim() == 2 and t.stride(1) == 1 and t.stride(0) >= t.shape[1]:
        return t.data_ptr(), t.shape[0], t.shape[1], t.stride(0)
    return None


def non_finite(tensors: Sequence[Tensor]) -> list[bool]:
    """For each tensor, whether it holds a NaN or an Inf (one threaded pass over them all)."""
    flags = [False] * len(tensors)
    fast, rows = [], []
    for i, t in enumerate(tensors):
        if (described := _as_rows(t)) is not None:
            fast.append(i)
            rows.append(described)
        elif t.numel():
            flags[i] = reference.non_finite([t])[0]
    if fast:
        table = np.array(rows, dtype=np.int64)
        found = np.zeros(len(fast), dtype=np.int64)
        elements = int((table[:, 1] * table[:, 2]).sum())
        workers = min(len(fast), threads.num_workers(elements // 64))
        threads.run(finite.non_finite_flags, table, found, workers=workers)
        for i, bad in zip(fast, found.tolist(), strict=True):
            flags[i] = bool(bad)
    return flags


#: a table's rule runs right after its dedup (when its optimizer allows) if its summed
#: gradients take at most this many bytes: they are then still in cache for the rule
FUSE_BYTES = 2 << 20

_workspace_lock = threading.Lock()
_workspace_buffer = np.empty(0, dtype=np.float32)


def _workspace(size: int) -> np.ndarray:
    """A float32 buffer of at least ``size`` (the step's summed row gradients), grown as
    needed and reused across steps, so its pages are not faulted in again every step."""
    global _workspace_buffer
    if _workspace_buffer.size < size:
        _workspace_buffer = np.empty(max(size, int(1.25 * _workspace_buffer.size)), np.float32)
    return _workspace_buffer


def _biggest_first(base: np.ndarray) -> np.ndarray:
    """Tables by id count, biggest first: the order workers claim them in."""
    return np.argsort(-np.diff(base), kind="stable").astype(np.int64)


def update(
    states: Sequence[TableState],
    features: Sequence[Sequence[FeatureBatch]],
    grads: Sequence[Sequence[Tensor]],
    lrs: Sequence[float],
    step: int,
    check_finite: bool = False,
) -> bool:
    """One optimizer step for every table, on the rows its features touched (in place).

    ``check_finite``: the dedup checks every gradient row it reads (and the rows of empty
    bags) for NaN and Inf, and every table's dedup runs before the first rule; if one holds
    such a value, no table is written and this returns ``False``. Otherwise ``True``.
    """
    check_updatable("cpu", states, RULES)
    if not states:
        return True
    keep: list[Tensor] = []
    tables = table_descriptors("update", states, with_positions=True)
    feats, first = feature_descriptors("update", features, grads, keep)
    base = np.zeros(len(states) + 1, dtype=np.int64)
    per_table = np.bincount(feats[:, F_TABLE], weights=feats[:, F_IDS], minlength=len(states))
    base[1:] = np.cumsum(per_table.astype(np.int64))
    ids = int(base[-1])
    groups = _groups(states)
    (kind, lazy), members = next(iter(groups.items()))
    single = lazy and len(groups) == 1
    listed = _listed_tables(RULES[kind], feats, base) if single else np.zeros(len(states), bool)
    offset = np.zeros(len(states) + 1, dtype=np.int64)  # no summed block for a listed table
    offset[1:] = np.cumsum(np.diff(base) * tables[:, T_DIM] * ~listed)
    with _workspace_lock:  # one update at a time uses the shared gradient workspace
        plan = (
            base,
            np.empty(ids, dtype=np.int64),  # unique rows, table by table
            np.empty(len(states), dtype=np.int64),  # unique rows per table
            offset,  # each table's gradient block in the workspace
            _workspace(int(offset[-1])),
            np.zeros(1, dtype=np.int64),  # the work counter workers claim from
            np.zeros(len(states), dtype=np.int64),  # tables whose gradients are not finite
        )
        workers = threads.num_workers(ids)
        order = _biggest_first(base)
        if listed.any():
            occ = occurrences.occurrence_buffers(ids, len(states))
            args = (tables, feats, first, plan, occ, order, listed.astype(np.int64))
            bad = sum(threads.run(occurrences.unique_occurrences, *args, workers=workers))
            if check_finite and plan[6].any():
                return False
            if bad:
                _raise_bad_ids("update", states, features)
            _apply_rules(states, lrs, step, tables, plan, {(kind, lazy): members}, listed, occ)
            return True
        fused = getattr(RULES[kind], "fused", None) if single else None
        fuse = np.zeros(len(states), dtype=np.int64)
        if fused is not None and not check_finite:  # summed gradients still in cache for the rule
            fuse[:] = 4 * np.diff(offset) <= FUSE_BYTES
        if fuse.any():  # every id is checked first: no table may change if one is bad
            if sum(threads.run(dedup.out_of_range, tables, feats, workers=workers)):
                _raise_bad_ids("update", states, features)
            hp, common = _hyperparameters(states, lrs, step, kind, members)
            args = (tables, feats, first, plan, order, fuse, hp, common)
            threads.run(fused, *args, workers=workers)
            groups = {(kind, lazy): [t for t in members if not fuse[t]]}
        else:
            bad = sum(
                threads.run(
                    dedup.unique_gradients, tables, feats, first, plan, order, workers=workers
                )
            )
            if check_finite and plan[6].any():
                return False
            if bad:
                _raise_bad_ids("update", states, features)
        _apply_rules(states, lrs, step, tables, plan, groups)
    return True


def _listed_tables(rule: object, feats: np.ndarray, base: np.ndarray) -> np.ndarray:
    """Which tables are deduplicated into occurrence lists (:mod:`.occurrences`): those with
    at least twice as many ids as samples, whose summed gradient block would outgrow the
    activation gradient it sums, when the rule has an ``update_listed`` kernel."""
    tables = base.shape[0] - 1
    if not hasattr(rule, "update_listed"):
        return np.zeros(tables, dtype=bool)
    samples = np.bincount(feats[:, F_TABLE], weights=feats[:, F_SAMPLES], minlength=tables)
    return np.diff(base) >= 2 * samples


def _groups(states: Sequence[TableState]) -> dict[tuple[type, bool], list[int]]:
    """The tables by optimizer kind and laziness."""
    groups: dict[tuple[type, bool], list[int]] = {}
    for t, state in enumerate(states):
        groups.setdefault((type(state.optimizer), state.optimizer.lazy), []).append(t)
    return groups


def _hyperparameters(
    states: Sequence[TableState], lrs: Sequence[float], step: int, kind: type, members: list[int]
) -> tuple[np.ndarray, np.ndarray]:
    """``hp`` (the rule's constants, rows of ``members`` only) and ``common``, per table."""
    common = float32_rows(
        [common_row(s.optimizer, lr) for s, lr in zip(states, lrs, strict=True)], 5
    )
    params: list[list[float]] = [[] for _ in states]
    for t in members:
        params[t] = RULES[kind].hyperparameters(states[t].optimizer, lrs[t], step)
    return float32_rows(params, max(len(p) for p in params)), common


def _apply_rules(
    states: Sequence[TableState],
    lrs: Sequence[float],
    step: int,
    tables: np.ndarray,
    plan: tuple[np.ndarray, ...],
    groups: dict[tuple[type, bool], list[int]],
    listed: np.ndarray | None = None,
    occ: tuple[np.ndarray, ...] = (),
) -> None:
    """One parallel pass per optimizer kind over the unique rows of its tables; for one
    lazy kind, a second over those of its ``listed`` tables (their occurrences in ``occ``)."""
    for (kind, lazy), members in groups.items():
        if not members:
            continue
        rule = RULES[kind]
        hp, common = _hyperparameters(states, lrs, step, kind, members)
        if listed is not None:
            active = listed.astype(np.int64)
            workers = threads.num_workers(int(plan[2][listed].sum()))
            plan[5][0] = 0
            threads.run(rule.update_listed, tables, plan, occ, hp, common, active, workers=workers)
            members = [t for t in members if not listed[t]]
            if not members:
                continue
        active = np.zeros(len(states), dtype=np.int64)
        active[members] = 1
        rows = plan[2] if lazy else tables[:, T_VOCAB]  # unique rows, or every row
        if not lazy:
            _index_unique_rows(states, plan, members)
        workers = threads.num_workers(int(rows[members].sum()))
        kernel = rule.update if lazy else rule.update_all
        plan[5][0] = 0
        threads.run(kernel, tables, plan, hp, common, active, workers=workers)


def _index_unique_rows(
    states: Sequence[TableState], plan: tuple[np.ndarray, ...], members: list[int]
) -> None:
    """Point each table's index at its unique rows: a non-lazy rule sweeps every row and
    finds a row's summed gradient through the index, which a hashed dedup (few ids for the
    vocabulary) does not write."""
    base, unique, count = plan[0], plan[1], plan[2]
    for t in members:
        n = int(count[t])
        rows = unique[base[t] : base[t] + n]
        positions(states[t].weight)[rows] = np.arange(n, dtype=np.int32)
