"""Keyed records of dynamic tables in checkpoints: digests, deltas and their replay, checked
against plain Python dicts (``{key: row}``) updated by hand, and key spaces with pending
counts and a count-min sketch replayed through a chain of deltas."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch

from embcore.checkpoint import _dynamic
from embcore.checkpoint._errors import CheckpointError
from embcore.checkpoint._records import Records, apply, changed, digests, set_digest
from embcore.dynamic.keyspace import KeySpace
from embcore.dynamic.policy import CountAdmission, Eviction


def records(table: dict[int, np.ndarray]) -> Records:
    keys = np.array(sorted(table), np.int64)
    rows = np.array([table[k] for k in keys], np.float32).reshape(len(keys), 2)
    return Records(keys, digests(keys, [rows]), {"weight": rows})


def as_dict(r: Records) -> dict[int, np.ndarray]:
    return {int(k): r.columns["weight"][i] for i, k in enumerate(r.keys)}


def test_a_digest_changes_with_any_bit_of_a_record_and_not_with_order():
    rng = np.random.default_rng(0)
    keys = np.array([-(2**63), -3, 0, 7, 2**63 - 1], np.int64)
    rows = rng.standard_normal((5, 3)).astype(np.float32)
    base = digests(keys, [rows])
    for i in range(5):
        for j in range(3):
            for bit in (0, 17, 31):
                flipped = rows.copy()
                flipped.view(np.uint32)[i, j] ^= np.uint32(1 << bit)
                d = digests(keys, [flipped])
                assert not np.array_equal(d[i], base[i])
                assert np.array_equal(np.delete(d, i, 0), np.delete(base, i, 0))
    other_key = digests(keys + 1, [rows])
    assert not np.any(np.all(other_key == base, axis=1))
    order = rng.permutation(5)
    assert set_digest(base[order]) == set_digest(base)
    assert set_digest(base[:4]) != set_digest(base)
    # -0.0 and 0.0 are different bits: a delta stores the change
    z = np.zeros((1, 1), np.float32)
    assert not np.array_equal(digests(keys[:1], [z]), digests(keys[:1], [-z]))


@pytest.mark.parametrize("seed", range(5))
def test_changed_then_apply_gives_the_new_dict(seed):
    rng = np.random.default_rng(seed)
    old = {int(k): rng.standard_normal(2).astype(np.float32) for k in rng.integers(-50, 50, 40)}
    new = dict(old)
    for k in list(new)[:5]:  # updated
        new[k] = new[k] + 1
    for k in list(new)[5:12]:  # deleted
        del new[k]
    for k in rng.integers(60, 90, 6):  # inserted
        new[int(k)] = rng.standard_normal(2).astype(np.float32)
    a, b = records(old), records(new)
    upserts, deleted = changed(a, b)
    want_upserts = sorted(k for k in new if k not in old or not np.array_equal(new[k], old[k]))
    assert b.keys[upserts].tolist() == want_upserts
    assert deleted.tolist() == sorted(set(old) - set(new))
    got = as_dict(apply(a, b.take(upserts), deleted))
    assert sorted(got) == sorted(new)
    for k, v in new.items():
        assert np.array_equal(got[k], v)


def test_apply_refuses_deleting_a_key_the_base_lacks():
    a = records({1: np.ones(2), 2: np.ones(2)})
    empty = records({})
    with pytest.raises(ValueError, match=r"deletes keys \[5\] that its base does not hold"):
        apply(a, empty, np.array([5], np.int64))
    with pytest.raises(ValueError, match="deletes keys it also stores"):
        apply(a, records({2: np.zeros(2)}), np.array([2], np.int64))


# ------------------------------------------------------------ a chain of key-space deltas
@dataclass
class FakeLink:
    path: str
    manifest: dict[str, Any]
    stored: dict[str, Any]


def read(link: FakeLink, keys: list[str]) -> dict[str, np.ndarray]:
    return {k: link.stored[k].numpy() for k in keys}


def table_state(space: KeySpace, dim: int = 3) -> dict[str, np.ndarray]:
    """A store's state over ``space``: rows are a function of key and step."""
    state = space.state()
    keys = state["keys"]
    weight = (keys[:, None] % 97 + state["last_seen"][:, None] * 0.5 + np.arange(dim)).astype(
        np.float32
    )
    return state | {"weight": weight, "accumulators": weight * 2}


def save_chain(states: list[dict[str, np.ndarray]]) -> list[FakeLink]:
    chain, known, section = [], None, None
    for i, state in enumerate(states):
        tensors, section, known = _dynamic.save_tensors({"t": state}, known, section)
        chain.append(FakeLink(f"ckpt-{i}", {"dynamic": section}, tensors))
    return chain


def assert_same_state(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    want = {k: v for k, v in want.items() if k != "rows"}
    assert sorted(got) == sorted(want)
    for k, v in want.items():
        assert np.array_equal(got[k], v), k


def test_a_chain_of_key_space_deltas_replays_to_each_full_state():
    # small exact_pending: the count-min sketch takes over during the run
    space = KeySpace(
        "t", CountAdmission(min_count=2), Eviction(steps_to_live=3, max_rows=30), exact_pending=8
    )
    rng = np.random.default_rng(1)
    states = []
    for step in range(12):
        space.train(rng.integers(-40, 40, 25).astype(np.int64))
        space.end_step()
        if step % 3 == 2:
            states.append(table_state(space))
    assert "pending/sketch" in states[-1]  # the sketch was used
    chain = save_chain(states)
    for n in range(1, len(chain) + 1):
        groups, extras = _dynamic.restore("t", chain[:n], read)
        assert_same_state(_dynamic.to_state(groups, extras), states[n - 1])
    # the deltas hold only the records that changed (not every row each time)
    section = chain[-1].manifest["dynamic"]["t"]["groups"]["rows"]
    assert 0 < section["stored"] < section["count"] + section["deleted"]
    # a delta whose base is another checkpoint does not replay
    with pytest.raises(CheckpointError, match="ckpt-2: table 't'"):
        _dynamic.restore("t", [chain[0], chain[2]], read)


def test_a_delta_of_an_unchanged_table_stores_nothing():
    space = KeySpace("t")
    space.train(np.arange(100, dtype=np.int64))
    state = table_state(space)
    chain = save_chain([state, state])
    rows = chain[1].manifest["dynamic"]["t"]["groups"]["rows"]
    assert (rows["count"], rows["stored"], rows["deleted"]) == (100, 0, 0)
    assert chain[1].stored["t.weight"].shape == (0, 3)
    assert not chain[1].manifest["dynamic"]["t"]["extras"]["step"]["stored"]


def test_digests_do_not_depend_on_the_thread_count():
    rng = np.random.default_rng(2)
    keys = rng.integers(-(2**63), 2**63 - 1, 10_000, dtype=np.int64)
    rows = rng.standard_normal((10_000, 5)).astype(np.float32)
    threads = torch.get_num_threads()
    try:
        got = []
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            got.append(digests(keys, [rows, keys]))
    finally:
        torch.set_num_threads(threads)
    assert np.array_equal(got[0], got[1]) and np.array_equal(got[0], got[2])
    one = np.stack(
        [
            digests(keys[i : i + 1], [rows[i : i + 1], keys[i : i + 1]])[0]
            for i in range(0, 10_000, 997)
        ]
    )
    assert np.array_equal(one, got[0][::997])
