"""Batches on their way into the engine: :class:`PreparedBatch` and the feature-leaf test.

See docs/architecture.md for where preparing sits in a training step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from embcore.config import FeatureConfig, ResolvedFeature, ResolvedTable
from embcore.inputs import FeatureBatch

__all__ = ["PreparedBatch", "is_feature", "stacked_shape"]


def is_feature(x: Any) -> bool:
    """Whether ``x`` is a leaf of a feature-config structure."""
    return isinstance(x, FeatureConfig)


@dataclass(frozen=True, eq=False)
class PreparedBatch:
    """A batch validated and converted by :meth:`EmbeddingEngine.prepare`.

    Preparing is pure work on the inputs (no table is read), so it can run in another thread
    while the previous step computes; ``enqueue`` and ``forward`` accept the result.
    """

    batches: tuple[FeatureBatch, ...]
    engine: int  # id() of the engine that prepared it


def stacked_shape(
    features: Sequence[ResolvedFeature],
    tables: Sequence[ResolvedTable],
    shapes: Sequence[tuple[int, ...]],
) -> tuple[int, ...]:
    """``(*output_shape, F, dim)``: the shape of ``EmbeddingEngine.stacked``'s result for
    features with these output shapes.

    Raises:
        ValueError: the features differ in output shape or dim (naming them).
    """
    first = features[0]
    shape, dim = shapes[0], tables[first.table].dim
    for f, s in zip(features, shapes, strict=True):
        if s != shape or tables[f.table].dim != dim:
            raise ValueError(
                f"EmbeddingEngine.stacked: feature '{f.name}' has output shape "
                f"{s} and dim {tables[f.table].dim}, but feature "
                f"'{first.name}' has {shape} and {dim}; stacked() needs every feature to "
                "share both (use forward() for mixed features)"
            )
    return (*shape, len(features), dim)
