"""Embedding columns: a categorical column looked up in an embedding table
(docs/semantics.md §1.18).

``embedding_column(categorical, dimension)`` gives a column with its own table named
``"tbl_" + categorical.name``; ``shared_embedding_columns([a, b], dimension)`` gives one column
per categorical column, all reading one table named ``"tbl_" + collection name``, whose default
is the sorted column names joined by ``"_"`` plus ``"_shared_embedding"``.

Where the lookup runs (``embedding_lookup_device``; the plain names are embcore's aliases):

============================  ==========  ====================================================
TensorFlow name               alias       meaning in embcore
============================  ==========  ====================================================
``"tpu_embedding_core"``      ``engine``  the :class:`EmbeddingEngine`: sparse in-engine update
``"tpu_tensor_core"``         ``dense``   a dense ``[B, tensor_core_shape[1]]`` lookup in the
                                          model; the table is a parameter trained by the
                                          model's own torch optimizer
``"cpu"``                     ``host``    serving only: a lookup in the trained engine tables;
                                          training such a column raises ``ValueError``
``None``                                  the engine (training and serving alike)
============================  ==========  ====================================================
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from embcore._validate import check_int, describe
from embcore.config import COMBINERS
from embcore.feature_column.categorical import CategoricalColumn
from embcore.feature_column.wrappers import categorical_column_from_config

__all__ = [
    "LOOKUP_DEVICES",
    "EmbeddingColumn",
    "EmbeddingTable",
    "embedding_column",
    "embedding_columns_from_config",
    "shared_embedding_columns",
]

LOOKUP_DEVICES: dict[str, str] = {
    "tpu_embedding_core": "engine",
    "engine": "engine",
    "tpu_tensor_core": "dense",
    "dense": "dense",
    "cpu": "cpu",
    "host": "cpu",
}


@dataclass(frozen=True, eq=False)
class EmbeddingTable:
    """What the columns of one table share. Built by the functions below; columns of one
    ``shared_embedding_columns`` call hold the same object.

    Attributes:
        name: the engine table name (``"tbl_..."``, or a ``table_to_config_dict`` key).
        lookup_device: ``"engine"``, ``"dense"``, ``"cpu"`` or ``None`` (see the module doc).
        learning_rate, optimization_parameters: per-table overrides from a v1 ``TableConfig``.
    """

    name: str
    num_buckets: int
    dimension: int
    combiner: str = "mean"
    initializer: Callable[..., Any] | None = None
    learning_rate_fn: Callable[[int], float] | None = None
    lookup_device: str | None = None
    tensor_core_shape: tuple[int | None, int] | None = None
    use_safe_embedding_lookup: bool = True
    shared: bool = False
    learning_rate: float | None = None
    optimization_parameters: Any = None

    def to_config(self) -> dict[str, Any]:
        """The serving-relevant fields (callables and optimizers are training-only)."""
        return {
            "name": self.name,
            "num_buckets": self.num_buckets,
            "dimension": self.dimension,
            "combiner": self.combiner,
            "lookup_device": self.lookup_device,
            "tensor_core_shape": None
            if self.tensor_core_shape is None
            else list(self.tensor_core_shape),
            "use_safe_embedding_lookup": self.use_safe_embedding_lookup,
            "shared": self.shared,
        }


@dataclass(frozen=True, eq=False)
class EmbeddingColumn:
    """A categorical column embedded in :attr:`table`; activations are ``(B, dimension)``, or
    ``(B, max_sequence_length, dimension)`` for a sequence column."""

    categorical_column: CategoricalColumn
    table: EmbeddingTable
    max_sequence_length: int = 0

    @property
    def name(self) -> str:
        suffix = "_shared_embedding" if self.table.shared else "_embedding"
        return self.categorical_column.name + suffix

    @property
    def feature_key(self) -> str:
        """The feature the ids come from; also the key of this column's activation."""
        return self.categorical_column.key

    @property
    def weight_key(self) -> str | None:
        return self.categorical_column.weight_key

    @property
    def is_sequence(self) -> bool:
        return self.categorical_column.is_sequence

    @property
    def dimension(self) -> int:
        return self.table.dimension

    @property
    def combiner(self) -> str:
        return self.table.combiner

    @property
    def lookup_device(self) -> str | None:
        return self.table.lookup_device

    def to_config(self) -> dict[str, Any]:
        return {
            "categorical_column": self.categorical_column.to_config(),
            "table": self.table.to_config(),
            "max_sequence_length": self.max_sequence_length,
        }


# ------------------------------------------------------------------------------- validation


def _check_categorical(owner: str, column: Any) -> CategoricalColumn:
    if not isinstance(column, CategoricalColumn):
        raise TypeError(
            f"{owner}: categorical_column must be a categorical column (categorical_column_with_"
            f"identity, _vocabulary_list, _vocabulary_file, _hash_bucket, weighted_categorical_"
            f"column or a sequence_ variant), got {describe(column)}"
        )
    return column


def _check_table_args(
    owner: str,
    dimension: Any,
    combiner: Any,
    initializer: Any,
    learning_rate_fn: Any,
    embedding_lookup_device: Any,
    tensor_core_shape: Any,
    use_safe_embedding_lookup: Any,
) -> dict[str, Any]:
    """The checks every embedding column makes (docs/semantics.md §1.18), in TensorFlow's order."""
    dimension = check_int(owner, "dimension", dimension, minimum=1)
    shape = None
    if tensor_core_shape is not None:
        if (
            isinstance(tensor_core_shape, (str, bytes))
            or not isinstance(tensor_core_shape, Sequence)
            or len(tensor_core_shape) != 2
        ):
            raise ValueError(
                f"{owner}: tensor_core_shape must be a list of length 2 [batch, width], got "
                f"{tensor_core_shape!r}"
            )
        batch, width = tensor_core_shape
        if batch is not None and batch != -1:
            batch = check_int(owner, "tensor_core_shape[0]", batch, minimum=1)
        shape = (
            None if batch in (None, -1) else batch,
            check_int(owner, "tensor_core_shape[1]", width, minimum=1),
        )
    if initializer is not None and not callable(initializer):
        raise ValueError(f"{owner}: initializer must be callable if specified, got {initializer!r}")
    if combiner not in COMBINERS:
        raise ValueError(f"{owner}: combiner must be one of {list(COMBINERS)}, got {combiner!r}")
    if learning_rate_fn is not None and not callable(learning_rate_fn):
        raise ValueError(
            f"{owner}: learning_rate_fn must be a function of the global step, got "
            f"{describe(learning_rate_fn)}"
        )
    device = None
    if embedding_lookup_device is not None:
        if embedding_lookup_device not in LOOKUP_DEVICES:
            raise ValueError(
                f"{owner}: embedding_lookup_device must be one of {sorted(LOOKUP_DEVICES)} or "
                f"None, got {embedding_lookup_device!r}"
            )
        device = LOOKUP_DEVICES[embedding_lookup_device]
    if device == "dense":
        if shape is None:
            raise ValueError(
                f"{owner}: embedding_lookup_device={embedding_lookup_device!r} requires "
                "tensor_core_shape=[batch, width]"
            )
        if learning_rate_fn is not None:
            raise ValueError(
                f"{owner}: learning_rate_fn applies to engine tables; a 'tpu_tensor_core' (dense) "
                "table is trained by the model's own optimizer"
            )
        if combiner == "sqrtn":
            raise ValueError(
                f"{owner}: the dense ('tpu_tensor_core') lookup supports combiner 'mean' or "
                "'sum', got 'sqrtn'"
            )
    elif shape is not None:
        raise ValueError(
            f"{owner}: tensor_core_shape is only used with embedding_lookup_device="
            f"'tpu_tensor_core' (alias 'dense'), got embedding_lookup_device="
            f"{embedding_lookup_device!r}"
        )
    if not isinstance(use_safe_embedding_lookup, bool):
        raise ValueError(
            f"{owner}: use_safe_embedding_lookup must be True or False, got "
            f"{describe(use_safe_embedding_lookup)}"
        )
    return {
        "dimension": dimension,
        "combiner": combiner,
        "initializer": initializer,
        "learning_rate_fn": learning_rate_fn,
        "lookup_device": device,
        "tensor_core_shape": shape,
        "use_safe_embedding_lookup": use_safe_embedding_lookup,
    }


def _check_column(owner: str, column: CategoricalColumn, length: Any, device: str | None) -> int:
    length = check_int(owner, "max_sequence_length", length, minimum=0)
    if column.is_sequence and length < 1:
        raise ValueError(
            f"{owner}: max_sequence_length must be > 0 for the sequence column "
            f"'{column.name}', got {length}"
        )
    if not column.is_sequence and length != 0:
        raise ValueError(
            f"{owner}: max_sequence_length must be 0 for the non-sequence column "
            f"'{column.name}', got {length}"
        )
    if device == "dense" and column.is_sequence:
        raise ValueError(
            f"{owner}: the dense ('tpu_tensor_core') lookup does not support the sequence "
            f"column '{column.name}'"
        )
    if device == "dense" and column.weight_key is not None:
        warnings.warn(
            f"{owner}: the dense ('tpu_tensor_core') lookup ignores the weights "
            f"'{column.weight_key}' of '{column.name}', as TensorFlow does",
            UserWarning,
            stacklevel=3,
        )
    return length


# --------------------------------------------------------------------------------- builders


def embedding_column(
    categorical_column: CategoricalColumn,
    dimension: int,
    combiner: str = "mean",
    initializer: Callable[..., Any] | None = None,
    max_sequence_length: int = 0,
    learning_rate_fn: Callable[[int], float] | None = None,
    embedding_lookup_device: str | None = None,
    tensor_core_shape: Sequence[int | None] | None = None,
    use_safe_embedding_lookup: bool = True,
) -> EmbeddingColumn:
    """Embed ``categorical_column`` in its own ``(num_buckets, dimension)`` table.

    Args:
        categorical_column: any categorical column of this package (sequence ones included).
        dimension: the embedding width, an int > 0.
        combiner: ``"mean"``, ``"sum"`` or ``"sqrtn"``: how an example's ids are combined
            (not used by sequence columns, whose positions each get their own vector).
        initializer: ``initializer(shape, dtype=torch.float32)`` returning the table; the
            default is a truncated normal with std ``1/sqrt(dimension)``.
        max_sequence_length: > 0 for sequence columns (longer rows are truncated, shorter
            ones padded with zero vectors), exactly 0 otherwise.
        learning_rate_fn: ``fn(global_step) -> learning rate`` for this table; pass the same
            function object to tables that share a schedule.
        embedding_lookup_device: see the module docstring.
        tensor_core_shape: ``[batch, width]`` for the dense lookup; ``batch`` may be ``None``
            or -1; ids at position >= ``width`` in a row are dropped.
        use_safe_embedding_lookup: prune ids < 0 and, for mean/sqrtn, weights <= 0, as
            ``safe_embedding_lookup_sparse`` (embcore applies it on every path).

    Raises:
        TypeError: ``categorical_column`` is not a categorical column.
        ValueError: any argument outside the rules above.
    """
    owner = f"embedding_column({getattr(categorical_column, 'name', categorical_column)!r})"
    column = _check_categorical(owner, categorical_column)
    args = _check_table_args(
        owner,
        dimension,
        combiner,
        initializer,
        learning_rate_fn,
        embedding_lookup_device,
        tensor_core_shape,
        use_safe_embedding_lookup,
    )
    length = _check_column(owner, column, max_sequence_length, args["lookup_device"])
    table = EmbeddingTable(name="tbl_" + column.name, num_buckets=column.num_buckets, **args)
    return EmbeddingColumn(column, table, length)


def shared_embedding_columns(
    categorical_columns: Sequence[CategoricalColumn],
    dimension: int,
    combiner: str = "mean",
    initializer: Callable[..., Any] | None = None,
    shared_embedding_collection_name: str | None = None,
    max_sequence_lengths: Sequence[int] | None = None,
    learning_rate_fn: Callable[[int], float] | None = None,
    embedding_lookup_device: str | None = None,
    tensor_core_shape: Sequence[int | None] | None = None,
    use_safe_embedding_lookup: bool = True,
) -> list[EmbeddingColumn]:
    """Embed several categorical columns in one shared table; one column per input.

    Arguments as :func:`embedding_column`, plus ``shared_embedding_collection_name`` (the
    table is ``"tbl_" + name``) and ``max_sequence_lengths``, one per column (``None`` or
    ``[]``: all 0).

    Raises:
        TypeError: an element is not a categorical column.
        ValueError: no columns, a repeated feature key, different ``num_buckets``, a
            ``max_sequence_lengths`` of the wrong length, or any check of ``embedding_column``.
    """
    owner = "shared_embedding_columns"
    if isinstance(categorical_columns, CategoricalColumn) or not isinstance(
        categorical_columns, Sequence
    ):
        raise ValueError(f"{owner}: categorical_columns must be a list of categorical columns")
    columns = [_check_categorical(owner, c) for c in categorical_columns]
    if not columns:
        raise ValueError(f"{owner}: categorical_columns must not be empty")
    keys = [c.key for c in columns]
    if len(set(keys)) != len(keys):
        raise ValueError(f"{owner}: each column needs its own feature key, got {keys}")
    buckets = {c.name: c.num_buckets for c in columns}
    if len(set(buckets.values())) > 1:
        raise ValueError(f"{owner}: all columns must have the same num_buckets, got {buckets}")
    lengths = list(max_sequence_lengths or [0] * len(columns))
    if len(lengths) != len(columns):
        raise ValueError(
            f"{owner}: max_sequence_lengths has {len(lengths)} entries for {len(columns)} "
            "columns; give one per column"
        )
    args = _check_table_args(
        owner,
        dimension,
        combiner,
        initializer,
        learning_rate_fn,
        embedding_lookup_device,
        tensor_core_shape,
        use_safe_embedding_lookup,
    )
    name = shared_embedding_collection_name
    if name is None:
        name = "_".join(sorted(c.name for c in columns)) + "_shared_embedding"
    elif not isinstance(name, str) or not name:
        raise ValueError(f"{owner}: shared_embedding_collection_name must be a non-empty str")
    table = EmbeddingTable(
        name="tbl_" + name, num_buckets=columns[0].num_buckets, shared=True, **args
    )
    return [
        EmbeddingColumn(c, table, _check_column(owner, c, n, args["lookup_device"]))
        for c, n in zip(columns, lengths, strict=True)
    ]


def embedding_columns_from_config(configs: Sequence[Mapping[str, Any]]) -> list[EmbeddingColumn]:
    """Rebuild columns from :meth:`EmbeddingColumn.to_config`; columns that named the same
    table share it again. Initializers and learning-rate functions are not restored."""
    tables: dict[str, EmbeddingTable] = {}
    out = []
    for config in configs:
        t = dict(config["table"])
        if t["tensor_core_shape"] is not None:
            t["tensor_core_shape"] = tuple(t["tensor_core_shape"])
        table = tables.setdefault(t["name"], EmbeddingTable(**t))
        column = categorical_column_from_config(config["categorical_column"])
        out.append(EmbeddingColumn(column, table, int(config["max_sequence_length"])))
    return out
