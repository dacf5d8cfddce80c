"""Raw feature containers -> ragged values (the hash is in test_fc_hashing.py)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import torch

from embcore import RaggedIds
from embcore.feature_column.raw_inputs import to_ragged


def rows(r):
    """Back to a list of lists, for comparisons."""
    v = r.values.tolist()
    return [v[a:b] for a, b in zip(r.row_splits[:-1], r.row_splits[1:], strict=True)]


# ---------------------------------------------------------------------------- containers


def test_dense_tensors_drop_padding_but_keep_zero():
    r, keep = to_ragged("f", torch.tensor([[3, -1], [0, 5], [-1, -1]])).drop_padding()
    assert rows(r) == [[3], [0, 5], []]
    assert keep.tolist() == [True, False, True, True, False, False]
    r, _ = to_ragged("f", torch.tensor([4, 0, -1])).drop_padding()
    assert rows(r) == [[4], [0], []]


def test_lists_and_ragged_keep_every_entry():
    r, keep = to_ragged("f", [[3, -1], [], [7]]).drop_padding()
    assert rows(r) == [[3, -1], [], [7]] and keep is None
    r, _ = to_ragged("f", [1, -1, 2]).drop_padding()  # a list is not padded
    assert rows(r) == [[1], [-1], [2]]
    r = to_ragged("f", RaggedIds.from_lists([[1, 2], [3]]))
    assert rows(r) == [[1, 2], [3]] and r.kind == "int"
    assert rows(to_ragged("f", [])) == []


def test_strings_from_numpy_lists_and_bytes():
    r, _ = to_ragged("f", np.array([["a", ""], ["b", "c"]])).drop_padding()
    assert rows(r) == [["a"], ["b", "c"]] and r.kind == "string"
    r = to_ragged("f", [["x", b"y"], []])
    assert rows(r) == [["x", "y"], []]
    r = to_ragged("f", np.array([["a"], ["b", "c"]], dtype=object))
    assert rows(r) == [["a"], ["b", "c"]]


def test_sparse_tensor_rows_follow_indices():
    sp = torch.sparse_coo_tensor([[2, 0, 0], [0, 1, 0]], [9, 5, 4], (3, 4), check_invariants=True)
    assert rows(to_ragged("f", sp)) == [[4, 5], [], [9]]
    twice = torch.sparse_coo_tensor([[0, 0], [1, 1]], [3, 4], (1, 2), check_invariants=True)
    with pytest.raises(ValueError, match=r"repeats index \[0, 1\]"):
        to_ragged("f", twice)  # coalescing would add the two ids into a third one
    with pytest.raises(ValueError, match="rank 2"):
        to_ragged("f", torch.sparse_coo_tensor([[0]], [1], (2,), check_invariants=True))


def test_pyarrow_arrays():
    r = to_ragged("f", pa.array([["a", "b"], None, [], ["c"]]))
    assert rows(r) == [["a", "b"], [], [], ["c"]]
    r = to_ragged("f", pa.chunked_array([pa.array([1, None]), pa.array([3])]))
    assert rows(r) == [[1], [], [3]]
    r = to_ragged("f", pa.array(["x", "y", "x"]).dictionary_encode())
    assert rows(r) == [["x"], ["y"], ["x"]]
    r = to_ragged("f", pa.array([[1, 2], [3]], type=pa.large_list(pa.int32())))
    assert rows(r) == [[1, 2], [3]] and r.kind == "int"
    r = to_ragged("f", pa.array([["a", "b"], ["c"], ["d"]])[1:])  # a sliced list array
    assert rows(r) == [["c"], ["d"]]
    with pytest.raises(ValueError, match="null"):
        to_ragged("f", pa.array([["a", None]]))


@pytest.mark.parametrize(
    ("value", "error", "match"),
    [
        (torch.tensor(3), ValueError, "scalar"),
        (torch.zeros(2, 2, 2, dtype=torch.int64), ValueError, "rank 1"),
        (torch.tensor([True]), TypeError, "bool"),
        ([[1], 2], ValueError, "row 1"),
        ([["a", 1]], TypeError, "all ints"),
        ({"a": 1}, TypeError, "dict"),
        ([[[1]]], ValueError, "nested"),
    ],
)
def test_bad_inputs_name_the_feature(value, error, match):
    with pytest.raises(error, match=match) as info:
        to_ragged("my_feature", value)
    assert "my_feature" in str(info.value)
