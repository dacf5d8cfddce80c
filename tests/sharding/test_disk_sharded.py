"""Tables in DiskStorage shard on 2 gloo ranks: each rank keeps its piece in its own
directory, trains bit for bit as the in-memory sharded engine (caches of 1 row and of the
whole piece), and checkpoints move between 2 ranks and 1 (N -> M)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import embcore as ec
from embcore.sharding import ShardingPlan, TableShard
from embcore.storage import cached_row_bytes

pytestmark = pytest.mark.multiprocess

VOCAB = {"a": 11, "b": 6}
DIM = 4


def engine(
    world: int | None, directory: str | None = None, cache_rows: int = 1, planned: bool = False
) -> ec.EmbeddingEngine:
    """Table ``a`` row-wise (div) over both ranks, ``b`` table-wise on rank 1 (``planned``:
    where the planner puts them); in memory (``directory=None``) or in DiskStorage caching
    ``cache_rows`` rows (``planned``: the engine's storage for both)."""
    tables, default = {}, None
    for name, vocab in VOCAB.items():
        storage = None
        if directory is not None:  # Adagrad: one slot float per element
            storage = ec.DiskStorage(directory, cache_rows * cached_row_bytes(DIM, DIM))
        if planned:
            storage, default = None, storage
        combiner = "sum" if name == "a" else "mean"
        tables[name] = ec.TableConfig(vocab, DIM, name=name, combiner=combiner, storage=storage)
    features = {
        "x": ec.FeatureConfig(table=tables["a"]),
        "y": ec.FeatureConfig(table=tables["a"]),  # two features share a
        "z": ec.FeatureConfig(table=tables["b"]),
    }
    plan = None
    if world is not None and not planned:
        placed = {"a": TableShard.row_wise([0, 1], "div"), "b": TableShard.table_wise(1)}
        plan = ShardingPlan(world_size=world, tables=placed)
    opt = ec.Adagrad(learning_rate=0.3)
    return ec.EmbeddingEngine(features, optimizer=opt, plan=plan, storage=default)


def batch(step: int, rank: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return {f: torch.randint(0, VOCAB["b" if f == "z" else "a"], (5,), generator=g) for f in "xyz"}


def train(e: ec.EmbeddingEngine, ranks: list[int], steps: range) -> None:
    for step in steps:
        parts = [batch(step, r) for r in ranks]
        inputs = {f: torch.cat([p[f] for p in parts]) for f in "xyz"}
        sum((v * v * (1 + i)).sum() for i, v in enumerate(e(inputs).values())).backward()


def state(e: ec.EmbeddingEngine) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in e.state_dict().items()}


def worker(rank: int, world: int, tmp: str) -> dict[str, Any]:
    memory = engine(world)
    train(memory, [rank], range(4))
    out: dict[str, Any] = {"memory": state(memory)}
    for rows in (1, 11):
        disk = engine(world, f"{tmp}/disk{rows}", rows)
        train(disk, [rank], range(4))
        out[f"disk{rows}"] = state(disk)
        out[f"files{rows}"] = sorted(
            str(p.relative_to(tmp)) for p in Path(tmp, f"disk{rows}").rglob("*.rows")
        )
        if rows == 1:
            ec.checkpoint.save(disk, f"{tmp}/two")
            info = disk.table_info("a")
            out["misses"] = info["misses"]
        disk.close()
    auto = engine(world, f"{tmp}/auto", 2 * 17, planned=True)  # the engine-wide storage
    train(auto, [rank], range(4))
    out["auto"] = state(auto)
    out["auto_plan"] = {n: s.placement for n, s in auto.plan.tables.items()}
    auto.close()
    resumed = engine(world, f"{tmp}/rank{{rank}}-resumed", 2)
    ec.checkpoint.load(resumed, f"{tmp}/one")
    out["resumed"] = state(resumed)
    out["resumed_files"] = sorted(str(p.relative_to(tmp)) for p in Path(tmp).glob("rank*/*.rows"))
    resumed.close()
    return out


def test_disk_tables_shard_on_two_ranks_like_memory_and_move_between_2_and_1(tmp_path):
    import sharding_harness as h

    one = engine(None)  # one process on the concatenated batches: the sharded engine's numbers
    train(one, [0, 1], range(4))
    want = state(one)
    ec.checkpoint.save(one, tmp_path / "one")
    ranks = h.launch("test_disk_sharded:worker", 2, str(tmp_path))
    for r in ranks:
        for key, value in want.items():
            assert torch.equal(r["memory"][key], value), key
            for name in ("disk1", "disk11", "resumed", "auto"):
                assert torch.equal(r[name][key], value), (name, key)
    # each rank its own directory: a's two pieces, b on rank 1 only
    assert ranks[0]["files1"] == ["disk1/rank0/a.rows", "disk1/rank1/a.rows", "disk1/rank1/b.rows"]
    assert ranks[0]["resumed_files"] == ["rank0-resumed/a.rows", "rank1-resumed/a.rows",
                                         "rank1-resumed/b.rows"]  # fmt: skip
    assert set(ranks[0]["auto_plan"].values()) <= {"table_wise", "row_wise:div"}
    assert ranks[0]["misses"] > 0  # the row-wise lookups went through the 1-row caches
    back = engine(None, str(tmp_path / "back"), 3)  # 2 ranks -> 1 process, on disk
    ec.checkpoint.load(back, tmp_path / "two")
    for key, value in state(back).items():
        assert torch.equal(value, want[key]), key
