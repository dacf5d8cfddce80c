"""One kernel call for the training lookups of many key spaces (embcore.dynamic.batch) against
its reference, KeySpace.train table by table (rows, new keys, row metadata, free rows, through
eviction), and its fused default initializer against default_rows, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from embcore.dynamic import _init_kernels
from embcore.dynamic.batch import Fill, eligible, train_many
from embcore.dynamic.index import IndexMemoryError
from embcore.dynamic.init import _HI, _LO, default_rows, table_salt
from embcore.dynamic.keyspace import KeySpace
from embcore.dynamic.policy import CountAdmission, Eviction

I64_MIN, I64_MAX = -(2**63), 2**63 - 1


def key_state(space: KeySpace) -> tuple:
    keys, rows, freq, last = space.items()
    index = space._index
    free = index._free[: index._n_free].tolist()
    return (keys.tolist(), rows.tolist(), freq.tolist(), last.tolist(), space.num_rows, free)


def draw(rng: np.random.Generator, pool: np.ndarray, n: int) -> np.ndarray:
    """``n`` keys, mostly repeats from ``pool``, some fresh (extremes included)."""
    keys = pool[rng.zipf(1.3, n) % pool.size]
    fresh = rng.random(n) < 0.2
    keys[fresh] = rng.integers(I64_MIN, I64_MAX, int(fresh.sum()), dtype=np.int64)
    return keys


@pytest.mark.parametrize("ttl, cap", [(None, None), (2, None), (None, 40), (3, 25)])
def test_every_lookup_equals_keyspace_train_table_by_table(ttl, cap):
    rng = np.random.default_rng(ttl or 0 + (cap or 0))
    pools = [
        np.array([0, -1, I64_MIN, I64_MAX, 5], np.int64),
        rng.integers(I64_MIN, I64_MAX, 300, dtype=np.int64),
        rng.integers(-50, 50, 60, dtype=np.int64),
    ]
    evict = Eviction(steps_to_live=ttl, max_rows=cap)
    ref = [KeySpace(f"t{t}", eviction=evict) for t in range(3)]
    got = [KeySpace(f"t{t}", eviction=evict) for t in range(3)]
    assert all(eligible(s) for s in got)
    for step in range(12):
        batch = [draw(rng, p, int(rng.integers(0, 400))) for p in pools]
        base = int(rng.integers(0, 3))
        admitted = train_many(got, batch, base=base)
        for t in range(3):
            want = ref[t].train(batch[t])
            np.testing.assert_array_equal(admitted[t].rows, want.rows + base)
            np.testing.assert_array_equal(admitted[t].new_keys, want.new_keys)
            np.testing.assert_array_equal(admitted[t].new_rows, want.new_rows)
            assert key_state(got[t]) == key_state(ref[t]), (step, t)
            if step % 3 != 2:  # two lookups before a step boundary, now and then
                evicted = (got[t].end_step(), ref[t].end_step())
                np.testing.assert_array_equal(evicted[0].keys, evicted[1].keys)


def test_only_first_sight_key_spaces_are_taken():
    pending = KeySpace("p", admission=CountAdmission(min_count=2))
    assert not eligible(pending)
    with pytest.raises(ValueError, match=r"table 'p'.*first sight"):
        train_many([pending], [np.arange(3, dtype=np.int64)])


def test_a_failed_growth_changes_no_table(monkeypatch):
    from embcore.dynamic import index as index_module

    small, big = KeySpace("small"), KeySpace("big")
    train_many([small, big], [np.arange(5, dtype=np.int64), np.arange(5, dtype=np.int64)])
    before = (key_state(small), key_state(big))
    real = index_module._empty

    def limited(shape, dtype):
        if shape > 1000:
            raise MemoryError("no memory")
        return real(shape, dtype)

    monkeypatch.setattr(index_module, "_empty", limited)
    with pytest.raises(IndexMemoryError, match=r"table 'big'"):
        train_many([small, big], [np.arange(10, 20, dtype=np.int64), np.arange(5000)])
    assert (key_state(small), key_state(big)) == before


def test_every_tail_value_lies_beyond_the_bound_the_kernel_checks():
    """draw_row recomputes only values beyond TAIL_BOUND std: every p in a tail (beyond
    _P_LOW) must land there through the central branch it computed first."""
    lower = np.linspace(_LO, _init_kernels._P_LOW, 200_001)
    for p in (lower, 1.0 - lower):
        x = np.array([_init_kernels._central(v) for v in p[::50]])
        assert (np.abs(x) > _init_kernels.TAIL_BOUND).all()
    assert abs(_init_kernels._central(_init_kernels._P_LOW)) > _init_kernels.TAIL_BOUND


@pytest.mark.parametrize("dim", [1, 7, 64])
def test_draw_row_is_normal_rows_bit_for_bit(dim):
    keys = np.random.default_rng(dim).integers(I64_MIN, I64_MAX, 20_000, dtype=np.int64)
    keys[:3] = [0, I64_MIN, I64_MAX]
    salt = np.uint64(table_salt(3, "user"))
    std = 1.0 / np.sqrt(dim)
    want = np.empty((keys.size, dim), np.float32)
    _init_kernels.normal_rows(keys, salt, _LO, _HI, std, want, 0, 1)
    got = np.empty_like(want)
    for i, key in enumerate(keys):
        _init_kernels.draw_row(got, i, key, salt, _LO, _HI - _LO, std)
    np.testing.assert_array_equal(got, want)
    # the rare tail branch (p beyond 0.02425 of either end) is among these values
    tails = np.abs(want * np.sqrt(dim)) > 1.97
    assert tails.any()


def test_new_rows_take_default_values_and_slots_in_the_same_call():
    dim, capacity, seed = 64, 4000, 11
    spaces = [KeySpace("user"), KeySpace("item")]
    weights = [torch.full((capacity, dim), 7.0) for _ in spaces]
    slots = [torch.full((capacity, dim), 7.0), torch.full((capacity,), 7.0)]
    fills = [
        Fill(w, table_salt(seed, s.table), ((slot, 0.25),))
        for w, s, slot in zip(weights, spaces, slots, strict=True)
    ]
    rng = np.random.default_rng(5)
    pool = rng.integers(I64_MIN, I64_MAX, 3000, dtype=np.int64)
    seen: list[set[int]] = [set(), set()]
    for _ in range(3):
        batch = [draw(rng, pool, 1000), draw(rng, pool, 700)]
        admitted = train_many(spaces, batch, base=1, prepare=lambda t, rows: fills[t])
        for t, space in enumerate(spaces):
            new = admitted[t].new_keys
            assert not set(new.tolist()) & seen[t]
            seen[t] |= set(new.tolist())
            rows = torch.from_numpy(admitted[t].new_rows + 1)
            want = default_rows(seed, space.table, new, dim)
            np.testing.assert_array_equal(weights[t][rows].numpy(), want)
            assert bool((slots[t][rows] == 0.25).all())
    for t, space in enumerate(spaces):  # every other row untouched
        held = np.zeros(capacity, bool)
        held[space.items()[1] + 1] = True
        assert bool((weights[t][torch.from_numpy(~held)] == 7.0).all())
        assert bool((slots[t][torch.from_numpy(~held)] == 7.0).all())


def test_rows_that_cannot_grow_leave_every_table_unchanged(monkeypatch):
    import embcore as ec
    from embcore.rows import keyed

    tables = [ec.TableConfig(None, 4, name=n) for n in ("a", "b")]
    features = {n: ec.FeatureConfig(t) for n, t in zip("ab", tables, strict=True)}
    emb = ec.EmbeddingEngine(features, ec.SGD(0.1))
    emb({"a": torch.arange(3), "b": torch.arange(3)})["a"].sum().backward()
    before = [(emb.table_keys(n).tolist(), emb.table_rows(n, torch.arange(3))) for n in "ab"]

    def no_memory(*args, **kwargs):
        raise MemoryError("no memory")

    monkeypatch.setattr(keyed, "_buffers", no_memory)
    with pytest.raises(IndexMemoryError, match=r"table 'b'.*nothing was changed"):
        emb({"a": torch.arange(3, 6), "b": torch.arange(100)})  # only b must grow
    for n, (keys, rows) in zip("ab", before, strict=True):
        assert emb.table_keys(n).tolist() == keys
        assert torch.equal(emb.table_rows(n, torch.arange(3)), rows)
    monkeypatch.undo()
    emb({"a": torch.arange(3, 6), "b": torch.arange(100)})
    assert emb.table_keys("a").tolist() == list(range(6))
    assert emb.table_keys("b").numel() == 100


def test_copies_and_moves_take_the_rows_not_the_whole_reservation():
    import copy
    import pickle

    import embcore as ec

    table = ec.TableConfig(None, 64, name="t")
    emb = ec.EmbeddingEngine({"f": ec.FeatureConfig(table)}, ec.Adagrad(0.1))
    emb({"f": torch.arange(20_000)})["f"].sum().backward()  # buffers: views of 32x arrays
    rows = emb.store.rows[0]
    assert rows.weight.untyped_storage().nbytes() > 4 * rows.weight.nbytes
    names = sorted(rows._buffers)
    twin = copy.deepcopy(emb)
    for r in (rows, twin.store.rows[0]):
        assert sorted(r._buffers) == names
        for t in r._buffers.values():
            assert t.untyped_storage().nbytes() == t.nbytes
    assert len(pickle.dumps(emb)) < 3 * rows.weight.nbytes
    batch = {"f": torch.arange(19_990, 20_100)}
    for e in (emb, twin):
        e(batch)["f"].sum().backward()
    keys = torch.arange(20_100)
    assert torch.equal(emb.table_rows("t", keys), twin.table_rows("t", keys))


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_a_copied_key_space_describes_its_own_arrays(how):
    """train_many keeps each key space's array addresses between calls: a copy must take its
    own, not write into the arrays of the space it was copied from."""
    import copy
    import pickle

    rng = np.random.default_rng(4)
    space, ref = KeySpace("t"), KeySpace("t")
    first = rng.integers(I64_MIN, I64_MAX, 300, dtype=np.int64)
    for space_ in (space, ref):
        space_.train(first[:10])
    train_many([space], [first])
    ref.train(first)
    twin = copy.deepcopy(space) if how == "deepcopy" else pickle.loads(pickle.dumps(space))
    before = key_state(space)
    for new in (0, 0, 5, 40):  # held keys again (nothing grows), then new ones
        keys = np.concatenate([first[:20], rng.integers(I64_MIN, I64_MAX, new, dtype=np.int64)])
        np.testing.assert_array_equal(train_many([twin], [keys])[0].rows, ref.train(keys).rows)
        assert key_state(twin) == key_state(ref)
    assert key_state(space) == before


def test_a_copied_engine_initialises_its_own_new_rows():
    """The row storage keeps where the lookup kernel writes new rows while its buffers stay: a
    copy of an engine whose buffers are already its own writes into its own."""
    import copy

    import embcore as ec

    table = ec.TableConfig(None, 8, name="t")
    emb = ec.EmbeddingEngine({"f": ec.FeatureConfig(table)}, ec.Adagrad(0.1), seed=3)
    held = torch.arange(20)
    emb({"f": held})["f"].sum().backward()  # room for 32 rows
    copy.deepcopy(emb)  # the buffers become arrays of their own size
    emb({"f": held})["f"].sum().backward()  # (described again)
    twin = copy.deepcopy(emb)
    before = emb.table_rows("t", held).clone()
    new = torch.arange(1000, 1010)  # rows within the room: nothing grows
    twin({"f": new})  # admits and initialises the new rows (no update)
    assert torch.equal(emb.table_rows("t", held), before)
    assert emb.table_keys("t").numel() == 20
    want = default_rows(3, "t", new.numpy(), 8)
    np.testing.assert_array_equal(twin.table_rows("t", new).numpy(), want)
