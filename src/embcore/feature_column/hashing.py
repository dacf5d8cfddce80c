"""TensorFlow's hash behind hash buckets and out-of-vocabulary buckets.

``fingerprint64(value)`` is FarmHash ``Fingerprint64`` of the UTF-8 bytes of the value, and a
bucket is that modulo the number of buckets, exactly as ``tf.strings.to_hash_bucket_fast``::

    fingerprint64(v) = farmhash.Fingerprint64(utf8(v))      unsigned 64-bit
    bucket(v, n)     = fingerprint64(v) % n

Integers are hashed through their decimal text (``-12`` hashes as ``"-12"``), as TensorFlow
hashes integer features through ``as_string``; bytes are hashed as they are. A model ported
from TensorFlow therefore puts every value in the same bucket as it did there.

``fingerprint_cat64(a, b)`` is TensorFlow's ``FingerprintCat64``, which chains the features of a
crossed column into one 64-bit value (``embcore.feature_column.crossed``). Batches are
hashed by the Numba kernels of ``embcore._numba.farmhash`` (no Python call per value). See
docs/feature_columns.md, "The hash".
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from embcore._numba.farmhash import (
    fingerprint_bytes,
    fingerprint_int64,
    fingerprint_separated,
)

__all__ = ["fingerprint64", "fingerprint_cat64", "fingerprints", "hash_buckets"]

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def _is_int(v: object) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _check_int64(value: int) -> int:
    if not _INT64_MIN <= int(value) <= _INT64_MAX:
        raise ValueError(f"fingerprint64: integer {value} does not fit in int64")
    return int(value)


def _as_bytes(value: object) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        try:
            return value.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(f"fingerprint64: string {value!r} is not valid Unicode ({e})") from e
    if _is_int(value):
        return str(_check_int64(value)).encode("ascii")  # type: ignore[arg-type]
    raise TypeError(f"fingerprint64: expected a str, bytes or int, got {type(value).__name__}")


def _hash_strings(values: Sequence[object], out: np.ndarray) -> None:
    """Write the fingerprints of ``values`` (str and/or bytes) into ``out`` ``(N,) uint64``.

    All-``str`` input takes the fast path: the values joined with ``"\\x00"`` and encoded
    once (in C), then hashed in one Numba pass that splits at zero bytes. No byte of a
    multi-byte UTF-8 character is 0, so the zero bytes are exactly the separators, unless a
    value holds ``"\\x00"`` itself: then the count differs and each value is encoded alone.
    """
    n = len(values)
    try:
        text = "\x00".join(values)  # type: ignore[arg-type]
    except TypeError:
        text = None
    if text is not None:
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError:
            for v in values:
                _as_bytes(v)  # raises naming the bad string
            raise
        if fingerprint_separated(np.frombuffer(data, dtype=np.uint8), out) == n:
            return
    # Values holding "\x00", bytes, or str mixed with bytes: rare, one call per value.
    if any(map(_is_int, values)):
        raise TypeError("fingerprint64: values mix integers with strings; give one kind")
    parts = [_as_bytes(v) for v in values]
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, parts), np.int64, count=n), out=offsets[1:])
    buf = np.frombuffer(b"".join(parts), dtype=np.uint8)
    fingerprint_bytes(buf, offsets[:-1], offsets[1:], out)


def fingerprints(values: Sequence[object] | np.ndarray) -> np.ndarray:
    """``fingerprint64`` of every value, ``(N,) uint64``.

    Args:
        values: ``(N,)`` integers (any NumPy integer array, or Python ints), or strings / bytes
            (an object, ``str`` or ``bytes`` array, or a list); arrays of any shape are
            flattened.

    Raises:
        TypeError: a value that is neither a string, bytes nor an integer (floats, bools).
        ValueError: an integer outside int64, or a string that cannot be UTF-8 encoded.
    """
    array = values.reshape(-1) if isinstance(values, np.ndarray) else None
    out = np.empty(len(values) if array is None else array.size, dtype=np.uint64)
    if len(out) == 0:
        return out
    if array is not None and array.dtype.kind in "iu":
        if array.dtype.kind == "u" and array.size and int(array.max()) > _INT64_MAX:
            raise ValueError(f"fingerprint64: integer {int(array.max())} does not fit in int64")
        fingerprint_int64(np.ascontiguousarray(array, dtype=np.int64), out)
        return out
    if array is not None and array.dtype.kind in "fb":
        raise TypeError(f"fingerprint64: expected strings, bytes or integers, got {array.dtype}")
    items = array if array is not None else list(values)
    if _is_int(items[0]):  # Python ints (NumPy int arrays took the path above)
        if not all(map(_is_int, items)):
            raise TypeError("fingerprint64: values mix integers with strings; give one kind")
        ints = np.array([_check_int64(v) for v in items], dtype=np.int64)
        fingerprint_int64(ints, out)
        return out
    _hash_strings(items.tolist() if array is not None else items, out)  # join is faster on lists
    return out


def fingerprint64(value: str | bytes | int) -> int:
    """The unsigned 64-bit FarmHash fingerprint of one value (see the module docstring)."""
    return int(fingerprints([_as_bytes(value)])[0])


def hash_buckets(values: Sequence[object] | np.ndarray, num_buckets: int) -> np.ndarray:
    """``fingerprint64(v) % num_buckets`` for every value, ``(N,) int64``, as
    ``tf.strings.to_hash_bucket_fast(values, num_buckets)`` (integers through their text).

    Args:
        values: ``(N,)`` strings (object array) or integers, as for :func:`fingerprints`.
        num_buckets: an int >= 1.
    """
    if not _is_int(num_buckets) or num_buckets < 1:
        raise ValueError(f"hash_buckets: num_buckets must be an int >= 1, got {num_buckets!r}")
    return (fingerprints(values) % np.uint64(num_buckets)).astype(np.int64)


_CAT_MUL = np.uint64(0xC6A4A7935BD1E995)
_SHIFT = np.uint64(47)


def _shift_mix(x: np.ndarray) -> np.ndarray:
    return x ^ (x >> _SHIFT)


def fingerprint_cat64(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """TensorFlow's ``FingerprintCat64(first, second)`` element by element (``(N,) uint64``
    each), arithmetic modulo 2**64::

        r = first ^ K;  r ^= ShiftMix(second * K) * K;  r *= K
        r = ShiftMix(ShiftMix(r) * K)         K = 0xc6a4a7935bd1e995, ShiftMix(x) = x ^ (x >> 47)
    """
    result = first ^ _CAT_MUL
    result ^= _shift_mix(second * _CAT_MUL) * _CAT_MUL
    result *= _CAT_MUL
    return _shift_mix(_shift_mix(result) * _CAT_MUL)
