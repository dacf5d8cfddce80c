"""One kernel call for the step boundaries of many key spaces (embcore.dynamic.boundary)
against its reference, KeySpace.end_step table by table: the same victims, removed in the same
order (the index's slots end up identical), the same freed rows and free stack, and the sink
rows reset."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from embcore.dynamic.batch import train_many
from embcore.dynamic.boundary import Sink, end_many
from embcore.dynamic.keyspace import KeySpace
from embcore.dynamic.policy import CountAdmission, Eviction

I64_MIN, I64_MAX = -(2**63), 2**63 - 1


def full_state(space: KeySpace) -> tuple:
    """Everything end_step may change, down to the index's slot layout."""
    index = space._index
    n = index.num_rows
    held = index._ctrl != 0
    return (
        space.step,
        len(index),
        index._ctrl.tolist(),
        index._keys[held].tolist(),
        index._rows[held].tolist(),
        index._free[: index._n_free].tolist(),
        space._live[:n].tolist(),
        space._key[:n][space._live[:n]].tolist(),
    )


@pytest.mark.parametrize(
    "ttl, cap", [(None, None), (1, None), (2, None), (None, 1), (None, 30), (3, 25), (1, 10)]
)
def test_every_boundary_equals_keyspace_end_step_table_by_table(ttl, cap):
    rng = np.random.default_rng(7 + (ttl or 0) * 13 + (cap or 0))
    pools = [
        np.array([0, -1, I64_MIN, I64_MAX, 5], np.int64),
        rng.integers(I64_MIN, I64_MAX, 300, dtype=np.int64),
        rng.integers(-50, 50, 60, dtype=np.int64),  # many equal frequencies and steps
    ]
    evict = Eviction(steps_to_live=ttl, max_rows=cap)
    ref = [KeySpace(f"t{t}", eviction=evict) for t in range(3)]
    got = [KeySpace(f"t{t}", eviction=evict) for t in range(3)]
    evicted_any = 0
    for step in range(15):
        batch = [p[rng.zipf(1.3, int(rng.integers(0, 300))) % p.size] for p in pools]
        train_many(got, batch)
        train_many(ref, batch)
        if step % 4 == 3:  # two lookups before a step boundary, now and then
            continue
        ended = end_many(got)
        for t in range(3):
            want = ref[t].end_step()
            np.testing.assert_array_equal(ended[t].keys, want.keys)
            np.testing.assert_array_equal(ended[t].rows, want.rows)
            assert full_state(got[t]) == full_state(ref[t]), (step, t)
            evicted_any += want.keys.size
    assert evicted_any > 0 or (ttl is None and cap is None)


def test_least_used_ties_break_by_last_seen_then_key():
    """Equal frequencies, then equal last-seen steps: the cuts pick the reference's keys."""
    evict = Eviction(max_rows=3)
    ref, got = KeySpace("a", eviction=evict), KeySpace("a", eviction=evict)
    for space in (ref, got):
        space.train(np.array([9, 4, 7, 1, 8, 8], np.int64))  # 8 used twice
        space.step = 1
        space.train(np.array([2, 6], np.int64))  # seen later: kept before 9, 4, 7, 1
    want = ref.end_step()
    ended = end_many([got])[0]
    assert want.keys.tolist() == [1, 4, 7, 9]
    np.testing.assert_array_equal(ended.keys, want.keys)
    np.testing.assert_array_equal(ended.rows, want.rows)
    assert full_state(got) == full_state(ref)
    assert sorted(got.keys().tolist()) == [2, 6, 8]


def test_sinks_are_reset_and_other_rows_kept():
    weight = torch.full((5, 3), 2.0)
    slot = torch.full((5, 3), 7.0)
    row_slot = torch.full((5,), 7.0)
    spaces = [KeySpace("a"), KeySpace("b")]
    end_many(spaces, [Sink(weight, ((slot, 0.5), (row_slot, 0.25))), None])
    assert weight[0].tolist() == [0.0] * 3 and slot[0].tolist() == [0.5] * 3
    assert row_slot[0].item() == 0.25
    assert bool((weight[1:] == 2.0).all() and (slot[1:] == 7.0).all())
    assert bool((row_slot[1:] == 7.0).all())
    assert [s.step for s in spaces] == [1, 1]


def test_only_first_sight_key_spaces_are_taken():
    pending = KeySpace("p", admission=CountAdmission(min_count=2))
    with pytest.raises(ValueError, match=r"table 'p'.*first sight"):
        end_many([pending])
    with pytest.raises(ValueError, match="C-contiguous float32"):
        end_many([KeySpace("d")], [Sink(torch.zeros((4, 2), dtype=torch.float64))])
