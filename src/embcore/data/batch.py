"""The batch type of the main job and the Criteo layout it follows.

A Criteo row is a click label, 13 integer ("dense") features and 26 hashed categorical
("sparse") features. Every data source here (synthetic, TSV, Parquet) yields the same
:class:`Batch`, already preprocessed, so that the model never sees raw strings::

    dense   (B, 13) float32   log(1 + max(x, 0)), missing -> 0
    sparse  (B, 26) int64     row ids in [0, vocab_sizes[f]), missing -> 0; or raw 64-bit
                              ids, missing -> MISSING_KEY (:func:`categorical_keys`)
    labels  (B,)    float32   0.0 or 1.0 (NaN for unlabeled rows to score)

Other sources (MovieLens) have other widths, described by a :class:`~embcore.data.layout.Layout`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "CRITEO_CARDINALITIES",
    "DENSE_NAMES",
    "MISSING_KEY",
    "NUM_DENSE",
    "NUM_SPARSE",
    "SPARSE_NAMES",
    "Batch",
    "capped_vocab_sizes",
    "categorical_ids",
    "categorical_keys",
    "dense_transform",
    "rebatch",
]

NUM_DENSE = 13
NUM_SPARSE = 26
DENSE_NAMES: tuple[str, ...] = tuple(f"I{i + 1}" for i in range(NUM_DENSE))
SPARSE_NAMES: tuple[str, ...] = tuple(f"C{i + 1}" for i in range(NUM_SPARSE))

#: Distinct values of each categorical column of the Criteo Kaggle display-ads data, in order.
CRITEO_CARDINALITIES: tuple[int, ...] = (
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194,
    27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572,
)  # fmt: skip


def capped_vocab_sizes(cap: int, cardinalities: Sequence[int] = CRITEO_CARDINALITIES) -> list[int]:
    """Table sizes ``min(cardinality, cap)``: the cap bounds memory, ids are folded into it."""
    if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
        raise ValueError(f"capped_vocab_sizes: cap must be an int >= 1, got {cap!r}")
    return [min(int(c), cap) for c in cardinalities]


def dense_transform(raw: np.ndarray) -> np.ndarray:
    """Criteo's usual dense preprocessing: ``log(1 + max(x, 0))``, NaN (missing) -> 0.

    Args:
        raw: ``(B, 13)`` float64 counts, NaN where missing (some Criteo counts are negative).

    Returns:
        ``(B, 13) float32``.
    """
    x = np.nan_to_num(raw, nan=0.0)
    return np.log1p(np.maximum(x, 0.0)).astype(np.float32)


def categorical_ids(raw: np.ndarray, vocab_sizes: Sequence[int]) -> np.ndarray:
    """Fold raw categorical values (Criteo's 32-bit hashes) into table rows.

    Missing (``-1``) becomes row 0; a value ``h >= 0`` becomes ``1 + h % (vocab - 1)``, so row 0
    means "missing" only (a one-row table maps everything to 0).

    Args:
        raw: ``(B, 26) int64``, ``-1`` where missing.
        vocab_sizes: the 26 table sizes.

    Returns:
        ``(B, 26) int64`` rows.
    """
    vocab = np.asarray(vocab_sizes, dtype=np.int64)
    buckets = np.maximum(vocab - 1, 1)
    ids = 1 + raw % buckets
    ids = np.where(vocab > 1, ids, 0)
    return np.where(raw < 0, 0, ids).astype(np.int64)


#: The raw id of a missing categorical value: no hash is negative, so it is a key of its own.
MISSING_KEY = -1


def categorical_keys(raw: np.ndarray) -> np.ndarray:
    """Raw categorical values as the 64-bit keys of dynamic tables (or of fixed tables that
    fold them, ``data.raw_ids``): a hash ``h`` is the key ``h``, missing is :data:`MISSING_KEY`.

    Args:
        raw: ``(B, F) int64``, ``-1`` where missing.

    Returns:
        ``(B, F) int64`` keys.
    """
    return np.where(raw < 0, MISSING_KEY, raw).astype(np.int64)


@dataclass(frozen=True, eq=False)
class Batch:
    """One preprocessed batch (shapes in the module docstring)."""

    dense: Tensor
    sparse: Tensor
    labels: Tensor

    def __post_init__(self) -> None:
        b = self.labels.shape[0] if self.labels.dim() == 1 else -1
        if (
            self.labels.dim() != 1
            or self.labels.dtype != torch.float32
            or self.dense.dim() != 2
            or self.dense.shape[0] != b
            or self.dense.dtype != torch.float32
            or self.sparse.dim() != 2
            or self.sparse.shape[0] != b
            or self.sparse.dtype != torch.int64
        ):
            raise ValueError(
                f"Batch: expected dense (B, D) float32, sparse (B, S) int64 and labels (B,) "
                f"float32 (D = {NUM_DENSE}, S = {NUM_SPARSE} for Criteo rows), got dense "
                f"{tuple(self.dense.shape)} {self.dense.dtype}, sparse "
                f"{tuple(self.sparse.shape)} {self.sparse.dtype}, labels "
                f"{tuple(self.labels.shape)} {self.labels.dtype}"
            )

    @property
    def size(self) -> int:
        """Number of rows ``B``."""
        return int(self.labels.shape[0])

    @classmethod
    def from_numpy(cls, dense: np.ndarray, sparse: np.ndarray, labels: np.ndarray) -> Batch:
        """Wrap arrays (converted to float32 / int64 / float32) without copying when possible."""

        def tensor(x: np.ndarray, dtype: type) -> Tensor:
            # read-only arrays (e.g. from pyarrow) are copied: torch tensors are writable
            return torch.from_numpy(np.require(x, dtype=dtype, requirements=["C", "W"]))

        return cls(
            dense=tensor(dense, np.float32),
            sparse=tensor(sparse, np.int64),
            labels=tensor(labels, np.float32),
        )

    @staticmethod
    def concat(batches: Sequence[Batch]) -> Batch:
        """One batch holding the rows of ``batches`` in order."""
        return Batch(
            dense=torch.cat([b.dense for b in batches]),
            sparse=torch.cat([b.sparse for b in batches]),
            labels=torch.cat([b.labels for b in batches]),
        )

    def slice(self, start: int, stop: int) -> Batch:
        """Rows ``[start, stop)``."""
        return Batch(self.dense[start:stop], self.sparse[start:stop], self.labels[start:stop])


def rebatch(batches: Iterable[Batch], batch_size: int, drop_last: bool = False) -> Iterator[Batch]:
    """Re-cut a stream of batches of any sizes into batches of exactly ``batch_size`` rows.

    The last batch may be smaller unless ``drop_last``.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"rebatch: batch_size must be an int >= 1, got {batch_size!r}")
    pending: list[Batch] = []
    rows = 0
    for batch in batches:
        pending.append(batch)
        rows += batch.size
        if rows < batch_size:
            continue
        merged = Batch.concat(pending)
        start = 0
        while rows - start >= batch_size:
            yield merged.slice(start, start + batch_size)
            start += batch_size
        pending = [merged.slice(start, rows)] if start < rows else []
        rows -= start
    if rows and not drop_last:
        yield Batch.concat(pending)
