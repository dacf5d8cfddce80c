"""``TableConfig(initial_capacity=N)``: a dynamic table reserves its key index, row metadata,
rows and slots for N keys when the engine is built, and trains exactly as without (rows,
values, slots, eviction, checkpoints), growing past N as without; bad values are refused.
(The step-by-step model of tests/dynamic/test_engine_dynamic_model.py runs with hints too.)"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import embcore as ec
from embcore.dynamic.index import IndexMemoryError
from embcore.dynamic.init import default_rows
from embcore.rows._capacity import hint_of

I64_MIN, I64_MAX = -(2**63), 2**63 - 1


def engine(hint, optimizer=None, eviction=None, name="t", dim=8):
    tables = [
        ec.TableConfig(None, dim, name=n, eviction=eviction, initial_capacity=h)
        for n, h in ((name, hint), ("plain", None))
    ]
    features = {"x": ec.FeatureConfig(tables[0]), "y": ec.FeatureConfig(tables[1])}
    return ec.EmbeddingEngine(features, optimizer or ec.Adagrad(0.1), seed=5)


def batches(steps=8, seed=0):
    """Raw int64 keys, repeats and new ones (both extremes included) each step."""
    rng = np.random.default_rng(seed)
    pool = rng.integers(I64_MIN, I64_MAX, 400, dtype=np.int64)
    pool[:2] = I64_MIN, I64_MAX
    for _ in range(steps):
        x = pool[rng.zipf(1.2, 64) % pool.size]
        yield {"x": torch.from_numpy(x), "y": torch.from_numpy(pool[rng.integers(0, 50, 16)])}


def content(emb):
    """Every dynamic table's state, rows included, and every other state_dict tensor."""
    out = {}
    for t in emb.tables:
        for k, v in emb.store.dynamic_state(t.index).items():
            out[f"{t.name}:{k}"] = torch.as_tensor(np.asarray(v)).clone()
    return out | {k: v.clone() for k, v in emb.state_dict().items()}


@pytest.mark.parametrize("hint", [5, 60, 1000])  # growth past it, some, none
@pytest.mark.parametrize(
    "eviction", [None, ec.Eviction(steps_to_live=2), ec.Eviction(max_rows=40)], ids=str
)
@pytest.mark.parametrize("optimizer", [ec.Adagrad(0.1), ec.RowwiseAdagrad(0.2), ec.SGD(0.5)])
def test_a_table_with_a_hint_trains_bit_equal_to_one_without(hint, eviction, optimizer):
    plain, held = engine(None, optimizer, eviction), engine(hint, optimizer, eviction)
    for batch in batches():
        acts = [e(batch) for e in (plain, held)]
        for name in ("x", "y"):
            assert torch.equal(acts[0][name], acts[1][name]), name
        for a in acts:
            ((a["x"] ** 2).sum() + a["y"].sum()).backward()
        got, want = content(held), content(plain)
        assert sorted(got) == sorted(want)
        for key, value in want.items():
            assert torch.equal(got[key], value), key
    assert held.table_info("t") == plain.table_info("t")


def test_new_rows_take_the_default_initializer_bit_for_bit():
    """The rows the kernel initialises in reserved (pre-written) memory are the reference's."""
    emb = engine(300)
    keys = np.array([I64_MIN, -1, 0, 7, I64_MAX], np.int64)
    emb({"x": torch.from_numpy(keys), "y": torch.arange(2)})  # lookup only: no update
    want = default_rows(5, "t", keys, 8)
    np.testing.assert_array_equal(emb.table_rows("t", torch.from_numpy(keys)).numpy(), want)


def test_nothing_grows_until_the_table_holds_its_hint_then_it_grows():
    emb = engine(1000, ec.SGD(0.1))
    rows = emb.store.rows[0]
    index = rows.space._index
    start = (rows.weight.data_ptr(), index._keys, rows.space._key, index.capacity)
    assert rows.weight.shape[0] >= 1001 and index.fits(1000) and rows.space.fits(1000)
    for step in range(4):  # 250 new keys a step: 1000 in all
        keys = torch.arange(250 * step, 250 * (step + 1)) * 7919 - 10**6
        emb({"x": keys, "y": torch.arange(2)})["x"].sum().backward()
    now = (rows.weight.data_ptr(), index._keys, rows.space._key, index.capacity)
    assert all(a is b or a == b for a, b in zip(now, start, strict=True))
    assert emb.table_keys("t").numel() == 1000
    keys = torch.arange(10**6, 10**6 + 1500)  # past the hint: every table part grows
    emb({"x": keys, "y": torch.arange(2)})
    assert emb.table_keys("t").numel() == 2500 and rows.space._index.capacity > start[3]
    assert rows.weight.shape[0] >= 2501
    want = default_rows(5, "t", keys.numpy(), 8)
    np.testing.assert_array_equal(emb.table_rows("t", keys).numpy(), want)


def test_a_loaded_table_keeps_its_hint(tmp_path):
    emb = engine(500)
    for batch in batches(4):
        emb(batch)["x"].sum().backward()
    ec.checkpoint.save(emb, tmp_path / "c")
    for hint in (500, None):
        other = engine(hint)
        ec.checkpoint.load(other, tmp_path / "c")
        got, want = content(other), content(emb)
        assert all(torch.equal(got[k], want[k]) for k in want)
        rows = other.store.rows[0]
        assert (rows.weight.shape[0] > 500) == (hint is not None)
        assert rows.space.fits(500 - emb.table_keys("t").numel()) == (hint is not None)


@pytest.mark.parametrize("bad", [0, -3, 2.5, "100", True])
def test_a_bad_hint_is_refused_naming_the_table_and_value(bad):
    with pytest.raises(ValueError, match=r"name='user'\): initial_capacity must be an int >= 1"):
        ec.TableConfig(None, 8, name="user", initial_capacity=bad)


def test_a_hint_on_a_fixed_table_is_refused():
    with pytest.raises(ValueError, match=r"'user'.*initial_capacity= is for dynamic tables"):
        ec.TableConfig(100, 8, name="user", initial_capacity=10)


def test_a_hint_beyond_the_memory_is_refused_before_anything_is_allocated():
    with pytest.raises(IndexMemoryError, match=r"table 'huge': initial_capacity=10{13} reserves"):
        engine(10**13, name="huge")


def test_key_shards_share_the_hint():
    table = ec.EmbeddingEngine(
        {"x": ec.FeatureConfig(ec.TableConfig(None, 4, name="t", initial_capacity=10))}, ec.SGD(1)
    ).tables[0]
    assert [hint_of(table, s) for s in (1, 3, 4, 20)] == [10, 4, 3, 1]
