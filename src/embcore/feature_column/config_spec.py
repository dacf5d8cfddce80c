"""``EmbeddingConfigSpec``: what an :class:`~embcore.estimator.Estimator` embeds and how it
trains the tables (docs/semantics.md §1.20), plus the v1 ``TableConfig``/``FeatureConfig`` of its
dict form.

Two ways to say what to embed, exactly one of which is given:

* ``feature_columns``: embedding columns (tables ``"tbl_" + name``, features read through
  their categorical columns);
* ``feature_to_config_dict`` and ``table_to_config_dict``: v1 configs; the features are ids
  already (any container a feature column accepts), the tables are named by their dict keys.

How each table is trained::

    optimizer  = embcore optimizer of (the table's optimization_parameters or the spec's)
    rate       = learning_rate_fn(global_step)  if the column / table has one
               = table learning_rate            if not None (0.0 freezes it;
                                                docs/semantics.md §6 pitfall 26)
               = the optimizer's learning_rate  otherwise
    clipvalue  = (-clipping_limit, clipping_limit) intersected with the optimizer's own clip
    gradients  = d(loss)/d(activation) * experimental_gradient_multiplier_fn(global_step)
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from embcore._validate import check_bool, check_int, check_real, describe
from embcore.config import COMBINERS
from embcore.engine import EmbeddingEngine
from embcore.feature_column.categorical import RawIdsColumn
from embcore.feature_column.embedding import EmbeddingColumn, EmbeddingTable
from embcore.feature_column.parameters import (
    AdagradParameters,
    AdamParameters,
    FtrlParameters,
    OptimizationParameters,
    StochasticGradientDescentParameters,
    replace_quietly,
    to_optimizer,
)
from embcore.feature_column.wrappers import SequenceCategoricalColumn, WeightedCategoricalColumn
from embcore.optimizers import Optimizer

__all__ = ["EmbeddingConfigSpec", "V1FeatureConfig", "V1TableConfig"]

SUPPORTED_PARAMETERS = (
    AdagradParameters,
    AdamParameters,
    FtrlParameters,
    StochasticGradientDescentParameters,
)
PARTITION_STRATEGIES = ("div", "mod")


def _check_parameters(owner: str, field: str, value: Any) -> None:
    if not isinstance(value, (*SUPPORTED_PARAMETERS, Optimizer)):
        raise ValueError(
            f"{owner}: {field} must be one of AdagradParameters, AdamParameters, FtrlParameters, "
            f"StochasticGradientDescentParameters (or an embcore optimizer), got {describe(value)}"
        )


@dataclass(frozen=True, eq=False)
class V1TableConfig:
    """A v1 table (``tpu_embedding.TableConfig``): rows, width and per-table training options.

    ``combiner=None`` means one id per example and is run as ``"sum"``. At most one of
    ``learning_rate`` (a constant; ``0.0`` is honoured) and ``learning_rate_fn``.
    ``hot_id_replication`` only changes TPU performance and is accepted as is.
    """

    vocabulary_size: int
    dimension: int
    initializer: Callable[..., Any] | None = None
    combiner: str | None = "mean"
    hot_id_replication: bool = False
    learning_rate: float | None = None
    learning_rate_fn: Callable[[int], float] | None = None
    optimization_parameters: OptimizationParameters | Optimizer | None = None

    def __post_init__(self) -> None:
        owner = "TableConfig"
        check_int(owner, "vocabulary_size", self.vocabulary_size, minimum=1)
        check_int(owner, "dimension", self.dimension, minimum=1)
        if self.initializer is not None and not callable(self.initializer):
            raise ValueError(f"{owner}: initializer must be callable if specified")
        if self.combiner is not None and self.combiner not in COMBINERS:
            raise ValueError(
                f"{owner}: combiner must be one of {list(COMBINERS)} or None, got {self.combiner!r}"
            )
        check_bool(owner, "hot_id_replication", self.hot_id_replication)
        if self.learning_rate is not None and self.learning_rate_fn is not None:
            raise ValueError(
                f"{owner}: at most one of learning_rate and learning_rate_fn may be set, got "
                f"{self.learning_rate} and {self.learning_rate_fn!r}"
            )
        if self.learning_rate is not None:
            check_real(owner, "learning_rate", self.learning_rate, minimum=0.0)
        if self.learning_rate_fn is not None and not callable(self.learning_rate_fn):
            raise ValueError(f"{owner}: learning_rate_fn must be callable")
        if self.optimization_parameters is not None:
            _check_parameters(owner, "optimization_parameters", self.optimization_parameters)


@dataclass(frozen=True, eq=False)
class V1FeatureConfig:
    """A v1 feature (``tpu_embedding.FeatureConfig``): its table's key in
    ``table_to_config_dict``, its sequence length (0: pooled), and the feature holding its
    weights."""

    table_id: str
    max_sequence_length: int = 0
    weight_key: str | None = None

    def __post_init__(self) -> None:
        owner = f"FeatureConfig(table_id={self.table_id!r})"
        if not isinstance(self.table_id, str):
            raise ValueError(f"{owner}: table_id must be a str")
        check_int(owner, "max_sequence_length", self.max_sequence_length, minimum=0)
        if self.weight_key is not None and not isinstance(self.weight_key, str):
            raise ValueError(f"{owner}: weight_key must be a str or None")


def _clip(clipvalue: tuple[float | None, float | None] | None, limit: float) -> tuple:
    """Intersect an optimizer's clip range with ``[-limit, limit]``."""
    lo, hi = clipvalue if clipvalue is not None else (None, None)
    return (-limit if lo is None else max(lo, -limit), limit if hi is None else min(hi, limit))


@dataclass(frozen=True, eq=False)
class EmbeddingConfigSpec:
    """What to embed and how to train it (see the module docstring).

    Args:
        feature_columns: embedding columns (``embedding_column``/``shared_embedding_columns``).
        optimization_parameters: ``AdagradParameters``, ``AdamParameters``, ``FtrlParameters``
            or ``StochasticGradientDescentParameters`` (an embcore optimizer also works), for
            every table without its own.
        clipping_limit: clip every summed row gradient to ``[-limit, limit]`` (TensorFlow
            stores and ignores it; embcore applies it, docs/semantics.md §6 pitfall 23).
        pipeline_execution_with_tensor_core: pipelined training (one-step-stale activations,
            docs/semantics.md §4.5), handed to the engine.
        experimental_gradient_multiplier_fn: ``fn(global_step) -> float`` multiplying every
            activation gradient.
        feature_to_config_dict, table_to_config_dict: the dict form (v1 configs).
        partition_strategy: ``"div"`` or ``"mod"`` row sharding across processes; with one
            process both store the same table.
        profile_data_directory: where the engine writes lookup statistics (docs/semantics.md §4.6).

    Raises:
        ValueError: neither or both of the two forms, an unknown partition strategy, missing
            or unsupported optimization parameters, a feature key used by two columns, a
            feature whose table is unknown or a table no feature uses, a bad clipping limit.
        TypeError: a column that is not an embedding column, a dict value that is not a v1
            config.
    """

    feature_columns: Sequence[EmbeddingColumn] | None = None
    optimization_parameters: OptimizationParameters | Optimizer | None = None
    clipping_limit: float | None = None
    pipeline_execution_with_tensor_core: bool = False
    experimental_gradient_multiplier_fn: Callable[[int], float] | None = None
    feature_to_config_dict: Mapping[str, V1FeatureConfig] | None = None
    table_to_config_dict: Mapping[str, V1TableConfig] | None = None
    partition_strategy: str = "div"
    profile_data_directory: str | os.PathLike | None = None

    def __post_init__(self) -> None:
        owner = "EmbeddingConfigSpec"
        dicts = (self.feature_to_config_dict, self.table_to_config_dict)
        if self.feature_columns is None and None in dicts:
            raise ValueError(
                f"{owner}: specify feature_columns, or both feature_to_config_dict and "
                "table_to_config_dict"
            )
        if self.feature_columns is not None and dicts != (None, None):
            raise ValueError(
                f"{owner}: specify feature_columns or the pair feature_to_config_dict / "
                "table_to_config_dict, not both (TensorFlow would ignore the dicts)"
            )
        if self.partition_strategy not in PARTITION_STRATEGIES:
            raise ValueError(
                f"{owner}: partition_strategy must be 'div' or 'mod', got "
                f"{self.partition_strategy!r}"
            )
        if self.clipping_limit is not None:
            check_real(owner, "clipping_limit", self.clipping_limit, minimum=0.0)
        check_bool(
            owner, "pipeline_execution_with_tensor_core", self.pipeline_execution_with_tensor_core
        )
        fn = self.experimental_gradient_multiplier_fn
        if fn is not None and not callable(fn):
            raise ValueError(f"{owner}: experimental_gradient_multiplier_fn must be callable")
        directory = self.profile_data_directory
        if directory is not None and not isinstance(directory, (str, os.PathLike)):
            raise ValueError(f"{owner}: profile_data_directory must be a path or None")
        if self.feature_columns is not None:
            self._check_columns(owner)
        else:
            self._check_dicts(owner)

    def _check_columns(self, owner: str) -> None:
        columns = self.feature_columns
        if isinstance(columns, EmbeddingColumn):
            columns = [columns]
        if isinstance(columns, (str, bytes)) or not isinstance(columns, Sequence):
            raise TypeError(f"{owner}: feature_columns must be a list of embedding columns")
        for c in columns:
            if not isinstance(c, EmbeddingColumn):
                raise TypeError(
                    f"{owner}: feature_columns must be embedding columns (embedding_column, "
                    f"shared_embedding_columns), got {describe(c)}"
                )
        object.__setattr__(self, "feature_columns", tuple(columns))
        if self.optimization_parameters is None:
            raise ValueError(f"{owner}: optimization_parameters is required with feature_columns")
        _check_parameters(owner, "optimization_parameters", self.optimization_parameters)
        check_embedding_columns(owner, self.feature_columns)

    def _check_dicts(self, owner: str) -> None:
        features, tables = self.feature_to_config_dict, self.table_to_config_dict
        if not isinstance(features, Mapping) or not isinstance(tables, Mapping):
            raise TypeError(
                f"{owner}: feature_to_config_dict and table_to_config_dict must be dicts"
            )
        for name, t in tables.items():
            if not isinstance(t, V1TableConfig):
                raise TypeError(f"{owner}: table '{name}' must be a TableConfig, got {describe(t)}")
        for name, f in features.items():
            if not isinstance(f, V1FeatureConfig):
                raise TypeError(
                    f"{owner}: feature '{name}' must be a FeatureConfig, got {describe(f)}"
                )
            if f.table_id not in tables:
                raise ValueError(
                    f"{owner}: feature '{name}' uses table '{f.table_id}', which is not in "
                    f"table_to_config_dict ({sorted(tables)})"
                )
            if f.weight_key is not None and tables[f.table_id].combiner is None:
                raise ValueError(
                    f"{owner}: feature '{name}' has weight_key '{f.weight_key}' but its table "
                    "has combiner=None (one id per example takes no weights)"
                )
        unused = sorted(set(tables) - {f.table_id for f in features.values()})
        if unused:
            raise ValueError(f"{owner}: tables {unused} are not used by any feature")
        if self.optimization_parameters is not None:
            _check_parameters(owner, "optimization_parameters", self.optimization_parameters)
        elif any(t.optimization_parameters is None for t in tables.values()):
            raise ValueError(
                f"{owner}: optimization_parameters is required unless every table has its own"
            )

    # ----------------------------------------------------------------------- derived views
    @cached_property
    def embedding_columns(self) -> tuple[EmbeddingColumn, ...]:
        """Every column; the dict form becomes columns over raw ids, one table per key."""
        if self.feature_columns is not None:
            return tuple(self.feature_columns)
        tables = {
            name: EmbeddingTable(
                name=name,
                num_buckets=t.vocabulary_size,
                dimension=t.dimension,
                combiner=t.combiner or "sum",
                initializer=t.initializer,
                learning_rate_fn=t.learning_rate_fn,
                use_safe_embedding_lookup=False,
                shared=True,
                learning_rate=t.learning_rate,
                optimization_parameters=t.optimization_parameters,
            )
            for name, t in sorted(self.table_to_config_dict.items())  # type: ignore[union-attr]
        }
        columns = []
        for name, f in sorted(self.feature_to_config_dict.items()):  # type: ignore[union-attr]
            table = tables[f.table_id]
            column: Any = RawIdsColumn(name, table.num_buckets)
            if f.weight_key is not None:
                column = WeightedCategoricalColumn(column, f.weight_key)
            if f.max_sequence_length:
                column = SequenceCategoricalColumn(column)
            columns.append(EmbeddingColumn(column, table, f.max_sequence_length))
        return tuple(columns)

    @property
    def tensor_core_feature_columns(self) -> tuple[EmbeddingColumn, ...]:
        """The columns looked up densely in the model (``"tpu_tensor_core"``)."""
        return tuple(c for c in self.embedding_columns if c.lookup_device == "dense")

    def engine_options(self) -> dict[str, Any]:
        """The settings to hand to :class:`~embcore.EmbeddingEngine` that it accepts.

        Raises:
            NotImplementedError: pipelining was asked of an engine without it (a setting that
                changes numerics is never dropped; the other two change none and wait for an
                engine that takes them).
        """
        accepted = inspect.signature(EmbeddingEngine.__init__).parameters
        options: dict[str, Any] = {}
        if self.pipeline_execution_with_tensor_core:
            if "pipeline_execution_with_tensor_core" not in accepted:
                raise NotImplementedError(
                    "EmbeddingConfigSpec(pipeline_execution_with_tensor_core=True): this embcore "
                    "engine has no pipelined execution; use False"
                )
            options["pipeline_execution_with_tensor_core"] = True
        if self.profile_data_directory is not None and "profile_data_directory" in accepted:
            options["profile_data_directory"] = os.fspath(self.profile_data_directory)
        if "partition_strategy" in accepted:
            options["partition_strategy"] = self.partition_strategy
        return options

    def table_optimizers(
        self, global_step: Callable[[], int]
    ) -> Callable[[EmbeddingTable], Optimizer]:
        """A function giving each table its embcore optimizer (see the module docstring);
        learning-rate functions read ``global_step()`` when the engine asks for the rate."""
        rates: dict[int, Callable[[], float]] = {}

        def rate_of(fn: Callable[[int], float]) -> Callable[[], float]:
            # One closure per function object: the engine calls each distinct one once a step.
            return rates.setdefault(id(fn), lambda: float(fn(global_step())))

        def for_table(table: EmbeddingTable) -> Optimizer:
            params = table.optimization_parameters or self.optimization_parameters
            optimizer = to_optimizer(params)  # type: ignore[arg-type]
            changes: dict[str, Any] = {}
            if table.learning_rate_fn is not None:
                changes["learning_rate"] = rate_of(table.learning_rate_fn)
            elif table.learning_rate is not None:
                changes["learning_rate"] = table.learning_rate
            if self.clipping_limit is not None:
                changes["clipvalue"] = _clip(optimizer.clipvalue, float(self.clipping_limit))
            return replace_quietly(optimizer, **changes) if changes else optimizer

        return for_table


def check_embedding_columns(owner: str, columns: Sequence[EmbeddingColumn]) -> None:
    """Cross-column checks: one column per feature key, one table object per table name."""
    keys: dict[str, str] = {}
    tables: dict[str, EmbeddingTable] = {}
    for c in columns:
        if c.feature_key in keys:
            raise ValueError(
                f"{owner}: feature '{c.feature_key}' is used by two columns "
                f"('{keys[c.feature_key]}' and '{c.name}'); each feature may feed one column"
            )
        keys[c.feature_key] = c.name
        known = tables.setdefault(c.table.name, c.table)
        if known is not c.table:
            raise ValueError(
                f"{owner}: two different tables are named '{c.table.name}'; give shared columns "
                "one shared_embedding_columns call, or distinct collection names"
            )
