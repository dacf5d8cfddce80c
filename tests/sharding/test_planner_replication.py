"""The planner's hot-table rule: with lookup statistics, small hot tables are replicated."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import embcore as ec
from embcore.cli.main import main
from embcore.inputs import FeatureBatch
from embcore.sharding import plan
from embcore.sharding.planner import REPLICATE_MAX_BYTES, replication
from embcore.stats import StatsCollector, StatsTable

ADAGRAD = ec.Adagrad(learning_rate=0.1)
WORLD, BATCH, DIM = 4, 4096, 64


def features(**vocab: int) -> dict[str, ec.FeatureConfig]:
    return {
        name: ec.FeatureConfig(table=ec.TableConfig(vocabulary_size=v, dim=DIM, name=name))
        for name, v in vocab.items()
    }


def measured(tmp_path, name: str, vocab: int, ids_per_example: float, seed: int):
    """Real statistics (``embcore.stats``) of Zipf one-hot batches in which a fraction
    ``ids_per_example`` of the examples look the table up."""
    rng = np.random.default_rng(seed)
    collector = StatsCollector(tmp_path / name, [StatsTable(name, vocab, DIM, 1)], sample_rate=1.0)
    for _ in range(4):
        present = rng.random(256) < ids_per_example
        lengths = present.astype(np.int64)
        ids = ((rng.zipf(1.2, int(lengths.sum())) - 1) % vocab).astype(np.int64)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        batch = FeatureBatch(torch.from_numpy(ids), torch.from_numpy(offsets), None, "sum", (256,))
        collector.observe([[batch]])
    return collector.stats[0]


def ring_bytes(vocab: int, dim: int, world: int) -> float:
    """A ring all-reduce of a (vocab, dim + 1) float32 buffer: bytes sent, summed over ranks."""
    return world * 2 * (world - 1) / world * 4 * vocab * (dim + 1)


def row_wise_bytes(vocab: int, dim: int, world: int, ids: float) -> float:
    """Row-wise div over every rank, one-hot ids all distinct (unique = min(ids, vocab)):
    each rank sends each other owner its share of unique ids and of (id, contribution) pairs,
    and gets back the unique rows; summed over ranks."""
    unique = min(ids, vocab)
    share = 1 / world
    per_pair = share * (8 * unique + (8 + 4 * dim) * ids) + share * 4 * dim * unique
    return world * (world - 1) * per_pair


def test_small_hot_tables_are_replicated_big_or_cold_ones_are_not(tmp_path):
    fc = features(hot=2_000, cold=20_000, big=1_000_000, costly=8_000, tiny=10)
    stats = {
        "hot": measured(tmp_path, "hot", 2_000, 1.0, 0),
        "cold": measured(tmp_path, "cold", 20_000, 0.05, 1),
        "big": measured(tmp_path, "big", 1_000_000, 1.0, 2),
        "costly": {"ids_per_example": 1.0, "unique_ratio": 1.0},
    }
    p = plan(fc, WORLD, optimizer=ADAGRAD, batch_size=BATCH, stats=stats)
    assert p["hot"].scheme == "data_parallel"
    assert p["cold"].scheme != "data_parallel"
    assert p["big"].scheme != "data_parallel"
    assert p["costly"].scheme != "data_parallel"
    assert p["tiny"].scheme == "data_parallel"  # no statistics: the balance score decides

    verdicts = {
        v.table: v for v in replication(fc, WORLD, optimizer=ADAGRAD, batch_size=BATCH, stats=stats)
    }
    assert sorted(verdicts) == ["big", "cold", "costly", "hot"]
    hot, cold, big, costly = (verdicts[n] for n in ("hot", "cold", "big", "costly"))
    assert hot.replicate and hot.reason.startswith("small, hot")
    assert hot.replica_bytes == 2_000 * DIM * 8  # Adagrad: weights + accumulators
    assert hot.lookups_per_row == pytest.approx(WORLD * BATCH / 2_000)
    assert hot.all_reduce_bytes == round(ring_bytes(2_000, DIM, WORLD))
    assert not big.replicate and big.reason == "over 16 MiB"
    assert big.replica_bytes > REPLICATE_MAX_BYTES
    assert not cold.replicate and cold.reason.startswith("cold")
    assert cold.lookups_per_row == pytest.approx(
        WORLD * BATCH * stats["cold"].mean_ids_per_example / 20_000
    )
    assert cold.lookups_per_row < 1
    # 8000 rows, 2 lookups per row: hot and small, but the dense all-reduce costs more
    assert not costly.replicate and costly.reason.startswith("all-reduce costs more")
    assert costly.lookups_per_row == pytest.approx(WORLD * BATCH / 8_000)
    assert costly.all_reduce_bytes == round(ring_bytes(8_000, DIM, WORLD))
    assert costly.all_to_all_bytes <= row_wise_bytes(8_000, DIM, WORLD, BATCH) * (1 + 1e-9)
    assert ring_bytes(8_000, DIM, WORLD) > row_wise_bytes(8_000, DIM, WORLD, BATCH)
    assert ring_bytes(2_000, DIM, WORLD) < row_wise_bytes(2_000, DIM, WORLD, BATCH)


def test_the_same_table_is_replicated_only_while_it_is_hot_and_small():
    fc = features(t=2_000)
    hot = {"t": {"ids_per_example": 1.0}}
    cold = {"t": {"ids_per_example": 0.1}}  # 0.8 lookups per row and step
    assert plan(fc, WORLD, batch_size=BATCH, stats=hot)["t"].scheme == "data_parallel"
    assert plan(fc, WORLD, batch_size=BATCH, stats=cold)["t"].scheme != "data_parallel"
    # the thresholds are parameters: a higher heat bar (8.2 lookups per row here), or a
    # smaller size bar, turns replication off
    hotter = plan(fc, WORLD, batch_size=BATCH, stats=hot, replicate_min_lookups_per_row=9)
    assert hotter["t"].scheme != "data_parallel"
    small = plan(fc, WORLD, batch_size=BATCH, stats=hot, replicate_max_bytes=100_000)
    assert small["t"].scheme != "data_parallel"
    # an override wins over the rule, and one rank never replicates
    forced = plan(fc, WORLD, batch_size=BATCH, stats=hot, overrides={"t": "row_wise"})
    assert forced["t"].scheme == "row_wise"
    assert plan(fc, 1, batch_size=BATCH, stats=hot)["t"].scheme == "table_wise"
    with pytest.raises(ValueError, match="replicate_min_lookups_per_row must be a number >= 0"):
        plan(fc, WORLD, stats=hot, replicate_min_lookups_per_row=-1)


def test_a_replica_that_does_not_fit_is_sharded_instead():
    fc = features(t=2_000)
    p = plan(
        fc,
        WORLD,
        optimizer=ADAGRAD,
        batch_size=BATCH,
        stats={"t": {"ids_per_example": 1.0}},
        memory_per_rank=2_000 * DIM * 8 - 1,  # a whole replica is one byte too many
    )
    assert p["t"].scheme == "row_wise"


def test_cli_plan_shows_the_rule(tmp_path, capsys: pytest.CaptureFixture[str]):
    stats = tmp_path / "stats.json"
    stats.write_text(json.dumps({"t00": {"ids_per_example": 1}, "t06": {"ids_per_example": 0.01}}))
    assert main(["plan", "--workload", "W1", "-w", "4", "--stats", str(stats)]) == 0
    out = capsys.readouterr().out
    section = out.split("hot-table replication (tables with statistics)\n")[1].splitlines()
    header = " ".join(section[0].split())
    assert header == "table size lookups/row all-reduce all-to-all verdict"
    rows = {line.split()[0]: line for line in section[1:]}
    assert sorted(rows) == ["t00", "t06"]
    assert "11.22" in rows["t00"] and "replicate (small, hot" in rows["t00"]  # 4 x 4096 / 1460
    assert "shard (cold" in rows["t06"]
    placements = {line.split()[0]: line for line in out.splitlines()[3:29]}
    assert "data_parallel on all" in placements["t00"]
    assert "data_parallel" not in placements["t06"]
