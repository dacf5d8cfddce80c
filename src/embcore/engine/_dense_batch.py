"""Many one-id dense features converted at once: a DLRM's categorical fields.

The common raw input of a recommendation model is one ``(B,) int64`` tensor of ids per
feature. :func:`~embcore.inputs.to_feature_batch` converts each on its own (checks, a range
check, a copy: about 20 us of tensor calls and Python per feature); :func:`dense_batches`
gives the same batches for all of them with one copy and one range check, and hands every
other input (and any bad one, so that its error names the feature) to the per-feature path.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from embcore._one_per_sample import one_per_sample
from embcore.config import ResolvedFeature, ResolvedTable
from embcore.inputs import FeatureBatch

__all__ = ["dense_batches"]


def dense_batches(
    features: Sequence[ResolvedFeature],
    tables: Sequence[ResolvedTable],
    ids: Sequence[Any],
    device: torch.device,
) -> list[FeatureBatch] | None:
    """What ``to_feature_batch`` gives each feature, where every input is a ``(B,) int64``
    CPU tensor of ids in range for a pooled feature of a fixed-size table without
    ``safe_lookup`` or an output shape of its own, for a CPU engine; else ``None``.

    The batches' ids are rows of one ``(F, B)`` copy of the inputs (so, as on the per-feature
    path, none is a view of the caller's tensors); they share the offsets ``arange(B + 1)``.
    """
    if device.type != "cpu" or len(ids) < 2 or not isinstance(ids[0], Tensor):
        return None
    samples = ids[0].shape[0] if ids[0].dim() == 1 else -1
    vocab = []
    for f, x in zip(features, ids, strict=True):
        table = tables[f.table]
        if (
            not isinstance(x, Tensor)
            or x.layout != torch.strided
            or x.dtype != torch.int64
            or not x.is_cpu
            or x.dim() != 1
            or x.shape[0] != samples
            or f.config.max_sequence_length > 0
            or f.config.output_shape is not None
            or table.vocabulary_size is None
            or table.config.safe_lookup
        ):
            return None
        vocab.append(table.vocabulary_size)
    values = torch.stack(list(ids))  # (F, B): the batches' own copy
    if samples:
        low, high = torch.aminmax(values, dim=1)
        if bool(low.min() < 0) or bool((high >= torch.tensor(vocab)).any()):
            return None  # the per-feature path raises, naming the feature and the id
    offsets = one_per_sample(samples)
    return [
        FeatureBatch(values[i], offsets, None, tables[f.table].combiner, (samples,))
        for i, f in enumerate(features)
    ]
