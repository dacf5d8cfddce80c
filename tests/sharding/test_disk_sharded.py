"""Tables in DiskStorage shard on 2 gloo ranks: each rank keeps its piece in its own
directory, trains bit for bit as the in-memory sharded engine (caches of 1 row and of the
whole piece), and checkpoints move between 2 ranks and 1 (N -> M), a delta holding touched
rows included."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import embcore as ec
from embcore.cli.stats import load_directory
from embcore.sharding import ShardingPlan, TableShard
from embcore.storage import cached_row_bytes

pytestmark = pytest.mark.multiprocess

VOCAB = {"a": 11, "b": 6}
DIM = 4
#: optimizer -> (itself, its slot floats per row): element-wise and row-wise slots
OPTIMIZERS = {
    "adagrad": (lambda: ec.Adagrad(learning_rate=0.3), DIM),
    "rowwise_adagrad": (lambda: ec.RowwiseAdagrad(learning_rate=0.3), 1),
}


def engine(
    world: int | None,
    directory: str | None = None,
    cache_rows: int = 1,
    planned: bool = False,
    opt: str = "adagrad",
    **options: Any,
) -> ec.EmbeddingEngine:
    """Table ``a`` row-wise (div) over both ranks, ``b`` table-wise on rank 1 (``planned``:
    where the planner puts them); in memory (``directory=None``) or in DiskStorage caching
    ``cache_rows`` rows (``planned``: the engine's storage for both)."""
    tables, default = {}, None
    for name, vocab in VOCAB.items():
        storage = None
        if directory is not None:
            slots = OPTIMIZERS[opt][1]
            storage = ec.DiskStorage(directory, cache_rows * cached_row_bytes(DIM, slots))
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
    optimizer = OPTIMIZERS[opt][0]()
    return ec.EmbeddingEngine(features, optimizer, plan=plan, storage=default, **options)


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


def worker(rank: int, world: int, tmp: str, opt: str) -> dict[str, Any]:
    memory = engine(world, opt=opt)
    train(memory, [rank], range(4))
    out: dict[str, Any] = {"memory": state(memory)}
    for rows in (1, 11):
        stats = {"profile_data_directory": f"{tmp}/stats"} if rows == 1 else {}
        disk = engine(world, f"{tmp}/disk{rows}", rows, opt=opt, **stats)
        train(disk, [rank], range(4))
        out[f"disk{rows}"] = state(disk)
        out[f"files{rows}"] = sorted(
            str(p.relative_to(tmp)) for p in Path(tmp, f"disk{rows}").rglob("*.rows")
        )
        if rows == 1:
            ec.checkpoint.save(disk, f"{tmp}/two")
            out["info"] = disk.table_info("a")
            disk.write_statistics()
        disk.close()
    auto = engine(world, f"{tmp}/auto", 2 * 17, planned=True, opt=opt)  # the engine-wide storage
    train(auto, [rank], range(4))
    out["auto"] = state(auto)
    out["auto_plan"] = {n: s.placement for n, s in auto.plan.tables.items()}
    auto.close()
    resumed = engine(world, f"{tmp}/rank{{rank}}-resumed", 2, opt=opt)
    ec.checkpoint.load(resumed, f"{tmp}/one")
    out["resumed"] = state(resumed)
    out["resumed_files"] = sorted(str(p.relative_to(tmp)) for p in Path(tmp).glob("rank*/*.rows"))
    resumed.close()
    # a delta holding touched rows, written by one process, into both sharded engines
    for name, directory in (("delta_memory", None), ("delta_disk", f"{tmp}/delta-disk")):
        e = engine(world, directory, 2, opt=opt)
        ec.checkpoint.load(e, f"{tmp}/delta")
        out[name] = state(e)
        e.close()
    return out


@pytest.mark.parametrize("opt", list(OPTIMIZERS))
def test_disk_tables_shard_on_two_ranks_like_memory_and_move_between_2_and_1(tmp_path, opt):
    import sharding_harness as h

    one = engine(
        None, opt=opt
    )  # one process on the concatenated batches: the sharded engine's numbers
    train(one, [0, 1], range(4))
    want = state(one)
    ec.checkpoint.save(one, tmp_path / "one")
    saver = engine(None, str(tmp_path / "one-disk"), 3, opt=opt)  # touched rows in a delta
    train(saver, [0, 1], range(2))
    ec.checkpoint.save(saver, tmp_path / "base")
    train(saver, [0, 1], range(2, 4))
    ec.checkpoint.save(saver, tmp_path / "delta", base=tmp_path / "base")
    assert set(ec.checkpoint.read_manifest(tmp_path / "delta")["touched"]) >= {"a.weight"}
    ranks = h.launch("test_disk_sharded:worker", 2, str(tmp_path), opt)
    for r in ranks:
        for key, value in want.items():
            assert torch.equal(r["memory"][key], value), key
            for name in ("disk1", "disk11", "resumed", "auto", "delta_memory", "delta_disk"):
                assert torch.equal(r[name][key], value), (name, key)
    # each rank its own directory: a's two pieces, b on rank 1 only
    assert ranks[0]["files1"] == ["disk1/rank0/a.rows", "disk1/rank1/a.rows", "disk1/rank1/b.rows"]
    assert ranks[0]["resumed_files"] == ["rank0-resumed/a.rows", "rank1-resumed/a.rows",
                                         "rank1-resumed/b.rows"]  # fmt: skip
    assert set(ranks[0]["auto_plan"].values()) <= {"table_wise", "row_wise:div"}
    info = ranks[0]["info"]  # both pieces of a, summed
    assert info["misses"] > 0  # the row-wise lookups went through the 1-row caches
    assert info["cache_capacity"] == 2  # a row each
    # the statistics: both ranks' counters, over the engine's 4 steps (not 4 per rank)
    found = {s.table: s for _, s in load_directory(tmp_path / "stats")}
    counted = {k: info[k] for k in ("hits", "misses", "rows_read", "rows_written")}
    assert {k: found["a"].cache[k] for k in counted} == counted
    assert found["a"].cache["steps"] == 4 and found["b"].cache["steps"] == 4
    back = engine(None, str(tmp_path / "back"), 3, opt=opt)  # 2 ranks -> 1 process, on disk
    ec.checkpoint.load(back, tmp_path / "two")
    for key, value in state(back).items():
        assert torch.equal(value, want[key]), key
