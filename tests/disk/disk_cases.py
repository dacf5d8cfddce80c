"""Builders shared by the disk-table tests: engines over the shared scenario with both tables
in memory or in DiskStorage, and a cache budget counted in rows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from engine_cases import OptCase, scenario_tables

import embcore as ec
from embcore.storage import cached_row_bytes


def cache_bytes(rows: int, dim: int, optimizer: ec.Optimizer) -> int:
    """The ``cache_bytes`` that holds exactly ``rows`` rows of a table of width ``dim``."""
    slots = sum(1 if s.rowwise else dim for s in optimizer.slot_specs())
    return rows * cached_row_bytes(dim, slots)


def disk_table(table: ec.TableConfig, directory: Path, rows: int, opt: ec.Optimizer, **kw: Any):
    """``table`` in DiskStorage under ``directory`` with a cache of ``rows`` rows."""
    storage = ec.DiskStorage(directory, cache_bytes(rows, table.dim, opt), **kw)
    return ec.TableConfig(
        table.vocabulary_size,
        table.dim,
        initializer=table.initializer,
        combiner=table.combiner,
        name=table.name,
        storage=storage,
    )


def scenario_pair(
    case: OptCase, directory: Path, rows: int, seed: int = 0, **options: Any
) -> tuple[ec.EmbeddingEngine, ec.EmbeddingEngine]:
    """The shared scenario in memory and with both tables on disk (``rows`` cached each)."""
    from engine_cases import scenario_features

    ta, tb, _ = scenario_tables(np.random.default_rng(seed))
    opt = case.make()
    memory = ec.EmbeddingEngine(scenario_features(ta, tb), case.make(), **options)
    disk = ec.EmbeddingEngine(
        scenario_features(
            disk_table(ta, directory, rows, opt), disk_table(tb, directory, rows, opt)
        ),
        case.make(),
        **options,
    )
    return memory, disk


def assert_same_tables(memory: ec.EmbeddingEngine, disk: ec.EmbeddingEngine) -> None:
    """Every row and slot equal, bit for bit."""
    assert disk.step == memory.step
    for name, weight in memory.embedding_tables.items():
        assert torch.equal(disk.embedding_tables[name], weight), name
        for slot, value in memory.slot_variables[name].items():
            assert torch.equal(disk.slot_variables[name][slot], value), (name, slot)


def big_small_engine(
    vocab: int, dim: int, opt: ec.Optimizer, directory: Path | None = None, rows: int = 5
) -> ec.EmbeddingEngine:
    """Table ``big`` (``vocab`` x ``dim``; in DiskStorage caching ``rows`` rows unless
    ``directory`` is None) and table ``small`` (7 x 3) in memory beside it."""
    storage = None if directory is None else ec.DiskStorage(directory, cache_bytes(rows, dim, opt))
    big = ec.TableConfig(vocab, dim, name="big", storage=storage)
    small = ec.TableConfig(7, 3, name="small")
    features = {"b": ec.FeatureConfig(big), "s": ec.FeatureConfig(small)}
    return ec.EmbeddingEngine(features, opt, seed=3)


def big_small_batches(n: int, vocab: int, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """``n`` batches of 16 Zipf ids of ``big`` and 16 uniform ids of ``small``."""
    rng = np.random.default_rng(seed)
    return [
        {
            "b": torch.from_numpy(rng.zipf(1.2, 16) % vocab),
            "s": torch.from_numpy(rng.integers(0, 7, 16)),
        }
        for _ in range(n)
    ]


def train_big_small(e: ec.EmbeddingEngine, steps: list[dict[str, torch.Tensor]]) -> None:
    """One training step per batch, on a loss of both features."""
    for batch in steps:
        acts = e(batch)
        (acts["b"].pow(2).sum() + acts["s"].sum()).backward()
