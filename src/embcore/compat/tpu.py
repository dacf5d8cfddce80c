"""TensorFlow's TPU embedding names on embcore, for porting code line by line.

=================================================  ===========================================
TensorFlow                                         here
=================================================  ===========================================
``tf.tpu.experimental.embedding.TPUEmbedding``     :class:`TPUEmbedding` (wraps the engine)
``....embedding.TableConfig`` / ``FeatureConfig``  ``embcore.TableConfig`` / ``FeatureConfig``
``....embedding.SGD`` / ``Adagrad`` / ``Adam`` /   the embcore optimizers
``FTRL``
``tf.tpu.experimental.embedding_column`` and       ``embcore.feature_column`` functions
``shared_embedding_columns``
``tf.tpu.experimental.*Parameters``                ``embcore.feature_column`` parameter classes
``tf.estimator.tpu.experimental.EmbeddingConfigSpec``  :class:`EmbeddingConfigSpec`
``tf.estimator.tpu.TPUEstimator`` / ``...Spec``    :class:`TPUEstimator` / :func:`TPUEstimatorSpec`
``tf.estimator.Estimator``                         :class:`PortedEstimator`
``tf.estimator.RunConfig`` / ``tpu.TPUConfig``      :class:`RunConfig` / :class:`TPUConfig`
``tpu_embedding.TableConfig`` / ``FeatureConfig``  :data:`tpu_embedding` (the v1 configs)
=================================================  ===========================================

``embcore.compat.tf`` arranges these (and a few runtime stand-ins) under TensorFlow's module
paths, so that ``import tensorflow as tf`` can become ``from embcore.compat import tf``.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from embcore import feature_column as fc
from embcore._validate import check_bool, check_int, describe
from embcore.compat.namespace import Namespace
from embcore.config import FeatureConfig, TableConfig
from embcore.engine import EmbeddingEngine
from embcore.estimator import Estimator, EstimatorSpec, ModeKeys
from embcore.optimizers import FTRL, SGD, Adagrad, Adam, Optimizer

__all__ = [
    "FTRL",
    "SGD",
    "Adagrad",
    "AdagradParameters",
    "Adam",
    "AdamParameters",
    "EmbeddingConfigSpec",
    "FeatureConfig",
    "FtrlParameters",
    "PortedEstimator",
    "RunConfig",
    "StochasticGradientDescentParameters",
    "TPUConfig",
    "TPUEmbedding",
    "TPUEstimator",
    "TPUEstimatorSpec",
    "TableConfig",
    "embedding_column",
    "estimator_spec",
    "input_layer",
    "shared_embedding_columns",
    "tpu_embedding",
]

embedding_column = fc.embedding_column
shared_embedding_columns = fc.shared_embedding_columns
AdagradParameters = fc.AdagradParameters
AdamParameters = fc.AdamParameters
FtrlParameters = fc.FtrlParameters
StochasticGradientDescentParameters = fc.StochasticGradientDescentParameters

#: ``from tensorflow.python.tpu import tpu_embedding``: the v1 configs of the dict form.
tpu_embedding = Namespace(
    "tpu_embedding", TableConfig=fc.V1TableConfig, FeatureConfig=fc.V1FeatureConfig
)


class TPUEmbedding(nn.Module):
    """``tf.tpu.experimental.embedding.TPUEmbedding`` on an :class:`~embcore.EmbeddingEngine`.

    Args:
        feature_config: a nest of ``FeatureConfig``.
        batch_size: accepted and checked (an int >= 1); embcore takes any batch size.
        optimizer: ``SGD``, ``Adagrad``, ``Adam``, ``FTRL`` (any embcore optimizer); ``None``
            for lookup only. TensorFlow 2.4's order ``TPUEmbedding(config, optimizer)`` works.
        pipeline_execution_with_tensor_core: pipelined training, passed to the engine.
        initialize_tpu_embedding: accepted; there is no device to initialize.

    ``enqueue``, ``dequeue`` and ``apply_gradients`` behave as in TensorFlow; ``emb(features)``
    is the engine's PyTorch-style lookup. ``embedding_tables`` is keyed by ``TableConfig``.
    """

    def __init__(
        self,
        feature_config: Any,
        batch_size: int | None = None,
        optimizer: Optimizer | None = None,
        pipeline_execution_with_tensor_core: bool = False,
        initialize_tpu_embedding: bool = True,
    ) -> None:
        super().__init__()
        if isinstance(batch_size, Optimizer) and optimizer is None:
            batch_size, optimizer = None, batch_size  # TPUEmbedding(feature_config, optimizer)
        if batch_size is not None:
            check_int("TPUEmbedding", "batch_size", batch_size, minimum=1)
        if optimizer is not None and not isinstance(optimizer, Optimizer):
            raise ValueError(
                "TPUEmbedding: optimizer must be one of SGD, Adagrad, Adam, FTRL, got "
                f"{describe(optimizer)}"
            )
        check_bool("TPUEmbedding", "initialize_tpu_embedding", initialize_tpu_embedding)
        check_bool(
            "TPUEmbedding",
            "pipeline_execution_with_tensor_core",
            pipeline_execution_with_tensor_core,
        )
        options = {}
        if pipeline_execution_with_tensor_core:
            if (
                "pipeline_execution_with_tensor_core"
                not in inspect.signature(EmbeddingEngine.__init__).parameters
            ):
                raise NotImplementedError(
                    "TPUEmbedding: this embcore engine has no pipelined execution"
                )
            options["pipeline_execution_with_tensor_core"] = True
        self.batch_size = batch_size
        self.engine = EmbeddingEngine(feature_config, optimizer, **options)

    def enqueue(
        self, features: Any, weights: Any = None, training: bool = True, name: str | None = None
    ) -> None:
        self.engine.enqueue(features, weights, training=training)

    def dequeue(self, name: str | None = None) -> Any:
        return self.engine.dequeue()

    def apply_gradients(self, gradients: Any, name: str | None = None) -> None:
        self.engine.apply_gradients(gradients)

    def forward(self, features: Any, weights: Any = None) -> Any:
        return self.engine(features, weights)

    @property
    def embedding_tables(self) -> dict[TableConfig, Tensor]:
        """``{TableConfig: (vocab, dim) tensor}``, the live tables."""
        tables = self.engine.embedding_tables
        return {t.config: tables[t.name] for t in self.engine.tables}


class EmbeddingConfigSpec(fc.EmbeddingConfigSpec):
    """``tf.estimator.tpu.experimental.EmbeddingConfigSpec``; also takes ``column=`` for
    ``feature_columns=``, the spelling of TensorFlow's own documentation examples."""

    def __init__(
        self,
        feature_columns: Any = None,
        optimization_parameters: Any = None,
        clipping_limit: float | None = None,
        pipeline_execution_with_tensor_core: bool = False,
        experimental_gradient_multiplier_fn: Callable[[int], float] | None = None,
        feature_to_config_dict: Mapping[str, Any] | None = None,
        table_to_config_dict: Mapping[str, Any] | None = None,
        partition_strategy: str = "div",
        profile_data_directory: str | None = None,
        column: Any = None,
    ) -> None:
        if column is not None:
            if feature_columns is not None:
                raise ValueError("EmbeddingConfigSpec: give feature_columns or column, not both")
            feature_columns = column
        super().__init__(
            feature_columns=feature_columns,
            optimization_parameters=optimization_parameters,
            clipping_limit=clipping_limit,
            pipeline_execution_with_tensor_core=pipeline_execution_with_tensor_core,
            experimental_gradient_multiplier_fn=experimental_gradient_multiplier_fn,
            feature_to_config_dict=feature_to_config_dict,
            table_to_config_dict=table_to_config_dict,
            partition_strategy=partition_strategy,
            profile_data_directory=profile_data_directory,
        )


def _reject(owner: str, **unsupported: Any) -> None:
    given = [k for k, v in unsupported.items() if v is not None]
    if given:
        raise NotImplementedError(f"{owner}: {given} are not supported by embcore")


def _metric_values(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """TensorFlow metrics are ``(value, update_op)`` pairs; keep the values."""
    return {k: v[0] if isinstance(v, tuple) else v for k, v in metrics.items()}


def input_layer(features: Mapping[str, Any], feature_columns: Any) -> Tensor:
    """``tf.compat.v1.feature_column.input_layer`` inside a ``model_fn``: the columns'
    ``(B, Σ width)`` values in name order, as :class:`~embcore.feature_column.DenseFeatures`.

    Raises:
        ValueError: embedding columns outside an Estimator's ``model_fn`` (where nothing looked
            them up; build one ``DenseFeatures`` module instead, so its tables persist).
    """
    columns = (
        [feature_columns] if not isinstance(feature_columns, (list, tuple)) else feature_columns
    )
    layer = fc.DenseFeatures(list(columns))
    if layer.feature_columns and not isinstance(features, fc.EmbeddedFeatures):
        raise ValueError(
            "input_layer: embedding columns are looked up by the Estimator; outside a model_fn, "
            "build one embcore.feature_column.DenseFeatures module and call it"
        )
    return layer(features)


def estimator_spec(
    mode: str,
    predictions: Any = None,
    loss: Tensor | None = None,
    train_op: torch.optim.Optimizer | None = None,
    eval_metric_ops: Mapping[str, Any] | None = None,
    export_outputs: Any = None,
    training_chief_hooks: Any = None,
    training_hooks: Any = None,
    scaffold: Any = None,
    evaluation_hooks: Any = None,
    prediction_hooks: Any = None,
) -> EstimatorSpec:
    """``tf.estimator.EstimatorSpec``: ``train_op`` is the torch optimizer of the model."""
    _reject(
        "EstimatorSpec",
        export_outputs=export_outputs,
        training_chief_hooks=training_chief_hooks,
        training_hooks=training_hooks,
        scaffold=scaffold,
        evaluation_hooks=evaluation_hooks,
        prediction_hooks=prediction_hooks,
    )
    metrics = None if eval_metric_ops is None else _metric_values(eval_metric_ops)
    return EstimatorSpec(mode, predictions, loss, train_op, metrics)


def TPUEstimatorSpec(  # TensorFlow's name
    mode: str,
    predictions: Any = None,
    loss: Tensor | None = None,
    train_op: torch.optim.Optimizer | None = None,
    eval_metrics: Any = None,
    export_outputs: Any = None,
    scaffold_fn: Any = None,
    host_call: Any = None,
    training_hooks: Any = None,
    evaluation_hooks: Any = None,
    prediction_hooks: Any = None,
) -> EstimatorSpec:
    """``tf.estimator.tpu.TPUEstimatorSpec``; ``eval_metrics`` is ``(metric_fn, tensors)``
    (a list or dict of tensors) and is evaluated now."""
    _reject(
        "TPUEstimatorSpec",
        export_outputs=export_outputs,
        scaffold_fn=scaffold_fn,
        host_call=host_call,
        training_hooks=training_hooks,
        evaluation_hooks=evaluation_hooks,
        prediction_hooks=prediction_hooks,
    )
    metrics = None
    if eval_metrics is not None:
        metric_fn, tensors = eval_metrics
        out = metric_fn(**tensors) if isinstance(tensors, Mapping) else metric_fn(*tensors)
        metrics = _metric_values(out)
    return EstimatorSpec(mode, predictions, loss, train_op, metrics)


@dataclass(frozen=True)
class TPUConfig:
    """``tf.estimator.tpu.TPUConfig``: accepted for porting; nothing here loops on a TPU.

    ``iterations_per_loop`` and the other fields are kept but change nothing.
    """

    iterations_per_loop: int = 2
    num_shards: int | None = None
    num_cores_per_replica: int | None = None
    per_host_input_for_training: Any = True
    tpu_job_name: str | None = None
    initial_infeed_sleep_secs: int | None = None
    input_partition_dims: Any = None
    eval_training_input_configuration: Any = None
    experimental_host_call_every_n_steps: int = 1


@dataclass(frozen=True)
class RunConfig:
    """``tf.estimator.RunConfig`` / ``tf.estimator.tpu.RunConfig`` for :class:`TPUEstimator`.

    Used: ``model_dir``, ``tf_random_seed`` (the tables' initializer seed),
    ``save_checkpoints_steps``, ``keep_checkpoint_max`` and ``log_step_count_steps`` (how
    often ``train`` logs ``loss = ..., step = ...`` and ``global_step/sec``). Accepted and
    unused (there is no TPU or cluster): ``tpu_config``, ``cluster``, ``master``,
    ``evaluation_master``, ``session_config``, ``save_summary_steps``,
    ``save_checkpoints_secs`` (must be None: checkpoints are by steps).
    """

    model_dir: str | None = None
    tf_random_seed: int | None = None
    save_checkpoints_steps: int | None = None
    keep_checkpoint_max: int = 5
    log_step_count_steps: int | None = 100
    tpu_config: TPUConfig | None = None
    cluster: Any = None
    master: str | None = None
    evaluation_master: str | None = None
    session_config: Any = None
    save_summary_steps: int | None = 100
    save_checkpoints_secs: int | None = None

    def __post_init__(self) -> None:
        if self.save_checkpoints_secs is not None:
            raise NotImplementedError(
                "RunConfig: save_checkpoints_secs is not supported; use save_checkpoints_steps"
            )
        for name in ("save_checkpoints_steps", "log_step_count_steps", "tf_random_seed"):
            value = getattr(self, name)
            if value is not None:
                check_int("RunConfig", name, value, minimum=0 if name == "tf_random_seed" else 1)
        check_int("RunConfig", "keep_checkpoint_max", self.keep_checkpoint_max, minimum=1)


class TPUEstimator(Estimator):
    """``tf.estimator.tpu.TPUEstimator``: an :class:`~embcore.estimator.Estimator` whose
    ``input_fn`` and ``model_fn`` get ``params["batch_size"]`` for the current mode.

    ``config`` is a :class:`RunConfig` (its ``model_dir``, seed, checkpoint and logging
    settings are used). ``use_tpu`` is accepted; everything runs on the engine's device.
    """

    def __init__(
        self,
        model_fn: Callable[..., EstimatorSpec],
        model_dir: str | None = None,
        config: RunConfig | None = None,
        params: Mapping[str, Any] | None = None,
        use_tpu: bool = True,
        train_batch_size: int | None = None,
        eval_batch_size: int | None = None,
        predict_batch_size: int | None = None,
        embedding_config_spec: fc.EmbeddingConfigSpec | None = None,
        **options: Any,
    ) -> None:
        if config is not None:
            if not isinstance(config, RunConfig):
                raise NotImplementedError(
                    f"TPUEstimator: config must be a tf.estimator.RunConfig (embcore.compat.tpu."
                    f"RunConfig), got {describe(config)}"
                )
            both = model_dir is not None and config.model_dir is not None
            if both and os.fspath(model_dir) != os.fspath(config.model_dir):  # type: ignore[arg-type]
                raise ValueError(
                    f"TPUEstimator: model_dir {model_dir!r} differs from config.model_dir "
                    f"{config.model_dir!r}; give one"
                )
            model_dir = model_dir if model_dir is not None else config.model_dir
            options = {
                "save_checkpoints_steps": config.save_checkpoints_steps,
                "keep_checkpoint_max": config.keep_checkpoint_max,
                "log_step_count_steps": config.log_step_count_steps,
                **({"seed": config.tf_random_seed} if config.tf_random_seed is not None else {}),
                **options,
            }
        if params and "batch_size" in params:
            raise ValueError("TPUEstimator: params['batch_size'] is reserved; pass *_batch_size")
        self._batch_sizes = {
            ModeKeys.TRAIN: train_batch_size,
            ModeKeys.EVAL: eval_batch_size,
            ModeKeys.PREDICT: predict_batch_size,
        }
        for mode, size in self._batch_sizes.items():
            if size is not None:
                check_int("TPUEstimator", f"{mode} batch size", size, minimum=1)
        super().__init__(model_fn, model_dir, embedding_config_spec, params, **options)

    def _params_for(self, mode: str) -> dict[str, Any]:
        params = super()._params_for(mode)
        if self._batch_sizes[mode] is not None:
            params["batch_size"] = self._batch_sizes[mode]
        return params


class PortedEstimator(TPUEstimator):
    """``tf.estimator.Estimator(model_fn, model_dir, config, params, warm_start_from)`` on
    :class:`~embcore.estimator.Estimator` (through :class:`TPUEstimator`, without batch sizes).

    TensorFlow's Estimator looks embedding columns up inside ``model_fn``; here the engine
    looks them up before ``model_fn`` runs, so name them in ``embedding_config_spec`` (an
    :class:`EmbeddingConfigSpec`, a keyword TensorFlow's Estimator does not have).
    """

    def __init__(
        self,
        model_fn: Callable[..., EstimatorSpec],
        model_dir: str | None = None,
        config: RunConfig | None = None,
        params: Mapping[str, Any] | None = None,
        warm_start_from: Any = None,
        *,
        embedding_config_spec: fc.EmbeddingConfigSpec | None = None,
    ) -> None:
        if warm_start_from is not None:
            raise NotImplementedError(
                "Estimator: warm_start_from is not supported; load a TensorFlow checkpoint's "
                "tables with embcore.compat.tf_checkpoint.load_tf_checkpoint(estimator, path), "
                "or point model_dir at an embcore model_dir to continue it"
            )
        super().__init__(
            model_fn, model_dir, config, params, embedding_config_spec=embedding_config_spec
        )
