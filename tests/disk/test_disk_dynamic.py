"""A dynamic table in DiskStorage computes what the same dynamic table in memory computes, bit
for bit: the same activations at every step, the same keys, rows, slots and counters after,
with admission and eviction on (freed rows reused), for several optimizers, both API styles
and caches of one row, a few rows and the whole table; its checkpoints (full and delta) load
into either kind. The in-memory dynamic table is the yardstick (tests/dynamic checks it)."""

from __future__ import annotations

import errno
import gc
import os
from collections.abc import Iterator

import numpy as np
import pytest
import torch
from disk_cases import cache_bytes
from engine_cases import (
    DIM_A,
    DIM_B,
    FEATURE_PATHS,
    FEATURE_TABLE,
    OPTIMIZER_CASES,
    OptCase,
    get_path,
    nested,
    random_gradients,
    scenario_batch,
    scenario_features,
    scenario_step,
)

import embcore as ec
from embcore.disk import DiskTableError
from embcore.rows import RowEnv
from embcore.rows.disk_keyed import DiskKeyedRows

I64_MIN, I64_MAX = -(2**63), 2**63 - 1
#: the key of id k, per table (extremes and negatives; rows are not handed out in key order)
KEYS = {
    "a": np.array([I64_MAX, -3, 0, 8_231_778_211, I64_MIN, 7, -(2**40), 2**62, 1], np.int64),
    "b": np.array([5, I64_MIN + 1, I64_MAX - 1, -77, 2**33, 0, 42, -(2**62), 3], np.int64),
}
DIMS = {"a": DIM_A, "b": DIM_B}
STEPS = (4, 3, 5, 2, 4, 3, 5)
ADMIT = ec.CountAdmission(min_count=2)
EVICT = ec.Eviction(steps_to_live=2, max_rows=5)
WHOLE = 16  # rows: more than a table ever holds


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
    gc.collect()  # drop the engines: their disk tables' locks


def tables(opt: ec.Optimizer, directory=None, rows: int = 0, **policy) -> dict:
    """The scenario's two tables, dynamic; in DiskStorage (``rows`` cached each) or memory."""
    out = {}
    for name, combiner in (("a", "sqrtn"), ("b", "mean")):
        storage = None
        if directory is not None:
            storage = ec.DiskStorage(directory, cache_bytes(rows, DIMS[name], opt))
        out[name] = ec.TableConfig(
            None, DIMS[name], combiner=combiner, name=name, storage=storage, **policy
        )
    return out


def pair(case: OptCase, directory, rows: int, **options) -> tuple:
    policy = options.pop("policy", {"admission": ADMIT, "eviction": EVICT})
    memory = tables(case.make(), **policy)
    disk = tables(case.make(), directory, rows, **policy)
    return (
        ec.EmbeddingEngine(scenario_features(memory["a"], memory["b"]), case.make(), **options),
        ec.EmbeddingEngine(scenario_features(disk["a"], disk["b"]), case.make(), **options),
    )


def as_keys(x, table: str):
    lut = torch.from_numpy(KEYS[table])
    if isinstance(x, ec.RaggedIds):
        return ec.RaggedIds(lut[x.values], x.row_splits)
    if x.layout == torch.sparse_coo:
        return torch.sparse_coo_tensor(
            x._indices(), lut[x._values()], x.shape, check_invariants=True
        )
    return lut[x]


def run_and_compare(memory, disk, style: str = "backward", seed: int = 3, steps=STEPS) -> None:
    rng = np.random.default_rng(seed)
    for size in steps:
        batch = scenario_batch(rng, size)
        grads = random_gradients(rng, batch)
        keyed = nested(
            {p: as_keys(get_path(batch.features, p), FEATURE_TABLE[p]) for p in FEATURE_PATHS}
        )
        want = scenario_step(memory, keyed, batch.weights, grads, style)
        got = scenario_step(disk, keyed, batch.weights, grads, style)
        for p in FEATURE_PATHS:
            assert torch.equal(got[p], want[p]), (p, got[p], want[p])


def assert_same(memory, disk, counters=("rows", "pending", "dropped_gradients", "step")) -> None:
    """The same keys, rows, slots and ``counters`` (``dropped_gradients`` counts since the
    engine was made: not in a checkpoint)."""
    assert disk.step == memory.step
    for name in ("a", "b"):
        keys = memory.table_keys(name)
        assert torch.equal(disk.table_keys(name), keys), name
        assert torch.equal(disk.embedding_tables[name], memory.embedding_tables[name]), name
        for slot, value in memory.slot_variables[name].items():
            assert torch.equal(disk.slot_variables[name][slot], value), (name, slot)
        probe = torch.from_numpy(KEYS[name])  # held keys and keys without a row (zeros)
        assert torch.equal(disk.table_rows(name, probe), memory.table_rows(name, probe))
        mine, theirs = disk.table_info(name), memory.table_info(name)
        for counter in counters:
            assert mine[counter] == theirs[counter], (name, counter)


CASES = {c.id: c for c in OPTIMIZER_CASES}


@pytest.mark.parametrize("rows", [1, 3, WHOLE])
@pytest.mark.parametrize("case_id", ["adagrad", "rowwise_adagrad", "adam", "ftrl"])
def test_equals_the_dynamic_table_in_memory(case_id: str, rows: int, tmp_path) -> None:
    memory, disk = pair(CASES[case_id], tmp_path, rows)
    run_and_compare(memory, disk)
    assert_same(memory, disk)
    info = disk.table_info("a")
    assert info["dropped_gradients"] > 0  # admission held keys back
    assert info["cache_capacity"] == rows and info["hits"] + info["misses"] > 0
    if rows == 1:
        assert info["overflow_rows"] > 0 and info["rows_cached"] == 0
        assert info["rows_written"] > 0 and info["rows_read"] > 0
    if rows == WHOLE:  # every row stays cached: nothing is read back
        assert info["rows_read"] == 0 and info["overflow_rows"] == 0


@pytest.mark.parametrize("style", ["apply_gradients", "backward"])
def test_both_styles_and_no_policy(style: str, tmp_path) -> None:
    memory, disk = pair(CASES["adagrad"], tmp_path, 2, policy={})
    run_and_compare(memory, disk, style)
    assert_same(memory, disk)


def test_pipelined_and_prefetched(tmp_path) -> None:
    """Pipelined updates (flushed before a training lookup when keys may be evicted) and rows
    read ahead by ``prepare`` give the same numbers."""
    memory, disk = pair(CASES["rowwise_adagrad"], tmp_path, 3, pipeline=True)
    rng = np.random.default_rng(7)
    for size in STEPS:
        batch = scenario_batch(rng, size)
        grads = random_gradients(rng, batch)
        keyed = nested(
            {p: as_keys(get_path(batch.features, p), FEATURE_TABLE[p]) for p in FEATURE_PATHS}
        )
        want = scenario_step(memory, keyed, batch.weights, grads, "backward")
        prepared = disk.prepare(keyed, batch.weights)
        got = scenario_step(disk, prepared, None, grads, "backward")
        for p in FEATURE_PATHS:
            assert torch.equal(got[p], want[p]), p
    memory.flush()
    disk.flush()
    assert_same(memory, disk)
    assert disk.table_info("a")["prefetched_rows"] > 0


def test_freed_rows_are_reused(tmp_path) -> None:
    """Keys evicted at a step's end free their rows; the next keys take them (born again in
    the cache, never read from the stale records), in memory and on disk alike."""
    opt = ec.Adagrad(learning_rate=0.5)
    evict = {"eviction": ec.Eviction(steps_to_live=1)}
    engines = []
    for storage in (None, ec.DiskStorage(tmp_path, cache_bytes(1, 3, opt))):
        table = ec.TableConfig(None, 3, name="t", storage=storage, **evict)
        engines.append(ec.EmbeddingEngine({"f": ec.FeatureConfig(table)}, opt))
    for keys in ([11, 12, 13], [14, 15, 16], [17, 18, 19], [11, 14, 20]):
        acts = [e({"f": torch.tensor(keys)})["f"] for e in engines]
        for a in acts:
            (a * torch.arange(1.0, 4.0)[:, None]).sum().backward()
        assert torch.equal(acts[0], acts[1])
    memory, disk = engines
    assert disk.store.rows[0].space.num_rows == 6  # 12 keys admitted on 6 rows
    assert torch.equal(disk.table_keys("t"), memory.table_keys("t"))
    assert torch.equal(disk.embedding_tables["t"], memory.embedding_tables["t"])
    assert torch.equal(
        disk.slot_variables["t"]["accumulators"], memory.slot_variables["t"]["accumulators"]
    )


def test_refuses_what_the_disk_cannot_hold(tmp_path) -> None:
    opt = ec.Adam(learning_rate=0.1, lazy_adam=False, use_gradient_accumulation=True)
    table = ec.TableConfig(None, 4, name="t", storage=ec.DiskStorage(tmp_path, 10_000))
    with pytest.raises(ValueError, match=r"table 't': Adam with lazy_adam=False"):
        ec.EmbeddingEngine({"f": ec.FeatureConfig(table)}, opt)
    emb = ec.EmbeddingEngine({"f": ec.FeatureConfig(table)}, ec.SGD(learning_rate=0.1))
    resolved, env = emb.store.rows[0].table, RowEnv(0, torch.device("cpu"))
    with pytest.raises(ValueError, match=r"table 't': .* by key shard .*part=\['piece'\]"):
        DiskKeyedRows(resolved, env, piece=None)  # a dense piece of a sharded engine


def test_key_index_is_counted_beside_the_cache(tmp_path) -> None:
    table = ec.TableConfig(None, 8, name="t", storage=ec.DiskStorage(tmp_path, 4096))
    emb = ec.EmbeddingEngine({"f": ec.FeatureConfig(table)}, ec.SGD(learning_rate=0.1))
    rows = emb.store.rows[0]
    assert isinstance(rows, DiskKeyedRows)
    keys = torch.arange(5000, dtype=torch.int64) * 7919 - 10**12
    emb({"f": keys})["f"].sum().backward()
    info = emb.table_info("t")
    assert info["rows"] == 5000 and info["rows_cached"] <= info["cache_capacity"]
    per_key = info["index_bytes"] / info["rows"]
    assert 20 < per_key < 80, per_key  # index slots + row metadata, grown by half at most
    assert rows.memory()["ram"] == info["ram_bytes"] + info["index_bytes"]


LOADED = ("rows", "pending", "step")


@pytest.mark.parametrize("rows", [1, WHOLE])
def test_checkpoint_and_delta_round_trip(rows: int, tmp_path) -> None:
    """A full checkpoint and a delta of a disk engine load into a memory engine and into a
    disk engine, which then train on exactly as the original; a memory engine's checkpoint
    loads into a disk engine."""
    memory, disk = pair(CASES["adagrad"], tmp_path / "run", rows)
    run_and_compare(memory, disk, steps=STEPS[:3])
    ec.checkpoint.save(disk, tmp_path / "full")
    run_and_compare(memory, disk, seed=4, steps=STEPS[3:5])
    ec.checkpoint.save(disk, tmp_path / "delta", base=tmp_path / "full")
    ec.checkpoint.save(memory, tmp_path / "from-memory")
    ec.checkpoint.verify(tmp_path / "delta")
    to_memory, to_disk = pair(CASES["adagrad"], tmp_path / "load", rows)
    ec.checkpoint.load(to_memory, tmp_path / "delta")
    ec.checkpoint.load(to_disk, tmp_path / "delta")
    assert_same(memory, to_memory, LOADED)
    assert_same(memory, to_disk, LOADED)
    run_and_compare(memory, to_disk, seed=5, steps=STEPS[5:])
    run_and_compare(to_memory, disk, seed=5, steps=STEPS[5:])
    assert_same(memory, to_disk, LOADED)
    assert_same(to_memory, disk, LOADED)
    del to_disk
    gc.collect()
    reference, again = pair(CASES["adagrad"], tmp_path / "load", rows)
    ec.checkpoint.load(reference, tmp_path / "delta")
    ec.checkpoint.load(again, tmp_path / "from-memory")
    assert_same(reference, again, LOADED)


def test_a_full_disk_stops_training_until_a_checkpoint_is_loaded(tmp_path, monkeypatch) -> None:
    """A training step whose write-back fails has counted and admitted its keys: the table
    refuses further steps (one clear error) until a checkpoint is loaded, then trains on as
    the in-memory table loaded from the same checkpoint."""
    memory, disk = pair(CASES["adagrad"], tmp_path / "run", 3)
    run_and_compare(memory, disk, steps=STEPS[:2])
    ec.checkpoint.save(disk, tmp_path / "c")
    real = os.pwritev
    monkeypatch.setattr(os, "pwritev", lambda *a: (_ for _ in ()).throw(OSError(errno.ENOSPC, "")))
    rng = np.random.default_rng(11)
    with pytest.raises(DiskTableError, match=r"the disk is full.*restore the engine from a check"):
        for size in STEPS:  # the cache fills with changed rows, then must write some back
            batch = scenario_batch(rng, size)
            keyed = nested(
                {p: as_keys(get_path(batch.features, p), FEATURE_TABLE[p]) for p in FEATURE_PATHS}
            )
            scenario_step(disk, keyed, batch.weights, random_gradients(rng, batch), "backward")
    monkeypatch.setattr(os, "pwritev", real)
    with pytest.raises(DiskTableError, match=r"refuses further steps"):
        run_and_compare(memory, disk, steps=STEPS[:1])
    for e in (memory, disk):
        ec.checkpoint.load(e, tmp_path / "c")
    run_and_compare(memory, disk, seed=12, steps=STEPS[2:5])
    assert_same(memory, disk, LOADED)
