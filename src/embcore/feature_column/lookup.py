"""Embedding columns turned into tables and activations.

:class:`EmbeddingLookup` owns the state of a set of embedding columns: one
:class:`~embcore.EmbeddingEngine` for the engine columns (feature ``key`` -> table
``tbl_...``), and one dense parameter per ``"dense"`` (``tpu_tensor_core``) table. It turns a
raw feature dict into engine inputs (:meth:`EmbeddingLookup.transform`) and activations::

    raw {"video": [[3, 7], [5]], "query": ["a b", ...]}
      -> ids {"video": RaggedIds(values=[3, 7, 5], row_splits=[0, 2, 3]), ...}
      -> activations {"video": (B, dim), "clicks": (B, L, dim), ...}   keyed by feature key

:class:`EmbeddedFeatures` is a raw feature dict that already carries the activations: the
:class:`~embcore.estimator.Estimator` hands one to ``model_fn``, and ``DenseFeatures`` reads it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from embcore.config import FeatureConfig, TableConfig
from embcore.engine import EmbeddingEngine
from embcore.feature_column.categorical import ColumnIds
from embcore.feature_column.config_spec import check_embedding_columns
from embcore.feature_column.embedding import EmbeddingColumn, EmbeddingTable
from embcore.initializers import initial_rows
from embcore.inputs import RaggedIds
from embcore.optimizers import Optimizer

__all__ = ["EmbeddedFeatures", "EmbeddingLookup", "TransformedFeatures"]

OptimizerChoice = Optimizer | Callable[[EmbeddingTable], Optimizer | None] | None


class EmbeddedFeatures(dict):
    """The raw features of a batch, with the embedding columns already looked up.

    Attributes:
        activations: ``{feature key: (B, dim) or (B, L, dim) float32}``.
        sequence_lengths: ``{feature key: (B,) int64}`` for sequence columns:
            ``min(last position + 1, max_sequence_length)`` (a sparse input's positions are
            its column indices, see ``raw_inputs``).
    """

    def __init__(
        self,
        raw: Mapping[str, Any],
        activations: Mapping[str, Tensor],
        sequence_lengths: Mapping[str, Tensor] | None = None,
    ) -> None:
        super().__init__(raw)
        self.activations = dict(activations)
        self.sequence_lengths = dict(sequence_lengths or {})


@dataclass(frozen=True, eq=False)
class TransformedFeatures:
    """A batch ready for lookup: ``ids``/``weights`` for the engine (``RaggedIds`` by feature
    key, or a ``(B, width)`` sparse tensor for a sequence whose ids have gaps between their
    positions; unweighted features absent from ``weights``), ``dense`` ids for dense columns,
    and ``lengths`` ``(B,) int64`` for sequence columns."""

    ids: dict[str, RaggedIds | Tensor]
    weights: dict[str, RaggedIds | Tensor]
    dense: dict[str, ColumnIds]
    lengths: dict[str, Tensor]
    batch_size: int
    raw: Mapping[str, Any] = field(repr=False, default_factory=dict)


def _ragged(values: np.ndarray, row_splits: np.ndarray) -> RaggedIds:
    # A copy when needed: torch wants writable memory (pyarrow gives read-only views).
    values = np.require(values, requirements=["C", "W"])
    return RaggedIds(
        torch.from_numpy(values), torch.from_numpy(np.require(row_splits, requirements=["W"]))
    )


def _positioned(values: np.ndarray, col: ColumnIds) -> Tensor:
    """A ``(B, last position + 1)`` sparse tensor holding ``values`` at ``(row, position)``:
    how the engine takes a sequence whose ids sit at given positions (``indices[:, 1]``)."""
    rows = np.repeat(np.arange(len(col.row_splits) - 1, dtype=np.int64), np.diff(col.row_splits))
    positions = col.positions if col.positions is not None else np.zeros(0, dtype=np.int64)
    width = int(positions.max()) + 1 if len(positions) else 1
    indices = torch.from_numpy(np.stack([rows, positions]))  # (2, N)
    values = np.require(values, requirements=["C", "W"])
    batch = len(col.row_splits) - 1
    # The indices are in range and unique by construction: no need to check them again.
    return torch.sparse_coo_tensor(
        indices, torch.from_numpy(values), (batch, width), check_invariants=False
    )


def _engine_input(values: np.ndarray, col: ColumnIds, positioned: bool) -> RaggedIds | Tensor:
    return _positioned(values, col) if positioned else _ragged(values, col.row_splits)


class EmbeddingLookup(nn.Module):
    """The tables of a set of embedding columns, and their lookups.

    Args:
        columns: embedding columns; each feature key at most once.
        optimizer: for the engine tables: an embcore optimizer for all of them, a function
            ``table -> optimizer``, or ``None`` for lookup-only tables.
        seed: seeds the default initializers (engine and dense tables alike).
        device: where tables and activations live.
        engine_options: extra keyword arguments for :class:`~embcore.EmbeddingEngine`.

    Raises:
        TypeError, ValueError: a column that is not an embedding column, a feature key used
            twice, or two different tables with one name.
    """

    def __init__(
        self,
        columns: Sequence[EmbeddingColumn],
        optimizer: OptimizerChoice = None,
        *,
        seed: int = 0,
        device: torch.device | str | None = None,
        engine_options: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        columns = tuple(columns)
        for c in columns:
            if not isinstance(c, EmbeddingColumn):
                raise TypeError(f"EmbeddingLookup: expected embedding columns, got {c!r}")
        if not columns:
            raise ValueError("EmbeddingLookup: no columns")
        check_embedding_columns("EmbeddingLookup", columns)
        self.columns = columns
        self.device = torch.device("cpu" if device is None else device)
        tables: dict[str, EmbeddingTable] = {}
        for c in columns:
            tables.setdefault(c.table.name, c.table)
        engine_columns = [c for c in columns if c.lookup_device != "dense"]
        self.engine: EmbeddingEngine | None = None
        if engine_columns:
            configs = {
                name: TableConfig(
                    vocabulary_size=t.num_buckets,
                    dim=t.dimension,
                    initializer=t.initializer,
                    optimizer=optimizer(t) if callable(optimizer) else optimizer,
                    combiner=t.combiner,
                    name=name,
                    safe_lookup=t.use_safe_embedding_lookup,
                )
                for name, t in tables.items()
                if t.lookup_device != "dense"
            }
            feature_config = {
                c.feature_key: FeatureConfig(
                    table=configs[c.table.name],
                    max_sequence_length=c.max_sequence_length,
                    name=c.feature_key,
                )
                for c in engine_columns
            }
            self.engine = EmbeddingEngine(
                feature_config, seed=seed, device=self.device, **dict(engine_options or {})
            )
        # Dense tables are model parameters (trained by the model's torch optimizer).
        self.dense_table_names = [n for n, t in tables.items() if t.lookup_device == "dense"]
        self.dense_params = nn.ParameterList(
            nn.Parameter(
                initial_rows(
                    n, tables[n].num_buckets, tables[n].dimension, tables[n].initializer, seed
                ).to(self.device)
            )
            for n in self.dense_table_names
        )

    @property
    def dense_tables(self) -> dict[str, nn.Parameter]:
        """``{table name: (vocab, dim) parameter}`` of the dense (``tpu_tensor_core``) tables."""
        return dict(zip(self.dense_table_names, self.dense_params, strict=True))

    @property
    def host_columns(self) -> list[EmbeddingColumn]:
        """Columns whose lookup device is ``"cpu"`` (serving only)."""
        return [c for c in self.columns if c.lookup_device == "cpu"]

    def check_trainable(self) -> None:
        """Raise ``ValueError`` if a column may only be served (``"cpu"``)."""
        if self.host_columns:
            names = [c.name for c in self.host_columns]
            raise ValueError(
                f"columns {names} have embedding_lookup_device='cpu', which is for serving "
                "only; use None or 'tpu_embedding_core' (alias 'engine') to train them"
            )

    # ------------------------------------------------------------------------- transform
    def transform(self, features: Mapping[str, Any]) -> TransformedFeatures:
        """Map every column's raw feature to ids (see the module docstring).

        Raises:
            ValueError: a missing feature, a bad value, or columns with different batch sizes.
        """
        if not isinstance(features, Mapping):
            raise TypeError(f"features must be a dict, got {type(features).__name__}")
        ids, weights, dense, lengths = {}, {}, {}, {}
        sizes: dict[str, int] = {}
        for c in self.columns:
            col = c.categorical_column.transform(features)
            rows = len(col.row_splits) - 1
            sizes[c.feature_key] = rows
            if c.is_sequence:
                lengths[c.feature_key] = torch.from_numpy(
                    np.minimum(col.sequence_lengths(), c.max_sequence_length)
                ).to(self.device)
            if c.lookup_device == "dense":
                dense[c.feature_key] = col
                continue
            # A sequence with given positions goes in as a sparse tensor (the engine embeds
            # each id at its column index); everything else as ragged rows.
            positioned = c.is_sequence and col.positions is not None
            ids[c.feature_key] = _engine_input(col.ids, col, positioned)
            if col.weights is not None:
                weights[c.feature_key] = _engine_input(col.weights, col, positioned)
        if len(set(sizes.values())) > 1:
            raise ValueError(f"features have different batch sizes: {sizes}")
        return TransformedFeatures(
            ids, weights, dense, lengths, next(iter(sizes.values())), features
        )

    # -------------------------------------------------------------------------- lookups
    def dense_activations(self, batch: TransformedFeatures) -> dict[str, Tensor]:
        """``(B, dim)`` activations of the dense columns, differentiable in their tables."""
        out = {}
        tables = self.dense_tables
        for c in self.columns:
            if c.lookup_device == "dense":
                out[c.feature_key] = _dense_lookup(
                    c, tables[c.table.name], batch.dense[c.feature_key], self.device
                )
        return out

    def forward(self, features: Mapping[str, Any]) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        """Activations and sequence lengths by feature key, PyTorch style: in training mode
        with optimizers, ``loss.backward()`` updates the engine tables."""
        batch = self.transform(features)
        acts: dict[str, Tensor] = {}
        if self.engine is not None:
            trains = self.training and torch.is_grad_enabled()
            if trains and all(t.optimizer is not None for t in self.engine.tables):
                self.check_trainable()
            acts.update(self.engine(batch.ids, batch.weights or None))
        acts.update(self.dense_activations(batch))
        return acts, batch.lengths


def _dense_lookup(
    column: EmbeddingColumn, table: Tensor, col: ColumnIds, device: torch.device
) -> Tensor:
    """The TensorCore lookup (docs/semantics.md §1.18): ids densified to ``[B, width]`` (ids at
    positions, i.e. column indices, >= width dropped), ``sum`` or ``mean`` (``Σe / max(count, 1)``:
    empty rows are 0); weights ignored."""
    batch_dim, width = column.table.tensor_core_shape  # type: ignore[misc]
    rows = len(col.row_splits) - 1
    if batch_dim is not None and batch_dim != rows:
        raise ValueError(
            f"feature '{column.feature_key}': tensor_core_shape {[batch_dim, width]} expects a "
            f"batch of {batch_dim}, got {rows}"
        )
    lengths = np.diff(col.row_splits)
    row_of = np.repeat(np.arange(rows, dtype=np.int64), lengths)
    position = col.positions  # a sparse or padded input's column index, as TensorFlow's
    if position is None:
        position = np.arange(len(col.ids)) - np.repeat(col.row_splits[:-1], lengths)
    keep = position < width
    if column.table.use_safe_embedding_lookup:
        keep &= col.ids >= 0
    ids, row_of = col.ids[keep], row_of[keep]
    vocab = table.shape[0]
    bad = (ids < 0) | (ids >= vocab)
    if bad.any():
        raise ValueError(
            f"feature '{column.feature_key}': id {int(ids[np.flatnonzero(bad)[0]])} is out of "
            f"range for table '{column.table.name}' with vocabulary_size {vocab}"
        )
    ids_t = torch.from_numpy(ids).to(device)
    rows_t = torch.from_numpy(row_of).to(device)
    out = torch.zeros(rows, table.shape[1], dtype=table.dtype, device=device)
    out = out.index_add(0, rows_t, table[ids_t])  # (B, dim)
    if column.combiner == "mean":
        counts = torch.bincount(rows_t, minlength=rows).clamp(min=1).to(table.dtype)
        out = out / counts[:, None]
    return out
