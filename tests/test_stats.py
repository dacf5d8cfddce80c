"""Lookup statistics: exact summaries, sketch bounds, atomic keyed files, merges."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from embcore.inputs import FeatureBatch
from embcore.stats import StatsCollector, StatsTable, TableStats, load_stats, stats_path


def ragged_batch(rows: list[list[int]], combiner: str = "sum") -> FeatureBatch:
    lengths = [len(r) for r in rows]
    offsets = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int64)
    values = torch.tensor([x for r in rows for x in r], dtype=torch.int64)
    return FeatureBatch(values, offsets, None, combiner, (len(rows),))


def zipf_rows(rng: np.random.Generator, batch: int, vocab: int) -> list[list[int]]:
    return [list((rng.zipf(1.3, size=rng.integers(0, 6)) - 1) % vocab) for _ in range(batch)]


def test_summaries_match_numpy(tmp_path):
    rng = np.random.default_rng(1)
    tables = [StatsTable("t", 1000, 8, 2)]
    collector = StatsCollector(tmp_path, tables, sample_rate=1.0, capacity=1000)
    per_example, ratios, everything = [], [], []
    for _ in range(5):
        a, b = zipf_rows(rng, 32, 1000), zipf_rows(rng, 32, 1000)
        collector.observe([[ragged_batch(a), ragged_batch(b)]])
        per_example += [len(x) + len(y) for x, y in zip(a, b, strict=True)]
        ids = [i for r in a + b for i in r]
        everything += ids
        ratios.append(len(set(ids)) / len(ids))
    s = collector.stats[0]
    assert s.batches == 5 and s.examples == 160 and s.ids == len(everything)
    assert s.mean_ids_per_example == pytest.approx(np.mean(per_example))
    assert s.quantile(0.5) == int(np.quantile(per_example, 0.5, method="inverted_cdf"))
    assert s.quantile(0.99) == int(np.quantile(per_example, 0.99, method="inverted_cdf"))
    assert s.unique_ratio == pytest.approx(np.mean(ratios))
    # capacity above the number of distinct ids: the sketch is exact
    ids, counts = np.unique(everything, return_counts=True)
    assert s.sketch == dict(zip(ids.tolist(), counts.tolist(), strict=True))


def test_sketch_keeps_heavy_hitters_within_its_error_bound(tmp_path):
    rng = np.random.default_rng(2)
    collector = StatsCollector(
        tmp_path, [StatsTable("t", 5000, 4, 1)], sample_rate=1.0, capacity=16
    )
    everything = []
    for _ in range(20):
        rows = [list((rng.zipf(1.2, size=3) - 1) % 5000) for _ in range(64)]
        everything += [i for r in rows for i in r]
        collector.observe([[ragged_batch(rows)]])
    s = collector.stats[0]
    assert len(s.sketch) <= 16
    ids, counts = np.unique(everything, return_counts=True)
    exact = dict(zip(ids.tolist(), counts.tolist(), strict=True))
    bound = len(everything) / 17
    assert s.sketch_error == pytest.approx(bound)
    for i, c in exact.items():
        if c > bound:
            assert i in s.sketch, (i, c, bound)
    for i, est in s.sketch.items():
        assert exact[i] - bound <= est <= exact[i]


def test_shard_load_uses_the_load_function(tmp_path):
    table = StatsTable(
        "t", 10, 4, 1, load_of=lambda ids: np.bincount(ids % 3, minlength=3), num_shards=3
    )
    collector = StatsCollector(tmp_path, [table], sample_rate=1.0)
    collector.observe([[ragged_batch([[0, 1, 2], [3, 4], [9]])]])
    assert collector.stats[0].shard_load == [3, 2, 1]


def test_flush_adds_other_ranks_and_only_the_writer_writes(tmp_path):
    def table(rank: int) -> StatsTable:  # a replicated table: each rank serves its own ids
        return StatsTable(
            "t", 10, 4, 1, load_of=lambda ids: np.eye(2, dtype=np.int64)[rank] * ids.size,
            num_shards=2, strategy="data_parallel on all",
        )  # fmt: skip

    ranks = [StatsCollector(tmp_path, [table(r)], sample_rate=1.0, world_size=2) for r in (0, 1)]
    ranks[0].observe([[ragged_batch([[1, 2], [2]])]])
    ranks[1].observe([[ragged_batch([[5], [], [7, 7, 7]])]])
    gathered = [[TableStats.from_json(s.to_json()) for s in c.stats] for c in ranks]
    assert ranks[1].flush(others=[gathered[0]], write=False) != []
    assert list(tmp_path.iterdir()) == []  # a non-writer only resets
    assert ranks[1].stats[0].batches == 0
    (path,) = ranks[0].flush(others=[gathered[1]])
    s = TableStats.from_json(json.loads(path.read_text()))
    assert (s.batches, s.examples, s.ids, s.shard_load) == (2, 5, 7, [3, 4])
    assert s.key["sharding_strategy"] == "data_parallel on all" and s.key["world_size"] == 2
    assert s.hottest(2) == [(7, 3), (2, 2)]
    regrouped = ranks[0].regrouped([StatsTable("t", 10, 4, 1)], world_size=1)
    assert regrouped.sample_rate == 1.0 and regrouped.stats[0].key["world_size"] == 1


def test_round_trip_and_atomic_keyed_files(tmp_path):
    tables = [StatsTable("video/v1", 100, 8, 1), StatsTable("user", 50, 4, 1)]
    collector = StatsCollector(tmp_path, tables, sample_rate=1.0, world_size=2, strategy="mod")
    collector.observe([[ragged_batch([[1, 2], [2]])], [ragged_batch([[3], []])]])
    before = [TableStats.from_json(s.to_json()) for s in collector.stats]
    paths = collector.flush()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in paths)
    assert not any(p.name.endswith(".tmp") for p in tmp_path.iterdir())
    assert "/" not in paths[0].name and paths[0].name.startswith("video_v1-")
    for stats in before:
        loaded = load_stats(tmp_path, stats.key)
        assert loaded is not None and loaded.to_json() == stats.to_json()
    # another global configuration is another file; nothing is stored for it yet
    other = dict(before[0].key, world_size=4)
    assert stats_path(tmp_path, other) != paths[0]
    assert load_stats(tmp_path, other) is None


def test_two_runs_merge_like_one(tmp_path):
    rng = np.random.default_rng(3)
    batches = [zipf_rows(rng, 16, 200) for _ in range(6)]
    table = [StatsTable("t", 200, 4, 1)]
    one = StatsCollector(tmp_path / "one", table, sample_rate=1.0, capacity=8)
    for rows in batches:
        one.observe([[ragged_batch(rows)]])
    one.flush()
    for half in (batches[:3], batches[3:]):
        run = StatsCollector(tmp_path / "two", table, sample_rate=1.0, capacity=8)
        for rows in half:
            run.observe([[ragged_batch(rows)]])
        run.flush()
    key = one.stats[0].key
    a, b = load_stats(tmp_path / "one", key), load_stats(tmp_path / "two", key)
    assert (a.batches, a.examples, a.ids, a.sketch_total) == (
        b.batches,
        b.examples,
        b.ids,
        b.sketch_total,
    )
    assert np.array_equal(a.ids_per_example, b.ids_per_example)
    assert a.unique_ratio == pytest.approx(b.unique_ratio)


def test_sampling_rate_is_honoured_and_deterministic(tmp_path):
    table = [StatsTable("t", 10, 4, 1)]
    batch = [[ragged_batch([[1]])]]
    runs = []
    for _ in range(2):
        c = StatsCollector(tmp_path, table, sample_rate=0.03, seed=7)
        runs.append([c.maybe_observe(batch) for _ in range(4000)])
    assert runs[0] == runs[1]
    assert 0.02 < np.mean(runs[0]) < 0.04
    with pytest.raises(ValueError, match="sample_rate must be in"):
        StatsCollector(tmp_path, table, sample_rate=0.0)


def test_loading_a_mismatched_version_is_refused(tmp_path):
    c = StatsCollector(tmp_path, [StatsTable("t", 10, 4, 1)], sample_rate=1.0)
    c.observe([[ragged_batch([[1]])]])
    (path,) = c.flush()
    data = json.loads(path.read_text())
    data["format_version"] = 99
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="format_version 99"):
        load_stats(tmp_path, c.stats[0].key)
