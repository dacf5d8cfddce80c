"""Checkpoints of disk tables: the same files as for in-memory tables (a checkpoint saved from
one loads into the other), written and read one box of rows at a time, and a resume from the
last checkpoint that ends where an uninterrupted run ends, bit for bit."""

from __future__ import annotations

import gc

import pytest
import torch
from disk_cases import (
    assert_same_tables,
    big_small_batches,
    big_small_engine,
    cache_bytes,
    train_big_small,
)

import embcore as ec
import embcore.disk.table as disk_rows
from embcore._lazy_box import LazyBox

OPT = ec.RowwiseAdagrad(learning_rate=0.3)
VOCAB, DIM = 300, 6


def engine(directory=None, rows: int = 5) -> ec.EmbeddingEngine:
    return big_small_engine(VOCAB, DIM, OPT, directory, rows)


def batches(n: int, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    return big_small_batches(n, VOCAB, seed)


train = train_big_small


@pytest.fixture(autouse=True)
def _small_boxes(monkeypatch) -> None:
    monkeypatch.setattr(disk_rows, "_CHUNK", 64)  # several boxes in a small table
    monkeypatch.setattr(disk_rows, "_MAKE_ROWS", 32)


def test_save_from_disk_load_in_memory_and_back(tmp_path) -> None:
    memory, disk = engine(), engine(tmp_path / "d")
    steps = batches(6)
    train(memory, steps[:3])
    train(disk, steps[:3])
    ec.checkpoint.save(disk, tmp_path / "ck")
    ec.checkpoint.verify(tmp_path / "ck")
    restored = engine()
    ec.checkpoint.load(restored, tmp_path / "ck")
    assert_same_tables(memory, restored)
    # and a checkpoint of the in-memory engine into a fresh disk engine, which goes on exactly
    ec.checkpoint.save(memory, tmp_path / "ck2")
    del disk
    gc.collect()  # the engine's lock on its directory goes with it
    again = engine(tmp_path / "d")
    ec.checkpoint.load(again, tmp_path / "ck2")
    assert again.table_info("big")["rows_cached"] == 0  # loaded to the file, not the cache
    train(memory, steps[3:])
    train(again, steps[3:])
    assert_same_tables(memory, again)


def test_save_and_load_hold_one_box_at_a_time(tmp_path, monkeypatch) -> None:
    """A save reads each box once, when DCP writes it; a load writes each box to the table
    as soon as it is filled: at most one box of rows is held at a time."""
    disk = engine(tmp_path / "d")
    train(disk, batches(2))
    reads, holding, most = [0], set(), [0]
    tensor, filled = LazyBox.tensor, LazyBox.filled

    def counted_tensor(self):
        value = tensor(self)
        if self._write is None:
            reads[0] += 1
        else:
            holding.add(id(self))
            most[0] = max(most[0], len(holding))
        return value

    def counted_filled(self, elements):
        filled(self, elements)
        if self._buffer is None:
            holding.discard(id(self))

    monkeypatch.setattr(LazyBox, "tensor", counted_tensor)
    monkeypatch.setattr(LazyBox, "filled", counted_filled)
    boxes = -(-VOCAB // disk_rows._CHUNK)
    ec.checkpoint.save(disk, tmp_path / "ck")
    assert reads[0] == 2 * boxes  # weight and accumulators, each box once
    before = {n: t.clone() for n, t in disk.embedding_tables.items()}
    train(disk, batches(1, seed=9))
    ec.checkpoint.load(disk, tmp_path / "ck")
    assert most[0] == 1 and not holding
    for name, value in before.items():
        assert torch.equal(disk.embedding_tables[name], value)


def test_delta_of_a_disk_engine_loads(tmp_path) -> None:
    memory, disk = engine(), engine(tmp_path / "d")
    steps = batches(4, seed=1)
    for e, where in ((memory, "m"), (disk, "d")):
        train(e, steps[:2])
        ec.checkpoint.save(e, tmp_path / f"{where}-base")
        train(e, steps[2:])
        ec.checkpoint.save(e, tmp_path / f"{where}-delta", base=tmp_path / f"{where}-base")
    restored = engine(tmp_path / "r")
    ec.checkpoint.load(restored, tmp_path / "d-delta")
    assert_same_tables(memory, restored)


def test_a_lookup_only_engine_serves_a_disk_table_from_a_checkpoint(tmp_path) -> None:
    """``optimizer=None`` over a disk table loaded from a training checkpoint (its slots
    dropped) looks up what the trainer looks up, with a cache of a few rows."""
    trainer = engine(tmp_path / "d")
    train(trainer, batches(3))
    ec.checkpoint.save(trainer, tmp_path / "ck")
    storage = ec.DiskStorage(tmp_path / "serve", cache_bytes(4, DIM, ec.SGD()))
    big = ec.TableConfig(VOCAB, DIM, name="big", storage=storage)
    small = ec.TableConfig(7, 3, name="small")
    server = ec.EmbeddingEngine({"b": ec.FeatureConfig(big), "s": ec.FeatureConfig(small)})
    ec.checkpoint.load(server, tmp_path / "ck", allow_optimizer_change=True)
    probe = {"b": torch.arange(0, VOCAB, 7), "s": torch.arange(7)}
    with torch.no_grad():
        want, got = trainer(probe), server(probe)
    assert torch.equal(got["b"], want["b"]) and torch.equal(got["s"], want["s"])
    assert server.table_info("big")["cache_capacity"] == 4


def test_a_save_of_a_fresh_table_draws_each_initializer_block_once(tmp_path, monkeypatch):
    """Rows never touched are drawn from the initializer when saved: each box of a block
    reuses the block drawn for the one before (drawing part of a block draws all of it), and
    the values stay the in-memory table's through saves and training after them."""
    from embcore.initializers import BLOCK_ROWS

    calls = []
    real = disk_rows.initial_rows
    monkeypatch.setattr(disk_rows, "initial_rows", lambda *a, **k: calls.append(a) or real(*a, **k))
    memory, disk = engine(), engine(tmp_path / "d")
    ec.checkpoint.save(disk, tmp_path / "fresh")
    assert len(calls) == -(-VOCAB // BLOCK_ROWS)  # 5 boxes of 64 rows, 2 tensors: 1 draw
    steps = batches(6, seed=3)
    for e in (memory, disk):
        train(e, steps[:3])
    ec.checkpoint.save(disk, tmp_path / "trained")  # cached rows copied over drawn ones
    for e in (memory, disk):
        train(e, steps[3:])  # blocks written for the first time after the save
    assert_same_tables(memory, disk)
    restored = engine()
    ec.checkpoint.load(restored, tmp_path / "fresh")
    assert_same_tables(engine(), restored)
