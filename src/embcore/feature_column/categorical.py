"""Categorical columns: map a raw feature (ints, strings, lists of them) to ids in ``[0, n)``.

A column reads ``features[key]`` (any container :func:`to_ragged` accepts) and returns one row
of ids per example::

    column                                    raw row         ids
    categorical_column_with_identity(k, 10)   [3, 7]          [3, 7]
    ..._with_vocabulary_list(k, ["a", "b"])   ["b", "zz"]     [1, -1]   (-1: default_value)
    ..._with_hash_bucket(k, 100)              ["zz"]          [fingerprint64("zz") % 100]

This module holds the base class and the identity and hash columns; ``vocabulary`` the
vocabulary columns; ``wrappers`` the weighted and sequence forms. Columns are frozen and hold
no state.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from embcore._validate import check_int, describe
from embcore.feature_column.hashing import hash_buckets
from embcore.feature_column.raw_inputs import to_ragged

__all__ = [
    "CategoricalColumn",
    "ColumnIds",
    "HashedCategoricalColumn",
    "IdentityCategoricalColumn",
    "RawIdsColumn",
    "categorical_column_with_hash_bucket",
    "categorical_column_with_identity",
]


@dataclass(frozen=True, eq=False)
class ColumnIds:
    """One column's ids for a batch: ``ids`` ``(N,) int64`` in rows split by ``row_splits``
    ``(B+1,) int64``, ``weights`` ``(N,) float32`` or ``None``, and ``positions`` ``(N,)
    int64``, each id's position in its row (increasing within a row), or ``None`` for
    ``0, 1, ...`` (see ``raw_inputs``)."""

    ids: np.ndarray
    row_splits: np.ndarray
    weights: np.ndarray | None = None
    positions: np.ndarray | None = None

    def sequence_lengths(self) -> np.ndarray:
        """``(B,) int64``: each row's last position + 1, 0 for an empty row (TensorFlow's
        ``sequence_length_from_sparse_tensor``)."""
        lengths = np.diff(self.row_splits)
        if self.positions is None:
            return lengths
        out = np.zeros(len(lengths), dtype=np.int64)
        full = lengths > 0
        out[full] = self.positions[self.row_splits[1:][full] - 1] + 1
        return out


def check_key(owner: str, key: Any) -> str:
    if not isinstance(key, str) or not key:
        raise ValueError(f"{owner}: key must be a non-empty str, got {describe(key)}")
    return key


def dtype_kind(owner: str, dtype: Any) -> str:
    """``"string"`` or ``"int"`` from a dtype-like (str, int, "string", "int64", NumPy or
    torch integer dtypes)."""
    if dtype in (str, bytes, "string", "str"):
        return "string"
    if dtype in (int, "int", "int32", "int64"):
        return "int"
    integral = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)
    if isinstance(dtype, torch.dtype) and dtype in integral:
        return "int"
    try:
        kind = np.dtype(dtype).kind
    except TypeError:
        kind = ""
    if kind in "iu" and kind:
        return "int"
    if kind in "US" and kind:
        return "string"
    raise ValueError(f"{owner}: dtype must be a string or an integer type, got {dtype!r}")


def value_kind(value: Any) -> str:
    if isinstance(value, str):
        return "string"
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        return "int"
    return "other"


def get_feature(features: Mapping[str, Any], key: str, column: str) -> Any:
    if key not in features:
        raise ValueError(
            f"feature column '{column}': feature '{key}' is not in the features dict (keys: "
            f"{sorted(map(str, features))})"
        )
    return features[key]


@dataclass(frozen=True, eq=False)
class CategoricalColumn:
    """Base class: reads ``features[key]`` and maps each value to an id."""

    key: str

    @property
    def name(self) -> str:
        return self.key

    @property
    def num_buckets(self) -> int:
        raise NotImplementedError

    @property
    def is_sequence(self) -> bool:
        return False

    @property
    def weight_key(self) -> str | None:
        return None

    def _map(self, values: np.ndarray, kind: str) -> np.ndarray:
        """``(N,) int64`` ids of ``values`` of ``kind`` ("int", "float" or "string")."""
        raise NotImplementedError

    def _expect(self, kind: str, expected: str) -> None:
        if kind != expected:
            raise TypeError(
                f"feature column '{self.name}': feature '{self.key}' must hold {expected} "
                f"values, got {kind} values"
            )

    def transform(self, features: Mapping[str, Any]) -> ColumnIds:
        """The ids of one batch, padding of dense inputs dropped (see ``raw_inputs``)."""
        ragged, _ = to_ragged(self.key, get_feature(features, self.key, self.name)).drop_padding()
        return ColumnIds(
            self._map(ragged.values, ragged.kind), ragged.row_splits, positions=ragged.columns
        )

    def to_config(self) -> dict[str, Any]:
        raise NotImplementedError


@dataclass(frozen=True, eq=False)
class IdentityCategoricalColumn(CategoricalColumn):
    """Integer values used as ids; values outside ``[0, num_buckets)`` become
    ``default_value``, or raise ``ValueError`` naming the key and the value if it is None."""

    number_of_buckets: int = 1
    default_value: int | None = None

    @property
    def num_buckets(self) -> int:
        return self.number_of_buckets

    def _map(self, values: np.ndarray, kind: str) -> np.ndarray:
        self._expect(kind, "int")
        bad = (values < 0) | (values >= self.num_buckets)
        if not bad.any():
            return values
        if self.default_value is None:
            v = int(values[np.flatnonzero(bad)[0]])
            raise ValueError(
                f"categorical_column_with_identity(key='{self.key}'): value {v} is out of range "
                f"[0, {self.num_buckets}); set default_value to map such values to a bucket"
            )
        return np.where(bad, self.default_value, values)

    def to_config(self) -> dict[str, Any]:
        return {
            "type": "identity",
            "key": self.key,
            "num_buckets": self.num_buckets,
            "default_value": self.default_value,
        }


@dataclass(frozen=True, eq=False)
class HashedCategoricalColumn(CategoricalColumn):
    """``fingerprint64(value) % hash_bucket_size`` (see ``hashing``)."""

    hash_bucket_size: int = 1
    kind: str = "string"

    @property
    def num_buckets(self) -> int:
        return self.hash_bucket_size

    def _map(self, values: np.ndarray, kind: str) -> np.ndarray:
        self._expect(kind, self.kind)
        return hash_buckets(values, self.hash_bucket_size)

    def to_config(self) -> dict[str, Any]:
        return {
            "type": "hash_bucket",
            "key": self.key,
            "hash_bucket_size": self.hash_bucket_size,
            "dtype": self.kind,
        }


@dataclass(frozen=True, eq=False)
class RawIdsColumn(CategoricalColumn):
    """Integer ids passed through unchanged (the engine checks their range); what a
    ``feature_to_config_dict`` feature reads."""

    number_of_buckets: int = 1

    @property
    def num_buckets(self) -> int:
        return self.number_of_buckets

    def _map(self, values: np.ndarray, kind: str) -> np.ndarray:
        self._expect(kind, "int")
        return values

    def to_config(self) -> dict[str, Any]:
        return {"type": "raw_ids", "key": self.key, "num_buckets": self.num_buckets}


# --------------------------------------------------------------------------------- builders


def categorical_column_with_identity(
    key: str, num_buckets: int, default_value: int | None = None
) -> IdentityCategoricalColumn:
    """Integer values used as ids in ``[0, num_buckets)``.

    Raises:
        ValueError: ``num_buckets`` < 1, or ``default_value`` outside ``[0, num_buckets)``.
    """
    owner = f"categorical_column_with_identity(key={key!r})"
    check_key(owner, key)
    num_buckets = check_int(owner, "num_buckets", num_buckets, minimum=1)
    if default_value is not None:
        default_value = check_int(owner, "default_value", default_value, minimum=0)
        if default_value >= num_buckets:
            raise ValueError(
                f"{owner}: default_value must be in [0, {num_buckets}), got {default_value}"
            )
    return IdentityCategoricalColumn(key, num_buckets, default_value)


def categorical_column_with_hash_bucket(
    key: str, hash_bucket_size: int, dtype: Any = str
) -> HashedCategoricalColumn:
    """``fingerprint64(value) % hash_bucket_size``; integers hash through their decimal text.

    Raises:
        ValueError: ``hash_bucket_size`` < 1 or a dtype that is neither string nor integer.
    """
    owner = f"categorical_column_with_hash_bucket(key={key!r})"
    check_key(owner, key)
    size = check_int(owner, "hash_bucket_size", hash_bucket_size, minimum=1)
    return HashedCategoricalColumn(key, size, dtype_kind(owner, dtype))
