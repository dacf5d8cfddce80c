"""float16 / bfloat16 tables (Triton backend, interpreted on the CPU) through checkpoints and
the sharded engine: saved and loaded in their storage dtype, sharded as the plain engine."""

from __future__ import annotations

import os

import pytest
import torch

if torch.cuda.is_available():
    pytest.skip("CUDA present: the compiled kernels are tested elsewhere", allow_module_level=True)
os.environ["TRITON_INTERPRET"] = "1"  # before triton's first import (conftest sets it too)
pytest.importorskip("triton")

import embcore as ec
from embcore.sharding import ShardingPlan, TableShard

HALF = [torch.float16, torch.bfloat16]


def _config() -> dict:
    a = ec.TableConfig(vocabulary_size=12, dim=4, name="a", combiner="mean")
    b = ec.TableConfig(vocabulary_size=9, dim=6, name="b")
    return {"x": ec.FeatureConfig(table=a), "y": ec.FeatureConfig(table=a),
            "z": ec.FeatureConfig(table=b)}  # fmt: skip


def _train(engine: ec.EmbeddingEngine, steps: int, seed: int = 0) -> None:
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        batch = {
            "x": ec.RaggedIds(
                torch.randint(0, 12, (6,), generator=gen), torch.tensor([0, 2, 3, 3, 6])
            ),
            "y": torch.randint(0, 12, (4, 1), generator=gen),
            "z": torch.randint(0, 9, (4, 1), generator=gen),
        }
        out = engine(batch)
        sum((v * (i + 1)).sum() for i, v in enumerate(out.values())).backward()


def _engine(dtype: torch.dtype, seed: int = 1, **kwargs) -> ec.EmbeddingEngine:
    opt = ec.Adagrad(learning_rate=0.3)
    return ec.EmbeddingEngine(
        _config(), opt, backend="triton", seed=seed, storage_dtype=dtype, **kwargs
    )


@pytest.mark.parametrize("dtype", HALF)
def test_checkpoint_round_trip_keeps_the_storage_dtype(tmp_path, dtype: torch.dtype) -> None:
    engine = _engine(dtype)
    _train(engine, 2)
    ec.checkpoint.save(engine, tmp_path / "ckpt")
    restored = _engine(dtype, seed=7)
    ec.checkpoint.load(restored, tmp_path / "ckpt")
    for name, table in engine.embedding_tables.items():
        assert restored.embedding_tables[name].dtype == dtype
        assert torch.equal(restored.embedding_tables[name], table), name
        for slot, value in engine.slot_variables[name].items():
            assert torch.equal(restored.slot_variables[name][slot], value), (name, slot)
    _train(engine, 1, seed=3)  # and training goes on identically
    _train(restored, 1, seed=3)
    for name, table in engine.embedding_tables.items():
        assert torch.equal(restored.embedding_tables[name], table), name


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize(
    "shard",
    [
        TableShard.table_wise(0),
        TableShard.row_wise([0], "div"),
        TableShard.column_wise([0], 4),
        TableShard.data_parallel(1),
    ],
    ids=["table_wise", "row_wise", "column_wise", "data_parallel"],
)
def test_sharded_engine_stores_half_tables_like_the_plain_engine(
    dtype: torch.dtype, shard: TableShard
) -> None:
    """A one-rank plan (every scheme's protocol, messages to itself) equals the plain engine
    bit for bit, tables in the storage dtype."""
    b_shard = TableShard.column_wise([0], 6) if shard.scheme == "column_wise" else shard
    plan = ShardingPlan(world_size=1, tables={"a": shard, "b": b_shard})
    sharded, plain = _engine(dtype, plan=plan), _engine(dtype)
    _train(sharded, 2)
    _train(plain, 2)
    for name, table in plain.embedding_tables.items():
        assert sharded.embedding_tables[name].dtype == dtype
        assert torch.equal(sharded.embedding_tables[name], table), name


def test_sharded_checkpoint_of_half_tables_loads_into_the_plain_engine(tmp_path) -> None:
    plan = ShardingPlan(
        world_size=1, tables={"a": TableShard.row_wise([0], "mod"), "b": TableShard.table_wise(0)}
    )
    sharded = _engine(torch.bfloat16, plan=plan)
    _train(sharded, 2)
    ec.checkpoint.save(sharded, tmp_path / "ckpt")
    plain = _engine(torch.bfloat16, seed=5)
    ec.checkpoint.load(plain, tmp_path / "ckpt")
    for name, table in sharded.embedding_tables.items():
        assert torch.equal(plain.embedding_tables[name], table), name
