"""A row-storage kind written outside embcore (``tests/row_seam_kind.py``) shards on 2 gloo
ranks like the built-in dense rows: table-wise and row-wise pieces of it train exactly as one
process does on the concatenated batches, and a checkpoint moves between 2 ranks and 1."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import embcore as ec
from embcore.sharding import ShardingPlan, TableShard

pytestmark = pytest.mark.multiprocess


def engine(world: int | None, reversed_tables: tuple[str, ...]) -> ec.EmbeddingEngine:
    import row_seam_kind as kind

    before = kind.use(reversed_tables)
    try:
        a = ec.TableConfig(vocabulary_size=7, dim=3, name="a", combiner="sum")
        b = ec.TableConfig(vocabulary_size=5, dim=3, name="b")
        features = {"x": ec.FeatureConfig(table=a), "z": ec.FeatureConfig(table=b)}
        plan = None
        if world is not None:
            tables = {"a": TableShard.row_wise([0, 1], "div"), "b": TableShard.table_wise(1)}
            plan = ShardingPlan(world_size=world, tables=tables)
        return ec.EmbeddingEngine(features, optimizer=ec.Adagrad(learning_rate=0.2), plan=plan)
    finally:
        kind.restore(before)


def batch(step: int, rank: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(100 * step + rank)
    return {
        "x": torch.randint(0, 7, (4,), generator=g),
        "z": torch.randint(0, 5, (4,), generator=g),
    }


def train(e: ec.EmbeddingEngine, ranks: list[int], steps: range) -> None:
    for step in steps:
        parts = [batch(step, r) for r in ranks]
        inputs = {f: torch.cat([p[f] for p in parts]) for f in ("x", "z")}
        sum((v * v).sum() for v in e(inputs).values()).backward()


def worker(rank: int, world: int, tmp: str) -> dict[str, Any]:
    import row_seam_kind as kind

    e = engine(world, ("a", "b"))
    train(e, [rank], range(3))
    ec.checkpoint.save(e, f"{tmp}/two")
    resumed = engine(world, ("a", "b"))
    ec.checkpoint.load(resumed, f"{tmp}/one")
    return {
        "kinds": [type(s.rows).__name__ for s in e.store._sharded if s.rows is not None],
        "state": {k: v.clone() for k, v in e.state_dict().items()},
        "resumed": {k: v.clone() for k, v in resumed.state_dict().items()},
        "calls": dict(kind.ReversedRows.calls),
    }


def test_a_registered_kind_shards_on_two_ranks_like_one_process(tmp_path):
    import sharding_harness as h

    one = engine(None, ())
    train(one, [0, 1], range(3))
    ec.checkpoint.save(one, tmp_path / "one")
    want = one.state_dict()
    ranks = h.launch("test_row_storage_seam_ranks:worker", 2, str(tmp_path))
    assert ranks[0]["kinds"] == ["ReversedRows"]  # a's first half; b lives on rank 1
    assert ranks[1]["kinds"] == ["ReversedRows", "ReversedRows"]
    assert ranks[1]["calls"]["map"] >= 3 and ranks[1]["calls"]["for_update"] >= 6
    for r in ranks:
        for key, value in want.items():
            assert torch.equal(r["state"][key], value), key
            assert torch.equal(r["resumed"][key], value), key
    back = engine(None, ("a", "b"))
    ec.checkpoint.load(back, tmp_path / "two")
    for key, value in back.state_dict().items():
        assert torch.equal(value, want[key]), key
