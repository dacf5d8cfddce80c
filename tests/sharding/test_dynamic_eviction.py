"""The table-wide max_rows choice over shards: each shard's least used survivors suffice to
find the table's least used keys, in one process's order."""

from __future__ import annotations

import numpy as np
import pytest

from embcore.sharding.schemes._key_steps import least_used_global


@pytest.mark.parametrize("shards,excess", [(2, 1), (2, 7), (3, 20), (4, 60)])
def test_the_shards_candidates_give_the_tables_least_used_keys(shards: int, excess: int):
    rng = np.random.default_rng(shards * 100 + excess)
    keys = rng.choice(np.arange(-500, 500), 60, replace=False).astype(np.int64)
    freq = rng.integers(1, 4, 60)  # many ties: last-seen step, then key decide
    last = rng.integers(0, 3, 60)
    owner = rng.integers(0, shards, 60)
    # one process: sort every key by (freq, last_seen, key) and take the first `excess`
    want = sorted(zip(freq.tolist(), last.tolist(), keys.tolist(), strict=True))[:excess]
    candidates = []
    for p in range(shards):
        mine = np.flatnonzero(owner == p)
        order = np.lexsort((keys[mine], last[mine], freq[mine]))[:excess]
        candidates.append(np.stack([freq[mine][order], last[mine][order], keys[mine][order]], 1))
    got = least_used_global(candidates, excess)
    assert got.tolist() == [k for _, _, k in want]
