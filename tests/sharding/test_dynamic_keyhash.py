"""The key -> shard map of dynamic tables: its formula, its balance, and its independence from
the key index's own hash bits (so each shard's index stays well spread)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from embcore.sharding.keyhash import SALT, key_shard

M64 = (1 << 64) - 1


def splitmix_finalizer(x: int) -> int:
    """SplitMix64's finalizer of ``x + golden``, in Python integers (the published constants)."""
    z = (x + 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def reference_shard(key: int, shards: int) -> int:
    h = splitmix_finalizer((key & M64) ^ SALT)
    return ((h & 0xFFFFFFFF) * shards) >> 32


EDGE_KEYS = [0, 1, -1, 2, -2, 2**63 - 1, -(2**63), 2**32, -(2**32), 8_231_778_211_409]


@pytest.mark.parametrize("shards", [1, 2, 3, 5, 8])
def test_key_shard_is_the_documented_formula(shards: int):
    rng = np.random.default_rng(0)
    keys = np.concatenate([np.array(EDGE_KEYS, np.int64), rng.integers(-(2**63), 2**63 - 1, 500)])
    got = key_shard(torch.from_numpy(keys), shards)
    assert got.dtype == torch.int64
    assert got.tolist() == [reference_shard(int(k), shards) for k in keys]
    assert torch.equal(key_shard(keys, shards), got)  # NumPy input alike


@pytest.mark.parametrize("shards", [2, 3, 7])
def test_shards_are_balanced_for_sequential_and_random_keys(shards: int):
    n = 120_000
    for keys in (np.arange(n, dtype=np.int64), np.random.default_rng(1).integers(0, 2**62, n)):
        counts = np.bincount(key_shard(keys, shards).numpy(), minlength=shards)
        assert counts.sum() == n
        assert np.abs(counts / (n / shards) - 1).max() < 0.03, counts


def index_bits(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The key index's home-slot bits (top 6 of the hash) and fingerprint (low 7 bits)."""
    h = np.array([splitmix_finalizer(int(k) & M64) for k in keys], dtype=np.uint64)
    return (h >> np.uint64(58)).astype(np.int64), (h & np.uint64(0x7F)).astype(np.int64)


def spread(values: np.ndarray, buckets: int) -> float:
    """Pearson's chi-square statistic of ``values`` over ``buckets`` equal buckets, divided by
    the degrees of freedom (about 1 for a uniform sample)."""
    counts = np.bincount(values, minlength=buckets)
    expected = values.size / buckets
    return float(((counts - expected) ** 2 / expected).sum() / (buckets - 1))


def test_the_keys_of_one_shard_spread_over_its_index_like_any_keys():
    keys = np.arange(40_000, dtype=np.int64) * 7919
    home, fingerprint = index_bits(keys)
    mine = key_shard(keys, 2).numpy() == 0
    assert abs(mine.mean() - 0.5) < 0.02
    # One shard's keys cover the home slots and fingerprints evenly (chi-square / dof near 1;
    # 2 is far beyond chance at these sizes).
    assert spread(home[mine], 64) < 2 and spread(fingerprint[mine], 128) < 2
    # The check is sharp: placing by the index's own low hash bit would leave shard 0 half
    # the fingerprints, and placing by its top bit half the home slots.
    assert spread(fingerprint[fingerprint % 2 == 0], 128) > 50
    assert spread(home[home < 32], 64) > 50


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="num_shards must be an int >= 1, got 0"):
        key_shard(np.zeros(3, np.int64), 0)
    with pytest.raises(TypeError, match="keys must be int64, got int32"):
        key_shard(np.zeros(3, np.int32), 2)
