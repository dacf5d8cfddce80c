"""New rows: the default initializer against a pure-Python reference of its formula, its
independence of batch, order and threads, its distribution, and user initializers."""

from __future__ import annotations

import hashlib
import math
from statistics import NormalDist

import numpy as np
import pytest
import torch

from embcore.dynamic.init import default_rows, new_rows

M64 = (1 << 64) - 1


def mix(x: int) -> int:
    """SplitMix64's finalizer of ``x + golden``, with Python ints."""
    z = (x + 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def reference_row(seed: int, table: str, key: int, dim: int) -> list[float]:
    name = int.from_bytes(hashlib.blake2b(table.encode(), digest_size=8).digest(), "little")
    salt = mix((seed & M64) ^ mix(name))
    state = mix(mix(key & M64) ^ salt)
    normal, std = NormalDist(), 1 / math.sqrt(dim)
    lo, hi = normal.cdf(-2.0), normal.cdf(2.0)
    row = []
    for _ in range(dim):
        u = ((mix(state) >> 11) + 0.5) / 2.0**53
        row.append(std * normal.inv_cdf(lo + (hi - lo) * u))
        state = (state + 0x9E3779B97F4A7C15) & M64
    return row


@pytest.mark.parametrize("key", [0, -1, 1, 2**63 - 1, -(2**63), 8_231_778_211_409])
def test_default_rows_follow_the_documented_formula(key):
    got = default_rows(7, "user", np.array([key], np.int64), 12)
    np.testing.assert_allclose(got[0], reference_row(7, "user", key, 12), rtol=1e-6, atol=1e-7)


def test_a_row_depends_only_on_seed_table_and_key():
    keys = np.random.default_rng(0).integers(-(2**63), 2**63 - 1, 5000, dtype=np.int64)
    whole = default_rows(1, "user", keys, 8)
    order = np.random.default_rng(1).permutation(keys.size)
    np.testing.assert_array_equal(default_rows(1, "user", keys[order], 8), whole[order])
    np.testing.assert_array_equal(default_rows(1, "user", keys[17:18], 8), whole[17:18])
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = default_rows(1, "user", keys, 8)
    finally:
        torch.set_num_threads(before)
    np.testing.assert_array_equal(one, whole)
    assert not np.array_equal(default_rows(2, "user", keys[:4], 8), whole[:4])
    assert not np.array_equal(default_rows(1, "item", keys[:4], 8), whole[:4])
    # keys equal modulo a small number do not start alike
    assert not np.allclose(default_rows(1, "user", np.array([3, 3 + 4096]), 8)[0], whole[0])


def test_distribution_is_the_fixed_tables_truncated_normal():
    dim = 16
    rows = default_rows(0, "t", np.arange(-60_000, 60_000, dtype=np.int64), dim)
    std = 1 / math.sqrt(dim)
    assert rows.dtype == np.float32 and rows.shape == (120_000, dim)
    assert np.abs(rows).max() <= 2 * std
    # a standard normal cut at +-2 has variance 1 - 2 * 2 * pdf(2) / (cdf(2) - cdf(-2))
    normal = NormalDist()
    mass = normal.cdf(2) - normal.cdf(-2)
    expected_std = std * math.sqrt(1 - 4 * normal.pdf(2) / mass)
    assert abs(rows.mean()) < 3 * expected_std / math.sqrt(rows.size)
    assert abs(rows.std() / expected_std - 1) < 0.01
    # the share within one std matches the truncated normal's
    inside = (normal.cdf(1) - normal.cdf(-1)) / mass
    assert abs(float((np.abs(rows) < std).mean()) - inside) < 0.005


def test_a_user_initializer_gets_one_call_in_key_order():
    calls = []

    def init(shape, dtype=None):
        calls.append((shape, dtype))
        return torch.arange(shape[0] * shape[1], dtype=torch.float64).reshape(shape)

    got = new_rows(np.array([-5, 2, 9], np.int64), table="t", dim=2, seed=0, initializer=init)
    assert calls == [((3, 2), torch.float32)]
    assert got.dtype == np.float32 and got.tolist() == [[0, 1], [2, 3], [4, 5]]
    assert new_rows(np.empty(0, np.int64), table="t", dim=2, seed=0, initializer=init).shape == (
        0,
        2,
    )
    assert len(calls) == 1  # not called for no new keys
    plain = new_rows(
        np.array([1], np.int64), table="t", dim=3, seed=0, initializer=lambda s: np.ones(s)
    )
    assert plain.tolist() == [[1.0, 1.0, 1.0]]


def test_new_rows_errors_name_the_table_and_the_problem():
    keys = np.array([1, 2], np.int64)
    with pytest.raises(ValueError, match=r"table 'ads': initializer returned shape \(2,\)"):
        new_rows(keys, table="ads", dim=3, seed=0, initializer=lambda s: np.zeros(2))
    with pytest.raises(ValueError, match="table 'ads': initializer returned dtype int64"):
        new_rows(keys, table="ads", dim=3, seed=0, initializer=lambda s: np.zeros(s, np.int64))
    with pytest.raises(ValueError, match="table 'ads': new_rows takes strictly ascending keys"):
        new_rows(keys[::-1].copy(), table="ads", dim=3, seed=0)
    with pytest.raises(
        TypeError, match="table 'ads': new_rows takes a 1-D int64 array of keys, got float64"
    ):
        new_rows(np.array([1.5]), table="ads", dim=3, seed=0)
    with pytest.raises(ValueError, match="table 'ads': dim must be a positive int, got 0"):
        default_rows(0, "ads", keys, 0)
