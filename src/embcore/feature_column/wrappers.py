"""Weighted and sequence forms of a categorical column, and rebuilding columns from config.

``weighted_categorical_column(c, "w")`` gives ``c``'s ids a float32 weight each, read from
``features["w"]`` and aligned entry for entry; ``sequence_categorical_column_with_*(...)`` mark
a column as a sequence, embedded one vector per position.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from embcore._validate import describe
from embcore.feature_column.bucketized import BucketizedColumn
from embcore.feature_column.categorical import (
    CategoricalColumn,
    ColumnIds,
    RawIdsColumn,
    categorical_column_with_hash_bucket,
    categorical_column_with_identity,
    check_key,
    get_feature,
)
from embcore.feature_column.crossed import crossed_column
from embcore.feature_column.raw_inputs import to_ragged
from embcore.feature_column.vocabulary import (
    categorical_column_with_vocabulary_file,
    categorical_column_with_vocabulary_list,
)

__all__ = [
    "SequenceCategoricalColumn",
    "WeightedCategoricalColumn",
    "categorical_column_from_config",
    "sequence_categorical_column_with_hash_bucket",
    "sequence_categorical_column_with_identity",
    "sequence_categorical_column_with_vocabulary_file",
    "sequence_categorical_column_with_vocabulary_list",
    "weighted_categorical_column",
]


@dataclass(frozen=True, eq=False, init=False)
class WeightedCategoricalColumn(CategoricalColumn):
    """A categorical column whose ids carry the float weights in ``features[weight_key]``,
    aligned entry for entry with the ids."""

    categorical_column: CategoricalColumn
    weight_feature_key: str

    def __init__(self, categorical_column: CategoricalColumn, weight_feature_key: str) -> None:
        object.__setattr__(self, "key", categorical_column.key)
        object.__setattr__(self, "categorical_column", categorical_column)
        object.__setattr__(self, "weight_feature_key", weight_feature_key)

    @property
    def name(self) -> str:
        return f"{self.categorical_column.name}_weighted_by_{self.weight_feature_key}"

    @property
    def num_buckets(self) -> int:
        return self.categorical_column.num_buckets

    @property
    def is_sequence(self) -> bool:
        return self.categorical_column.is_sequence

    @property
    def weight_key(self) -> str:
        return self.weight_feature_key

    def _map(self, values: np.ndarray, kind: str) -> np.ndarray:
        return self.categorical_column._map(values, kind)

    def transform(self, features: Mapping[str, Any]) -> ColumnIds:
        ids = to_ragged(self.key, get_feature(features, self.key, self.name))
        weights = to_ragged(self.weight_key, get_feature(features, self.weight_key, self.name))
        if weights.kind == "string":
            raise TypeError(
                f"feature column '{self.name}': weights '{self.weight_key}' must be numbers, "
                "got strings"
            )
        if not np.array_equal(ids.row_splits, weights.row_splits):
            raise ValueError(
                f"feature column '{self.name}': weights '{self.weight_key}' are not aligned with "
                f"ids '{self.key}': row lengths {weights.row_lengths().tolist()} vs "
                f"{ids.row_lengths().tolist()}"
            )
        if (ids.columns is None) != (weights.columns is None) or (
            ids.columns is not None and not np.array_equal(ids.columns, weights.columns)
        ):
            raise ValueError(
                f"feature column '{self.name}': weights '{self.weight_key}' are not aligned with "
                f"ids '{self.key}': sparse ids and weights must share their indices"
            )
        kept, keep = ids.drop_padding()
        w = weights.values if keep is None else weights.values[keep]
        ids = self._map(kept.values, kept.kind)
        return ColumnIds(ids, kept.row_splits, w.astype(np.float32), kept.columns)

    def to_config(self) -> dict[str, Any]:
        return {
            "type": "weighted",
            "categorical_column": self.categorical_column.to_config(),
            "weight_feature_key": self.weight_feature_key,
        }


@dataclass(frozen=True, eq=False, init=False)
class SequenceCategoricalColumn(CategoricalColumn):
    """A categorical column read as a sequence: one embedding per position."""

    categorical_column: CategoricalColumn

    def __init__(self, categorical_column: CategoricalColumn) -> None:
        if not isinstance(categorical_column, CategoricalColumn):
            raise TypeError(
                "SequenceCategoricalColumn: categorical_column must be a categorical column, "
                f"got {describe(categorical_column)}"
            )
        if categorical_column.is_sequence:
            raise ValueError(
                f"SequenceCategoricalColumn: '{categorical_column.name}' is already a sequence"
            )
        object.__setattr__(self, "key", categorical_column.key)
        object.__setattr__(self, "categorical_column", categorical_column)

    @property
    def name(self) -> str:
        return self.categorical_column.name

    @property
    def num_buckets(self) -> int:
        return self.categorical_column.num_buckets

    @property
    def is_sequence(self) -> bool:
        return True

    @property
    def weight_key(self) -> str | None:
        return self.categorical_column.weight_key

    def _map(self, values: np.ndarray, kind: str) -> np.ndarray:
        return self.categorical_column._map(values, kind)

    def transform(self, features: Mapping[str, Any]) -> ColumnIds:
        return self.categorical_column.transform(features)

    def to_config(self) -> dict[str, Any]:
        return {"type": "sequence", "categorical_column": self.categorical_column.to_config()}


# --------------------------------------------------------------------------------- builders


def weighted_categorical_column(
    categorical_column: CategoricalColumn, weight_feature_key: str, dtype: Any = None
) -> WeightedCategoricalColumn:
    """Attach per-id weights read from ``features[weight_feature_key]`` (cast to float32).

    Raises:
        TypeError: ``categorical_column`` is not a categorical column.
        ValueError: a bad weight key, or a column that already has weights.
    """
    owner = f"weighted_categorical_column(weight_feature_key={weight_feature_key!r})"
    if not isinstance(categorical_column, CategoricalColumn):
        raise TypeError(
            f"{owner}: categorical_column must be a categorical column, got "
            f"{describe(categorical_column)}"
        )
    check_key(owner, weight_feature_key)
    if categorical_column.weight_key is not None:
        raise ValueError(f"{owner}: '{categorical_column.name}' already has weights")
    if weight_feature_key == categorical_column.key:
        raise ValueError(f"{owner}: the weight key must differ from the id key")
    if dtype is not None and np.dtype(dtype).kind != "f":
        raise ValueError(f"{owner}: dtype must be a float type, got {dtype!r}")
    return WeightedCategoricalColumn(categorical_column, weight_feature_key)


def sequence_categorical_column_with_identity(
    key: str, num_buckets: int, default_value: int | None = None
) -> SequenceCategoricalColumn:
    """The sequence form of :func:`categorical_column_with_identity`."""
    return SequenceCategoricalColumn(
        categorical_column_with_identity(key, num_buckets, default_value)
    )


def sequence_categorical_column_with_vocabulary_list(
    key: str,
    vocabulary_list: Sequence[str | int],
    dtype: Any = None,
    default_value: int = -1,
    num_oov_buckets: int = 0,
) -> SequenceCategoricalColumn:
    """The sequence form of :func:`categorical_column_with_vocabulary_list`."""
    return SequenceCategoricalColumn(
        categorical_column_with_vocabulary_list(
            key, vocabulary_list, dtype, default_value, num_oov_buckets
        )
    )


def sequence_categorical_column_with_vocabulary_file(
    key: str,
    vocabulary_file: str,
    vocabulary_size: int | None = None,
    num_oov_buckets: int = 0,
    default_value: int | None = None,
    dtype: Any = str,
) -> SequenceCategoricalColumn:
    """The sequence form of :func:`categorical_column_with_vocabulary_file`."""
    return SequenceCategoricalColumn(
        categorical_column_with_vocabulary_file(
            key, vocabulary_file, vocabulary_size, num_oov_buckets, default_value, dtype
        )
    )


def sequence_categorical_column_with_hash_bucket(
    key: str, hash_bucket_size: int, dtype: Any = str
) -> SequenceCategoricalColumn:
    """The sequence form of :func:`categorical_column_with_hash_bucket`."""
    return SequenceCategoricalColumn(
        categorical_column_with_hash_bucket(key, hash_bucket_size, dtype)
    )


def categorical_column_from_config(config: Mapping[str, Any]) -> CategoricalColumn:
    """Rebuild a column from :meth:`CategoricalColumn.to_config` (vocabulary files come back
    as vocabulary lists with the same ids)."""
    kind = config["type"]
    if kind == "identity":
        return categorical_column_with_identity(
            config["key"], config["num_buckets"], config["default_value"]
        )
    if kind == "vocabulary_list":
        return categorical_column_with_vocabulary_list(
            config["key"],
            config["vocabulary_list"],
            "int64" if config["dtype"] == "int" else "string",
            config["default_value"],
            config["num_oov_buckets"],
        )
    if kind == "hash_bucket":
        return categorical_column_with_hash_bucket(
            config["key"], config["hash_bucket_size"], "int64" if config["dtype"] == "int" else str
        )
    if kind == "raw_ids":
        return RawIdsColumn(config["key"], config["num_buckets"])
    if kind == "weighted":
        return weighted_categorical_column(
            categorical_column_from_config(config["categorical_column"]),
            config["weight_feature_key"],
        )
    if kind == "sequence":
        return SequenceCategoricalColumn(
            categorical_column_from_config(config["categorical_column"])
        )
    if kind == "bucketized":
        return BucketizedColumn.from_config(config)
    if kind == "crossed":
        keys = [
            k if isinstance(k, str) else categorical_column_from_config(k) for k in config["keys"]
        ]
        return crossed_column(keys, config["hash_bucket_size"], config["hash_key"])
    raise ValueError(f"categorical_column_from_config: unknown column type {kind!r}")
