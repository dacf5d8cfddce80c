"""Many one-id dense or ragged features converted at once: a DLRM's categorical fields.

The common raw input of a recommendation model is one ``(B,) int64`` tensor of ids per
feature. :func:`~embcore.inputs.to_feature_batch` converts each on its own (checks, a range
check, a copy: about 20 us of tensor calls and Python per feature); :func:`dense_batches`
gives the same batches for all of them with one kernel call that copies every id into one
``(F, B)`` block and range-checks it on the way (:func:`embcore._numba.ids.copy_checked_ids`),
and hands every other input (and any bad one, so that its error names the feature) to the
per-feature path. :func:`ragged_batches` does the same for :class:`~embcore.inputs.RaggedIds`
inputs, checking their row splits in the same pass
(:func:`embcore._numba.ids.copy_checked_ragged`). What depends only on the engine's features is
worked out once (:func:`dense_plan`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from embcore._numba.ids import copy_checked_ids, copy_checked_ragged
from embcore._one_per_sample import one_per_sample
from embcore.config import ResolvedFeature, ResolvedTable
from embcore.inputs import FeatureBatch, RaggedIds

__all__ = ["DensePlan", "dense_batches", "dense_plan", "ragged_batches"]


@dataclass(frozen=True, eq=False)
class DensePlan:
    """What the joint conversion needs of an engine's features (they never change).

    Attributes:
        limits: ``(F,) int64``: each feature's table's vocabulary size (ids must be below it).
        combiners: each feature's table's combiner.
    """

    limits: np.ndarray
    combiners: tuple[str, ...]


def dense_plan(
    features: Sequence[ResolvedFeature], tables: Sequence[ResolvedTable]
) -> DensePlan | None:
    """The plan for engines of at least two features, each a pooled feature of a fixed-size
    table without ``safe_lookup`` or an output shape of its own; else ``None`` (their one-id
    inputs are converted feature by feature)."""
    if len(features) < 2:
        return None
    for f in features:
        table = tables[f.table]
        if (
            f.config.max_sequence_length > 0
            or f.config.output_shape is not None
            or table.vocabulary_size is None
            or table.config.safe_lookup
        ):
            return None
    limits = np.array([tables[f.table].vocabulary_size for f in features], dtype=np.int64)
    return DensePlan(limits, tuple(tables[f.table].combiner for f in features))


def dense_batches(
    plan: DensePlan | None, ids: Sequence[Any], device: torch.device
) -> list[FeatureBatch] | None:
    """What ``to_feature_batch`` gives each feature, where every input is a ``(B,) int64``
    CPU tensor (any stride) of ids in range, for a CPU engine with a ``plan``; else ``None``.

    The batches' ids are rows of one ``(F, B)`` copy of the inputs (so, as on the per-feature
    path, none is a view of the caller's tensors); they share the offsets ``arange(B + 1)``.
    """
    if plan is None or device.type != "cpu" or len(ids) != len(plan.limits):
        return None
    first = ids[0]
    if type(first) is RaggedIds:
        return ragged_batches(plan, ids)
    if type(first) is not Tensor:
        return None
    shape = first.shape
    if len(shape) != 1:
        return None
    strided, int64 = torch.strided, torch.int64
    sources: list[int] = []  # per feature: the address of its ids, their stride
    for x in ids:  # plain strided int64 CPU tensors of one shape, whose memory holds their ids
        if (
            type(x) is not Tensor
            or x.layout is not strided
            or x.dtype is not int64
            or not x.is_cpu
            or x.shape != shape
            or x.is_neg()
        ):
            return None
        sources += (x.data_ptr(), x.stride()[0])
    samples = shape[0]
    block = np.empty((len(ids), samples), dtype=np.int64)  # the batches' own copy
    sources_table = np.array(sources, dtype=np.int64).reshape(-1, 2)
    if copy_checked_ids(sources_table, plan.limits, block) >= 0:
        return None  # the per-feature path raises, naming the feature and the id
    values = torch.from_numpy(block)
    offsets, output_shape = one_per_sample(samples), (samples,)
    return [
        FeatureBatch(v, offsets, None, combiner, output_shape)
        for v, combiner in zip(values.unbind(0), plan.combiners, strict=True)
    ]


def _plain(x: Any) -> bool:
    """``x`` is a plain contiguous 1-D int64 CPU tensor: its memory holds its elements."""
    return (
        type(x) is Tensor
        and x.layout is torch.strided
        and x.dtype is torch.int64
        and x.is_cpu
        and x.dim() == 1
        and x.is_contiguous()
        and not x.is_neg()
    )


def ragged_batches(plan: DensePlan, ids: Sequence[Any]) -> list[FeatureBatch] | None:
    """What ``to_feature_batch`` gives each feature, where every input is a
    :class:`~embcore.inputs.RaggedIds` of contiguous int64 CPU ids in range and row splits
    that are still valid (they may have changed in place since it was built); else ``None``.

    The batches' ids and offsets are slices of one copy of all the inputs' ids and one of all
    their row splits (so, as on the per-feature path, none is a view of the caller's tensors).
    """
    sources: list[int] = []  # per feature: its ids' address and count, its splits' and rows
    for x in ids:
        if type(x) is not RaggedIds or not (_plain(x.values) and _plain(x.row_splits)):
            return None
        rows = x.row_splits.shape[0] - 1
        if rows < 0:
            return None
        sources += (x.values.data_ptr(), x.values.shape[0], x.row_splits.data_ptr(), rows)
    table = np.array(sources, dtype=np.int64).reshape(-1, 4)
    values = np.empty(int(table[:, 1].sum()), dtype=np.int64)  # the batches' own copies
    splits = np.empty(int(table[:, 3].sum()) + len(ids), dtype=np.int64)
    if copy_checked_ragged(table, plan.limits, values, splits) >= 0:
        return None  # the per-feature path raises, naming the feature and the bad value
    values_t, splits_t = torch.from_numpy(values), torch.from_numpy(splits)
    batches, at_value, at_split = [], 0, 0
    for (_, count, _, rows), combiner in zip(table.tolist(), plan.combiners, strict=True):
        batches.append(
            FeatureBatch(
                values_t[at_value : at_value + count],
                splits_t[at_split : at_split + rows + 1],
                None,
                combiner,
                (rows,),
            )
        )
        at_value, at_split = at_value + count, at_split + rows + 1
    return batches
