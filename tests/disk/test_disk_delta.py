"""Delta checkpoints of fixed disk tables hold only the rows touched since their base, and
load exactly: base plus deltas equal the saving engine and an in-memory engine trained the
same way, bit for bit, whatever the cache size. The touched rows are counted here from the
batches themselves (the distinct ids each step updated)."""

from __future__ import annotations

import functools
import json

import numpy as np
import pytest
import torch
from disk_cases import (
    assert_same_tables,
    big_small_batches,
    big_small_engine,
    train_big_small,
)

import embcore as ec
import embcore.disk.table as disk_rows
from embcore._lazy_box import LazyBox
from embcore.checkpoint._errors import CheckpointError
from embcore.checkpoint._manifest import MANIFEST
from embcore.checkpoint._touched import patch_chunks

OPT = ec.RowwiseAdagrad(learning_rate=0.3)
VOCAB, DIM = 2000, 6


engine = functools.partial(big_small_engine, VOCAB, DIM, OPT)  # (directory=None, rows=5)
batches = functools.partial(big_small_batches, vocab=VOCAB)  # (n, seed=0)
train = train_big_small


def touched(steps: list[dict[str, torch.Tensor]]) -> np.ndarray:
    """The rows of ``big`` these steps updated: every distinct id they looked up."""
    return np.unique(np.concatenate([b["b"].numpy() for b in steps]))


def manifest(path) -> dict:
    return ec.checkpoint.read_manifest(path)


@pytest.fixture(autouse=True)
def _small_boxes(monkeypatch) -> None:
    monkeypatch.setattr(disk_rows, "_CHUNK", 64)  # several boxes in a small table
    monkeypatch.setattr(disk_rows, "_MAKE_ROWS", 32)


@pytest.mark.parametrize("rows", [1, 5, VOCAB])
def test_a_delta_holds_the_touched_rows_and_loads_exactly(tmp_path, rows) -> None:
    memory, disk = engine(), engine(tmp_path / "d", rows)
    steps = batches(5, seed=rows)
    for e in (memory, disk):
        train(e, steps[:2])
    ec.checkpoint.save(disk, tmp_path / "full")
    for e in (memory, disk):
        train(e, steps[2:4])
    ec.checkpoint.save(disk, tmp_path / "d1", base=tmp_path / "full")
    for e in (memory, disk):
        train(e, steps[4:])
    ec.checkpoint.save(disk, tmp_path / "d2", base=tmp_path / "d1")

    for path, since in (("d1", steps[2:4]), ("d2", steps[4:])):
        m = manifest(tmp_path / path)
        want = touched(since)
        for key in ("big.weight", "big.accumulators"):
            assert m["touched"][key]["rows"] == want.size, (path, key)
            assert key not in m["tensors"]  # not whole
        assert m["tensors"]["big.weight#touched"]["shape"] == [want.size, DIM]
        assert "small.weight" in m["tensors"]  # an in-memory table: whole
    ec.checkpoint.verify(tmp_path / "d2")
    for restored in (engine(), engine(tmp_path / "r", rows)):
        ec.checkpoint.load(restored, tmp_path / "d2")
        assert_same_tables(memory, restored)
    again = engine()
    ec.checkpoint.load(again, tmp_path / "d1")  # the middle of the chain
    middle = engine()
    train(middle, steps[:4])
    assert_same_tables(middle, again)


def test_the_touched_rows_are_exactly_those_updated(tmp_path) -> None:
    disk = engine(tmp_path / "d", rows=3)
    steps = batches(3, seed=7)
    train(disk, steps[:1])
    ec.checkpoint.save(disk, tmp_path / "full")
    train(disk, steps[1:])
    ec.checkpoint.save(disk, tmp_path / "delta", base=tmp_path / "full")
    restored = engine()
    ec.checkpoint.load(restored, tmp_path / "full")
    base_rows = restored.embedding_tables["big"].clone()
    ec.checkpoint.load(restored, tmp_path / "delta")
    changed = np.flatnonzero((restored.embedding_tables["big"] != base_rows).any(1).numpy())
    assert set(changed.tolist()) <= set(touched(steps[1:]).tolist())
    assert manifest(tmp_path / "delta")["touched"]["big.weight"]["rows"] == touched(steps[1:]).size


def test_an_engine_that_did_not_save_the_base_writes_the_table_whole(tmp_path) -> None:
    """Only an engine that saved or loaded the base knows what changed since: another one
    (the same training, never saved) writes the table whole, and the delta still loads."""
    steps = batches(4, seed=2)
    saver, other, memory = engine(tmp_path / "a"), engine(tmp_path / "b"), engine()
    for e in (saver, other, memory):
        train(e, steps[:2])
    ec.checkpoint.save(saver, tmp_path / "full")
    for e in (other, memory):
        train(e, steps[2:])
    ec.checkpoint.save(other, tmp_path / "delta", base=tmp_path / "full")
    m = manifest(tmp_path / "delta")
    assert "big.weight" in m["tensors"] and not m.get("touched")
    restored = engine()
    ec.checkpoint.load(restored, tmp_path / "delta")
    assert_same_tables(memory, restored)


def test_a_delta_on_a_loaded_checkpoint_or_an_older_base(tmp_path) -> None:
    """After a load, deltas are relative to the checkpoint loaded; a delta on an older base
    than the last save is written whole; both load exactly."""
    steps = batches(6, seed=4)
    first, memory = engine(tmp_path / "a"), engine()
    for e in (first, memory):
        train(e, steps[:2])
    ec.checkpoint.save(first, tmp_path / "full")
    resumed = engine(tmp_path / "b", rows=2)
    ec.checkpoint.load(resumed, tmp_path / "full")
    for e in (resumed, memory):
        train(e, steps[2:4])
    ec.checkpoint.save(resumed, tmp_path / "d1", base=tmp_path / "full")
    assert manifest(tmp_path / "d1")["touched"]["big.weight"]["rows"] == touched(steps[2:4]).size
    for e in (resumed, memory):
        train(e, steps[4:])
    ec.checkpoint.save(resumed, tmp_path / "d2", base=tmp_path / "full")  # not the last save
    assert "big.weight" in manifest(tmp_path / "d2")["tensors"]
    restored = engine()
    ec.checkpoint.load(restored, tmp_path / "d2")
    assert_same_tables(memory, restored)


def test_a_failed_save_keeps_the_rows_touched(tmp_path) -> None:
    """A save that fails (its path exists) forgets nothing: the next delta on the same base
    still holds every row touched since it."""
    steps = batches(3, seed=5)
    disk, memory = engine(tmp_path / "d", rows=2), engine()
    for e in (disk, memory):
        train(e, steps[:1])
    ec.checkpoint.save(disk, tmp_path / "full")
    for e in (disk, memory):
        train(e, steps[1:2])
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "x").write_text("mine")
    with pytest.raises(FileExistsError):
        ec.checkpoint.save(disk, tmp_path / "taken", base=tmp_path / "full")
    for e in (disk, memory):
        train(e, steps[2:])
    ec.checkpoint.save(disk, tmp_path / "delta", base=tmp_path / "full")
    m = manifest(tmp_path / "delta")
    assert m["touched"]["big.weight"]["rows"] == touched(steps[1:]).size
    restored = engine()
    ec.checkpoint.load(restored, tmp_path / "delta")
    assert_same_tables(memory, restored)


def test_malformed_touched_rows_are_refused_and_nothing_loads(tmp_path) -> None:
    disk = engine(tmp_path / "d")
    steps = batches(2, seed=6)
    train(disk, steps[:1])
    ec.checkpoint.save(disk, tmp_path / "full")
    train(disk, steps[1:])
    ec.checkpoint.save(disk, tmp_path / "delta", base=tmp_path / "full")
    path = tmp_path / "delta" / MANIFEST
    m = json.loads(path.read_text())
    m["touched"]["big.weight"]["rows"] += 1
    path.write_text(json.dumps(m))
    with pytest.raises(CheckpointError, match=r"touched rows of 'big\.weight' are malformed"):
        ec.checkpoint.verify(tmp_path / "delta")
    fresh = engine()
    before = {n: w.clone() for n, w in fresh.embedding_tables.items()}
    with pytest.raises(CheckpointError, match=r"big\.weight"):
        ec.checkpoint.load(fresh, tmp_path / "delta")
    for name, weight in before.items():
        assert torch.equal(fresh.embedding_tables[name], weight)


@pytest.mark.parametrize("lazy", [False, True])
def test_patch_chunks_writes_the_rows_inside_each_box(lazy) -> None:
    """Boxes at any row and column offset take exactly their rows and columns of a patch
    (NumPy reference: the same rows assigned into the full array)."""
    rng = np.random.default_rng(0)
    full = rng.standard_normal((20, 8)).astype(np.float32)
    ids = np.array([0, 3, 9, 10, 19])
    values = rng.standard_normal((5, 8)).astype(np.float32)
    want = full.copy()
    want[ids] = values
    offsets = [(0, 0), (0, 4), (10, 0), (10, 4)]
    written = {}
    chunks = []
    for r, c in offsets:
        if lazy:
            box = LazyBox((10, 4), torch.float32, write=lambda v, o=(r, c): written.update({o: v}))
        else:
            box = torch.from_numpy(full[r : r + 10, c : c + 4].copy())
        chunks.append(((r, c), box))
    later = patch_chunks(chunks, (ids, values))
    for (r, c), box in chunks:
        if lazy:
            box.tensor().copy_(torch.from_numpy(full[r : r + 10, c : c + 4]))
            box.filled(40)
    for patch in later:
        patch()
    for (r, c), box in chunks:
        got = written[(r, c)] if lazy else box
        np.testing.assert_array_equal(got.numpy(), want[r : r + 10, c : c + 4])
