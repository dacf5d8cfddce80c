"""KeySpace against a step-by-step Python model of admission and eviction: exact key sets in
the edge cases (min_count across features and within one lookup, the steps_to_live boundary,
max_rows ties, re-admission, evaluation lookups), then random operation sequences."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from embcore.dynamic import index as index_module
from embcore.dynamic.index import IndexMemoryError
from embcore.dynamic.keyspace import KeySpace
from embcore.dynamic.policy import CountAdmission, Eviction

I64_MIN, I64_MAX = -(2**63), 2**63 - 1


class Model:
    """The rules, one key at a time, with dicts."""

    def __init__(self, k: int = 1, ttl: int | None = None, cap: int | None = None) -> None:
        self.k, self.ttl, self.cap = k, ttl, cap
        self.step = 0
        self.pending: dict[int, tuple[int, int]] = {}  # key -> (count, last seen)
        self.held: dict[int, list[int]] = {}  # key -> [row, freq, last seen]
        self.free: list[int] = []
        self.next_row = 0

    def train(self, keys: list[int]) -> tuple[list[int], list[int], list[int]]:
        new = []
        for key, m in sorted(Counter(keys).items()):
            if key in self.held:
                self.held[key][1] += m
                self.held[key][2] = self.step
                continue
            total = self.pending.pop(key, (0, 0))[0] + m
            if total < self.k:
                self.pending[key] = (total, self.step)
                continue
            row = min(self.free) if self.free else self.next_row
            if self.free:
                self.free.remove(row)
            else:
                self.next_row += 1
            self.held[key] = [row, total, self.step]
            new.append(key)
        rows = [self.held[key][0] if key in self.held else -1 for key in keys]
        return rows, new, [self.held[key][0] for key in new]

    def lookup(self, keys: list[int]) -> list[int]:
        return [self.held[key][0] if key in self.held else -1 for key in keys]

    def end_step(self) -> list[int]:
        t = self.step
        gone = {key for key, (_, _, last) in self.held.items() if self.ttl and last + self.ttl <= t}
        rest = sorted((f, last, key) for key, (_, f, last) in self.held.items() if key not in gone)
        if self.cap is not None and len(rest) > self.cap:
            gone |= {key for _, _, key in rest[: len(rest) - self.cap]}
        for key in gone:
            self.free.append(self.held.pop(key)[0])
        if self.ttl:
            self.pending = {k: v for k, v in self.pending.items() if v[1] + self.ttl > t}
        self.step += 1
        return sorted(gone)


def a(keys: list[int]) -> np.ndarray:
    return np.array(keys, dtype=np.int64)


def space(k: int = 1, ttl: int | None = None, cap: int | None = None, **kw) -> KeySpace:
    return KeySpace(
        "user", CountAdmission(min_count=k), Eviction(steps_to_live=ttl, max_rows=cap), **kw
    )


def state(ks: KeySpace) -> dict[int, list[int]]:
    keys, rows, freq, last = ks.items()
    columns = (x.tolist() for x in (keys, rows, freq, last))
    return {k: [r, f, s] for k, r, f, s in zip(*columns, strict=True)}


def test_min_count_is_reached_across_features_and_within_one_lookup():
    ks = space(k=2)
    user_id, clicked_user = [5, 7], [5]  # two features sharing the table: one lookup
    got = ks.train(a(user_id + clicked_user))
    assert got.rows.tolist() == [0, -1, 0] and got.new_keys.tolist() == [5]
    got = ks.train(a([9, 9, 11]))  # twice in one lookup: every occurrence reads the row
    assert got.rows.tolist() == [1, 1, -1] and got.new_keys.tolist() == [9]
    got = ks.train(a([7, 11, 11]))  # counts carry across lookups
    assert got.new_keys.tolist() == [7, 11] and got.rows.tolist() == [2, 3, 3]
    assert state(ks) == {5: [0, 2, 0], 7: [2, 2, 0], 9: [1, 2, 0], 11: [3, 3, 0]}


def test_steps_to_live_removes_a_key_at_the_end_of_step_t_plus_s():
    ks = space(ttl=2)
    ks.train(a([1, 2]))  # step 0
    assert ks.end_step().keys.tolist() == []  # end of step 0
    ks.train(a([2]))  # step 1: refreshes 2
    assert ks.end_step().keys.tolist() == []  # end of step 1
    gone = ks.end_step()  # end of step 2 = 0 + 2: key 1 goes, key 2 (seen in step 1) stays
    assert gone.keys.tolist() == [1] and gone.rows.tolist() == [0]
    assert ks.keys().tolist() == [2]
    assert ks.end_step().keys.tolist() == [2]  # end of step 3 = 1 + 2
    assert len(ks) == 0


def test_max_rows_evicts_least_frequent_then_least_recent_then_smallest_key():
    ks = space(cap=3)
    ks.train(a([40, 30, 30, 20, 10]))  # step 0: freq 40:1 30:2 20:1 10:1
    assert ks.end_step().keys.tolist() == [10]  # 10, 20, 40 tie on (1, 0): smallest key
    ks.train(a([20, 50]))  # step 1: 20 -> (2, 1); 50 new (1, 1)
    assert ks.end_step().keys.tolist() == [40]  # (1, 0) beats 50's (1, 1)
    ks.train(a([60, 60, 60]))  # step 2: four rows, 30 and 20 have (2, 0) and (2, 1)
    assert ks.end_step().keys.tolist() == [50]
    assert state(ks) == {20: [1, 2, 1], 30: [2, 2, 0], 60: [3, 3, 2]}


def test_steps_to_live_runs_before_max_rows():
    ks = space(ttl=1, cap=1)
    ks.train(a([1, 2, 2, 3]))  # step 0
    assert ks.end_step().keys.tolist() == [1, 3]  # none expired yet; 2 is the most used
    ks.train(a([4]))  # step 1
    # 2 expires (0 + 1 <= 1) first, which leaves 4 alone: within max_rows
    assert ks.end_step().keys.tolist() == [2]
    assert ks.keys().tolist() == [4]


def test_an_evicted_key_starts_over():
    ks = space(k=2, ttl=1)
    ks.train(a([8, 8]))
    ks.end_step()  # step 0 ends: 8 (last seen 0) stays, as 0 + 1 > 0
    ks.end_step()  # step 1 ends: 8 goes
    assert len(ks) == 0
    assert ks.train(a([8])).rows.tolist() == [-1]  # count restarted at 1
    got = ks.train(a([8]))
    assert got.rows.tolist() == [0] and got.new_keys.tolist() == [8]
    assert state(ks) == {8: [0, 2, 2]}


def test_pending_counts_expire_like_rows():
    ks = space(k=2, ttl=1)
    ks.train(a([4]))
    ks.end_step()
    ks.end_step()  # the pending count of 4 (seen in step 0) is forgotten at the end of step 1
    assert ks.train(a([4])).rows.tolist() == [-1]
    assert ks.train(a([4])).new_keys.tolist() == [4]


def test_evaluation_lookups_never_insert_count_or_refresh():
    ks = space(k=2, ttl=1)
    ks.train(a([1, 1, 2]))  # 1 admitted, 2 pending
    for _ in range(5):
        assert ks.lookup(a([1, 2, 3, 3])).tolist() == [0, -1, -1, -1]
    assert ks.train(a([3])).rows.tolist() == [-1]  # eval occurrences of 3 did not count
    assert ks.pending.counts(a([2, 3])).tolist() == [1, 1]
    ks.end_step()
    ks.lookup(a([1]))  # does not refresh 1
    assert ks.end_step().keys.tolist() == [1]


def test_every_int64_is_a_key():
    ks = space(k=2)
    keys = a([I64_MIN, -1, 0, I64_MAX])
    assert ks.train(keys).rows.tolist() == [-1] * 4
    assert ks.train(keys).new_keys.tolist() == [I64_MIN, -1, 0, I64_MAX]


def test_a_failed_allocation_changes_nothing(monkeypatch):
    ks = space(k=2)
    ks.train(a(list(range(13)) * 2))  # 13 rows: the index is full to its load limit
    ks.train(a([100]))
    before = (state(ks), ks.pending.items()[0].tolist(), ks.pending.items()[1].tolist())

    def no_memory(shape, dtype):
        raise MemoryError("Unable to allocate")

    monkeypatch.setattr(index_module, "_empty", no_memory)
    with pytest.raises(IndexMemoryError, match="table 'user'"):
        ks.train(a([100, 200, 201, 201]))
    after = (state(ks), ks.pending.items()[0].tolist(), ks.pending.items()[1].tolist())
    assert after == before
    monkeypatch.undo()
    assert ks.train(a([100, 200, 201, 201])).new_keys.tolist() == [100, 201]


settings_ = settings(max_examples=120, deadline=None)
pool = st.sampled_from([I64_MIN, -7, -1, 0, 1, 2, 3, 5, 8, 13, I64_MAX])
op = st.one_of(
    st.tuples(st.just("train"), st.lists(pool, max_size=10)),
    st.tuples(st.just("lookup"), st.lists(pool, max_size=6)),
    st.tuples(st.just("end_step"), st.just([])),
)


@settings_
@given(
    k=st.integers(1, 3),
    ttl=st.sampled_from([None, 1, 2, 4]),
    cap=st.sampled_from([None, 1, 3, 6]),
    sequence=st.lists(op, max_size=30),
)
def test_random_sequences_match_the_model(k, ttl, cap, sequence):
    ks, model = space(k, ttl, cap), Model(k, ttl, cap)
    for name, keys in sequence:
        if name == "train":
            got = ks.train(a(keys))
            rows, new, new_rows = model.train(keys)
            assert got.rows.tolist() == rows
            assert got.new_keys.tolist() == new and got.new_rows.tolist() == new_rows
        elif name == "lookup":
            assert ks.lookup(a(keys)).tolist() == model.lookup(keys)
        else:
            assert ks.end_step().keys.tolist() == model.end_step()
        assert state(ks) == model.held
        assert ks.num_rows == model.next_row


def without_rows(held: dict[int, list[int]]) -> dict[int, list[int]]:
    return {key: value[1:] for key, value in held.items()}


@settings_
@given(
    k=st.integers(1, 3),
    ttl=st.sampled_from([None, 1, 3]),
    cap=st.sampled_from([None, 2, 5]),
    before=st.lists(op, max_size=15),
    after=st.lists(op, max_size=15),
)
def test_a_restored_key_space_continues_like_the_original(k, ttl, cap, before, after):
    ks, model = space(k, ttl, cap), Model(k, ttl, cap)
    for sequence in (before, after):
        for name, keys in sequence:
            if name == "train":
                got = ks.train(a(keys))
                rows, new, _ = model.train(keys)
                assert ((got.rows >= 0).tolist(), got.new_keys.tolist()) == (
                    [r >= 0 for r in rows],
                    new,
                )
            elif name == "lookup":
                assert (ks.lookup(a(keys)) >= 0).tolist() == [r >= 0 for r in model.lookup(keys)]
            else:
                assert ks.end_step().keys.tolist() == model.end_step()
            assert without_rows(state(ks)) == without_rows(model.held)
        saved = ks.state()
        ks = KeySpace.from_state(
            "user", saved, CountAdmission(min_count=k), Eviction(steps_to_live=ttl, max_rows=cap)
        )
        assert ks.step == model.step
        assert ks.keys().tolist() == sorted(model.held)
        assert ks.items()[1].tolist() == list(range(len(model.held)))  # compacted, by key
        if k > 1:
            pending = ks.pending.state()
            expected = sorted(model.pending.items())
            assert pending["keys"].tolist() == [key for key, _ in expected]
            assert pending["counts"].tolist() == [c for _, (c, _) in expected]
            assert pending["last_seen"].tolist() == [s for _, (_, s) in expected]


def test_a_bad_saved_state_raises_naming_the_table_and_array():
    saved = space().state()
    saved["keys"] = a([3, 1])
    saved["freq"] = saved["last_seen"] = a([1, 1])
    with pytest.raises(ValueError, match="table 'ads': saved 'keys' must be strictly ascending"):
        KeySpace.from_state("ads", saved)
    saved["freq"] = np.array([1.0, 1.0])
    with pytest.raises(ValueError, match=r"table 'ads': saved 'freq' must be \(2,\) int64"):
        KeySpace.from_state("ads", saved)


def test_bad_keys_and_configs_raise_naming_the_table():
    with pytest.raises(TypeError, match=r"table 'user': KeySpace\.train takes a 1-D int64 array"):
        space().train(np.array([1.0, 2.0]))
    with pytest.raises(TypeError, match=r"table 'user': KeySpace\.lookup takes a 1-D int64 array"):
        space().lookup(np.array([True]))
    with pytest.raises(TypeError, match="table 'ads': admission must be a CountAdmission or None"):
        KeySpace("ads", admission=2)  # type: ignore[arg-type]


def test_reserve_makes_room_so_train_allocates_nothing(monkeypatch):
    space = KeySpace("t")
    space.reserve(500)
    assert len(space) == 0 and space.num_rows == 0  # room only, no state

    def no_memory(*args, **kwargs):
        raise MemoryError("no memory")

    monkeypatch.setattr(index_module, "_empty", no_memory)
    out = space.train(np.arange(500, dtype=np.int64) * 7)
    assert out.new_keys.size == 500 and len(space) == 500
    with pytest.raises(IndexMemoryError, match="table 't'"):
        space.reserve(10_000)
    assert len(space) == 500
