"""The key -> shard map of dynamic tables: a mixed, salted 64-bit hash of the key.

A dynamic table's key ``k`` (any int64) lives on shard::

    h     = mix64(uint64(k) ^ SALT)          SplitMix64's finalizer of (x + 0x9E3779B97F4A7C15)
    shard = ((h & 0xFFFFFFFF) * P) >> 32     the low 32 bits, scaled onto P shards

``SALT`` makes ``h`` a different hash from the one the key index uses (``mix64(k)``: its high
32 bits pick the home slot, its low 7 bits the fingerprint), so the keys one shard holds are
spread over its index exactly as a random sample of keys would be. The map depends on nothing
but the key and ``P``: any process computes it, and keys moving to another number of shards
are re-hashed. See ``docs/sharding.md`` ("Dynamic tables").
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

__all__ = ["SALT", "key_shard", "mix64"]

#: Salt of the placement hash: the first 8 bytes of SHA-256("embcore.sharding.key_hash").
SALT = 0xA837_D8CC_A7A7_347E

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_C1 = np.uint64(0xBF58476D1CE4E5B9)
_C2 = np.uint64(0x94D049BB133111EB)
_LOW32 = np.uint64(0xFFFFFFFF)


def mix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer of ``x + golden``, element-wise: ``(N,) uint64 -> (N,) uint64``
    (the same function as the key index's hash)."""
    z = np.asarray(x, dtype=np.uint64).reshape(-1) + _GOLDEN  # arrays wrap silently
    z = (z ^ (z >> np.uint64(30))) * _C1
    z = (z ^ (z >> np.uint64(27))) * _C2
    return z ^ (z >> np.uint64(31))


def key_shard(keys: Tensor | np.ndarray, num_shards: int) -> Tensor:
    """``(N,) int64`` on the CPU: the shard in ``[0, num_shards)`` of each of ``keys`` (``(N,)``
    int64, any values)."""
    if not isinstance(num_shards, int) or isinstance(num_shards, bool) or num_shards < 1:
        raise ValueError(f"key map: num_shards must be an int >= 1, got {num_shards!r}")
    if isinstance(keys, Tensor):
        keys = keys.detach().cpu().numpy()
    keys = np.ascontiguousarray(keys)
    if keys.dtype != np.int64:
        raise TypeError(f"key map: keys must be int64, got {keys.dtype}")
    if num_shards == 1:
        return torch.zeros(keys.size, dtype=torch.int64)
    h = mix64(keys.reshape(-1).view(np.uint64) ^ np.uint64(SALT))
    shard = ((h & _LOW32) * np.uint64(num_shards)) >> np.uint64(32)
    return torch.from_numpy(shard.view(np.int64))
