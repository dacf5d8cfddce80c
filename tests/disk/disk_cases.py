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
