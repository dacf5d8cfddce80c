"""TensorFlow checkpoints laid out in the less common ways (written by TensorFlow itself:
tests/fixtures/tensorflow/make_bundle_fixtures.py): a checkpoint split over two data files
imports exactly as the single-file one, and a partitioned tensor whose slices do not cover it
(rows or columns missing), which TensorFlow's own reader refuses, is refused naming the
tensor, never filled with zeros."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from test_tf_checkpoint import EXPECTED, make_engine, ragged

from embcore.compat._tf_bundle import read_checkpoint
from embcore.compat.tf_checkpoint import CheckpointError, load_tf_checkpoint

FIXTURES = Path(__file__).parents[1] / "fixtures" / "tensorflow"
BUNDLES = json.loads((FIXTURES / "bundles.json").read_text())
SHARDED = FIXTURES / "sharded" / "model.ckpt-9"
UNCOVERED = FIXTURES / "uncovered" / "ckpt"


def test_the_fixtures_are_from_tensorflow_and_split_over_two_data_files():
    assert BUNDLES["tensorflow"] == EXPECTED["tensorflow"] == "2.21.0"
    files = sorted(p.name for p in SHARDED.parent.glob("*.data-*"))
    assert (
        files
        == BUNDLES["sharded"]["data_files"]
        == [
            "model.ckpt-9.data-00000-of-00002",
            "model.ckpt-9.data-00001-of-00002",
        ]
    )
    assert all((SHARDED.parent / f).stat().st_size > 0 for f in files)


def test_a_checkpoint_over_two_data_files_imports_every_table_and_slot():
    engine = make_engine()
    loaded = load_tf_checkpoint(engine, SHARDED, layout="estimator")
    assert len(loaded) == 3 + 5
    slots = engine.slot_variables
    for name, state in EXPECTED["values"].items():
        np.testing.assert_array_equal(engine.embedding_tables[name].numpy(), state["parameters"])
        for slot, value in slots[name].items():
            np.testing.assert_array_equal(value.numpy(), state[slot])
    # and TensorFlow's lookups on the single-file checkpoint of the same values
    acts = engine({k: ragged(ids) for k, ids in EXPECTED["ids"].items()})
    for key, expected in EXPECTED["lookups"]["estimator"].items():
        np.testing.assert_allclose(acts[key].detach().numpy(), expected, rtol=1e-6, atol=1e-7)


def test_a_missing_data_file_is_named(tmp_path):
    for f in SHARDED.parent.iterdir():
        if not f.name.endswith("data-00001-of-00002"):
            (tmp_path / f.name).write_bytes(f.read_bytes())
    with pytest.raises(CheckpointError, match=r"model\.ckpt-9\.data-00001-of-00002"):
        read_checkpoint(tmp_path / "model.ckpt-9")


def test_slices_that_cover_a_tensor_are_put_back_together():
    assert (
        read_checkpoint(UNCOVERED, ["covered"])["covered"].tolist()
        == (BUNDLES["uncovered"]["covered"]["values"])
    )


@pytest.mark.parametrize("name", ["rows_missing", "columns_missing"])
def test_slices_that_do_not_cover_a_tensor_are_refused_as_tensorflow_refuses_them(name):
    assert "Does not have sufficient slices" in BUNDLES["uncovered"][name]["error"]
    with pytest.raises(CheckpointError, match=f"tensor '{name}': the slices hold"):
        read_checkpoint(UNCOVERED, [name])
    with pytest.raises(CheckpointError, match=r"tensor '\w+_missing': the slices hold"):
        read_checkpoint(UNCOVERED)  # every tensor: the first uncovered one is named
