"""``from embcore.compat import tf`` covers a TPUEstimator ranking program's names, and a name it
does not cover says so and what to use instead."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import embcore
from embcore.compat import tf, tpu
from embcore.compat.namespace import HINTS, NotProvidedError


def test_a_tf1_tpu_estimator_ranking_program_runs(tmp_path) -> None:
    # fmt: off
    price = tf.feature_column.numeric_column("price", shape=(2,), dtype=tf.float32)
    item = tf.feature_column.categorical_column_with_identity("item", num_buckets=10)
    item_emb = tf.compat.v1.tpu.experimental.embedding_column(item, dimension=3)
    columns = [price, item_emb]
    head = nn.Linear(5, 1)
    made = []

    def model_fn(features, labels, mode, params):
        net = tf.compat.v1.feature_column.input_layer(features, columns)
        logits = params["head"](net).squeeze(1)
        loss = nn.functional.binary_cross_entropy_with_logits(logits, labels)
        optimizer = tf.compat.v1.train.AdagradOptimizer(learning_rate=0.05)
        optimizer = tf.compat.v1.tpu.CrossShardOptimizer(optimizer)
        train_op = optimizer.minimize(loss, global_step=tf.compat.v1.train.get_global_step())
        made.append(train_op)
        return tf.compat.v1.estimator.tpu.TPUEstimatorSpec(mode, loss=loss, train_op=train_op)

    run_config = tf.compat.v1.estimator.tpu.RunConfig(
        model_dir=str(tmp_path), save_checkpoints_steps=2, tf_random_seed=3,
        tpu_config=tf.compat.v1.estimator.tpu.TPUConfig(iterations_per_loop=100))
    estimator = tf.compat.v1.estimator.tpu.TPUEstimator(
        model_fn=model_fn, config=run_config, use_tpu=True, train_batch_size=4,
        params={"head": head},
        embedding_config_spec=tf.compat.v1.estimator.tpu.experimental.EmbeddingConfigSpec(
            feature_columns=[item_emb],
            optimization_parameters=tf.compat.v1.tpu.experimental.AdagradParameters(0.1)))
    # fmt: on
    rng = np.random.default_rng(0)
    batches = [
        (
            {
                "price": rng.random((4, 2), dtype=np.float32),
                "item": torch.tensor(rng.integers(0, 10, 4)),
            },
            torch.tensor(rng.integers(0, 2, 4), dtype=torch.float32),
        )
        for _ in range(3)
    ]
    before = head.weight.detach().clone()
    estimator.train(lambda params: batches)
    assert estimator.global_step == 3 and estimator.model_dir == tmp_path
    assert estimator.latest_checkpoint().name == "ckpt-3"
    # one torch Adagrad, made once, over the dense head only, with TF1's hyperparameters
    assert all(op is made[0] for op in made) and isinstance(made[0], torch.optim.Adagrad)
    (group,) = made[0].param_groups
    assert [id(p) for p in group["params"]] == [id(head.weight), id(head.bias)]
    assert group["lr"] == 0.05 and group["initial_accumulator_value"] == 0.1 and group["eps"] == 0
    assert not torch.equal(head.weight, before)


def test_numeric_columns_join_dense_features_in_name_order() -> None:
    a = tf.feature_column.numeric_column("a", default_value=-1.0)
    z = tf.feature_column.numeric_column("z", shape=(2, 2), normalizer_fn=lambda x: x * 10)
    out = tf.keras.layers.DenseFeatures([z, a])(
        {"a": [1.0, float("nan")], "z": np.arange(8).reshape(2, 2, 2)}
    )
    want = np.array([[1, 0, 10, 20, 30], [-1, 40, 50, 60, 70]], np.float32)
    np.testing.assert_array_equal(out.numpy(), want)
    with pytest.raises(
        ValueError, match=r"numeric_column\('z'\): expected 4 value\(s\) per example"
    ):
        tf.keras.layers.DenseFeatures([z])({"z": np.zeros((2, 3))})
    with pytest.raises(ValueError, match="shape must be ints >= 1"):
        tf.feature_column.numeric_column("b", shape=(0,))
    got = tf.compat.v1.feature_column.input_layer({"a": [2.0, 3.0]}, [a])
    np.testing.assert_array_equal(got.numpy(), [[2.0], [3.0]])
    emb = tf.feature_column.embedding_column(
        tf.feature_column.categorical_column_with_identity("i", 4), 2
    )
    with pytest.raises(ValueError, match="looked up by the Estimator"):
        tf.compat.v1.feature_column.input_layer({"i": [1]}, [emb])


def test_dtypes_and_common_names_are_there() -> None:
    assert (tf.float32, tf.int64, tf.int32, tf.float64) == (
        torch.float32, torch.int64, torch.int32, torch.float64
    )  # fmt: skip
    assert repr(tf.string) == "tf.string"
    assert tf.estimator.RunConfig is tf.estimator.tpu.RunConfig
    assert tf.compat.v1.estimator.tpu.TPUEstimator is tf.estimator.tpu.TPUEstimator
    assert tf.train.AdagradOptimizer is tf.compat.v1.train.AdagradOptimizer
    assert "numeric_column" in dir(tf.feature_column)


@pytest.mark.parametrize(
    "path, instead",
    [
        ("tf.keras.layers.Dense", "torch.nn.Linear"),
        ("tf.data.Dataset", "any iterable of feature dicts"),
        ("tf.constant", "torch.tensor"),
        ("tf.compat.v1.train.FtrlOptimizer", "embcore.FTRL"),
        ("tf.nn.sigmoid_cross_entropy_with_logits", "binary_cross_entropy_with_logits"),
        ("tf.compat.v1.metrics.auc", "eval_metrics"),
        ("tf.estimator.tpu.TPUEstimatorX", "embcore knows no replacement for this name"),
        ("tf.compat.v1.layers.dense", "torch.nn.Linear"),
        ("tf.sparse.SparseTensor", "torch.sparse_coo_tensor"),
        ("tf.estimator.TrainSpec", "embcore.estimator.Estimator.train(input_fn, max_steps="),
    ],
)
def test_a_missing_name_says_it_is_not_provided_and_what_to_use(path: str, instead: str) -> None:
    node, parts, reached = tf, path.split(".")[1:], "tf"
    with pytest.raises(NotProvidedError) as info:
        for part in parts:
            node = getattr(node, part)
            reached += f".{part}"
    message = str(info.value)
    assert message.startswith(f"{reached}.{parts[reached.count('.')]} is not provided"), message
    assert "is not provided by embcore" in message and instead in message, message
    assert isinstance(info.value, AttributeError)  # hasattr() and getattr(x, n, d) still work
    assert not hasattr(tf.keras.layers, "Dense")


def test_dense_optimizer_arguments_are_checked() -> None:
    with pytest.raises(
        ValueError, match=r"AdagradOptimizer: learning_rate must be a finite number > 0, got inf"
    ):
        tf.compat.v1.train.AdagradOptimizer(float("inf"))
    with pytest.raises(ValueError, match=r"AdamOptimizer: beta1 must be in \[0, 1\)"):
        tf.compat.v1.train.AdamOptimizer(beta1=1.0)
    with pytest.raises(ValueError, match="depends on no trainable tensor"):
        tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(torch.ones(()))
    with pytest.raises(NotImplementedError, match="RunConfig"):
        tf.estimator.tpu.TPUEstimator(lambda features: None, config={"model_dir": "x"})


def test_a_model_fn_that_builds_its_train_op_in_every_mode_evaluates_and_predicts(
    tmp_path,
) -> None:
    """TensorFlow builds ``train_op`` in EVAL and PREDICT too and never runs it; here
    ``minimize`` gives ``None`` where gradients are off (evaluate, predict)."""
    item = tf.feature_column.categorical_column_with_identity("item", num_buckets=6)
    item_emb = tf.compat.v1.tpu.experimental.embedding_column(item, dimension=2)
    head = nn.Linear(2, 1)
    ops: dict[str, list] = {}

    def model_fn(features, labels, mode, params):
        logits = params["head"](tf.compat.v1.feature_column.input_layer(features, [item_emb]))
        logits = logits.squeeze(1)
        loss = (
            logits.sum() * 0 if labels is None
            else nn.functional.binary_cross_entropy_with_logits(logits, labels)
        )  # fmt: skip
        train_op = tf.compat.v1.train.AdagradOptimizer(0.1).minimize(loss)  # every mode
        ops.setdefault(mode, []).append(train_op)
        return tf.compat.v1.estimator.tpu.TPUEstimatorSpec(
            mode, loss=loss, train_op=train_op, predictions=torch.sigmoid(logits)
        )

    parameters = tf.compat.v1.tpu.experimental.AdagradParameters(0.1)
    estimator = tf.compat.v1.estimator.tpu.TPUEstimator(
        model_fn=model_fn, model_dir=str(tmp_path), train_batch_size=4, eval_batch_size=4,
        predict_batch_size=4, params={"head": head},
        embedding_config_spec=tf.compat.v1.estimator.tpu.experimental.EmbeddingConfigSpec(
            feature_columns=[item_emb], optimization_parameters=parameters))  # fmt: skip
    ids, labels = torch.tensor([0, 1, 2, 3]), torch.tensor([1.0, 0.0, 1.0, 0.0])
    estimator.train(lambda params: [({"item": ids}, labels)] * 2)
    metrics = estimator.evaluate(lambda params: [({"item": ids}, labels)])
    # the loss of the trained model, computed here from its tables and head directly
    table = next(iter(estimator.embedding_lookup.engine.embedding_tables.values()))
    with torch.no_grad():
        logits = head(table[ids]).squeeze(1)
        want = nn.functional.binary_cross_entropy_with_logits(logits, labels)
    assert metrics["loss"] == pytest.approx(float(want), rel=1e-6)
    predictions = list(estimator.predict(lambda params: [{"item": ids}]))
    np.testing.assert_allclose(
        [float(p) for p in predictions], torch.sigmoid(logits).numpy(), rtol=1e-6
    )
    assert isinstance(ops["train"][0], torch.optim.Adagrad)
    assert ops["eval"] == [None] and ops["infer"] == [None]


#: A realistic TensorFlow path for the hints keyed by a last component.
PATHS = {
    "Dense": "tf.keras.layers.Dense",
    "dense": "tf.compat.v1.layers.dense",
    "Model": "tf.keras.Model",
    "Sequential": "tf.keras.Sequential",
    "BatchNormalization": "tf.keras.layers.BatchNormalization",
    "batch_normalization": "tf.layers.batch_normalization",
    "Dropout": "tf.keras.layers.Dropout",
    "dropout": "tf.compat.v1.layers.dropout",
    "Embedding": "tf.keras.layers.Embedding",
    "SparseTensor": "tf.sparse.SparseTensor",
    "FtrlOptimizer": "tf.compat.v1.train.FtrlOptimizer",
    "RMSPropOptimizer": "tf.compat.v1.train.RMSPropOptimizer",
    "AdadeltaOptimizer": "tf.train.AdadeltaOptimizer",
    "ProximalAdagradOptimizer": "tf.compat.v1.train.ProximalAdagradOptimizer",
    "initialize_tpu_system": "tf.tpu.experimental.initialize_tpu_system",
    "cluster_resolver": "tf.distribute.cluster_resolver",
    "parse_example": "tf.io.parse_example",
    "tf.io": "tf.io.gfile",
}


def _resolve(dotted: str) -> None:
    """Import the longest module prefix of ``dotted`` and get the rest as attributes. A module
    that exists but needs a package not installed here (``torch.utils.tensorboard`` needs
    ``tensorboard``) must define the attribute in its source."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        name = ".".join(parts[:i])
        try:
            node = importlib.import_module(name)
        except ModuleNotFoundError as error:
            if error.name is None or dotted.startswith(error.name):
                continue  # name is not a module: try a shorter prefix
            for j in range(len(parts) - 1, 0, -1):
                module = ".".join(parts[:j])
                with contextlib.suppress(ModuleNotFoundError):
                    spec = importlib.util.find_spec(module)
                    assert spec is not None and spec.origin, dotted
                    source = Path(spec.origin).read_text(encoding="utf-8")
                    assert f"{parts[j]}" in source, dotted
                    return
            raise
        for attr in parts[i:]:
            node = getattr(node, attr)
        return
    raise AssertionError(f"{dotted} does not resolve")


@pytest.mark.parametrize("key", sorted(HINTS))
def test_every_hint_names_a_replacement_that_exists(key: str) -> None:
    path = PATHS.get(key, key if key.startswith("tf.") else f"tf.{key}")
    node = tf
    with pytest.raises(NotProvidedError) as info:
        for part in path.split(".")[1:]:
            node = getattr(node, part)
    message = str(info.value)
    assert message.startswith(f"{path} is not provided by embcore"), message
    assert message.endswith(HINTS[key]), message
    names = re.findall(r"\b((?:torch|embcore|logging)(?:\.\w+)+)", HINTS[key])
    assert names, f"{key}: the hint names no class or function: {HINTS[key]!r}"
    for name in names:
        _resolve(name)


def test_tf_estimator_estimator_is_embcores(tmp_path: Path) -> None:
    assert tf.estimator.Estimator is tf.compat.v1.estimator.Estimator is tpu.PortedEstimator
    assert issubclass(tpu.PortedEstimator, embcore.estimator.Estimator)
    item = tf.feature_column.categorical_column_with_identity("item", num_buckets=4)
    item_emb = tf.feature_column.embedding_column(item, dimension=2)
    head = nn.Linear(2, 1)

    def model_fn(features, labels, mode, params):
        net = tf.compat.v1.feature_column.input_layer(features, [item_emb])
        logits = params["head"](net).squeeze(1)
        loss = nn.functional.binary_cross_entropy_with_logits(logits, labels)
        train_op = tf.compat.v1.train.GradientDescentOptimizer(0.5).minimize(loss)
        return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

    config = tf.estimator.RunConfig(save_checkpoints_steps=1, tf_random_seed=4)
    estimator = tf.estimator.Estimator(
        model_fn, str(tmp_path), config, params={"head": head},
        embedding_config_spec=tpu.EmbeddingConfigSpec(
            feature_columns=[item_emb],
            optimization_parameters=tpu.StochasticGradientDescentParameters(0.5)))  # fmt: skip
    ids, labels = torch.tensor([0, 1, 2, 3]), torch.tensor([1.0, 0.0, 1.0, 0.0])
    before = head.weight.detach().clone()
    estimator.train(lambda: [({"item": ids}, labels)] * 3)
    assert estimator.global_step == 3 and estimator.model_dir == tmp_path
    assert not torch.equal(before, head.weight)
    assert estimator.evaluate(lambda: [({"item": ids}, labels)])["global_step"] == 3
    with pytest.raises(NotImplementedError, match=r"warm_start_from.*load_tf_checkpoint"):
        tf.estimator.Estimator(model_fn, warm_start_from="gs://old")
