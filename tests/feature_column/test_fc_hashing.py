"""TensorFlow's hash: FarmHash Fingerprint64, bit for bit, and TensorFlow's own buckets."""

from __future__ import annotations

import json
from pathlib import Path

import farmhash  # from the `cityhash` package (the test extra): Google's C++ FarmHash
import numpy as np
import pytest

from embcore import feature_column as fc
from embcore.feature_column.hashing import fingerprint64, fingerprints, hash_buckets

# ------------------------------------------------------------------------------- hashing
# The reference is the `farmhash` module of the `cityhash` package (a C++ build of Google's
# FarmHash), and TensorFlow's own buckets saved in tests/fixtures/tensorflow.

FIXTURES = Path(__file__).parents[1] / "fixtures" / "tensorflow"


def reference(value: bytes) -> int:
    return farmhash.Fingerprint64(value)


def test_fingerprints_match_farmhash_for_every_length():
    rng = np.random.default_rng(0)
    values = [rng.bytes(n) for n in range(301) for _ in range(3)]  # all four length classes
    np.testing.assert_array_equal(
        fingerprints(values), np.array([reference(v) for v in values], dtype=np.uint64)
    )
    text = [
        "".join(chr(c) for c in rng.integers(32, 127, n)) for n in range(301)
    ]  # ASCII str: the fast path
    np.testing.assert_array_equal(
        fingerprints(np.array(text, dtype=object)),
        np.array([reference(v.encode()) for v in text], dtype=np.uint64),
    )


def test_fingerprints_of_utf8_strings():
    rng = np.random.default_rng(1)
    alphabet = ["a", "é", "ß", "日", "本", "🙂", "\x00", " "]  # 1 to 4 UTF-8 bytes
    text = ["".join(rng.choice(alphabet, n)) for n in range(0, 120)] + ["", "naïve", "a\x00"]
    expected = np.array([reference(v.encode("utf-8")) for v in text], dtype=np.uint64)
    np.testing.assert_array_equal(fingerprints(np.array(text, dtype=object)), expected)
    np.testing.assert_array_equal(fingerprints(text), expected)
    np.testing.assert_array_equal(fingerprints(np.array(text[1:20])), expected[1:20])  # "<U"
    assert fingerprint64("naïve") == reference("naïve".encode())
    assert fingerprint64(b"\xff\xfe") == reference(b"\xff\xfe")  # bytes as they are
    mixed = ["é", b"\xc3\xa9", "x"]
    np.testing.assert_array_equal(
        fingerprints(mixed), [reference("é".encode())] * 2 + [reference(b"x")]
    )


def test_integers_hash_through_their_decimal_text():
    ints = [0, 1, -1, 9, 10, -10, 12, -12, 2**31 - 1, -(2**31), 2**63 - 1, -(2**63), 10**18]
    ints += np.random.default_rng(2).integers(-(2**63), 2**63 - 1, 200).tolist()
    expected = np.array([reference(str(v).encode()) for v in ints], dtype=np.uint64)
    np.testing.assert_array_equal(fingerprints(np.array(ints, dtype=np.int64)), expected)
    np.testing.assert_array_equal(fingerprints(ints), expected)  # Python ints
    np.testing.assert_array_equal(fingerprints(np.array(ints[:5], dtype=np.int32)), expected[:5])
    assert fingerprint64(-12) == fingerprint64("-12") == reference(b"-12")
    assert fingerprint64(np.int64(7)) == reference(b"7")


def test_buckets_equal_tensorflows_to_hash_bucket_fast():
    saved = json.loads((FIXTURES / "hash_buckets.json").read_text())
    cases = [c for c in saved["cases"] if c["op"] == "to_hash_bucket_fast"]
    assert saved["tensorflow"] == "2.21.0" and len(cases) == 5
    for case in cases:
        values = np.array(case["values"], dtype=object)
        assert hash_buckets(values, case["num_buckets"]).tolist() == case["buckets"]


def test_columns_bucket_like_tensorflows_feature_columns():
    saved = json.loads((FIXTURES / "hash_buckets.json").read_text())
    for case in saved["cases"]:
        dtype = np.int64 if case.get("dtype") == "int64" else str
        dense = np.array([case["values"]], dtype=dtype)  # one dense row: -1 / "" are padding
        if case["op"] == "hash_bucket_column":
            col = fc.categorical_column_with_hash_bucket("k", case["num_buckets"], dtype=dtype)
        elif case["op"] == "vocabulary_list_column":
            col = fc.categorical_column_with_vocabulary_list(
                "k", case["vocabulary"], num_oov_buckets=case["num_oov_buckets"]
            )
        else:
            continue
        assert col.transform({"k": dense}).ids.tolist() == case["buckets"], case["op"]


def test_hash_buckets_range_and_errors():
    values = np.array([f"v{i}" for i in range(500)], dtype=object)
    b = hash_buckets(values, 7)
    assert b.dtype == np.int64 and b.min() >= 0 and b.max() < 7
    assert len(set(b.tolist())) == 7  # 500 values spread over every bucket
    np.testing.assert_array_equal(b, [reference(v.encode()) % 7 for v in values])
    assert hash_buckets(np.array([], dtype=object), 3).tolist() == []
    grid = np.array([["a", "b"], ["c", "d"]])  # arrays of any shape are flattened
    np.testing.assert_array_equal(
        hash_buckets(grid, 5), [reference(c.encode()) % 5 for c in "abcd"]
    )
    with pytest.raises(ValueError, match="num_buckets"):
        hash_buckets(values, 0)
    with pytest.raises(TypeError, match="float"):
        fingerprint64(1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="float"):
        fingerprints(np.array([1.5]))
    with pytest.raises(TypeError, match="mix integers with strings"):
        fingerprints(["a", 3])
    with pytest.raises(ValueError, match="does not fit in int64"):
        fingerprints([2**63])
    with pytest.raises(ValueError, match="not valid Unicode"):
        fingerprints(["ok", "\ud800"])  # a lone surrogate has no UTF-8 form
