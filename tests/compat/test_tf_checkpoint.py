"""Importing TensorFlow checkpoints: checkpoints written by TensorFlow 2.21 itself
(tests/fixtures/tensorflow/make_checkpoint_fixtures.py), read without TensorFlow. The imported
engine's lookups must equal TensorFlow's lookups saved beside them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import embcore as ec
import embcore.compat
from embcore import feature_column as fc
from embcore.compat._tf_bundle import _signed_num_increasing, read_checkpoint
from embcore.compat.tf_checkpoint import CheckpointError, load_tf_checkpoint
from embcore.estimator import Estimator, EstimatorSpec, ModeKeys

FIXTURES = Path(__file__).parents[1] / "fixtures" / "tensorflow"
EXPECTED = json.loads((FIXTURES / "expected.json").read_text())
CHECKPOINTS = {
    "midlevel": FIXTURES / "midlevel" / "ckpt",
    "estimator": FIXTURES / "estimator" / "model.ckpt-7",
}
OPTIMIZERS = {
    "adagrad": lambda: ec.Adagrad(learning_rate=0.1),
    "adam": lambda: ec.Adam(learning_rate=0.1),
    "ftrl": lambda: ec.FTRL(learning_rate=0.1),
}


def make_engine(optimizers=True, **overrides):
    features = {}
    for name, (vocab, dim, opt) in EXPECTED["tables"].items():
        vocab, dim = overrides.get(name, (vocab, dim))
        table = ec.TableConfig(
            vocabulary_size=vocab,
            dim=dim,
            name=name,
            combiner="mean",
            optimizer=OPTIMIZERS[opt]() if optimizers else None,
        )
        features[name[4:]] = ec.FeatureConfig(table=table, name=name[4:])
    return ec.EmbeddingEngine(features, seed=0)


def ragged(ids):
    return ec.RaggedIds.from_lists([[v for v in row if v >= 0] for row in ids])


def test_fixtures_are_from_tensorflow():
    assert EXPECTED["tensorflow"] == "2.21.0"


@pytest.mark.parametrize("layout", sorted(CHECKPOINTS))
def test_imported_lookups_equal_tensorflows(layout):
    engine = make_engine()
    loaded = load_tf_checkpoint(engine, CHECKPOINTS[layout])
    assert len(loaded) == 3 + 5  # three tables, 1 + 2 + 2 slots
    acts = engine({k: ragged(ids) for k, ids in EXPECTED["ids"].items()})
    for key, expected in EXPECTED["lookups"][layout].items():
        np.testing.assert_allclose(acts[key].detach().numpy(), expected, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("layout", sorted(CHECKPOINTS))
def test_tables_and_every_slot_are_imported(layout):
    engine = make_engine()
    load_tf_checkpoint(engine, CHECKPOINTS[layout], layout=layout)
    slots = engine.slot_variables
    for name, state in EXPECTED["values"].items():
        np.testing.assert_array_equal(engine.embedding_tables[name].numpy(), state["parameters"])
        assert sorted(slots[name]) == sorted(s for s in state if s != "parameters")
        for slot, value in slots[name].items():
            np.testing.assert_array_equal(value.numpy(), state[slot])


def test_directory_and_estimator_names():
    engine = make_engine()
    loaded = load_tf_checkpoint(engine, FIXTURES / "estimator")  # reads the checkpoint file
    assert loaded["tbl_b.velocities"] == "input_layer/b_embedding/embedding_weights/Adam/v"
    assert loaded["tbl_c.linears"] == "input_layer/c_embedding/embedding_weights/Ftrl_1"
    loaded = load_tf_checkpoint(make_engine(), CHECKPOINTS["midlevel"])
    assert loaded["tbl_a.accumulators"] == (
        "model/embedding/tbl_a.Saccumulators/.ATTRIBUTES/VARIABLE_VALUE"
    )


def test_tables_only_without_optimizers_or_with_slots_false():
    engine = make_engine(optimizers=False)
    assert sorted(load_tf_checkpoint(engine, CHECKPOINTS["midlevel"])) == [
        "tbl_a.weight",
        "tbl_b.weight",
        "tbl_c.weight",
    ]
    engine = make_engine()
    before = engine.slot_variables["tbl_a"]["accumulators"].clone()
    load_tf_checkpoint(engine, CHECKPOINTS["estimator"], slots=False)
    assert torch.equal(engine.slot_variables["tbl_a"]["accumulators"], before)


def test_the_bundle_reader_reassembles_partitions():
    parts = read_checkpoint(CHECKPOINTS["estimator"])  # 2 partitions per variable
    np.testing.assert_array_equal(
        parts["input_layer/b_embedding/embedding_weights"],
        EXPECTED["values"]["tbl_b"]["parameters"],
    )
    assert all(v.dtype == np.float32 for v in parts.values())
    rows = np.arange(1000, dtype=np.float32)  # 3 parts from rows 0, 334, 667
    big = parts["input_layer/d_embedding/embedding_weights"]
    np.testing.assert_array_equal(big, np.stack([rows, -rows], axis=1))


def test_slice_key_numbers_keep_their_order():
    # OrderedCode's defining property: byte order of the encodings is numeric order.
    values = sorted({0, 1, -1, 63, 64, -64, -65, 334, 8191, 8192, -(2**20), 2**40, -(2**62)})
    values += [-(2**63), 2**63 - 1]
    values.sort()
    encoded = [_signed_num_increasing(v) for v in values]
    assert sorted(encoded) == encoded and len(set(encoded)) == len(encoded)
    assert [len(e) for e in encoded[:3]] == [10, 9, 3]  # -2**63, -2**62, -2**20
    assert _signed_num_increasing(5) == bytes([0x85]) and _signed_num_increasing(-1) == b"\x7f"


def _unchanged(engine, before):
    return all(torch.equal(v, before[k]) for k, v in engine.state_dict().items())


def test_shape_mismatch_names_table_and_shapes_and_changes_nothing():
    engine = make_engine(tbl_b=(7, 2))
    before = {k: v.clone() for k, v in engine.state_dict().items()}
    with pytest.raises(CheckpointError, match=r"table 'tbl_b'.*shape \[5, 2\].*\[7, 2\]"):
        load_tf_checkpoint(engine, CHECKPOINTS["midlevel"])
    assert _unchanged(engine, before)


def test_missing_slot_names_table_and_slot():
    features = {
        "a": ec.FeatureConfig(
            table=ec.TableConfig(
                vocabulary_size=6, dim=3, name="tbl_a", optimizer=ec.Adam(learning_rate=0.1)
            ),
            name="a",
        )
    }
    engine = ec.EmbeddingEngine(features)
    before = {k: v.clone() for k, v in engine.state_dict().items()}
    with pytest.raises(CheckpointError, match=r"table 'tbl_a', Adam slot 'momenta'.*Adam/m"):
        load_tf_checkpoint(engine, CHECKPOINTS["estimator"])
    with pytest.raises(CheckpointError, match=r"'tbl_a', Adam slot 'momenta'.*tbl_a\.Smomenta"):
        load_tf_checkpoint(engine, CHECKPOINTS["midlevel"])
    assert _unchanged(engine, before)
    load_tf_checkpoint(engine, CHECKPOINTS["midlevel"], slots=False)  # tables only: fine


def test_missing_table_and_overrides():
    features = {"z": ec.FeatureConfig(table=ec.TableConfig(vocabulary_size=6, dim=3, name="tbl_z"))}
    engine = ec.EmbeddingEngine(features)
    with pytest.raises(CheckpointError, match=r"table 'tbl_z' is not in the midlevel"):
        load_tf_checkpoint(engine, CHECKPOINTS["midlevel"])
    with pytest.raises(CheckpointError, match=r"table 'tbl_z' is not in the estimator"):
        load_tf_checkpoint(engine, CHECKPOINTS["estimator"])
    name = "input_layer/a_embedding/embedding_weights"
    loaded = load_tf_checkpoint(engine, CHECKPOINTS["estimator"], variable_names={"tbl_z": name})
    assert loaded == {"tbl_z.weight": name}
    np.testing.assert_array_equal(
        engine.embedding_tables["tbl_z"].numpy(), EXPECTED["values"]["tbl_a"]["parameters"]
    )
    with pytest.raises(ValueError, match="tables \\['nope'\\]"):
        load_tf_checkpoint(engine, CHECKPOINTS["estimator"], variable_names={"nope": name})


def test_bad_files_are_named(tmp_path):
    engine = make_engine()
    with pytest.raises(CheckpointError, match="no TensorFlow checkpoint here"):
        load_tf_checkpoint(engine, tmp_path / "model.ckpt-1")
    with pytest.raises(CheckpointError, match="checkpoint"):
        load_tf_checkpoint(engine, tmp_path)  # a directory without a checkpoint file
    copy = tmp_path / "ckpt"
    for f in CHECKPOINTS["midlevel"].parent.iterdir():
        shutil.copy(f, tmp_path / f.name)
    data = tmp_path / "ckpt.data-00000-of-00001"
    raw = bytearray(data.read_bytes())
    raw[40] ^= 0xFF
    data.write_bytes(bytes(raw))
    before = {k: v.clone() for k, v in engine.state_dict().items()}
    with pytest.raises(CheckpointError, match="CRC32C"):
        load_tf_checkpoint(engine, copy)
    assert _unchanged(engine, before)
    (tmp_path / "ckpt.index").write_bytes(b"not a table" * 10)
    with pytest.raises(CheckpointError, match="not a TensorFlow checkpoint index"):
        load_tf_checkpoint(engine, copy)
    with pytest.raises(ValueError, match="layout must be"):
        load_tf_checkpoint(engine, copy, layout="keras")
    with pytest.raises(TypeError, match="expected an EmbeddingEngine"):
        load_tf_checkpoint(object(), copy)


def test_estimator_and_dense_features_built_from_the_same_columns():
    column = fc.embedding_column(fc.categorical_column_with_identity("a", 6), 3)
    spec = fc.EmbeddingConfigSpec(
        feature_columns=[column], optimization_parameters=fc.AdagradParameters(0.1)
    )

    def model_fn(features, labels):
        return EstimatorSpec(ModeKeys.PREDICT, predictions=features.activations["a"])

    est = Estimator(model_fn, embedding_config_spec=spec)
    loaded = load_tf_checkpoint(est, CHECKPOINTS["estimator"])  # table tbl_a, slot Adagrad
    assert loaded["tbl_a.accumulators"] == "input_layer/a_embedding/embedding_weights/Adagrad"
    rows = [[v for v in row if v >= 0] for row in EXPECTED["ids"]["a"]]
    acts = est.embedding_lookup.engine({"a": ec.RaggedIds.from_lists(rows)})["a"]
    np.testing.assert_allclose(
        acts.detach().numpy(), EXPECTED["lookups"]["estimator"]["a"], rtol=1e-6
    )

    layer = fc.DenseFeatures([column])
    load_tf_checkpoint(layer, CHECKPOINTS["midlevel"], variable_names={"tbl_a": _A})
    with torch.no_grad():
        out = layer({"a": np.array(EXPECTED["ids"]["a"])})  # dense rows: -1 is padding
    np.testing.assert_allclose(out.numpy(), EXPECTED["lookups"]["midlevel"]["a"], rtol=1e-6)


_A = "model/embedding/tbl_a/.ATTRIBUTES/VARIABLE_VALUE"


def test_compat_tpu_embedding_restores_a_midlevel_checkpoint():
    from embcore.compat import tpu

    table = tpu.TableConfig(vocabulary_size=5, dim=2, name="tbl_b")
    embedding = tpu.TPUEmbedding({"b": tpu.FeatureConfig(table=table)}, tpu.Adam(0.1))
    loaded = ec.compat.load_tf_checkpoint(embedding, CHECKPOINTS["midlevel"])
    assert sorted(loaded) == ["tbl_b.momenta", "tbl_b.velocities", "tbl_b.weight"]
    acts = embedding({"b": ragged(EXPECTED["ids"]["b"])})
    np.testing.assert_allclose(
        acts["b"].detach().numpy(), EXPECTED["lookups"]["midlevel"]["b"], rtol=1e-6
    )
