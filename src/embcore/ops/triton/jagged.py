"""All features of one table as one jagged batch, so one launch covers the whole table.

Features that share a table are concatenated bag after bag (no id is copied per feature more
than once, and nothing here synchronizes with the device)::

    feature a (S=2): offsets [0, 2, 3]    values [4, 9 | 4]
    feature b (S=3): offsets [0, 1, 1, 3] values [7 | | 1, 4]
    table batch:     offsets [0, 2, 3, 4, 4, 6]  values [4, 9, 4, 7, 1, 4]  splits (2, 3)

The activations of the table come back as one ``(S_a + S_b, dim)`` buffer split per feature,
and the update reads one ``(S_a + S_b, dim)`` gradient (the features' gradients concatenated).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from embcore.inputs import FeatureBatch

__all__ = ["COMBINER_CODES", "TableBatch", "concat_gradients", "table_batch"]

#: combiner -> the code the kernels branch on
COMBINER_CODES = {"sum": 0, "mean": 1, "sqrtn": 2}


@dataclass(frozen=True)
class TableBatch:
    """One table's features of a step, concatenated.

    Attributes:
        values: ``(N,) int64`` ids, feature after feature.
        offsets: ``(S+1,) int64`` bag offsets into ``values``, ``S = sum(splits)``.
        weights: ``(N,) float32`` per-id weights (ones for unweighted features), or ``None``
            when no feature of the table is weighted.
        combiner: the code of the features' combiner (:data:`COMBINER_CODES`) when they all
            share one; ``-1`` when they differ, and then ``modes`` holds one code per bag.
        modes: ``(S,) int8`` combiner code per bag, or ``None``.
        splits: bags per feature.
    """

    values: Tensor
    offsets: Tensor
    weights: Tensor | None
    combiner: int
    modes: Tensor | None
    splits: tuple[int, ...]

    @property
    def num_bags(self) -> int:
        return self.offsets.numel() - 1

    @property
    def num_ids(self) -> int:
        return self.values.numel()


def table_batch(features: Sequence[FeatureBatch]) -> TableBatch:
    """Concatenate one table's features (at least one) into a :class:`TableBatch`."""
    device = features[0].values.device
    splits = tuple(b.num_samples for b in features)
    codes = [COMBINER_CODES[b.combiner] for b in features]
    combiner = codes[0] if len(set(codes)) == 1 else -1
    modes = None
    if combiner < 0:
        modes = torch.cat(
            [
                torch.full((s,), c, dtype=torch.int8, device=device)
                for s, c in zip(splits, codes, strict=True)
            ]
        )
    weighted = any(b.weights is not None for b in features)
    if len(features) == 1:
        b = features[0]
        weights = b.weights.to(torch.float32).contiguous() if weighted else None
        return TableBatch(
            b.values.contiguous(), b.offsets.contiguous(), weights, combiner, modes, splits
        )
    values = torch.cat([b.values for b in features])
    # each feature's offsets, shifted by the ids before it; its last offset is the next's first
    parts, base = [], 0
    for b in features:
        parts.append(b.offsets[:-1] + base)
        base += b.values.numel()
    parts.append(torch.full((1,), base, dtype=torch.int64, device=device))
    offsets = torch.cat(parts)
    weights = None
    if weighted:
        weights = torch.cat(
            [
                torch.ones(b.values.numel(), dtype=torch.float32, device=device)
                if b.weights is None
                else b.weights.to(torch.float32)
                for b in features
            ]
        )
    return TableBatch(values, offsets, weights, combiner, modes, splits)


def concat_gradients(grads: Sequence[Tensor]) -> Tensor:
    """``(S, dim) float32``: the features' activation gradients, bag after bag."""
    if len(grads) == 1:
        return grads[0].to(torch.float32).contiguous()
    return torch.cat([g.to(torch.float32) for g in grads]).contiguous()
