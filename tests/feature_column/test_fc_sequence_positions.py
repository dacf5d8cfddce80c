"""Sequence positions and lengths as TensorFlow's feature columns give them.

A sparse input places each id at its column index and a dense input keeps the columns of the
values left after its padding is dropped: a row with ids at columns 0 and 2 has length 3 and a
zero vector at position 1. Expected values were saved from TensorFlow 2.21
(tests/fixtures/tensorflow/make_sequence_fixture.py); the NumPy checks below restate them.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import embcore.feature_column as fc
from embcore.feature_column.raw_inputs import to_ragged

SAVED = json.loads(
    (Path(__file__).parents[1] / "fixtures" / "tensorflow" / "sequence_inputs.json").read_text()
)
CASES = {c["name"]: c for c in SAVED["cases"]}


def _init(value):
    return lambda shape, dtype=torch.float32: torch.tensor(value, dtype=dtype)


def _feature(case):
    value = case["input"]
    if case["kind"] == "sparse":
        indices = torch.tensor(value["indices"]).T
        return torch.sparse_coo_tensor(
            indices, torch.tensor(value["values"]), value["dense_shape"], check_invariants=True
        )
    if case["kind"] == "dense":
        return np.array(value)  # ints or "<U" strings
    return value  # a list of lists


def _embed(case, length, weights=None):
    if case["vocabulary"] is None:
        column = fc.sequence_categorical_column_with_identity("x", 10)
    else:
        column = fc.sequence_categorical_column_with_vocabulary_list("x", case["vocabulary"])
    features = {"x": _feature(case)}
    if weights is not None:
        column = fc.weighted_categorical_column(column, "w")
        features["w"] = weights
    rows = SAVED["table"][: column.num_buckets]
    emb = fc.embedding_column(column, 2, max_sequence_length=length, initializer=_init(rows))
    out = fc.DenseFeatures([emb])(features)
    name = emb.name
    return out.sequence[name].numpy(), out.sequence_lengths[name].tolist()


def test_fixture_is_from_tensorflow():
    assert SAVED["tensorflow"] == "2.21.0" and len(CASES) == 4


@pytest.mark.parametrize("name", sorted(CASES))
def test_sequence_embeddings_and_lengths_equal_tensorflows(name):
    case = CASES[name]
    expected = np.array(case["embeddings"], dtype=np.float32)  # (B, T, dim)
    got, lengths = _embed(case, expected.shape[1])
    np.testing.assert_array_equal(got, expected)
    assert lengths == case["lengths"]


@pytest.mark.parametrize("name", sorted(CASES))
def test_max_sequence_length_truncates_by_position(name):
    case = CASES[name]
    expected = np.array(case["embeddings"], dtype=np.float32)[:, :2]
    got, lengths = _embed(case, 2)
    np.testing.assert_array_equal(got, expected)
    assert lengths == np.minimum(case["lengths"], 2).tolist()


def test_sparse_row_with_a_gap_restated_in_numpy():
    table = np.array(SAVED["table"], dtype=np.float32)
    got, lengths = _embed(CASES["sparse ids at columns with gaps"], 6)
    assert lengths[0] == 3  # ids at columns 0 and 2
    np.testing.assert_array_equal(got[0, :3], np.stack([table[3], np.zeros(2), table[5]]))
    assert not got[0, 3:].any()


def test_weighted_sparse_sequence_keeps_weights_at_their_positions():
    case = CASES["sparse ids at columns with gaps"]
    value = case["input"]
    weights = torch.sparse_coo_tensor(
        torch.tensor(value["indices"]).T,
        torch.tensor([2.0, 3.0, 4.0, 5.0, 6.0]),
        (4, 6),
        check_invariants=True,
    )
    got, lengths = _embed(case, 6, weights)
    table = np.array(SAVED["table"], dtype=np.float32)
    assert lengths == case["lengths"]
    np.testing.assert_allclose(got[0, 2], 3.0 * table[5])  # the weight is a per-id gain
    np.testing.assert_allclose(got[2, 5], 6.0 * table[9])
    assert not got[0, 1].any()


def test_positions_of_raw_inputs():
    sparse = torch.sparse_coo_tensor(
        [[1, 0, 0], [1, 2, 0]], [7, 5, 3], (2, 4), check_invariants=True
    )
    r = to_ragged("x", sparse)
    assert r.positions().tolist() == [0, 2, 1]
    dense, keep = to_ragged("x", np.array([[3, -1, 5], [-1, 7, -1]])).drop_padding()
    assert dense.positions().tolist() == [0, 2, 1] and keep.sum() == 3
    assert to_ragged("x", [[3, 5], [7]]).positions().tolist() == [0, 1, 0]
    col = fc.sequence_categorical_column_with_identity("x", 10).transform({"x": sparse})
    assert col.sequence_lengths().tolist() == [3, 2]
    full = fc.sequence_categorical_column_with_identity("x", 10).transform({"x": [[1, 2], []]})
    assert full.positions is None and full.sequence_lengths().tolist() == [2, 0]


def test_tensor_core_lookup_drops_by_column_index():
    # The dense ("tpu_tensor_core") lookup densifies to [B, width] by column index: an id at
    # column 3 is dropped with width 2 although it is the second id of its row.
    table = np.array(SAVED["table"], dtype=np.float32)
    emb = fc.embedding_column(
        fc.categorical_column_with_identity("x", 10),
        2,
        combiner="sum",
        initializer=_init(table),
        embedding_lookup_device="tpu_tensor_core",
        tensor_core_shape=[None, 2],
    )
    sparse = torch.sparse_coo_tensor(
        [[0, 0, 1, 1], [0, 3, 1, 2]], [3, 5, 7, 9], (2, 4), check_invariants=True
    )
    dense = np.array([[3, -1, -1, 5], [-1, 7, 9, -1]])  # the same ids and columns
    for value in (sparse, dense):
        with torch.no_grad():
            out = fc.DenseFeatures([emb])({"x": value}).numpy()
        np.testing.assert_allclose(out, np.stack([table[3], table[7]]), rtol=1e-6)
