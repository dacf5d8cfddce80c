"""Many one-id dense features converted at once: a DLRM's categorical fields.

The common raw input of a recommendation model is one ``(B,) int64`` tensor of ids per
feature. :func:`~embcore.inputs.to_feature_batch` converts each on its own (checks, a range
check, a copy: about 20 us of tensor calls and Python per feature); :func:`dense_batches`
gives the same batches for all of them with one kernel call that copies every id into one
``(F, B)`` block and range-checks it on the way (:func:`embcore._numba.ids.copy_checked_ids`),
and hands every other input (and any bad one, so that its error names the feature) to the
per-feature path. What depends only on the engine's features is worked out once
(:func:`dense_plan`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from embcore._numba.ids import copy_checked_ids
from embcore._one_per_sample import one_per_sample
from embcore.config import ResolvedFeature, ResolvedTable
from embcore.inputs import FeatureBatch

__all__ = ["DensePlan", "dense_batches", "dense_plan"]


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
