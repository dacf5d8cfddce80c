"""The compat layer's own behaviour: TPUEmbedding, TPUEstimator(Spec) and the runtime stand-ins."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import embcore as ec
from embcore.compat import tf, tpu
from embcore.compat.runtime import GradientTape
from embcore.estimator import EstimatorSpec


def feature_config():
    t = tpu.TableConfig(vocabulary_size=5, dim=2)
    return t, {"f": tpu.FeatureConfig(table=t)}


def test_tpu_embedding_arguments():
    t, config = feature_config()
    emb = tpu.TPUEmbedding(config, tpu.SGD(0.1))  # TensorFlow 2.4's order
    assert emb.batch_size is None and isinstance(emb.engine, ec.EmbeddingEngine)
    assert list(emb.embedding_tables) == [t]
    with pytest.raises(ValueError, match="batch_size"):
        tpu.TPUEmbedding(config, 0, tpu.SGD(0.1))
    with pytest.raises(ValueError, match="optimizer must be one of"):
        tpu.TPUEmbedding(config, 8, torch.optim.SGD)
    emb = tpu.TPUEmbedding(config, 8, tpu.Adagrad(0.1), pipeline_execution_with_tensor_core=True)
    assert emb.engine.pipelined
    out = emb({"f": torch.tensor([1, 2])})  # the PyTorch style passes through
    assert out["f"].shape == (2, 2)
    assert set(emb.state_dict()) == {
        "engine.step",
        "engine.table_0.weight",
        "engine.table_0.accumulators",
    }


def test_tpu_estimator_batch_sizes_and_refusals(tmp_path):
    col = tpu.embedding_column(tf.feature_column.categorical_column_with_identity("v", 4), 2)
    spec = tpu.EmbeddingConfigSpec(column=[col], optimization_parameters=tpu.AdagradParameters(0.1))
    seen = []

    def model_fn(features, labels, mode, params):
        seen.append((mode, params["batch_size"]))
        loss = features.activations["v"].sum()
        return tpu.TPUEstimatorSpec(
            mode,
            loss=loss,
            predictions=loss[None],
            eval_metrics=(lambda x: {"m": (x, None)}, [loss]),
        )

    est = tpu.TPUEstimator(
        model_fn,
        str(tmp_path),
        train_batch_size=2,
        eval_batch_size=3,
        predict_batch_size=4,
        embedding_config_spec=spec,
    )

    def input_fn(params):
        return [{"v": torch.zeros(params["batch_size"], dtype=torch.int64)}]

    est.train(input_fn)
    metrics = est.evaluate(input_fn)
    assert metrics["m"] == pytest.approx(metrics["loss"])
    list(est.predict(input_fn))
    assert seen == [("train", 2), ("eval", 3), ("infer", 4)]
    with pytest.raises(ValueError, match="reserved"):
        tpu.TPUEstimator(model_fn, params={"batch_size": 1})
    with pytest.raises(NotImplementedError, match="RunConfig"):
        tpu.TPUEstimator(model_fn, config=object())
    with pytest.raises(NotImplementedError, match="host_call"):
        tpu.TPUEstimatorSpec("train", loss=torch.zeros(()), host_call=(print, []))
    with pytest.raises(NotImplementedError, match="training_hooks"):
        tf.estimator.EstimatorSpec("train", loss=torch.zeros(()), training_hooks=[1])
    with pytest.raises(ValueError, match="not both"):
        tpu.EmbeddingConfigSpec(
            feature_columns=[col], column=[col], optimization_parameters=tpu.AdagradParameters(0.1)
        )
    spec = tf.estimator.EstimatorSpec(
        "eval", loss=torch.ones(()), eval_metric_ops={"a": (torch.ones(()), None)}
    )
    assert isinstance(spec, EstimatorSpec) and float(spec.eval_metrics["a"]) == 1.0


def test_gradient_tape_structures_and_persistence():
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    y = torch.tensor(3.0)
    with GradientTape() as tape:
        tape.watch(y)
        loss = (x * y).sum()
    grads = tape.gradient(loss, {"x": x, "pair": (y, torch.zeros(1))})
    assert grads["x"].tolist() == [3.0, 3.0] and float(grads["pair"][0]) == 3.0
    assert grads["pair"][1] is None  # not connected
    with pytest.raises(RuntimeError, match="only be called once"):
        tape.gradient(loss, x)
    with GradientTape(persistent=True) as tape:
        loss = (x * x).sum()
    assert tape.gradient(loss, x).tolist() == tape.gradient(loss, [x])[0].tolist() == [2.0, 4.0]


def test_checkpoint_round_trip_and_strictness(tmp_path):
    a, b = nn.Linear(2, 2), nn.Linear(2, 2)
    path = tf.train.Checkpoint(model=a).save(str(tmp_path / "ck"))
    assert path.endswith("ck-1")
    tf.train.Checkpoint(model=b).restore(path).assert_consumed()
    torch.testing.assert_close(a.weight, b.weight)
    with pytest.raises(RuntimeError):
        tf.train.Checkpoint(model=nn.Linear(3, 2)).restore(path)
    with pytest.raises(ValueError, match="state_dict"):
        tf.train.Checkpoint(model=3)


def test_a_damaged_checkpoint_file_is_refused_by_name(tmp_path):
    a = nn.Linear(64, 64)
    path = tf.train.Checkpoint(model=a).save(str(tmp_path / "ck"))
    assert [p.name for p in tmp_path.iterdir()] == ["ck-1.safetensors"]  # no temporary left
    file = tmp_path / "ck-1.safetensors"
    data = bytearray(file.read_bytes())
    data[-100] ^= 0x01  # a bit of the weights
    file.write_bytes(bytes(data))
    b = nn.Linear(64, 64)
    before = b.weight.detach().clone()
    with pytest.raises(ValueError, match=r"ck-1\.safetensors"):
        tf.train.Checkpoint(model=b).restore(path)
    assert torch.equal(b.weight, before)


def test_tf_namespace_has_the_seed_paths():
    assert tf.tpu.experimental.embedding.TPUEmbedding is tpu.TPUEmbedding
    assert tf.compat.v1.tpu.experimental.embedding_column is tpu.embedding_column
    assert tf.keras.layers.DenseFeature is tf.keras.layers.DenseFeatures
    assert tf.estimator.tpu.experimental.EmbeddingConfigSpec is tpu.EmbeddingConfigSpec
    assert list(tf.range(torch.tensor(3))) == [0, 1, 2]
    assert tf.function(lambda: 1)() == 1 and tf.function(jit_compile=True)(lambda: 2)() == 2
    assert tpu.tpu_embedding.TableConfig(4, 2).dimension == 2
