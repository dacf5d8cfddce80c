"""``DenseFeatures``: raw features in, one dense tensor of embeddings out.

Columns are ordered by name (as TensorFlow's ``DenseFeatures`` does) and their ``(B, dim)``
activations concatenated::

    DenseFeatures([video_embedding, query_embedding])(features)   # (B, dim_query + dim_video)

Dense columns are concatenated in the same name order: ``numeric_column`` as ``(B,
prod(shape))`` float32 values, ``indicator_column`` as ``(B, num_buckets)`` multi-hot values and
``bucketized_column`` as ``(B, width * (len(boundaries) + 1))`` one-hot values. With sequence
columns the result is a :class:`DenseFeaturesOutput`: the concatenated pooled columns (``None``
if there are none), and per sequence column its ``(B, L, dim)`` activations and ``(B,)``
lengths.

Inside an :class:`~embcore.estimator.Estimator`'s ``model_fn`` the features arrive already
looked up (:class:`EmbeddedFeatures`) and ``DenseFeatures`` only arranges them; on a raw
feature dict it looks them up itself, in tables it creates on the first call (like a Keras
layer's ``build``) or on :meth:`DenseFeatures.build`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from embcore.feature_column.bucketized import BucketizedColumn
from embcore.feature_column.embedding import EmbeddingColumn
from embcore.feature_column.indicator import IndicatorColumn
from embcore.feature_column.lookup import EmbeddedFeatures, EmbeddingLookup, OptimizerChoice
from embcore.feature_column.numeric import NumericColumn

#: Columns whose values DenseFeatures computes from the raw features (no table to look up).
DENSE_COLUMNS = (NumericColumn, IndicatorColumn, BucketizedColumn)
Column = EmbeddingColumn | NumericColumn | IndicatorColumn | BucketizedColumn

__all__ = ["DenseFeatures", "DenseFeaturesOutput"]


class DenseFeaturesOutput(NamedTuple):
    """What :class:`DenseFeatures` returns when it has sequence columns.

    Attributes:
        dense: ``(B, Σ dim)`` the pooled columns concatenated by name, or ``None``.
        sequence: ``{column name: (B, L, dim)}``; positions past a row's length are zeros.
        sequence_lengths: ``{column name: (B,) int64}``.
    """

    dense: Tensor | None
    sequence: dict[str, Tensor]
    sequence_lengths: dict[str, Tensor]


class DenseFeatures(nn.Module):
    """Embedding columns as a module (see the module docstring).

    Args:
        feature_columns: an embedding, numeric, indicator or bucketized column, or a list of
            them.
        optimizer: trains the engine tables when the module looks up raw features itself in
            training mode (``loss.backward()`` applies the update); ``None``: lookup only.
        seed: seeds the default initializers of the tables it creates.
        device: where those tables live.

    Raises:
        TypeError: an element is not one of those columns.
        ValueError: no columns, or two columns with one name.
    """

    def __init__(
        self,
        feature_columns: Column | Sequence[Column],
        optimizer: OptimizerChoice = None,
        *,
        seed: int = 0,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        if isinstance(feature_columns, (EmbeddingColumn, *DENSE_COLUMNS)):
            feature_columns = [feature_columns]
        columns = list(feature_columns)
        for c in columns:
            if not isinstance(c, (EmbeddingColumn, *DENSE_COLUMNS)):
                raise TypeError(
                    f"DenseFeatures: expected embedding columns (embedding_column, "
                    f"shared_embedding_columns), numeric_column, indicator_column or "
                    f"bucketized_column, got {c!r}"
                )
        if not columns:
            raise ValueError("DenseFeatures: feature_columns must not be empty")
        names = [c.name for c in columns]
        if len(set(names)) != len(names):
            raise ValueError(f"DenseFeatures: duplicate columns in {names}")
        self.all_columns = tuple(sorted(columns, key=lambda c: c.name))
        #: The embedding columns (dense columns need no lookup).
        self.feature_columns = tuple(c for c in self.all_columns if isinstance(c, EmbeddingColumn))
        self._optimizer, self._seed, self._device = optimizer, seed, device
        self.lookup: EmbeddingLookup | None = None

    @property
    def has_sequence_columns(self) -> bool:
        return any(c.is_sequence for c in self.feature_columns)

    def build(self) -> EmbeddingLookup:
        """Create the tables (once) for looking up raw features."""
        if self.lookup is None:
            self.lookup = EmbeddingLookup(
                self.feature_columns, self._optimizer, seed=self._seed, device=self._device
            )
            self.lookup.train(self.training)
        return self.lookup

    def forward(self, features: Mapping[str, Any]) -> Tensor | DenseFeaturesOutput:
        """``(B, Σ dim)``, or a :class:`DenseFeaturesOutput` with sequence columns."""
        if isinstance(features, EmbeddedFeatures):
            acts, lengths = features.activations, features.sequence_lengths
            missing = [c.name for c in self.feature_columns if c.feature_key not in acts]
            if missing:
                raise ValueError(
                    f"DenseFeatures: columns {missing} were not looked up; add them to the "
                    "EmbeddingConfigSpec's feature_columns"
                )
        elif self.feature_columns:
            acts, lengths = self.build()(features)
        else:
            acts, lengths = {}, {}
        pooled = [
            c.dense(features) if isinstance(c, DENSE_COLUMNS) else acts[c.feature_key]
            for c in self.all_columns
            if isinstance(c, DENSE_COLUMNS) or not c.is_sequence
        ]
        dense = torch.cat(pooled, dim=1) if pooled else None
        if not self.has_sequence_columns:
            return dense  # type: ignore[return-value]
        sequence = {c.name: acts[c.feature_key] for c in self.feature_columns if c.is_sequence}
        seq_lengths = {
            c.name: lengths[c.feature_key] for c in self.feature_columns if c.is_sequence
        }
        return DenseFeaturesOutput(dense, sequence, seq_lengths)
