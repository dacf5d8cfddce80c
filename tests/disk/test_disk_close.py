"""``EmbeddingEngine.close()`` and ``with``: a disk table's lock and files are released at
once (not at garbage collection), so a second engine opens the directory; a closed engine
refuses steps with one clear error."""

from __future__ import annotations

import gc
import os

import pytest
import torch

import embcore as ec
from embcore.disk import DiskTableError


def make(directory) -> ec.EmbeddingEngine:
    table = ec.TableConfig(20, 4, name="t", storage=ec.DiskStorage(directory, cache_bytes=200))
    return ec.EmbeddingEngine({"f": ec.FeatureConfig(table=table)}, ec.Adagrad(learning_rate=0.1))


def step(engine: ec.EmbeddingEngine) -> None:
    engine({"f": torch.tensor([1, 5, 7])})["f"].sum().backward()


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_close_releases_the_directory_and_refuses_steps(tmp_path):
    gc.disable()  # nothing may be released by the garbage collector in this test
    try:
        before = open_fds()
        first = make(tmp_path)
        step(first)
        with pytest.raises(DiskTableError, match="another engine"):
            make(tmp_path)  # the first engine holds the lock
        first.close()
        assert open_fds() == before  # the working file and the lock file are closed
        first.close()  # again: nothing happens
        for call in (lambda: step(first), lambda: first({"f": torch.tensor([1])})):
            with pytest.raises(RuntimeError, match=r"engine was closed.*load a checkpoint"):
                call()
        second = make(tmp_path)  # the directory is free
        step(second)
        second.close()
    finally:
        gc.enable()


def test_with_closes_the_engine_at_the_end_of_the_block(tmp_path):
    gc.disable()
    try:
        with make(tmp_path) as engine:
            step(engine)
            keep = engine  # still referenced after the block: only close() frees the lock
        with pytest.raises(RuntimeError, match="engine was closed"):
            keep.enqueue({"f": torch.tensor([2])})
            keep.dequeue()
        with make(tmp_path) as again:
            step(again)
    finally:
        gc.enable()


def test_closing_an_engine_in_memory_refuses_steps_too():
    table = ec.TableConfig(20, 4, name="t")
    engine = ec.EmbeddingEngine({"f": ec.FeatureConfig(table=table)}, ec.SGD(learning_rate=0.1))
    step(engine)
    engine.close()
    with pytest.raises(RuntimeError, match="engine was closed"):
        step(engine)


def test_close_releases_a_dynamic_disk_table(tmp_path):
    gc.disable()
    try:
        before = open_fds()
        storage = ec.DiskStorage(tmp_path, cache_bytes=200)
        table = ec.TableConfig(None, 4, name="t", storage=storage)
        features = {"f": ec.FeatureConfig(table=table)}
        first = ec.EmbeddingEngine(features, ec.Adagrad(learning_rate=0.1))
        first({"f": torch.tensor([2**40, -7, 3])})["f"].sum().backward()
        first.close()
        assert open_fds() == before
        with pytest.raises(RuntimeError, match=r"engine was closed.*load a checkpoint"):
            first({"f": torch.tensor([3])})
        second = ec.EmbeddingEngine(features, ec.Adagrad(learning_rate=0.1))
        second({"f": torch.tensor([5])})["f"].sum().backward()
        second.close()
    finally:
        gc.enable()
