"""``crossed_column``: every combination of several features' values, hashed to one id.

TensorFlow's ``tf.feature_column.crossed_column(keys, hash_bucket_size, hash_key)`` (its
``SparseCross`` kernel with hashed output). A crossed key is expanded into its own keys, then
the keys are put in TensorFlow's kernel order: first the sparse ones (categorical columns, and
raw features given as ragged rows, ``RaggedIds``, sparse tensors or pyarrow arrays), then the
dense ones (raw features given as NumPy arrays, dense tensors or flat lists), each group in
key order. An example's crosses are the Cartesian product of its values in each key, in that
order, the last key varying fastest; an example with no value in some key has no cross. Each
cross hashes as::

    h = hash_key                                   (default 0xDECAFCAFFE, TensorFlow's)
    for each key, in that order:  h = FingerprintCat64(h, feature)
    id = h % hash_bucket_size                      (unsigned 64-bit)

where a string value's ``feature`` is its FarmHash ``Fingerprint64`` and an integer's (raw
int64 values, or the ids of a categorical key such as ``-1`` for out of vocabulary) is the
integer itself as an unsigned 64-bit value. Raw features are crossed as given: a dense input's
``""`` or ``-1`` entries are values too (TensorFlow drops padding only inside categorical
columns). See docs/feature_columns.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from embcore._validate import check_int
from embcore.feature_column.categorical import (
    CategoricalColumn,
    ColumnIds,
    HashedCategoricalColumn,
    get_feature,
)
from embcore.feature_column.hashing import fingerprint_cat64, fingerprints
from embcore.feature_column.raw_inputs import to_ragged

__all__ = ["DEFAULT_HASH_KEY", "CrossedColumn", "crossed_column"]

#: TensorFlow's ``sparse_cross_hashed`` key when ``hash_key`` is not given.
DEFAULT_HASH_KEY = 0xDECAFCAFFE
_ROWS = (list, tuple, np.ndarray)


@dataclass(frozen=True, eq=False, init=False)
class CrossedColumn(CategoricalColumn):
    """The crosses of ``keys`` (raw feature names or categorical columns); build it with
    :func:`crossed_column`."""

    keys: tuple[str | CategoricalColumn, ...]
    hash_bucket_size: int
    hash_key: int

    def __init__(
        self, keys: tuple[str | CategoricalColumn, ...], hash_bucket_size: int, hash_key: int
    ) -> None:
        names = [k if isinstance(k, str) else k.name for k in _leaves(keys)]
        object.__setattr__(self, "key", "_X_".join(sorted(names)))  # TensorFlow's name
        object.__setattr__(self, "keys", keys)
        object.__setattr__(self, "hash_bucket_size", hash_bucket_size)
        object.__setattr__(self, "hash_key", hash_key)

    @property
    def num_buckets(self) -> int:
        return self.hash_bucket_size

    def _features(self, key: str | CategoricalColumn, features: Mapping[str, Any]) -> tuple:
        """One key's ``(values (N,) uint64, row_splits (B+1,) int64, dense)``."""
        if isinstance(key, str):
            given = get_feature(features, key, self.name)
            raw = to_ragged(key, given)
            if raw.kind == "float":
                raise TypeError(
                    f"feature column '{self.name}': feature '{key}' must hold strings or "
                    "integers to be crossed, got floats (bucketize them first)"
                )
            flat_list = isinstance(given, (list, tuple)) and not any(
                isinstance(v, _ROWS) for v in given
            )
            dense = raw.dense or flat_list  # what TensorFlow would hold as a dense Tensor
            if raw.kind == "string":
                return fingerprints(raw.values), raw.row_splits, dense
            return raw.values.astype(np.int64).view(np.uint64), raw.row_splits, dense
        ids = key.transform(features)
        if ids.weights is not None:
            raise ValueError(
                f"feature column '{self.name}': crossed_column does not take weighted columns, "
                f"got '{key.name}'"
            )
        return ids.ids.astype(np.int64).view(np.uint64), ids.row_splits, False

    def transform(self, features: Mapping[str, Any]) -> ColumnIds:
        """The ids of every cross of every example, in rows (see the module docstring)."""
        leaves = [self._features(k, features) for k in _leaves(self.keys)]
        leaves.sort(key=lambda leaf: leaf[2])  # stable: sparse keys, then dense ones
        rows = {len(splits) - 1 for _, splits, _ in leaves}
        if len(rows) != 1:
            raise ValueError(
                f"feature column '{self.name}': its keys have different batch sizes "
                f"{[len(s) - 1 for _, s, _ in leaves]}"
            )
        (batch,) = rows
        # Partial crosses, ordered by (row, earlier keys); each key multiplies them by its
        # row's values, appended as the fastest-varying position.
        row = np.arange(batch, dtype=np.int64)
        hashes = np.full(batch, np.uint64(self.hash_key), dtype=np.uint64)
        for values, splits, _ in leaves:
            counts = np.diff(splits)[row]
            parent = np.repeat(np.arange(len(row)), counts)
            first = np.repeat(np.cumsum(counts) - counts, counts)
            within = np.arange(len(parent), dtype=np.int64) - first
            row = row[parent]
            hashes = fingerprint_cat64(hashes[parent], values[splits[row] + within])
        splits = np.zeros(batch + 1, dtype=np.int64)
        np.cumsum(np.bincount(row, minlength=batch), out=splits[1:])
        ids = (hashes % np.uint64(self.hash_bucket_size)).astype(np.int64)
        return ColumnIds(ids, splits)

    def to_config(self) -> dict[str, Any]:
        return {
            "type": "crossed",
            "keys": [k if isinstance(k, str) else k.to_config() for k in self.keys],
            "hash_bucket_size": self.hash_bucket_size,
            "hash_key": self.hash_key,
        }


def _leaves(keys: Sequence[str | CategoricalColumn]) -> list[str | CategoricalColumn]:
    """``keys`` with every crossed key replaced by its own keys, recursively."""
    out: list[str | CategoricalColumn] = []
    for key in keys:
        out.extend(_leaves(key.keys) if isinstance(key, CrossedColumn) else [key])
    return out


def crossed_column(
    keys: Sequence[str | CategoricalColumn], hash_bucket_size: int, hash_key: int | None = None
) -> CrossedColumn:
    """``tf.feature_column.crossed_column``: the hashed crosses of ``keys``.

    Args:
        keys: two or more feature names (raw string or integer features) or categorical
            columns (not hashed ones, as in TensorFlow; crossed columns are expanded).
        hash_bucket_size: ids are in ``[0, hash_bucket_size)``.
        hash_key: the first value of the hash chain (``None``: TensorFlow's default).

    Raises:
        ValueError: fewer than two keys, a key that is neither a name nor a categorical
            column, a hashed or sequence column, or a ``hash_bucket_size`` < 1.
    """
    owner = "crossed_column"
    if isinstance(keys, (str, CategoricalColumn)) or not isinstance(keys, Sequence):
        raise ValueError(f"{owner}: keys must be a list of two or more keys, got {keys!r}")
    if len(keys) < 2:
        raise ValueError(f"{owner}: keys must be a list of two or more keys, got {list(keys)}")
    for key in keys:
        if isinstance(key, str) and key:
            continue
        if not isinstance(key, CategoricalColumn):
            raise ValueError(
                f"{owner}: each key must be a feature name or a categorical column, got {key!r}"
            )
        if isinstance(key, HashedCategoricalColumn):
            raise ValueError(
                f"{owner}: hashed column '{key.name}' cannot be crossed (as in TensorFlow); "
                f"cross its feature name '{key.key}' instead"
            )
        if key.is_sequence:
            raise ValueError(f"{owner}: sequence column '{key.name}' cannot be crossed")
    size = check_int(owner, "hash_bucket_size", hash_bucket_size, minimum=1)
    if hash_key is None:
        hash_key = DEFAULT_HASH_KEY
    elif not 0 <= check_int(owner, "hash_key", hash_key, minimum=0) < 2**64:
        raise ValueError(f"{owner}: hash_key must fit in 64 bits, got {hash_key}")
    return CrossedColumn(tuple(keys), size, int(hash_key))
