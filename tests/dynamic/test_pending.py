"""Pending-admission counts: exact up to the limit, then a sketch that never under-counts."""

from __future__ import annotations

from collections import Counter

import numpy as np

from embcore.dynamic.keyspace import KeySpace
from embcore.dynamic.pending import EXACT_LIMIT, PendingCounts
from embcore.dynamic.policy import CountAdmission


def add(p: PendingCounts, keys: list[int], step: int = 0) -> None:
    uniq, mult = np.unique(np.array(keys, np.int64), return_counts=True)
    p.add(uniq, p.counts(uniq) + mult, step)


def test_counts_are_exact_for_at_least_a_million_pending_keys():
    assert EXACT_LIMIT >= 1_000_000
    p = PendingCounts("t", exact_limit=EXACT_LIMIT)
    keys = np.arange(-500_000, 500_000, dtype=np.int64) * 7919
    p.add(keys, np.full(keys.size, 1, np.int64), 0)
    p.add(keys[::2], p.counts(keys[::2]) + 2, 1)
    assert p.exact and len(p) == keys.size
    counts = p.counts(keys)
    assert (counts[::2] == 3).all() and (counts[1::2] == 1).all()


def test_past_the_limit_the_sketch_never_under_counts():
    rng = np.random.default_rng(0)
    p = PendingCounts("t", exact_limit=50, sketch_width=64, sketch_depth=3)  # collisions certain
    truth: Counter[int] = Counter()
    for step in range(30):
        batch = rng.integers(-300, 300, 40).tolist()
        truth.update(batch)
        add(p, batch, step)
    assert not p.exact and len(p) == 50
    keys = np.array(sorted(truth), np.int64)
    got = p.counts(keys)
    assert (got >= np.array([truth[k] for k in keys.tolist()])).all()
    exact_keys, exact_counts, _ = p.items()
    assert exact_counts.tolist() == [truth[k] for k in exact_keys.tolist()]


def test_a_wide_sketch_counts_like_the_exact_table():
    p = PendingCounts("t", exact_limit=3, sketch_width=1 << 20)
    truth: Counter[int] = Counter()
    for batch in ([1, 2, 3, 4, 5], [5, 5, 6], [4, 7, 1]):
        truth.update(batch)
        add(p, batch)
    keys = np.array(sorted(truth), np.int64)
    assert p.counts(keys).tolist() == [truth[k] for k in keys.tolist()]


def test_a_key_counted_in_the_sketch_is_admitted_no_later():
    ks = KeySpace("t", CountAdmission(min_count=3), exact_pending=1)
    ks.train(np.array([10, 20], np.int64))  # 10 counted exactly, 20 in the sketch
    ks.train(np.array([10, 20], np.int64))
    assert ks.train(np.array([20, 10], np.int64)).new_keys.tolist() == [10, 20]
