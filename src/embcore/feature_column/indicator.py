"""``indicator_column``: a categorical column as a multi-hot dense vector.

TensorFlow's ``tf.feature_column.indicator_column(categorical_column)``: each example becomes a
``(num_buckets,)`` float32 vector counting its ids (an id twice counts 2; an id of ``-1``, a
vocabulary column's default, counts nowhere); a weighted column sums its weights per id
instead::

    vocabulary ["a", "b", "c"]    ["a", "a", "c"]  ->  [2, 0, 1]
    weighted, 5 buckets           ids [0, 3, 3], weights [0.5, 2, 0.25]  ->  [0.5, 0, 0, 2.25, 0]

:class:`~embcore.feature_column.DenseFeatures` concatenates it with the other dense columns in
name order (its name is ``<column>_indicator``). See docs/feature_columns.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from embcore.feature_column.categorical import CategoricalColumn

__all__ = ["IndicatorColumn", "indicator_column"]


@dataclass(frozen=True, eq=False)
class IndicatorColumn:
    """The multi-hot form of :attr:`categorical_column`; build it with
    :func:`indicator_column`."""

    categorical_column: CategoricalColumn

    @property
    def name(self) -> str:
        return f"{self.categorical_column.name}_indicator"

    @property
    def width(self) -> int:
        return self.categorical_column.num_buckets

    def dense(self, features: Mapping[str, Any]) -> Tensor:
        """``(B, num_buckets) float32``: per example, the count (or summed weight) of each id."""
        col = self.categorical_column.transform(features)
        rows = len(col.row_splits) - 1
        row = np.repeat(np.arange(rows, dtype=np.int64), np.diff(col.row_splits))
        keep = (col.ids >= 0) & (col.ids < self.width)  # -1: no id (TensorFlow's one_hot)
        weights = np.ones(len(col.ids)) if col.weights is None else col.weights
        out = np.zeros((rows, self.width), dtype=np.float64)
        np.add.at(out, (row[keep], col.ids[keep]), weights[keep])
        return torch.from_numpy(out.astype(np.float32))


def indicator_column(categorical_column: CategoricalColumn) -> IndicatorColumn:
    """``tf.feature_column.indicator_column``: ``categorical_column`` as a multi-hot vector.

    Raises:
        ValueError: not a categorical column, or a sequence column (embed it instead).
    """
    if not isinstance(categorical_column, CategoricalColumn):
        raise ValueError(
            "indicator_column: categorical_column must be a categorical column "
            f"(categorical_column_with_*, bucketized_column, crossed_column), got "
            f"{categorical_column!r}"
        )
    if categorical_column.is_sequence:
        raise ValueError(
            f"indicator_column: sequence column '{categorical_column.name}' has no multi-hot "
            "form here; use embedding_column with max_sequence_length"
        )
    return IndicatorColumn(categorical_column)
