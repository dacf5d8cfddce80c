"""Batches on their way into the engine: :class:`PreparedBatch` and the feature-leaf test.

See docs/architecture.md for where preparing sits in a training step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from embcore.config import FeatureConfig
from embcore.inputs import FeatureBatch

__all__ = ["PreparedBatch", "is_feature"]


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
