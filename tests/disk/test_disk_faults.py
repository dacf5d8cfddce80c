"""A disk table's faults: one clear error naming the table, the directory and what to do;
the engine's tables unchanged (or the error says to restore from a checkpoint); files
readable by their owner only."""

from __future__ import annotations

import errno
import gc
import os
import stat

import numpy as np
import pytest
import torch
from disk_cases import assert_same_tables, cache_bytes

import embcore as ec
import embcore.disk.table as disk_rows
from embcore.disk._file import DiskTableError

OPT = ec.Adagrad(learning_rate=0.2)


def engine(directory, storage: bool = True, rows: int = 2, name: str = "t") -> ec.EmbeddingEngine:
    disk = ec.DiskStorage(directory, cache_bytes(rows, 4, OPT)) if storage else None
    table = ec.TableConfig(50, 4, name=name, storage=disk)
    return ec.EmbeddingEngine(ec.FeatureConfig(table), OPT)


def train(e: ec.EmbeddingEngine, ids: list[int]) -> None:
    e(torch.tensor(ids)).pow(2).sum().backward()


def test_files_are_private(tmp_path) -> None:
    e = engine(tmp_path / "d")
    train(e, [1, 2, 3])
    assert stat.S_IMODE(os.stat(tmp_path / "d").st_mode) == 0o700
    for name in ("t.rows", "t.lock"):
        assert stat.S_IMODE(os.stat(tmp_path / "d" / name).st_mode) == 0o600


def test_a_second_engine_on_the_directory_is_refused(tmp_path) -> None:
    first = engine(tmp_path)
    with pytest.raises(DiskTableError, match=r"table 't': another engine is using its disk") as e:
        engine(tmp_path)
    assert str(tmp_path) in str(e.value)
    train(first, [1])  # the first engine is untouched
    other = engine(tmp_path, name="u")  # another table in the same directory is fine
    del first
    gc.collect()
    engine(tmp_path)  # the lock went with the first engine
    assert other.table_info("u")["misses"] == 0


def test_read_only_file_system(tmp_path, monkeypatch) -> None:
    real = os.open

    def read_only(path, flags, *args):  # what a read-only mount answers to a write open
        if str(path).startswith(str(tmp_path)) and flags & (os.O_RDWR | os.O_WRONLY):
            raise OSError(errno.EROFS, "Read-only file system")
        return real(path, flags, *args)

    monkeypatch.setattr(os, "open", read_only)
    with pytest.raises(DiskTableError, match=r"table 't'.*read-only file system; give") as e:
        engine(tmp_path)
    assert str(tmp_path) in str(e.value)


@pytest.mark.parametrize("where", ["eviction", "new block"])
def test_full_disk_leaves_the_tables_unchanged(tmp_path, monkeypatch, where: str) -> None:
    """A write that fails (no space) raises before the step changes anything: the engine
    goes on from the same state once there is room."""
    monkeypatch.setattr(disk_rows, "_MAKE_ROWS", 16)  # blocks of 16 rows: 49 is in a new one
    memory, disk = engine(tmp_path / "m", storage=False), engine(tmp_path / "d")
    for e in (memory, disk):
        train(e, [1, 2])  # cached and changed: the next new rows evict them
    real = os.pwritev

    def full(fd, buffers, offset):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwritev", full)
    before = disk.table_info("t")
    with pytest.raises(DiskTableError, match=r"table 't'.*the disk is full; free space") as e:
        train(disk, [4, 5, 6] if where == "eviction" else [49])
    assert str(tmp_path / "d") in str(e.value)
    after = disk.table_info("t")
    assert disk.step == 1 and after["rows_cached"] == before["rows_cached"] == 2
    monkeypatch.setattr(os, "pwritev", real)
    for e in (memory, disk):
        train(e, [4, 5, 6, 1])
    assert_same_tables(memory, disk)


def test_truncated_file(tmp_path) -> None:
    e = engine(tmp_path)
    train(e, [1, 2, 3, 4, 5])  # rows 1-3 are written back on disk
    os.truncate(tmp_path / "t.rows", 512)
    with pytest.raises(DiskTableError, match=r"table 't': its working file .*t.rows is 512 "):
        train(e, [1, 2])
    with pytest.raises(DiskTableError, match="restore the engine from a checkpoint"):
        train(e, [3])


def test_damaged_record(tmp_path) -> None:
    e = engine(tmp_path)
    train(e, [1, 2, 3, 4, 5])
    size = e.table_info("t")["bytes_read"] // e.table_info("t")["rows_read"]
    with open(tmp_path / "t.rows", "r+b") as f:  # record 2's header
        f.seek(2 * size + 8)
        f.write(np.int64(7).tobytes())
    with pytest.raises(DiskTableError, match=r"records of ids \[2\] are damaged"):
        train(e, [2])


def test_bad_configs(tmp_path) -> None:
    with pytest.raises(ValueError, match=r"DiskStorage\(directory=.*cache_bytes must be an int"):
        ec.DiskStorage(tmp_path, cache_bytes=0)
    with pytest.raises(ValueError, match="DiskStorage: directory must be a non-empty path"):
        ec.DiskStorage("", cache_bytes=10)
    with pytest.raises(ValueError, match="io_threads must be an int >= 1, got 0"):
        ec.DiskStorage(tmp_path, cache_bytes=10, io_threads=0)
    with pytest.raises(ValueError, match=r"storage must be an embcore.DiskStorage or None"):
        ec.TableConfig(4, 4, name="d", storage="disk")


def test_full_disk_after_an_oversized_step_keeps_the_rows(tmp_path, monkeypatch) -> None:
    """A step with more rows than the cache holds empties the cache at its end; with the disk
    full, the cache keeps them (over budget) and the step completes; nothing is lost."""
    memory, disk = engine(tmp_path / "m", storage=False), engine(tmp_path / "d")
    disk(torch.tensor([0]))  # writes the table's block; row 0 stays cached, unchanged
    real = os.pwritev
    monkeypatch.setattr(os, "pwritev", lambda *a: (_ for _ in ()).throw(OSError(errno.ENOSPC, "")))
    for e in (memory, disk):
        train(e, [1, 2, 3])
    info = disk.table_info("t")
    assert disk.step == 1 and info["deferred_write_backs"] == 1 and info["rows_cached"] == 3
    with pytest.raises(DiskTableError, match="the disk is full"):
        train(disk, [4])  # needs room: the write-back is tried again, and fails again
    monkeypatch.setattr(os, "pwritev", real)
    for e in (memory, disk):
        train(e, [4, 1])
    assert disk.table_info("t")["rows_cached"] <= 2
    assert_same_tables(memory, disk)


def test_copying_a_disk_engine_is_refused(tmp_path) -> None:
    import copy
    import pickle

    e = engine(tmp_path)
    train(e, [1, 2])
    for copier in (copy.deepcopy, pickle.dumps):
        with pytest.raises(TypeError, match=r"table 't': a table in DiskStorage cannot be copied"):
            copier(e)
    train(e, [3])  # the engine is untouched
