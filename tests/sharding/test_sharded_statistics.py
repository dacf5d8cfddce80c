"""Lookup statistics of a sharded engine record each rank's load under the real plan.

Two and three gloo ranks train under plans that put every table under every scheme, profiling
every batch; rank 0 writes the sum of the ranks' statistics. The per-rank counts are checked
against a NumPy count of the same batches, with the docs/semantics.md §4.1 row maps written out
here.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import sharding_harness as h
import torch

import embcore as ec
from embcore.sharding import TableShard
from embcore.stats import TableStats

pytestmark = pytest.mark.multiprocess

FEATURES = {"a": ("a1", "a2"), "b": ("b",), "c": ("c_pool", "c_seq")}
VOCAB = {name: shape[0] for name, shape in h.SHAPES.items()}
SEQUENCE = {"c_seq": 3}  # max_sequence_length: later positions are dropped (docs/semantics.md §2.4)


def ids_of(feature: str, value: object) -> np.ndarray:
    """The ids a feature's input looks up, as a NumPy array."""
    if isinstance(value, ec.RaggedIds):
        ids, splits = value.values.numpy(), value.row_splits.numpy()
        if feature in SEQUENCE:
            positions = np.arange(ids.size) - np.repeat(splits[:-1], np.diff(splits))
            ids = ids[positions < SEQUENCE[feature]]
        return ids
    assert isinstance(value, torch.Tensor)
    return value.reshape(-1).numpy()


def shard_numpy(ids: np.ndarray, vocab: int, shards: int, strategy: str) -> np.ndarray:
    """docs/semantics.md §4.1: ``mod`` is ``i % P``; ``div`` is the contiguous split whose first
    ``N % P`` shards hold one row more (shard p starts at ``p * q + min(p, x)``)."""
    if strategy == "mod":
        return ids % shards
    q, x = divmod(vocab, shards)
    starts = np.array([p * q + min(p, x) for p in range(shards)])
    return np.searchsorted(starts, ids, side="right") - 1


def expected_load(shard: TableShard, vocab: int, world: int, ids_by_rank: list) -> list[int]:
    load = np.zeros(world, dtype=np.int64)
    for rank, ids in enumerate(ids_by_rank):
        if shard.scheme == "table_wise":
            load[shard.ranks[0]] += ids.size
        elif shard.scheme == "data_parallel":
            load[rank] += ids.size
        elif shard.scheme == "column_wise":
            load[list(shard.ranks)] += ids.size
        else:
            owners = np.array(shard.ranks)[
                shard_numpy(ids, vocab, len(shard.ranks), shard.partition_strategy)
            ]
            np.add.at(load, owners, 1)
    return load.tolist()


@pytest.mark.parametrize("world", [2, 3])
def test_shard_load_follows_the_plan(world: int, tmp_path: Path):
    paths = h.launch("worker_statistics", world, str(tmp_path))
    case = h.Case("row_wise:div", "adagrad", world)
    batches = [[h.local_batch(case, s, r)[0] for s in range(h.STEPS)] for r in range(world)]
    for name, plan in h.statistics_plans(world).items():
        assert all(p[name] == paths[0][name] for p in paths), "ranks disagree on the paths"
        files = sorted(Path(p) for p in paths[0][name])
        assert files == sorted((tmp_path / name).glob("*.json"))
        found = {
            s.table: s for s in (TableStats.from_json(json.loads(f.read_text())) for f in files)
        }
        assert sorted(found) == ["a", "b", "c"]
        for table, features in FEATURES.items():
            stats, shard = found[table], plan[table]
            ids_by_rank = [
                np.concatenate([ids_of(f, b[f]) for b in batches[r] for f in features])
                for r in range(world)
            ]
            want = expected_load(shard, VOCAB[table], world, ids_by_rank)
            assert stats.shard_load == want, (name, table, shard.describe())
            total = sum(i.size for i in ids_by_rank)
            assert stats.ids == total and stats.batches == h.STEPS * world
            assert stats.examples == h.STEPS * sum(3 + r for r in range(world))
            assert stats.key["world_size"] == world
            assert stats.key["sharding_strategy"] == shard.describe()
            if shard.scheme == "column_wise":  # every owner serves every id
                assert sum(stats.shard_load) == total * len(shard.ranks)
            else:
                assert sum(stats.shard_load) == total
