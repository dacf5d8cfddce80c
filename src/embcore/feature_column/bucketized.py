"""``bucketized_column``: a numeric feature cut into buckets, as one-hot values or as ids.

TensorFlow's ``tf.feature_column.bucketized_column(source, boundaries)``: with ``n``
boundaries there are ``n + 1`` buckets, each including its left boundary::

    boundaries [0, 10, 100]      buckets (-inf, 0) [0, 10) [10, 100) [100, +inf)
    price [[-5, 10000],          ids [[0, 3 + 4],         one-hot (DenseFeatures)
           [150,   10]]               [3, 2 + 4]]         (B, width * (n + 1))

Values are compared as float32 with float32 boundaries (TensorFlow's ``Bucketize`` keeps its
boundaries as float32); NaN falls in the last bucket. As a categorical column (for
``embedding_column``, ``indicator_column`` or ``crossed_column``) the ``j``-th value of an
example gets id ``bucket + j * (n + 1)``, so ``num_buckets = width * (n + 1)``. See
docs/feature_columns.md.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from embcore.feature_column.categorical import CategoricalColumn, ColumnIds
from embcore.feature_column.numeric import NumericColumn, numeric_column

__all__ = ["BucketizedColumn", "bucketized_column"]


@dataclass(frozen=True, eq=False, init=False)
class BucketizedColumn(CategoricalColumn):
    """A :class:`NumericColumn` cut at ``boundaries``; build it with :func:`bucketized_column`."""

    source_column: NumericColumn
    boundaries: tuple[float, ...]

    def __init__(self, source_column: NumericColumn, boundaries: tuple[float, ...]) -> None:
        object.__setattr__(self, "key", f"{source_column.name}_bucketized")
        object.__setattr__(self, "source_column", source_column)
        object.__setattr__(self, "boundaries", boundaries)

    @property
    def name(self) -> str:
        return self.key

    @property
    def width(self) -> int:
        """Dense values per example: one one-hot block of ``n + 1`` per source value."""
        return self.source_column.width * (len(self.boundaries) + 1)

    @property
    def num_buckets(self) -> int:
        return self.width

    def buckets(self, features: Mapping[str, Any]) -> np.ndarray:
        """``(B, source width) int64``: each value's bucket in ``[0, n]``."""
        values = self.source_column.dense(features).numpy()  # (B, w) float32, normalized
        edges = np.asarray(self.boundaries, dtype=np.float32)
        return np.searchsorted(edges, values, side="right").astype(np.int64)

    def transform(self, features: Mapping[str, Any]) -> ColumnIds:
        """Ids ``bucket + j * (n + 1)``, one per source value, in rows of ``width``."""
        buckets = self.buckets(features)
        rows, width = buckets.shape
        ids = buckets + np.arange(width, dtype=np.int64) * (len(self.boundaries) + 1)
        return ColumnIds(ids.reshape(-1), np.arange(rows + 1, dtype=np.int64) * width)

    def dense(self, features: Mapping[str, Any]) -> Tensor:
        """``(B, width) float32``: the one-hot buckets of each value, value after value."""
        buckets = torch.from_numpy(self.buckets(features))
        one_hot = torch.nn.functional.one_hot(buckets, len(self.boundaries) + 1)
        return one_hot.reshape(buckets.shape[0], self.width).to(torch.float32)

    def to_config(self) -> dict[str, Any]:
        source = self.source_column
        if source.normalizer_fn is not None or source.dtype != torch.float32:
            raise ValueError(
                f"bucketized_column '{self.name}': a source with a normalizer_fn or a dtype "
                "other than float32 cannot be saved as a config; build the column in code"
            )
        return {
            "type": "bucketized",
            "key": source.key,
            "shape": list(source.shape),
            "default_value": source.default_value,
            "boundaries": list(self.boundaries),
        }

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> BucketizedColumn:
        source = numeric_column(config["key"], tuple(config["shape"]), config["default_value"])
        return bucketized_column(source, config["boundaries"])


def bucketized_column(
    source_column: NumericColumn, boundaries: Sequence[float]
) -> BucketizedColumn:
    """``tf.feature_column.bucketized_column``: ``source_column`` cut at ``boundaries``.

    Args:
        source_column: a one-dimensional :func:`numeric_column` (shape ``(width,)``).
        boundaries: a non-empty, strictly increasing list or tuple of numbers.

    Raises:
        ValueError: the source is not a numeric column or not one-dimensional, or the
            boundaries are empty, not numbers, or not strictly increasing.
    """
    if not isinstance(source_column, NumericColumn):
        raise ValueError(
            f"bucketized_column: source_column must be a numeric_column, got {source_column!r}"
        )
    owner = f"bucketized_column({source_column.name!r})"
    if len(source_column.shape) != 1:
        raise ValueError(
            f"{owner}: source_column must be one-dimensional, got shape {source_column.shape}"
        )
    if not isinstance(boundaries, (list, tuple)) or not boundaries:
        raise ValueError(f"{owner}: boundaries must be a non-empty sorted list, got {boundaries!r}")
    if not all(isinstance(b, (int, float)) and not isinstance(b, bool) for b in boundaries):
        raise ValueError(f"{owner}: boundaries must be numbers, got {list(boundaries)}")
    for left, right in itertools.pairwise(boundaries):
        if not left < right:
            raise ValueError(
                f"{owner}: boundaries must be strictly increasing, got {left} then {right}"
            )
    return BucketizedColumn(source_column, tuple(float(b) for b in boundaries))
