"""Lookup statistics of dynamic tables: unique keys per step, rows held, their JSON and merges,
an engine profiling one, and the planner's expected rows from them."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import embcore as ec
from embcore.config import ResolvedTable, TableConfig
from embcore.inputs import FeatureBatch
from embcore.sharding.planner._tables import (
    DYNAMIC_EXPECTED_ROWS,
    expected_rows,
    planned_tables,
    resolved,
)
from embcore.stats import StatsCollector, StatsTable, TableStats, load_stats


def _batch(ids: list[int]) -> FeatureBatch:
    values = torch.tensor(ids, dtype=torch.int64)
    return FeatureBatch(values, torch.arange(len(ids) + 1), None, "sum", (len(ids),))


def test_unique_keys_per_step_and_rows_held(tmp_path) -> None:
    rng = np.random.default_rng(0)
    held = iter([10, 250, 40])  # what the table holds at each sampled batch
    table = StatsTable("user", None, 8, 1, rows_held=lambda: next(held))
    collector = StatsCollector(tmp_path, [table], sample_rate=1.0)
    uniques = []
    for _ in range(3):
        keys = rng.integers(-(2**63), 2**63 - 1, 50, dtype=np.int64)
        keys[:20] = keys[0]  # repeats
        collector.observe([[_batch(keys.tolist())]])
        uniques.append(len(set(keys.tolist())))
    s = collector.stats[0]
    assert s.unique_ids == sum(uniques)
    assert s.mean_unique_ids == pytest.approx(np.mean(uniques))
    assert s.rows_held == 250  # the most seen
    assert s.key["vocabulary_size"] is None
    (path,) = collector.flush()
    data = json.loads(path.read_text())
    assert data["summary"]["rows_held"] == 250 and data["unique_ids"] == sum(uniques)
    loaded = load_stats(tmp_path, s.key)
    assert (loaded.unique_ids, loaded.rows_held) == (sum(uniques), 250)


def test_fixed_tables_hold_no_rows_count(tmp_path) -> None:
    collector = StatsCollector(tmp_path, [StatsTable("t", 100, 4, 1)], sample_rate=1.0)
    collector.observe([[_batch([1, 1, 2])]])
    assert collector.stats[0].rows_held == 0 and collector.stats[0].unique_ids == 2


def test_merge_adds_unique_keys_and_keeps_the_most_rows() -> None:
    a = TableStats("t", {"table": "t"}, batches=2, unique_ids=30, rows_held=100)
    b = TableStats("t", {"table": "t"}, batches=1, unique_ids=12, rows_held=70)
    a.merge(b)
    assert (a.batches, a.unique_ids, a.rows_held) == (3, 42, 100)
    assert a.mean_unique_ids == pytest.approx(14.0)


def test_files_without_the_new_fields_still_load() -> None:
    data = TableStats("t", {"table": "t"}, batches=1).to_json()
    del data["unique_ids"], data["rows_held"]
    s = TableStats.from_json(data)
    assert (s.unique_ids, s.rows_held) == (0, 0)


def test_an_engine_profiles_a_dynamic_table(tmp_path) -> None:
    user = ec.TableConfig(vocabulary_size=None, dim=4, name="user")
    item = ec.TableConfig(vocabulary_size=50, dim=4, name="item")
    engine = ec.EmbeddingEngine(
        {"u": ec.FeatureConfig(table=user), "i": ec.FeatureConfig(table=item)},
        optimizer=ec.SGD(0.1),
        profile_data_directory=str(tmp_path),
        profile_sample_rate=1.0,
    )
    steps = [[5, -(2**63), 5, 2**63 - 1], [7, 5, 8, 9], [10, 11, 12, 13]]
    for keys in steps:
        acts = engine({"u": torch.tensor(keys), "i": torch.tensor([1, 2, 3, 4])})
        sum(a.sum() for a in acts.values()).backward()
    engine.write_statistics()
    key = {t.name: t for t in engine.store.stats_tables()}["user"]
    stats = {p.name.split("-")[0]: json.loads(p.read_text()) for p in tmp_path.iterdir()}
    assert stats["user"]["unique_ids"] == 3 + 4 + 4
    # observed before each step's lookup: 0, then 3, then 3 + 3 (5 was held) rows
    assert stats["user"]["rows_held"] == 6
    assert stats["item"]["rows_held"] == 0 and stats["item"]["key"]["vocabulary_size"] == 50
    assert stats["user"]["key"]["vocabulary_size"] is None and key.rows_held is not None
    assert engine.table_info("user")["rows"] == 10


def test_the_stats_report_shows_rows_held_of_dynamic_tables(tmp_path) -> None:
    from embcore.cli.stats import report

    held = iter([0, 3])
    tables = [
        StatsTable("user", None, 8, 1, rows_held=lambda: next(held)),
        StatsTable("t", 9, 4, 1),
    ]
    collector = StatsCollector(tmp_path, tables, sample_rate=1.0)
    for keys in ([5, 6, 5, 7], [8, 8, 8, 8]):
        collector.observe([[_batch(keys)], [_batch([1, 2, 1, 1])]])
    text = report([(tmp_path / "x.json", s) for s in collector.stats], top=3)
    assert "table user  (dynamic x 8," in text and "table t  (9 x 4," in text
    assert "rows held (the most at a sampled batch): 3" in text
    assert text.count("rows held") == 1  # only the dynamic table has the line
    assert "unique ids per batch 50.0% (2 on average)" in text  # 3/4 and 1/4; 3 and 1


def _dynamic(max_rows: int | None) -> ResolvedTable:
    eviction = None if max_rows is None else ec.Eviction(max_rows=max_rows)
    config = TableConfig(vocabulary_size=None, dim=8, name="user", eviction=eviction)
    return ResolvedTable(0, "user", config, None)


def test_the_planner_expects_a_dynamic_table_to_hold_what_its_statistics_saw() -> None:
    fixed = ResolvedTable(0, "t", TableConfig(vocabulary_size=123, dim=4), None)
    assert expected_rows(fixed, {"rows_held": 5}) == 123
    assert expected_rows(_dynamic(5000), {"rows_held": 40}) == 5000  # the bound wins
    assert expected_rows(_dynamic(None), {"rows_held": 40}) == 40
    assert expected_rows(_dynamic(None), TableStats("user", {}, rows_held=77)) == 77
    assert expected_rows(_dynamic(None), {"rows_held": 0}) == DYNAMIC_EXPECTED_ROWS
    assert expected_rows(_dynamic(None)) == DYNAMIC_EXPECTED_ROWS
    user = ec.TableConfig(vocabulary_size=None, dim=8, name="user")
    features = {"u": ec.FeatureConfig(table=user)}
    (planned,) = planned_tables(
        resolved(features, ec.Adagrad(0.1)),
        64,
        {"user": {"ids_per_example": 1.0, "rows_held": 900}},
    )
    assert planned.vocab == 900
