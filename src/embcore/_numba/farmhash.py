"""FarmHash ``Fingerprint64`` (``farmhashna::Hash64``) in Numba, over many values at once.

This is the hash behind TensorFlow's ``tf.strings.to_hash_bucket_fast`` and so behind its hash
and out-of-vocabulary buckets (see docs/feature_columns.md, "The hash"). The code follows
Google's ``farmhash.cc`` (farmhashna) line for line; the names are FarmHash's. All arithmetic is
on ``uint64`` and wraps modulo 2**64, as in C++.

A batch of strings is one byte buffer plus where each value starts and ends::

    buf      b"cats..dog"        (M,) uint8, the UTF-8 bytes of the values (with or without
    starts   [0, 5, 6]                      separators between them)
    ends     [4, 5, 9]           (N,) int64 each; value i is buf[starts[i]:ends[i]]
             "cats", "", "dog"

so hashing ``N`` values is one call and no Python per value.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["fingerprint_bytes", "fingerprint_int64", "fingerprint_separated"]

_U = np.uint64
K0 = _U(0xC3A5C85C97CB3127)
K1 = _U(0xB492B66FBE98F273)
K2 = _U(0x9AE16A3B2F90404F)
K_MUL = _U(0x9DDFEA08EB382D69)
SEED = _U(81)
# Numba types `uint64 op int` as float64, so every constant below is a uint64.
_0, _1, _2, _3, _8, _9 = _U(0), _U(1), _U(2), _U(3), _U(8), _U(9)
_113, _255, _47, _63 = _U(113), _U(255), _U(47), _U(63)

_JIT = {"cache": True, "nogil": True, "error_model": "numpy"}
_INLINE = {**_JIT, "inline": "always"}


@njit(**_INLINE)
def _fetch64(b, p):
    """Little-endian 8 bytes at ``b[p:p+8]`` (LLVM folds this into one load)."""
    v = _0
    for k in range(8):
        v |= _U(b[p + k]) << _U(8 * k)
    return v


@njit(**_INLINE)
def _fetch32(b, p):
    v = _0
    for k in range(4):
        v |= _U(b[p + k]) << _U(8 * k)
    return v


@njit(**_INLINE)
def _rotate(v, shift):
    """Rotate right by ``shift`` (1..63; FarmHash never rotates by 0 here)."""
    s = _U(shift)
    return (v >> s) | (v << (_U(64) - s))


@njit(**_INLINE)
def _shift_mix(v):
    return v ^ (v >> _47)


@njit(**_INLINE)
def _hash_len16_mul(u, v, mul):
    a = (u ^ v) * mul
    a ^= a >> _47
    b = (v ^ a) * mul
    b ^= b >> _47
    return b * mul


@njit(**_INLINE)
def _hash_len0to16(b, s, n):
    length = _U(n)
    if n >= 8:
        mul = K2 + length * _2
        a = _fetch64(b, s) + K2
        c = _fetch64(b, s + n - 8)
        d = _rotate(c, 37) * mul + a
        e = (_rotate(a, 25) + c) * mul
        return _hash_len16_mul(d, e, mul)
    if n >= 4:
        mul = K2 + length * _2
        a = _fetch32(b, s)
        return _hash_len16_mul(length + (a << _3), _fetch32(b, s + n - 4), mul)
    if n > 0:
        a = _U(b[s])
        c = _U(b[s + (n >> 1)])
        d = _U(b[s + n - 1])
        y = (a + (c << _8)) & _U(0xFFFFFFFF)  # uint32 in C++
        z = (length + (d << _2)) & _U(0xFFFFFFFF)
        return _shift_mix(y * K2 ^ z * K0) * K2
    return K2


@njit(**_INLINE)
def _hash_len17to32(b, s, n):
    mul = K2 + _U(n) * _2
    a = _fetch64(b, s) * K1
    c = _fetch64(b, s + 8)
    d = _fetch64(b, s + n - 8) * mul
    e = _fetch64(b, s + n - 16) * K2
    return _hash_len16_mul(
        _rotate(a + c, 43) + _rotate(d, 30) + e, a + _rotate(c + K2, 18) + d, mul
    )


@njit(**_INLINE)
def _hash_len33to64(b, s, n):
    mul = K2 + _U(n) * _2
    a = _fetch64(b, s) * K2
    c = _fetch64(b, s + 8)
    d = _fetch64(b, s + n - 8) * mul
    e = _fetch64(b, s + n - 16) * K2
    y = _rotate(a + c, 43) + _rotate(d, 30) + e
    z = _hash_len16_mul(y, a + _rotate(c + K2, 18) + d, mul)
    f = _fetch64(b, s + 16) * mul
    g = _fetch64(b, s + 24)
    h = (y + _fetch64(b, s + n - 32)) * mul
    i = (z + _fetch64(b, s + n - 24)) * mul
    return _hash_len16_mul(_rotate(f + g, 43) + _rotate(h, 30) + i, f + _rotate(g + a, 18) + h, mul)


@njit(**_INLINE)
def _weak_hash_len32_with_seeds(b, s, a, c):
    """``WeakHashLen32WithSeeds(s, a, b)``: returns the pair ``(first, second)``."""
    w = _fetch64(b, s)
    x = _fetch64(b, s + 8)
    y = _fetch64(b, s + 16)
    z = _fetch64(b, s + 24)
    a += w
    c = _rotate(c + a + z, 21)
    t = a
    a += x
    a += y
    c += _rotate(a, 44)
    return a + z, c + t


@njit(**_INLINE)
def _hash_long(b, s, n):
    """Strings over 64 bytes: 64-byte blocks, then the last 64 bytes."""
    x = SEED
    y = SEED * K1 + _113
    z = _shift_mix(y * K2 + _113) * K2
    v0, v1, w0, w1 = _0, _0, _0, _0
    x = x * K2 + _fetch64(b, s)
    end = s + ((n - 1) // 64) * 64
    last64 = end + ((n - 1) & 63) - 63
    while True:
        x = _rotate(x + y + v0 + _fetch64(b, s + 8), 37) * K1
        y = _rotate(y + v1 + _fetch64(b, s + 48), 42) * K1
        x ^= w1
        y += v0 + _fetch64(b, s + 40)
        z = _rotate(z + w0, 33) * K1
        v0, v1 = _weak_hash_len32_with_seeds(b, s, v1 * K1, x + w0)
        w0, w1 = _weak_hash_len32_with_seeds(b, s + 32, z + w1, y + _fetch64(b, s + 16))
        x, z = z, x
        s += 64
        if s == end:
            break
    mul = K1 + ((z & _255) << _1)
    s = last64
    w0 += _U((n - 1) & 63)
    v0 += w0
    w0 += v0
    x = _rotate(x + y + v0 + _fetch64(b, s + 8), 37) * mul
    y = _rotate(y + v1 + _fetch64(b, s + 48), 42) * mul
    x ^= w1 * _9
    y += v0 * _9 + _fetch64(b, s + 40)
    z = _rotate(z + w0, 33) * mul
    v0, v1 = _weak_hash_len32_with_seeds(b, s, v1 * mul, x + w0)
    w0, w1 = _weak_hash_len32_with_seeds(b, s + 32, z + w1, y + _fetch64(b, s + 16))
    x, z = z, x
    return _hash_len16_mul(
        _hash_len16_mul(v0, w0, mul) + _shift_mix(y) * K0 + z,
        _hash_len16_mul(v1, w1, mul) + x,
        mul,
    )


@njit(**_INLINE)
def _hash64(b, s, n):
    """``farmhashna::Hash64(b + s, n)``, which is ``farmhash::Fingerprint64``."""
    if n <= 16:
        return _hash_len0to16(b, s, n)
    if n <= 32:
        return _hash_len17to32(b, s, n)
    if n <= 64:
        return _hash_len33to64(b, s, n)
    return _hash_long(b, s, n)


@njit(**_JIT)
def fingerprint_bytes(buf, starts, ends, out):
    """``out[i] = Fingerprint64(buf[starts[i]:ends[i]])``.

    Args:
        buf: ``(M,) uint8``, the values' bytes.
        starts, ends: ``(N,) int64`` each, ``0 <= starts[i] <= ends[i] <= M`` (not checked:
            the callers build them from ``buf``).
        out: ``(N,) uint64``, written.
    """
    for i in range(out.shape[0]):
        out[i] = _hash64(buf, starts[i], ends[i] - starts[i])


@njit(**_JIT)
def fingerprint_separated(buf, out):
    """Hash the values of ``buf`` separated by single zero bytes, in one pass.

    ``b"cats\\x00\\x00dog"`` holds ``"cats"``, ``""`` and ``"dog"``. Returns the number of
    values found; when it is not ``len(out)`` (some value held a zero byte itself), ``out`` is
    garbage and the caller must hash another way.

    Args:
        buf: ``(M,) uint8``.
        out: ``(N,) uint64``, N >= 1, written.
    """
    n = out.shape[0]
    ends = np.empty(n, dtype=np.int64)
    found = 0
    for p in range(buf.shape[0]):  # find the separators, then hash
        if buf[p] == 0:
            if found == n - 1:
                return n + 1  # more separators than values
            ends[found] = p
            found += 1
    ends[found] = buf.shape[0]
    start = 0
    for i in range(n):
        out[i] = _hash64(buf, start, ends[i] - start)
        start = ends[i] + 1
    return found + 1


@njit(**_JIT)
def fingerprint_int64(values, out):
    """``out[i] = Fingerprint64(decimal text of values[i])``, as TensorFlow's ``as_string``
    writes it (``-12`` -> ``b"-12"``; ``-2**63`` included).

    Args:
        values: ``(N,) int64``.
        out: ``(N,) uint64``, written.
    """
    text = np.empty(20, dtype=np.uint8)  # "-9223372036854775808" is 20 bytes
    digits = np.empty(20, dtype=np.uint8)
    ten = _U(10)
    for i in range(values.shape[0]):
        v = values[i]
        n = 0
        if v < 0:
            text[0] = 45  # "-"
            n = 1
            u = _U(-(v + 1)) + _1  # |v| without overflowing at -2**63
        else:
            u = _U(v)
        k = 0
        while True:
            digits[k] = np.uint8(u % ten) + np.uint8(48)
            u //= ten
            k += 1
            if u == _0:
                break
        for j in range(k):
            text[n + j] = digits[k - 1 - j]
        out[i] = _hash64(text, 0, n + k)
