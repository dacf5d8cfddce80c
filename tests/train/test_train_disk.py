"""The main job with its tables on disk (``model.storage = "disk"``): the same AUC, loss and
tables as in memory, with a cache far smaller than the tables, and a resume from its last
checkpoint that ends where an uninterrupted run ends."""

from __future__ import annotations

import gc

import torch

from embcore.train.config import Config
from embcore.train.loop import train

DISK = ['model.storage="disk"', "model.cache_bytes=200000"]


def _quiet(_: str) -> None:
    pass


def _tables(result) -> dict[str, torch.Tensor]:
    engine = result.model.engine
    return {**engine.embedding_tables, **{f"{k}.s": v for k, v in _slots(engine).items()}}


def _slots(engine) -> dict[str, torch.Tensor]:
    return {t: next(iter(s.values())) for t, s in engine.slot_variables.items() if s}


def test_disk_tables_train_as_in_memory(tiny: Config, tmp_path) -> None:
    memory = train(tiny.with_overrides([f"train.out_dir={tmp_path / 'm'}"]), echo=_quiet)
    disk = train(tiny.with_overrides([*DISK, f"train.out_dir={tmp_path / 'd'}"]), echo=_quiet)
    assert disk.final == memory.final
    engine = disk.model.engine
    assert all(t.storage is not None for t in engine.tables)
    assert (tmp_path / "d" / "rows").is_dir()
    info = engine.table_info(engine.table_names[0])
    assert info["misses"] > 0 and info["cache_capacity"] < engine.tables[0].vocabulary_size
    want, got = _tables(memory), _tables(disk)
    assert sorted(want) == sorted(got)
    for name, value in want.items():
        assert torch.equal(got[name], value), name


def test_a_resumed_disk_run_ends_as_an_uninterrupted_one(tiny: Config, tmp_path) -> None:
    whole = train(tiny.with_overrides([*DISK, f"train.out_dir={tmp_path / 'a'}"]), echo=_quiet)
    out = f"train.out_dir={tmp_path / 'b'}"
    half = tiny.train.steps // 2
    first = train(tiny.with_overrides([*DISK, out]), stop_at=half, echo=_quiet)
    assert first.steps == half
    del first
    gc.collect()  # its engine's lock on out_dir/rows goes with it (a new process: at exit)
    resumed = train(tiny.with_overrides([*DISK, out]), resume=True, echo=_quiet)
    assert resumed.resumed_from > 0 and resumed.final == whole.final


def test_dynamic_tables_on_disk_train_as_in_memory(tiny: Config, tmp_path) -> None:
    dynamic = ['model.tables="dynamic"']
    memory = train(tiny.with_overrides([*dynamic, f"train.out_dir={tmp_path / 'm'}"]), echo=_quiet)
    out = f"train.out_dir={tmp_path / 'd'}"
    disk = train(tiny.with_overrides([*dynamic, *DISK, out]), echo=_quiet)
    assert disk.final == memory.final
    engine = disk.model.engine
    assert all(t.storage is not None and t.dynamic for t in engine.tables)
    info = engine.table_info(engine.table_names[0])
    assert info["misses"] > 0 and info["rows"] > info["cache_capacity"]
    want, got = _tables(memory), _tables(disk)
    assert sorted(want) == sorted(got)
    for name, value in want.items():
        assert torch.equal(got[name], value), name
