"""``crossed_column``, ``bucketized_column`` and ``indicator_column``: TensorFlow's semantics.

References: TensorFlow's own outputs saved in tests/fixtures/tensorflow/crossed_columns.json
(``make_cross_fixture.py``), and independent Python references written here from TensorFlow's
definitions: ``FingerprintCat64`` (tsl/platform/fingerprint.h) with Python integers modulo
2**64, the ``SparseCross`` hashed kernel's Cartesian product (last key fastest) with the
``farmhash`` module of the `cityhash` package as ``Fingerprint64``, ``Bucketize``'s
``upper_bound`` on float32 boundaries, and a one-hot count per id.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import math
from pathlib import Path

import farmhash  # from the `cityhash` package (the test extra): Google's C++ FarmHash
import numpy as np
import pytest

import embcore as ec
from embcore import feature_column as fc
from embcore.feature_column.crossed import DEFAULT_HASH_KEY
from embcore.feature_column.hashing import fingerprint_cat64
from embcore.feature_column.wrappers import categorical_column_from_config

FIXTURES = Path(__file__).parents[1] / "fixtures" / "tensorflow"
MASK = 2**64 - 1


def _load_fixture_module():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("make_cross", FIXTURES / "make_cross_fixture.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


MAKE = _load_fixture_module()
SAVED = json.loads((FIXTURES / "crossed_columns.json").read_text())


def cat64(fp1: int, fp2: int) -> int:
    """TensorFlow's FingerprintCat64 on Python ints (its definition, line by line)."""
    k = 0xC6A4A7935BD1E995

    def shift_mix(v: int) -> int:
        return v ^ (v >> 47)

    result = fp1 ^ k
    result ^= (shift_mix((fp2 * k) & MASK) * k) & MASK
    result = (result * k) & MASK
    result = (shift_mix(result) * k) & MASK
    return shift_mix(result)


def feature_hash(value: object) -> int:
    """A crossed value's 64-bit feature: Fingerprint64 of a string, an integer as uint64."""
    if isinstance(value, str):
        return farmhash.Fingerprint64(value.encode("utf-8"))
    return int(value) & MASK


def reference_cross(
    rows_per_key: list[list[list]], buckets: int, hash_key: int, dense: list[bool] | None = None
) -> list[list]:
    """Per example: the ids of the Cartesian product of its values, last key fastest; keys
    given ``dense`` go after the others (TensorFlow's SparseCross takes its sparse inputs
    first, then its dense ones)."""
    dense = dense or [False] * len(rows_per_key)
    ordered = [r for r, d in zip(rows_per_key, dense, strict=True) if not d]
    ordered += [r for r, d in zip(rows_per_key, dense, strict=True) if d]
    out = []
    for rows in zip(*ordered, strict=True):
        ids = []
        for combo in itertools.product(*rows):
            h = hash_key
            for value in combo:
                h = cat64(h, feature_hash(value))
            ids.append(h % buckets)
        out.append(ids)
    return out


def _rows(ids: fc.categorical.ColumnIds) -> list[list[int]]:
    return [ids.ids[a:b].tolist() for a, b in itertools.pairwise(ids.row_splits)]


def _features(case: dict) -> dict:
    out = {}
    for key, given in case["features"].items():
        ((form, rows),) = given.items()
        first = next(v for row in rows for v in row)
        if form == "ragged":
            out[key] = rows
        elif isinstance(first, float):
            out[key] = np.array(rows, dtype=np.float32)
        elif isinstance(first, int):
            out[key] = np.array(rows, dtype=np.int64)
        else:
            out[key] = np.array(rows, dtype=object)
    return out


# --------------------------------------------------------------------------- TensorFlow's
def test_fixture_is_from_tensorflow() -> None:
    assert SAVED["tensorflow"] == "2.21.0" and len(SAVED["cases"]) == len(MAKE.CASES) == 9


@pytest.mark.parametrize("case", SAVED["cases"], ids=lambda c: "-".join(map(str, c["column"][:1])))
def test_columns_equal_tensorflows(case: dict) -> None:
    column = MAKE.build(case["column"], fc)
    features = _features(case)
    if "ids" in case:
        ids = column.transform(features)
        assert ids.ids.tolist() == case["ids"]
        assert np.diff(ids.row_splits).tolist() == case["row_lengths"]
    if "dense" in case:
        want = np.array(case["dense"], dtype=np.float32).reshape(len(case["dense"]), -1)
        np.testing.assert_array_equal(column.dense(features).numpy(), want)
        out = fc.DenseFeatures([column])(features)  # the same through DenseFeatures
        np.testing.assert_array_equal(out.numpy(), want)


# ------------------------------------------------------------------- independent references
def test_fingerprint_cat64_matches_its_definition() -> None:
    rng = np.random.default_rng(0)
    a = rng.integers(0, 2**63, 500, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
    b = rng.integers(0, 2**63, 500, dtype=np.uint64) * np.uint64(3)
    a[:3], b[:3] = [0, MASK, 2**63], [MASK, 0, 1]
    got = fingerprint_cat64(a, b)
    assert got.dtype == np.uint64
    assert got.tolist() == [cat64(int(x), int(y)) for x, y in zip(a, b, strict=True)]


def test_crossed_ids_match_the_reference_on_random_batches() -> None:
    rng = np.random.default_rng(1)
    words = ["", "a", "cats", "naïve", "日本語", "x" * 40]

    def ragged(values: list) -> list[list]:
        return [list(rng.choice(values, rng.integers(0, 4))) for _ in range(40)]

    a = [[str(v) for v in row] for row in ragged(words)]
    b = [[int(v) for v in row] for row in ragged([0, 1, -1, 2**62, -(2**63), 17])]
    ident = fc.categorical_column_with_identity("i", 10, default_value=0)
    i_rows = [[int(v) for v in row] for row in ragged(list(range(12)))]
    col = fc.crossed_column(["a", "b", ident], 1_000_003, hash_key=7)
    got = _rows(col.transform({"a": a, "b": b, "i": i_rows}))
    mapped = [[v if v < 10 else 0 for v in row] for row in i_rows]  # the identity ids
    assert got == reference_cross([a, b, mapped], 1_000_003, 7)
    assert sum(map(len, got)) > 40  # rows with several crosses, and empty rows
    assert any(not row for row in got)
    default = fc.crossed_column(["a", "b"], 97)
    assert _rows(default.transform({"a": a, "b": b})) == reference_cross(
        [a, b], 97, DEFAULT_HASH_KEY
    )
    # dense raw features (a NumPy array, a flat list) go after the sparse keys
    d = rng.choice(words, (40, 2))
    flat = [str(v) for v in rng.choice(words, 40)]
    mixed = fc.crossed_column(["d", "flat", "a", ident], 10**9)
    got = _rows(mixed.transform({"d": d, "flat": flat, "a": a, "i": i_rows}))
    d_rows, flat_rows = [list(map(str, row)) for row in d], [[v] for v in flat]
    want = reference_cross(
        [d_rows, flat_rows, a, mapped], 10**9, DEFAULT_HASH_KEY, [True, True, False, False]
    )
    assert got == want
    assert got != reference_cross([d_rows, flat_rows, a, mapped], 10**9, DEFAULT_HASH_KEY)


def test_bucketized_and_indicator_match_their_references() -> None:
    rng = np.random.default_rng(2)
    boundaries = [-1.0, 0.0, 0.3, 2.5]
    values = rng.normal(size=(30, 2)).astype(np.float32)
    values[0] = [0.3, np.float32(0.3)]  # on a boundary: the bucket to its right
    col = fc.bucketized_column(fc.numeric_column("p", shape=2), boundaries)
    edges = [float(np.float32(b)) for b in boundaries]
    want_buckets = [[sum(e <= float(v) for e in edges) for v in row] for row in values]
    ids = col.transform({"p": values})
    assert _rows(ids) == [[b0, b1 + 5] for b0, b1 in want_buckets]
    one_hot = np.zeros((30, 2, 5), np.float32)
    for r, (b0, b1) in enumerate(want_buckets):
        one_hot[r, 0, b0] = one_hot[r, 1, b1] = 1
    np.testing.assert_array_equal(col.dense({"p": values}).numpy(), one_hot.reshape(30, 10))
    assert col.num_buckets == 10 and col.name == "p_bucketized"

    vocab = fc.categorical_column_with_vocabulary_list("v", ["a", "b"], num_oov_buckets=1)
    rows = [list(rng.choice(["a", "b", "zz"], rng.integers(0, 5))) for _ in range(20)]
    counts = np.zeros((20, 3), np.float32)
    for r, row in enumerate(rows):
        for v in row:
            counts[r, {"a": 0, "b": 1}.get(v, 2)] += 1
    ind = fc.indicator_column(vocab)
    np.testing.assert_array_equal(ind.dense({"v": rows}).numpy(), counts)
    assert ind.name == "v_indicator"


# ----------------------------------------------------------------------- wide and deep
def test_wide_and_deep_columns_train_and_round_trip_through_their_configs() -> None:
    price = fc.numeric_column("price")
    price_b = fc.bucketized_column(price, [10.0, 100.0])
    cross = fc.crossed_column([price_b, "kw"], 50)
    features = {"price": [5.0, 50.0, 500.0], "kw": [["a"], ["b", "c"], []]}
    wide = fc.DenseFeatures([fc.indicator_column(cross), price_b])
    x = wide(features)
    assert x.shape == (3, 53)
    np.testing.assert_array_equal(x[:, 50:].numpy(), np.eye(3, dtype=np.float32))  # bucket 0,1,2
    assert x[:, :50].sum(1).tolist() == [1.0, 2.0, 0.0]  # one cross per (bucket, keyword)
    deep = fc.DenseFeatures([fc.embedding_column(cross, 4)], optimizer=ec.SGD(learning_rate=1.0))
    deep.train()
    out = deep(features)
    assert out.shape == (3, 4) and out[2].abs().sum() == 0  # no keyword: no cross
    (name,) = deep.lookup.engine.embedding_tables
    before = deep.lookup.engine.embedding_tables[name].detach().clone()
    out.sum().backward()  # the engine applies SGD to the rows of the crosses
    changed = (deep.lookup.engine.embedding_tables[name] != before).any(1)
    want = np.zeros(50, bool)
    want[cross.transform(features).ids] = True
    assert changed.tolist() == want.tolist()
    for column in (cross, price_b, fc.crossed_column([cross, "z"], 9, hash_key=3)):
        again = categorical_column_from_config(json.loads(json.dumps(column.to_config())))
        feats = {**features, "z": [["q"], ["r"], ["s"]]}
        assert _rows(again.transform(feats)) == _rows(column.transform(feats))
        assert again.name == column.name


# ------------------------------------------------------------------------------- errors
def test_bad_arguments_are_refused_by_name() -> None:
    hashed = fc.categorical_column_with_hash_bucket("h", 10)
    with pytest.raises(ValueError, match=r"hashed column 'h' cannot be crossed.*'h' instead"):
        fc.crossed_column([hashed, "b"], 10)
    with pytest.raises(ValueError, match="two or more keys"):
        fc.crossed_column(["a"], 10)
    with pytest.raises(ValueError, match="hash_bucket_size must be an int >= 1, got 0"):
        fc.crossed_column(["a", "b"], 0)
    with pytest.raises(ValueError, match="sequence column"):
        fc.crossed_column([fc.sequence_categorical_column_with_identity("s", 3), "b"], 10)
    price = fc.numeric_column("price")
    with pytest.raises(ValueError, match=r"strictly increasing, got 2.0 then 1.0"):
        fc.bucketized_column(price, [0.0, 2.0, 1.0])
    with pytest.raises(ValueError, match="non-empty sorted list"):
        fc.bucketized_column(price, [])
    with pytest.raises(ValueError, match="one-dimensional"):
        fc.bucketized_column(fc.numeric_column("m", shape=(2, 2)), [1.0])
    with pytest.raises(ValueError, match="must be a numeric_column"):
        fc.bucketized_column(hashed, [1.0])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="must be a categorical column"):
        fc.indicator_column(price)  # type: ignore[arg-type]
    cross = fc.crossed_column(["a", "b"], 10)
    with pytest.raises(TypeError, match=r"feature 'b' must hold strings or integers.*floats"):
        cross.transform({"a": [["x"]], "b": [[1.5]]})
    with pytest.raises(ValueError, match=r"feature 'b' is not in the features dict"):
        cross.transform({"a": [["x"]]})
    assert math.isclose(DEFAULT_HASH_KEY, 0xDECAFCAFFE)
    with pytest.raises(ValueError, match="different batch sizes"):
        cross.transform({"a": [["x"]], "b": [["y"], ["z"]]})
