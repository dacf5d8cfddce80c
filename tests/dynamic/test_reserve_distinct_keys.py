"""A training lookup of a dynamic table makes room for its distinct new keys only: a batch
that repeats held keys needs no row, so it grows no buffer and trains even when no memory is
left; a batch with a few new keys among many repeats grows by those few."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import embcore as ec
from embcore.dynamic import index
from embcore.dynamic.keyspace import KeySpace
from embcore.rows import keyed as store
from embcore.sharding import ShardingPlan, TableShard

DIM = 2
REPEATS = 200_000


def engine(plan: ShardingPlan | None = None, **table_options) -> ec.EmbeddingEngine:
    table = ec.TableConfig(None, DIM, combiner="sum", name="t", **table_options)
    return ec.EmbeddingEngine({"f": ec.FeatureConfig(table)}, ec.SGD(learning_rate=1.0), plan=plan)


def train(emb: ec.EmbeddingEngine, keys: np.ndarray) -> None:
    emb({"f": torch.from_numpy(keys)})["f"].sum().backward()


def sizes(emb: ec.EmbeddingEngine) -> tuple[int, ...]:
    """Rows of the weight buffer, index capacity, row-metadata and pending-count sizes."""
    rows = emb.store.rows[0]
    space = rows.space
    pending = space.pending
    return (
        rows.tensor("weight").shape[0],
        space._index.capacity,
        space._key.size,
        0 if pending is None else pending._index.capacity,
    )


def no_memory(*args, **kwargs):
    raise MemoryError("no memory")


@pytest.mark.parametrize("admission", [None, 2])
def test_repeats_of_held_keys_grow_nothing_and_train_without_free_memory(monkeypatch, admission):
    options = {} if admission is None else {"admission": ec.CountAdmission(min_count=admission)}
    emb = engine(**options)
    held = np.arange(10, dtype=np.int64) * 7919 - 5
    train(emb, np.repeat(held, admission or 1))  # every key admitted
    assert emb.table_keys("t").tolist() == sorted(held.tolist())
    before = sizes(emb)
    rows_before = emb.table_rows("t", held).numpy().copy()
    batch = np.tile(held, REPEATS // held.size)  # 200,000 occurrences, 10 distinct held keys
    monkeypatch.setattr(store, "_buffers", no_memory)  # no row buffer can be allocated,
    monkeypatch.setattr(index, "_empty", no_memory)  # nor index slots
    train(emb, batch)
    assert sizes(emb) == before
    # SGD at rate 1 with a sum combiner: each row moves by minus its number of occurrences
    expected = rows_before - (REPEATS // held.size)
    np.testing.assert_array_equal(emb.table_rows("t", held).numpy(), expected)


def test_a_few_new_keys_among_repeats_grow_the_buffers_by_a_few_rows():
    emb = engine()
    held = np.arange(20, dtype=np.int64)
    train(emb, held)
    new = np.array([1000, 1001, 1002], np.int64)
    train(emb, np.concatenate([np.tile(held, 10_000), np.repeat(new, 10_000)]))
    weight_rows, index_slots, meta, _ = sizes(emb)
    assert emb.table_keys("t").numel() == 23
    assert weight_rows <= 2 * (23 + 16) + 1  # doubling from the keys held, not 230,000 rows
    assert index_slots <= 256 and meta <= 2 * 23 + 16


def test_key_hash_rows_of_a_one_rank_plan_grow_for_new_keys_only():
    plan = ShardingPlan(world_size=1, tables={"t": TableShard(scheme="key_hash", ranks=(0,))})
    emb = engine(plan=plan)
    held = np.arange(50, dtype=np.int64)
    train(emb, held)
    shard = emb.store._sharded[0].rows
    before = shard.weight.shape[0]
    real = shard.weight.new_zeros

    def refuse(*size, **kwargs):
        raise MemoryError("no memory")

    shard.weight.new_zeros = refuse  # growing this shard's rows would fail
    train(emb, np.tile(held, 2000))
    assert shard.weight.shape[0] == before
    shard.weight.new_zeros = real
    np.testing.assert_array_equal(emb.table_keys("t").numpy(), held)


def test_count_new_counts_distinct_keys_without_a_row():
    space = KeySpace("t")
    space.train(np.array([1, 2, 3], np.int64))
    keys = np.array([1, 1, 2, 9, 9, 9, 8, 3, 8], np.int64)
    assert space.count_new(keys) == 2
    assert space.count_new(np.zeros(0, np.int64)) == 0
    with pytest.raises(TypeError, match=r"table 't'.*int64"):
        space.count_new(keys.astype(np.int32))
