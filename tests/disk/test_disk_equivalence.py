"""A table in DiskStorage computes what the same table in memory computes, bit for bit: the
same activations at every step and the same rows and slots after, for every optimizer of the
conformance list, both API styles, pipelining and prefetching, whatever the cache size (one
row, a few rows, the whole table). The in-memory engine is the yardstick (it is checked
against the NumPy model in tests/engine and tests/optimizers)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch
from disk_cases import assert_same_tables, cache_bytes, scenario_pair
from engine_cases import (
    FEATURE_PATHS,
    OPTIMIZER_CASES,
    VOCAB_A,
    OptCase,
    random_gradients,
    scenario_batch,
    scenario_step,
)

import embcore as ec
import embcore.disk.table as disk_rows

STEPS = (4, 3, 5, 2)
#: non-lazy Adam updates every row at every step: refused for disk tables (tested below)
LAZY_CASES = [c for c in OPTIMIZER_CASES if c.hp.get("lazy_adam", True)]
CACHE_ROWS = (1, 3, VOCAB_A)


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def run_and_compare(
    memory: ec.EmbeddingEngine, disk: ec.EmbeddingEngine, style: str, seed: int = 3
) -> None:
    rng = np.random.default_rng(seed)
    for size in STEPS:
        batch = scenario_batch(rng, size)
        grads = random_gradients(rng, batch)
        want = scenario_step(memory, batch.features, batch.weights, grads, style)
        got = scenario_step(disk, batch.features, batch.weights, grads, style)
        for p in FEATURE_PATHS:
            assert torch.equal(got[p], want[p]), (p, got[p], want[p])
    assert bool(memory.embedding_tables["a"].abs().sum() > 0)


@pytest.mark.parametrize("case", LAZY_CASES, ids=[c.id for c in LAZY_CASES])
def test_every_optimizer_with_a_one_row_cache(case: OptCase, tmp_path) -> None:
    memory, disk = scenario_pair(case, tmp_path, rows=1)
    run_and_compare(memory, disk, "backward")
    assert_same_tables(memory, disk)
    info = disk.table_info("a")
    assert info["cache_capacity"] == 1 and info["overflow_rows"] > 0  # the step's rows pinned
    assert info["rows_cached"] == 0  # an overflowing cache empties itself after the step


@pytest.mark.parametrize("rows", CACHE_ROWS)
@pytest.mark.parametrize("style", ["backward", "apply_gradients"])
@pytest.mark.parametrize("case_id", ["adagrad", "rowwise_adagrad", "adam", "ftrl"])
def test_every_cache_size_and_style(case_id: str, style: str, rows: int, tmp_path) -> None:
    case = next(c for c in OPTIMIZER_CASES if c.id == case_id)
    memory, disk = scenario_pair(case, tmp_path, rows=rows)
    run_and_compare(memory, disk, style)
    assert_same_tables(memory, disk)
    info = disk.table_info("a")
    assert info["hits"] + info["misses"] > 0
    if rows == VOCAB_A:  # the whole table fits: each row is read once, never evicted
        assert info["evicted_rows"] == 0 and info["overflow_rows"] == 0


@pytest.mark.parametrize("rows", [1, VOCAB_A])
def test_pipelined(rows: int, tmp_path) -> None:
    """Pipelined: one step stale, as the pipelined in-memory table (the update of step N,
    applied after step N+1's lookup, finds its rows again if that lookup evicted them)."""
    case = next(c for c in OPTIMIZER_CASES if c.id == "adagrad")
    memory, disk = scenario_pair(case, tmp_path, rows=rows, pipeline=True)
    run_and_compare(memory, disk, "backward")
    memory.flush()
    disk.flush()
    assert_same_tables(memory, disk)


@pytest.mark.parametrize("rows", [1, 2, 40])
def test_prefetcher_with_a_small_cache(rows: int, tmp_path, monkeypatch) -> None:
    """Batches prepared ahead (``ec.Prefetcher``, depth 2) have their rows read in the
    background; a row written back between its prefetch and its use is read again."""
    monkeypatch.setattr(disk_rows, "_MAKE_ROWS", 16)  # several blocks in a small table
    opt = ec.RowwiseAdagrad(learning_rate=0.3)
    engines = []
    for storage in (None, ec.DiskStorage(tmp_path, cache_bytes(rows, 4, opt), io_threads=3)):
        table = ec.TableConfig(100, 4, name="t", storage=storage)
        engines.append(ec.EmbeddingEngine(ec.FeatureConfig(table), opt))
    rng = np.random.default_rng(0)
    batches = [torch.from_numpy(rng.zipf(1.3, 24) % 100) for _ in range(30)]
    for engine in engines:
        for _, batch in ec.Prefetcher(engine, batches, depth=2):
            engine(batch).pow(2).sum().backward()
    assert_same_tables(*engines)
    info = engines[1].table_info("t")
    assert info["prefetch_used"] > 0
    assert info["hits"] + info["misses"] == sum(np.unique(b).size for b in batches)


def test_default_initializer_and_lazy_blocks(tmp_path, monkeypatch) -> None:
    """Rows never touched are never written; a block is drawn from the in-memory table's
    initializer on first touch, so the values are the same."""
    monkeypatch.setattr(disk_rows, "_MAKE_ROWS", 64)
    opt = ec.Adagrad(learning_rate=0.5)
    engines = []
    for storage in (None, ec.DiskStorage(tmp_path, cache_bytes(8, 6, opt))):
        table = ec.TableConfig(1000, 6, name="t", storage=storage)
        engines.append(ec.EmbeddingEngine(ec.FeatureConfig(table), opt, seed=7))
    disk = engines[1]
    assert disk.table_info("t")["disk_bytes"] == 0  # creation writes nothing
    for engine in engines:
        engine(torch.tensor([3, 70, 3])).sum().backward()
    info = disk.table_info("t")
    record = (info["bytes_written"]) // info["rows_written"]
    assert info["rows_written"] == 128  # two blocks of 64 rows: those of ids 3 and 70
    assert 0 < info["disk_bytes"] <= 2 * 64 * record + 8192
    assert_same_tables(*engines)


def test_engine_default_storage_is_shared(tmp_path) -> None:
    """``EmbeddingEngine(storage=)`` puts the tables without their own storage on disk,
    splitting ``cache_bytes`` evenly: a fixed table smaller than its share takes its size,
    the others (a dynamic one among them) share the rest."""
    opt = ec.SGD(learning_rate=0.1)
    small = ec.TableConfig(4, 2, name="small")
    big = ec.TableConfig(1000, 2, name="big")
    own = ec.TableConfig(50, 2, name="own", storage=ec.DiskStorage(tmp_path / "own", 10_000))
    features = {n: ec.FeatureConfig(t) for n, t in (("s", small), ("b", big), ("o", own))}
    medium = ec.TableConfig(300, 2, name="medium")
    features["m"] = ec.FeatureConfig(medium)
    features["d"] = ec.FeatureConfig(ec.TableConfig(None, 2, name="dynamic"))
    budget = cache_bytes(4 + 3 * 100, 2, opt)
    engine = ec.EmbeddingEngine(features, opt, storage=ec.DiskStorage(tmp_path / "all", budget))
    assert engine.table_info("small")["cache_capacity"] == 4
    assert engine.table_info("big")["cache_capacity"] == 100
    assert engine.table_info("medium")["cache_capacity"] == 100
    assert engine.table_info("own")["cache_capacity"] == 50
    dynamic = engine.table_info("dynamic")
    assert dynamic["cache_capacity"] == 100 and dynamic["rows"] == 0  # on disk, keyed


def test_non_lazy_adam_is_refused(tmp_path) -> None:
    case = next(c for c in OPTIMIZER_CASES if not c.hp.get("lazy_adam", True))
    with pytest.raises(ValueError, match=r"table 'a': Adam with lazy_adam=False updates every row"):
        scenario_pair(case, tmp_path, rows=2)


def test_non_finite_skip_and_stacked(tmp_path) -> None:
    """``non_finite_gradients="skip"`` drops a step with a NaN gradient on disk tables as in
    memory; ``stacked()`` reads and trains them as ``forward`` does."""
    opt = ec.Adagrad(learning_rate=0.3)
    engines = []
    for storage in (None, ec.DiskStorage(tmp_path, cache_bytes(2, 4, opt))):
        table = ec.TableConfig(30, 4, name="t", storage=storage)
        features = {"x": ec.FeatureConfig(table), "y": ec.FeatureConfig(table)}
        engines.append(ec.EmbeddingEngine(features, opt, non_finite_gradients="skip"))
    rng = np.random.default_rng(4)
    for step in range(5):
        batch = {k: torch.from_numpy(rng.integers(0, 30, 6)) for k in ("x", "y")}
        outs = []
        for engine in engines:
            acts = engine.stacked(batch)  # (6, 2, 4)
            grad = torch.ones_like(acts)
            if step == 2:
                grad[0, 0, 0] = float("nan")
            acts.backward(grad)
            outs.append(acts.detach())
        assert torch.equal(outs[0], outs[1])
    assert engines[0].skipped_steps == engines[1].skipped_steps == 1
    assert_same_tables(*engines)
