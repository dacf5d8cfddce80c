"""``numeric_column``: a dense feature passed through (optionally normalized) by DenseFeatures.

TensorFlow's ``tf.feature_column.numeric_column``: ``features[key]`` holds ``(B, *shape)``
numbers (a list, NumPy array or tensor; ``(B,)`` for ``shape=(1,)``), which
:class:`~embcore.feature_column.DenseFeatures` flattens to ``(B, prod(shape))`` float32 and
concatenates with the other columns in name order (docs/feature_columns.md).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

__all__ = ["NumericColumn", "numeric_column"]


@dataclass(frozen=True)
class NumericColumn:
    """A numeric feature (see the module docstring); build it with :func:`numeric_column`."""

    key: str
    shape: tuple[int, ...]
    default_value: float | None
    dtype: torch.dtype
    normalizer_fn: Callable[[Tensor], Tensor] | None

    @property
    def name(self) -> str:
        return self.key

    @property
    def width(self) -> int:
        """Values per example: ``prod(shape)``."""
        return math.prod(self.shape)

    def dense(self, features: Mapping[str, Any]) -> Tensor:
        """``(B, width) float32`` from ``features[key]``, normalized.

        Raises:
            ValueError: the feature is missing (and no ``default_value``) or has another shape.
        """
        if self.key not in features:
            raise ValueError(f"numeric_column('{self.key}'): the features have no '{self.key}'")
        value = features[self.key]
        values = torch.as_tensor(
            np.asarray(value) if not isinstance(value, Tensor) else value, dtype=self.dtype
        )
        rows = values.shape[0] if values.dim() else 1
        if values.numel() != rows * self.width:
            raise ValueError(
                f"numeric_column('{self.key}'): expected {self.width} value(s) per example "
                f"(shape {self.shape}), got a value of shape {tuple(values.shape)}"
            )
        values = values.reshape(rows, self.width).to(torch.float32)
        if self.default_value is not None:
            values = torch.nan_to_num(values, nan=float(self.default_value))
        return self.normalizer_fn(values) if self.normalizer_fn is not None else values


def numeric_column(
    key: str,
    shape: int | Sequence[int] = (1,),
    default_value: float | None = None,
    dtype: torch.dtype = torch.float32,
    normalizer_fn: Callable[[Tensor], Tensor] | None = None,
) -> NumericColumn:
    """``tf.feature_column.numeric_column``: a dense feature of ``shape`` per example.

    Args:
        key: the feature's name in the feature dict.
        shape: values per example (an int or a tuple).
        default_value: replaces NaN (missing) values; ``None`` keeps them.
        dtype: a floating or integer torch dtype the input is read as.
        normalizer_fn: applied to the ``(B, prod(shape)) float32`` values.

    Raises:
        ValueError: an empty key, a non-positive shape or a non-numeric dtype.
    """
    if not isinstance(key, str) or not key:
        raise ValueError(f"numeric_column: key must be a non-empty string, got {key!r}")
    dims = (shape,) if isinstance(shape, int) else tuple(shape)
    if not dims or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in dims):
        raise ValueError(f"numeric_column('{key}'): shape must be ints >= 1, got {shape!r}")
    if not isinstance(dtype, torch.dtype) or dtype == torch.bool or dtype.is_complex:
        raise ValueError(
            f"numeric_column('{key}'): dtype must be a numeric torch dtype, got {dtype!r}"
        )
    if default_value is not None and not isinstance(default_value, (int, float)):
        raise ValueError(
            f"numeric_column('{key}'): default_value must be a number or None, got "
            f"{default_value!r}"
        )
    if normalizer_fn is not None and not callable(normalizer_fn):
        raise ValueError(f"numeric_column('{key}'): normalizer_fn must be callable")
    return NumericColumn(key, dims, default_value, dtype, normalizer_fn)
