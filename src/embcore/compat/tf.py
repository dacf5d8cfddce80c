"""TensorFlow's module paths over embcore: ``from embcore.compat import tf``.

A TensorFlow TPU embedding or TPUEstimator program runs with ``import tensorflow as tf``
replaced by ``from embcore.compat import tf``. Provided (and nothing else; any other name
raises :class:`~embcore.compat.namespace.NotProvidedError` saying what to use instead):

* ``tf.tpu.experimental.embedding.{TPUEmbedding, TableConfig, FeatureConfig, SGD, Adagrad,
  Adam, FTRL}``
* ``tf.tpu.experimental.{embedding_column, shared_embedding_columns, AdagradParameters,
  AdamParameters, FtrlParameters, StochasticGradientDescentParameters}``, and the same under
  ``tf.compat.v1.tpu.experimental``
* ``tf.feature_column.{input_layer, numeric_column, bucketized_column, crossed_column,
  indicator_column, embedding_column, categorical_column_with_*,
  sequence_categorical_column_with_*, weighted_categorical_column, shared_embedding_columns}``
  (also under ``tf.compat.v1.feature_column``)
* ``tf.keras.layers.DenseFeatures`` (also ``DenseFeature``)
* ``tf.estimator.{Estimator, ModeKeys, EstimatorSpec, RunConfig}`` (``Estimator`` is
  :class:`~embcore.compat.tpu.PortedEstimator`), ``tf.estimator.tpu.{TPUEstimator,
  TPUEstimatorSpec, RunConfig, TPUConfig}``, ``tf.estimator.tpu.experimental.
  EmbeddingConfigSpec``, and the same under ``tf.compat.v1.estimator``
* dense optimizers (``embcore.compat.dense``): ``tf.compat.v1.train.{GradientDescentOptimizer,
  MomentumOptimizer, AdagradOptimizer, AdamOptimizer, get_global_step,
  get_or_create_global_step}`` (also ``tf.train``), ``tf.compat.v1.tpu.CrossShardOptimizer``
* dtypes: ``tf.float16, bfloat16, float32, float64, int32, int64, bool`` (torch dtypes) and
  ``tf.string`` (features hold Python strings)
* runtime stand-ins (``embcore.compat.runtime``): ``tf.function``, ``tf.GradientTape``,
  ``tf.range``, ``tf.distribute.{TPUStrategy, InputOptions, InputContext}``,
  ``tf.train.Checkpoint``, ``tf.nn.embedding_lookup``

Tensors are PyTorch tensors throughout: feed ``torch`` ids, ``torch.sparse_coo_tensor`` or
``embcore.RaggedIds`` where TensorFlow takes ``Tensor``, ``SparseTensor`` or ``RaggedTensor``.
"""

from __future__ import annotations

from typing import Any

import torch

from embcore import feature_column as _fc
from embcore.compat import dense as _dense
from embcore.compat import runtime as _rt
from embcore.compat import tpu as _tpu
from embcore.compat.namespace import Namespace, not_provided
from embcore.estimator import ModeKeys

__all__ = [
    "GradientTape",
    "bfloat16",
    "bool",
    "compat",
    "distribute",
    "estimator",
    "feature_column",
    "float16",
    "float32",
    "float64",
    "function",
    "int32",
    "int64",
    "io",
    "keras",
    "layers",
    "losses",
    "nn",
    "range",
    "sparse",
    "string",
    "tpu",
    "train",
]


class _StringDType:
    """``tf.string``: string features are Python ``str`` values (lists or NumPy arrays)."""

    name = "string"

    def __repr__(self) -> str:
        return "tf.string"


float16, bfloat16 = torch.float16, torch.bfloat16
float32, float64 = torch.float32, torch.float64
int32, int64 = torch.int32, torch.int64
bool = torch.bool
string = _StringDType()


def _experimental(path: str) -> Namespace:
    return Namespace(
        path,
        embedding=Namespace(
            f"{path}.embedding",
            TPUEmbedding=_tpu.TPUEmbedding,
            TableConfig=_tpu.TableConfig,
            FeatureConfig=_tpu.FeatureConfig,
            SGD=_tpu.SGD,
            Adagrad=_tpu.Adagrad,
            Adam=_tpu.Adam,
            FTRL=_tpu.FTRL,
        ),
        embedding_column=_tpu.embedding_column,
        shared_embedding_columns=_tpu.shared_embedding_columns,
        AdagradParameters=_tpu.AdagradParameters,
        AdamParameters=_tpu.AdamParameters,
        FtrlParameters=_tpu.FtrlParameters,
        StochasticGradientDescentParameters=_tpu.StochasticGradientDescentParameters,
    )


def _feature_column(path: str) -> Namespace:
    return Namespace(
        path,
        input_layer=_tpu.input_layer,
        numeric_column=_fc.numeric_column,
        bucketized_column=_fc.bucketized_column,
        crossed_column=_fc.crossed_column,
        indicator_column=_fc.indicator_column,
        embedding_column=_fc.embedding_column,
        shared_embedding_columns=_fc.shared_embedding_columns,
        categorical_column_with_identity=_fc.categorical_column_with_identity,
        categorical_column_with_vocabulary_list=_fc.categorical_column_with_vocabulary_list,
        categorical_column_with_vocabulary_file=_fc.categorical_column_with_vocabulary_file,
        categorical_column_with_hash_bucket=_fc.categorical_column_with_hash_bucket,
        weighted_categorical_column=_fc.weighted_categorical_column,
        sequence_categorical_column_with_identity=_fc.sequence_categorical_column_with_identity,
        sequence_categorical_column_with_vocabulary_list=(
            _fc.sequence_categorical_column_with_vocabulary_list
        ),
        sequence_categorical_column_with_vocabulary_file=(
            _fc.sequence_categorical_column_with_vocabulary_file
        ),
        sequence_categorical_column_with_hash_bucket=(
            _fc.sequence_categorical_column_with_hash_bucket
        ),
    )


def _estimator(path: str) -> Namespace:
    spec_params = {
        # A ported example spells the parameters' path this way too.
        "AdagradParameters": _tpu.AdagradParameters,
        "AdamParameters": _tpu.AdamParameters,
        "FtrlParameters": _tpu.FtrlParameters,
        "StochasticGradientDescentParameters": _tpu.StochasticGradientDescentParameters,
    }
    return Namespace(
        path,
        ModeKeys=ModeKeys,
        Estimator=_tpu.PortedEstimator,
        EstimatorSpec=_tpu.estimator_spec,
        RunConfig=_tpu.RunConfig,
        tpu=Namespace(
            f"{path}.tpu",
            TPUEstimator=_tpu.TPUEstimator,
            TPUEstimatorSpec=_tpu.TPUEstimatorSpec,
            RunConfig=_tpu.RunConfig,
            TPUConfig=_tpu.TPUConfig,
            experimental=Namespace(
                f"{path}.tpu.experimental",
                EmbeddingConfigSpec=_tpu.EmbeddingConfigSpec,
                **spec_params,
            ),
        ),
    )


def _train(path: str, **extra: Any) -> Namespace:
    return Namespace(
        path,
        GradientDescentOptimizer=_dense.GradientDescentOptimizer,
        MomentumOptimizer=_dense.MomentumOptimizer,
        AdagradOptimizer=_dense.AdagradOptimizer,
        AdamOptimizer=_dense.AdamOptimizer,
        get_global_step=_dense.get_global_step,
        get_or_create_global_step=_dense.get_global_step,
        **extra,
    )


tpu = _experimental("tf.tpu.experimental")
tpu = Namespace("tf.tpu", experimental=tpu)
feature_column = _feature_column("tf.feature_column")
estimator = _estimator("tf.estimator")
keras = Namespace(
    "tf.keras",
    layers=Namespace(
        "tf.keras.layers", DenseFeatures=_fc.DenseFeatures, DenseFeature=_fc.DenseFeatures
    ),
)
distribute = Namespace(
    "tf.distribute",
    TPUStrategy=_rt.TPUStrategy,
    InputOptions=_rt.InputOptions,
    InputContext=_rt.InputContext,
)
train = _train("tf.train", Checkpoint=_rt.Checkpoint)
nn = Namespace("tf.nn", embedding_lookup=_rt.embedding_lookup)
# Namespaces that hold nothing, so that a name inside them says what to use instead.
sparse = Namespace("tf.sparse")
io = Namespace("tf.io")
losses = Namespace("tf.losses")
layers = Namespace("tf.layers")
compat = Namespace(
    "tf.compat",
    v1=Namespace(
        "tf.compat.v1",
        tpu=Namespace(
            "tf.compat.v1.tpu",
            experimental=_experimental("tf.compat.v1.tpu.experimental"),
            CrossShardOptimizer=_dense.CrossShardOptimizer,
        ),
        feature_column=_feature_column("tf.compat.v1.feature_column"),
        estimator=_estimator("tf.compat.v1.estimator"),
        train=_train("tf.compat.v1.train"),
        layers=Namespace("tf.compat.v1.layers"),
        losses=Namespace("tf.compat.v1.losses"),
        float32=float32,
        int64=int64,
        string=string,
    ),
)
function = _rt.function
GradientTape = _rt.GradientTape
range = _rt.tf_range


def __getattr__(name: str) -> Any:
    """``tf.<name>`` that embcore does not provide: say so, and what to use instead."""
    if name.startswith("__") and name.endswith("__"):
        raise AttributeError(name)
    raise not_provided(f"tf.{name}")
