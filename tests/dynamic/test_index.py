"""KeyIndex against a dict model: rows, reuse of freed rows, growth, every int64 as a key,
memory failures that leave the index unchanged, and thread-count independence."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from embcore.dynamic import index as index_module
from embcore.dynamic.index import IndexMemoryError, KeyIndex

I64_MIN, I64_MAX = -(2**63), 2**63 - 1
EXTREMES = [0, -1, 1, I64_MIN, I64_MIN + 1, I64_MAX, I64_MAX - 1]


class DictIndex:
    """The model: a dict, freed rows reused smallest first, else the next new row."""

    def __init__(self) -> None:
        self.rows: dict[int, int] = {}
        self.free: list[int] = []
        self.next = 0

    def insert(self, keys: list[int]) -> tuple[list[int], list[bool]]:
        out, new = [], []
        for k in keys:
            fresh = k not in self.rows
            if fresh:
                if self.free:
                    self.rows[k] = min(self.free)
                    self.free.remove(self.rows[k])
                else:
                    self.rows[k] = self.next
                    self.next += 1
            out.append(self.rows[k])
            new.append(fresh)
        return out, new

    def remove(self, keys: list[int]) -> list[int]:
        freed = [self.rows.pop(k) for k in keys if k in self.rows]
        self.free += freed
        return freed

    def find(self, keys: list[int]) -> list[int]:
        return [self.rows.get(k, -1) for k in keys]


def arr(keys: list[int]) -> np.ndarray:
    return np.array(keys, dtype=np.int64)


def check_same(index: KeyIndex, model: DictIndex) -> None:
    keys, rows = index.items()
    assert keys.tolist() == sorted(model.rows)
    assert rows.tolist() == [model.rows[k] for k in sorted(model.rows)]
    assert len(index) == len(model.rows)
    assert index.num_rows == model.next
    assert index.num_free == len(model.free)


def test_every_int64_is_a_key():
    index, model = KeyIndex("user"), DictIndex()
    rows, new = index.insert_new(arr(EXTREMES))
    assert (rows.tolist(), new.tolist()) == model.insert(EXTREMES)
    assert index.find(arr(EXTREMES)).tolist() == list(range(len(EXTREMES)))
    assert index.find(arr([2, -2, 12345])).tolist() == [-1, -1, -1]
    check_same(index, model)


def test_repeats_in_one_batch_share_the_first_occurrences_row():
    index = KeyIndex("t")
    rows, new = index.insert_new(arr([7, 3, 7, 7, -5, 3]))
    assert rows.tolist() == [0, 1, 0, 0, 2, 1]
    assert new.tolist() == [True, True, False, False, True, False]
    rows, new = index.insert_new(arr([3, 8, 8]))
    assert rows.tolist() == [1, 3, 3] and new.tolist() == [False, True, False]


def test_freed_rows_are_reused_smallest_first():
    index, model = KeyIndex("t"), DictIndex()
    for batch in ([10, 11, 12, 13, 14], [10, 13, 99]):
        model.insert(batch)
        index.insert(arr(batch))
    assert index.remove(arr([13, 42, 11])).tolist() == model.remove([13, 42, 11]) == [3, 1]
    assert index.insert(arr([50, 51, 52])).tolist() == model.insert([50, 51, 52])[0] == [1, 3, 6]
    check_same(index, model)


def test_growth_keeps_every_key():
    index, model = KeyIndex("t"), DictIndex()
    rng = np.random.default_rng(1)
    for _ in range(20):
        batch = rng.integers(I64_MIN, I64_MAX, 3000, dtype=np.int64, endpoint=True).tolist()
        assert index.insert(arr(batch)).tolist() == model.insert(batch)[0]
    assert index.capacity > 16
    check_same(index, model)
    probe = rng.integers(I64_MIN, I64_MAX, 1000, dtype=np.int64).tolist() + list(model.rows)
    assert index.find(arr(probe)).tolist() == model.find(probe)


def _home(keys: np.ndarray, cap: int) -> np.ndarray:
    """The home slot by the documented hash: SplitMix64's finalizer, then (h >> 32) * cap >> 32."""
    z = keys.view(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z = z ^ (z >> np.uint64(31))
    return ((z >> np.uint64(32)) * np.uint64(cap) >> np.uint64(32)).astype(np.int64)


@pytest.mark.parametrize("home", [15, 7])
def test_removal_inside_a_run_that_wraps_around(home):
    """Keys sharing one home slot form a run (past the end of a 16-slot table when the home is
    15); removing any of them keeps the others findable."""
    index = KeyIndex("t")
    assert index.capacity == 16
    candidates = np.arange(-20000, 20000, dtype=np.int64)
    same = candidates[_home(candidates, 16) == home][:6].tolist()
    assert len(same) == 6
    for gone in range(6):
        index, model = KeyIndex("t"), DictIndex()
        index.insert(arr(same))
        model.insert(same)
        assert index.remove(arr([same[gone]])).tolist() == model.remove([same[gone]])
        assert index.find(arr(same)).tolist() == model.find(same)
        index.insert(arr([same[gone]]))
        model.insert([same[gone]])
        assert index.find(arr(same)).tolist() == model.find(same)


key_pool = st.sampled_from([*EXTREMES, 2, 3, 5, 8, 13, -21, 34, 1 << 40, -(1 << 50)])
batches = st.lists(key_pool, max_size=12)
ops = st.lists(st.tuples(st.sampled_from(["insert", "remove", "find"]), batches), max_size=40)


@settings(max_examples=150, deadline=None)
@given(ops)
def test_random_operation_sequences_match_the_dict_model(sequence):
    index, model = KeyIndex("t"), DictIndex()
    for op, batch in sequence:
        keys = arr(batch)
        if op == "insert":
            rows, new = index.insert_new(keys)
            assert (rows.tolist(), new.tolist()) == model.insert(batch)
        elif op == "remove":
            assert index.remove(keys).tolist() == model.remove(batch)
        else:
            assert index.find(keys).tolist() == model.find(batch)
    check_same(index, model)


def test_lookups_are_the_same_for_any_thread_count():
    index = KeyIndex("t")
    rng = np.random.default_rng(2)
    held = rng.integers(I64_MIN, I64_MAX, 50_000, dtype=np.int64)
    index.insert(held)
    query = np.concatenate([held[::3], rng.integers(I64_MIN, I64_MAX, 20_000, dtype=np.int64)])
    before = torch.get_num_threads()
    try:
        results = []
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            results.append(index.find(query))
    finally:
        torch.set_num_threads(before)
    assert all((r == results[0]).all() for r in results)
    model = dict(zip(held.tolist(), index.find(held).tolist(), strict=True))
    assert results[0].tolist() == [model.get(k, -1) for k in query.tolist()]


def test_a_failed_growth_raises_naming_the_sizes_and_changes_nothing(monkeypatch):
    index = KeyIndex("user")
    index.insert(arr(list(range(13))))  # 13 keys fill 16 slots to the load limit
    index.remove(arr([4]))
    before = (index.items(), len(index), index.capacity, index.num_rows, index.num_free)

    def no_memory(shape, dtype):
        raise MemoryError("Unable to allocate")

    monkeypatch.setattr(index_module, "_empty", no_memory)
    with pytest.raises(IndexMemoryError, match=r"table 'user'.*slots \(\d+ bytes\) for 13 keys"):
        index.insert(arr([100, 101, 4, 102]))
    after = (index.items(), len(index), index.capacity, index.num_rows, index.num_free)
    assert after[1:] == before[1:]
    assert all((a == b).all() for a, b in zip(after[0], before[0], strict=True))
    monkeypatch.undo()
    assert index.insert(arr([100, 101, 4, 102])).tolist() == [4, 13, 14, 15]


def test_running_out_of_int32_rows_raises_unchanged():
    index = KeyIndex("user")
    index.insert(arr([1, 2]))
    index._next_row = 2**31 - 2  # as if 2**31 - 2 rows had been handed out
    with pytest.raises(IndexMemoryError, match=r"row 2147483648, past the int32 row limit"):
        index.insert(arr([5, 6, 7]))
    assert len(index) == 2 and index.find(arr([5])).tolist() == [-1]
    assert index.insert(arr([5])).tolist() == [2**31 - 2]


@pytest.mark.parametrize(
    "bad", [np.array([1.0]), np.array([1], np.int32), [1, 2], np.zeros((2, 2), np.int64)]
)
def test_keys_must_be_a_1d_int64_array(bad):
    with pytest.raises(
        TypeError, match=r"table 'clicks': KeyIndex\.find takes a 1-D int64 array of keys, got"
    ):
        KeyIndex("clicks").find(bad)


@pytest.mark.parametrize("n", [1000, 30_000, 100_000, 250_000])
def test_index_overhead_stays_under_24_bytes_per_key(n):
    index = KeyIndex("t")
    keys = np.random.default_rng(n).integers(I64_MIN, I64_MAX, n, dtype=np.int64)
    for start in range(0, n, 4096):
        index.insert(keys[start : start + 4096])
    assert len(index) == np.unique(keys).size
    assert index.nbytes == index.capacity * 13
    assert index.bytes_per_key() <= 24.0


def test_row_dtype_int64_costs_17_bytes_a_slot():
    index = KeyIndex("t", capacity=1000, row_dtype=np.int64)
    assert index.capacity >= 1000 / 0.85
    index.insert(arr([1, 2]))
    assert index.nbytes == index.capacity * 17
    with pytest.raises(ValueError, match="row_dtype must be int32 or int64"):
        KeyIndex("t", row_dtype=np.float32)


def test_items_in_slot_order_hold_the_same_pairs():
    index = KeyIndex("t")
    index.insert(arr([9, -4, 2**62, 0]))
    keys, rows = index.items(ordered=False)
    assert sorted(zip(keys.tolist(), rows.tolist(), strict=True)) == [
        (-4, 1), (0, 3), (9, 0), (2**62, 2)
    ]  # fmt: skip
