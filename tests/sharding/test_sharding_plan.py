"""Sharding specs and the planner: pure functions, no process group."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

import embcore as ec
from embcore.cli.main import main
from embcore.config import resolve
from embcore.sharding import ShardingPlan, TableShard, estimate, plan


def features(*tables: tuple[str, int, int], multi_hot: dict[str, int] | None = None) -> dict:
    out = {}
    for name, vocab, dim in tables:
        table = ec.TableConfig(vocabulary_size=vocab, dim=dim, name=name)
        out[name] = ec.FeatureConfig(table=table)
    return out


ADAGRAD = ec.Adagrad(learning_rate=0.1)


# ----------------------------------------------------------------------------- specs
def test_table_shard_constructors_and_forms():
    assert TableShard.table_wise(1).to_dict() == {"scheme": "table_wise", "ranks": [1]}
    rw = TableShard.row_wise([2, 0], "mod")
    assert rw.to_dict() == {"scheme": "row_wise", "ranks": [2, 0], "partition_strategy": "mod"}
    cw = TableShard.column_wise([0, 1, 2], 8)
    assert cw.column_sizes == (3, 3, 2)  # the first dim % n shards one column wider
    assert cw.column_bounds(8) == [(0, 3), (3, 6), (6, 8)]
    assert TableShard.data_parallel(3).ranks == (0, 1, 2)
    for shard in (rw, cw, TableShard.table_wise(0), TableShard.data_parallel(2)):
        assert TableShard.from_dict(shard.to_dict()) == shard


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"scheme": "hybrid", "ranks": (0,)}, "scheme must be one of"),
        ({"scheme": "table_wise", "ranks": (0, 1)}, "exactly one rank"),
        ({"scheme": "row_wise", "ranks": (0, 0), "partition_strategy": "div"}, "distinct"),
        ({"scheme": "row_wise", "ranks": (0, 1)}, "partition_strategy must be one of"),
        ({"scheme": "table_wise", "ranks": (0,), "partition_strategy": "mod"}, "row_wise only"),
        ({"scheme": "column_wise", "ranks": (0, 1), "column_sizes": (4,)}, "one width per rank"),
        ({"scheme": "column_wise", "ranks": (0, 1), "column_sizes": (4, 0)}, "ints >= 1"),
        ({"scheme": "row_wise", "ranks": (-1,), "partition_strategy": "div"}, "ints >= 0"),
    ],
)
def test_table_shard_rejects_bad_fields(kwargs: dict, message: str):
    with pytest.raises(ValueError, match=message):
        TableShard(**kwargs)


def test_plan_is_frozen_hashable_and_round_trips_through_json():
    p = ShardingPlan(
        world_size=3,
        tables={
            "a": TableShard.row_wise([0, 1, 2], "mod"),
            "b": TableShard.column_wise([2, 0], 5),
            "c": TableShard.data_parallel(3),
            "d": TableShard.table_wise(1),
        },
    )
    text = p.to_json()
    back = ShardingPlan.from_json(text)
    assert back == p and hash(back) == hash(p) and back.to_json() == text
    assert list(back.tables) == ["a", "b", "c", "d"]  # table order is kept
    assert json.loads(text)["tables"]["b"] == {
        "scheme": "column_wise",
        "ranks": [2, 0],
        "column_sizes": [3, 2],
    }
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.world_size = 4  # type: ignore[misc]
    with pytest.raises(TypeError):
        p.tables["e"] = TableShard.table_wise(0)  # type: ignore[index]
    with pytest.raises(KeyError, match="no table 'zz'"):
        p["zz"]


def test_plan_rejects_ranks_outside_the_world():
    with pytest.raises(ValueError, match=r"table 'a' is placed on ranks \[0, 2\].*ranks 0..1"):
        ShardingPlan(world_size=2, tables={"a": TableShard.row_wise([0, 2])})
    with pytest.raises(ValueError, match="must be on every rank"):
        ShardingPlan(world_size=3, tables={"a": TableShard.data_parallel(2)})
    with pytest.raises(ValueError, match="unknown fields"):
        ShardingPlan.from_dict(
            {"world_size": 1, "tables": {"a": {"scheme": "table_wise", "ranks": [0], "x": 1}}}
        )


def test_plan_check_against_an_engine_layout():
    fc = features(("a", 10, 4), ("b", 5, 3))
    _, tables = ec.config.resolve(fc, ec.RowwiseAdagrad(learning_rate=0.1))
    good = ShardingPlan(
        world_size=2, tables={"a": TableShard.row_wise([0, 1]), "b": TableShard.table_wise(1)}
    )
    good.check(tables, 2)
    with pytest.raises(ValueError, match="world_size=2, but the process group has 3"):
        good.check(tables, 3)
    missing = ShardingPlan(
        world_size=2, tables={"a": TableShard.table_wise(0), "z": TableShard.table_wise(0)}
    )
    with pytest.raises(ValueError, match=r"missing \['b'\], unknown \['z'\]"):
        missing.check(tables, 2)
    cw = ShardingPlan(
        world_size=2, tables={"a": TableShard.column_wise([0, 1], 4), "b": TableShard.table_wise(0)}
    )
    with pytest.raises(ValueError, match=r"table 'a' cannot be column-wise.*RowwiseAdagrad"):
        cw.check(tables, 2)
    _, plain = ec.config.resolve(fc, ADAGRAD)
    cw.check(plain, 2)
    narrow = ShardingPlan(
        world_size=2,
        tables={"a": TableShard.column_wise([0, 1], 4, [2, 1]), "b": TableShard.table_wise(0)},
    )
    with pytest.raises(ValueError, match=r"dim 4, but its column_sizes \[2, 1\] sum to 3"):
        narrow.check(plain, 2)


# --------------------------------------------------------------------------- planner
def test_planner_places_every_table_and_is_deterministic():
    fc = features(("big", 1_000_000, 64), ("mid", 50_000, 64), ("tiny", 10, 64), ("t4", 3, 8))
    p = plan(fc, 4, optimizer=ADAGRAD, batch_size=4096)
    assert p.world_size == 4 and list(p.tables) == ["big", "mid", "t4", "tiny"]
    assert p == plan(fc, 4, optimizer=ADAGRAD, batch_size=4096)
    assert p["tiny"].scheme == "data_parallel" and p["t4"].scheme == "data_parallel"
    assert p["big"].scheme == "row_wise"  # one-hot: fetching rows beats shipping ids


def test_planner_uses_lookup_statistics():
    fc = features(("big", 1_000_000, 128), ("other", 1_000_000, 128))
    one_hot = plan(fc, 2, optimizer=ADAGRAD, batch_size=2048)
    multi_hot = plan(
        fc,
        2,
        optimizer=ADAGRAD,
        batch_size=2048,
        stats={n: {"ids_per_example": 20, "unique_ratio": 1.0} for n in ("big", "other")},
    )
    assert one_hot["big"].scheme == "row_wise"
    # Twenty ids per example: pooled activations cost less than the ids' rows.
    assert multi_hot["big"].scheme in ("table_wise", "column_wise")
    r1, _ = estimate(one_hot, fc, optimizer=ADAGRAD, batch_size=2048)
    r20, _ = estimate(
        multi_hot,
        fc,
        optimizer=ADAGRAD,
        batch_size=2048,
        stats={n: {"ids_per_example": 20} for n in ("big", "other")},
    )
    assert r20[0].bytes_sent > r1[0].bytes_sent
    with pytest.raises(ValueError, match="statistics of table 'big'"):
        plan(fc, 2, stats={"big": {"ids_per_example": -1}})


def test_planner_overrides():
    fc = features(("a", 1000, 16), ("b", 1000, 64), ("c", 10, 4))
    p = plan(
        fc,
        3,
        overrides={"a": "row_wise:mod", "b": "column_wise", "c": TableShard.table_wise(2)},
    )
    assert p["a"] == TableShard.row_wise([0, 1, 2], "mod")
    assert p["b"] == TableShard.column_wise([0, 1, 2], 64)
    assert p["c"] == TableShard.table_wise(2)
    assert plan(fc, 3, overrides={"a": "table_wise:1"})["a"] == TableShard.table_wise(1)
    with pytest.raises(ValueError, match=r"unknown tables \['zz'\]"):
        plan(fc, 3, overrides={"zz": "row_wise"})
    with pytest.raises(ValueError, match="unknown override 'hybrid' for table 'a'"):
        plan(fc, 3, overrides={"a": "hybrid"})


def test_planner_never_proposes_column_wise_for_rowwise_slots():
    fc = features(("wide", 1_000_000, 512))
    p = plan(
        fc,
        2,
        optimizer=ec.RowwiseAdagrad(learning_rate=0.1),
        stats={"wide": {"ids_per_example": 50}},
    )
    assert p["wide"].scheme != "column_wise"


def test_planner_respects_memory_per_rank():
    fc = features(("a", 1_000_000, 64), ("b", 1_000_000, 64))
    # 256 MB of weights and 256 MB of accumulators per table
    p = plan(fc, 2, optimizer=ADAGRAD, memory_per_rank=600_000_000)
    ranks, tables = estimate(p, fc, optimizer=ADAGRAD)
    assert max(r.memory_bytes for r in ranks) <= 600_000_000
    assert sum(t.memory_bytes for t in tables) == 2 * 1_000_000 * 64 * 8
    with pytest.raises(
        ValueError, match=r"table '.' \(1000000x64\) does not fit in memory_per_rank=400000000"
    ):
        plan(fc, 2, optimizer=ADAGRAD, memory_per_rank=400_000_000)


def test_estimate_totals_match_the_table_sizes():
    fc = features(("a", 1000, 8), ("b", 7, 4))
    p = ShardingPlan(
        world_size=2,
        tables={"a": TableShard.row_wise([0, 1], "div"), "b": TableShard.data_parallel(2)},
    )
    ranks, tables = estimate(p, fc, optimizer=ec.Adam(), batch_size=16)
    # Adam: weights + momenta + velocities, 4 bytes each
    assert [r.memory_bytes for r in ranks] == [500 * 8 * 12 + 7 * 4 * 12] * 2
    assert tables[1].bytes_sent == 2 * (7 * 5 * 4)  # ring all-reduce, 2 ranks
    assert sum(r.bytes_sent for r in ranks) == sum(r.bytes_received for r in ranks)


def test_one_rank_plans_everything_table_wise_on_rank_0():
    p = plan(features(("a", 100, 8), ("b", 3, 2)), 1)
    assert all(s == TableShard.table_wise(0) for s in p.tables.values())


def test_planner_does_not_resolve_a_resolved_config_again(monkeypatch: pytest.MonkeyPatch):
    fc = features(("big", 1_000_000, 64), ("tiny", 10, 64))
    want = plan(fc, 2, optimizer=ADAGRAD, stats={"tiny": {"ids_per_example": 5}})
    want_estimate = estimate(want, fc, optimizer=ADAGRAD)
    config = ec.config.resolve(fc, ADAGRAD)

    def no_resolve(*args: object) -> None:
        raise AssertionError("resolved again")

    monkeypatch.setattr("embcore.sharding.planner._tables.resolve", no_resolve)
    assert plan(config, 2, stats={"tiny": {"ids_per_example": 5}}) == want
    assert estimate(want, config) == want_estimate


def test_every_schemes_candidates_and_overrides_are_valid_placements():
    from embcore.sharding.planner._tables import planned_tables

    fc = features(("wide", 1000, 96))
    (t,) = planned_tables(ec.config.resolve(fc, ADAGRAD), 16, None)
    for world in (1, 2, 3):
        for name, scheme in ec.sharding.SCHEMES.items():
            for placement in scheme.candidates(t, world, 32) + (
                scheme.parse_override("", t, world) or []
            ):
                shard = TableShard.from_dict(placement)
                assert shard.scheme == name and shard.describe().startswith(name)
                ShardingPlan(world_size=world, tables={"wide": shard})
                cost = scheme.cost(t, shard, world)
                assert len(cost.memory) == len(cost.sent) == len(cost.received) == world
                assert sum(cost.sent) == pytest.approx(sum(cost.received))


def test_a_scheme_added_to_the_registry_is_planned_without_other_edits(
    monkeypatch: pytest.MonkeyPatch,
):
    from embcore.sharding.schemes import SCHEMES, TableWise

    class Pinned(TableWise):  # a new scheme: table-wise, but only ever on the last rank
        scheme = "pinned"

        @classmethod
        def candidates(cls, t, world, min_column_width):
            return [{"scheme": cls.scheme, "ranks": [world - 1]}]

    monkeypatch.setitem(SCHEMES, "pinned", Pinned)
    shard = TableShard(scheme="pinned", ranks=(2,))
    assert shard.describe() == "pinned on 2" and TableShard.from_dict(shard.to_dict()) == shard
    fc = features(("a", 1000, 16), ("b", 10, 4))
    p = plan(fc, 3, overrides={"a": "pinned:1", "b": "pinned"})
    assert p["a"] == TableShard(scheme="pinned", ranks=(1,))
    assert p["b"] == TableShard(scheme="pinned", ranks=(2,))
    ranks, _ = estimate(p, fc)
    assert [r.memory_bytes for r in ranks] == [0, 1000 * 16 * 4, 10 * 4 * 4]


# ------------------------------------------------------------------------------- CLI
def test_cli_plan_prints_placements_and_per_rank_costs(capsys: pytest.CaptureFixture[str]):
    assert main(["plan", "--workload", "W1", "--world-size", "2"]) == 0
    out = capsys.readouterr().out
    assert "sharding plan for 2 rank(s), per-rank batch 4096" in out
    assert "t02" in out and "row_wise(div) on 0,1" in out and "data_parallel on all" in out
    rank_lines = [line for line in out.splitlines() if line.split()[:1] in (["0"], ["1"])]
    assert len(rank_lines) == 2


def test_cli_plan_writes_a_plan_the_engine_reads(tmp_path, capsys: pytest.CaptureFixture[str]):
    config = tmp_path / "tables.json"
    config.write_text(
        json.dumps(
            {
                "tables": [
                    {"name": "user", "vocabulary_size": 5000, "dim": 16},
                    {"name": "item", "vocabulary_size": 9, "dim": 4, "features": 2},
                ],
                "optimizer": "sgd",
                "batch_size": 64,
            }
        )
    )
    out_file = tmp_path / "plan.json"
    args = ["plan", "--config", str(config), "-w", "3", "--override", "user=row_wise:mod"]
    assert main([*args, "--json", "--output", str(out_file)]) == 0
    printed = capsys.readouterr().out
    p = ShardingPlan.from_json(out_file.read_text())
    assert ShardingPlan.from_json(printed) == p
    assert p["user"] == TableShard.row_wise([0, 1, 2], "mod") and p.world_size == 3
    assert main([*args, "--override", "nope=row_wise"]) == 2
    assert "unknown tables" in capsys.readouterr().err
    assert main([*args, "--override", "user"]) == 2
    assert "TABLE=SCHEME" in capsys.readouterr().err


def test_cli_plan_refuses_what_the_engine_would_refuse(tmp_path, capsys):
    config = tmp_path / "tables.json"
    table = {"name": "user", "vocabulary_size": 5000, "dim": 64}
    config.write_text(json.dumps({"tables": [table], "optimizer": "rowwise_adagrad"}))
    out_file = tmp_path / "plan.json"
    args = ["plan", "--config", str(config), "-w", "2", "--output", str(out_file)]
    assert main([*args, "--override", "user=column_wise"]) == 2
    captured = capsys.readouterr()
    assert "cannot be column-wise" in captured.err and "row-wise slots" in captured.err
    assert captured.out == "" and not out_file.exists()
    # the same plan with an element-wise optimizer is printed, and the engine accepts it
    assert main([*args, "--override", "user=column_wise", "--optimizer", "adagrad"]) == 0
    p = ShardingPlan.from_json(out_file.read_text())
    tables = resolve({"user/0": ec.FeatureConfig(table=ec.TableConfig(5000, 64, name="user"))},
                     ec.Adagrad())[1]  # fmt: skip
    p.check(tables, 2)


@pytest.mark.parametrize(
    "content, message",
    [
        ([{"name": "user", "vocabulary_size": 10, "dim": 4}], "expected a JSON object"),
        ({"tables": []}, '"tables" must be a non-empty list'),
        (
            {"tables": [{"name": "u", "dim": 4}]},
            r"tables\[0\]: missing fields \['vocabulary_size'\]",
        ),
        ({"tables": [{"vocabulary_size": -3, "dim": 4}]}, r"tables\[0\]: .*vocabulary_size"),
        ({"tables": [{"vocabulary_size": 9, "dim": 4, "features": "2"}]}, "features must be"),
        ({"tables": [{"vocabulary_size": 9, "dim": 4}], "batch": 3}, r"unknown keys \['batch'\]"),
        ({"tables": [{"vocabulary_size": 9, "dim": 4}], "optimizer": "adamw"}, "unknown optimizer"),
    ],
)
def test_cli_plan_malformed_configs_are_one_line_errors(tmp_path, capsys, content, message):
    config = tmp_path / "tables.json"
    config.write_text(json.dumps(content))
    assert main(["plan", "--config", str(config), "-w", "2"]) == 2
    err = capsys.readouterr().err
    assert re.search(message, err), err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_cli_plan_reports_statistics_that_match_no_table(tmp_path, capsys):
    config = tmp_path / "tables.json"
    config.write_text(json.dumps({"tables": [{"name": "user", "vocabulary_size": 50, "dim": 4}]}))
    stats = tmp_path / "stats.json"
    stats.write_text(json.dumps({"usr": {"ids_per_example": 30}, "user": {"ids_per_example": 2}}))
    assert main(["plan", "--config", str(config), "-w", "2", "--stats", str(stats)]) == 0
    captured = capsys.readouterr()
    assert "warning: ignoring statistics of tables the config does not have: ['usr']" in (
        captured.err
    )
    assert "user" in captured.out


@pytest.mark.parametrize(
    "extra, message",
    [
        (["-w", "0"], r"--world-size must be in \[1, 65536\], got 0"),
        (["-w", "1000000000"], r"--world-size must be in \[1, 65536\]"),
        (["-w", "2", "--batch-size", "-3"], "--batch-size must be positive, got -3"),
    ],
)
def test_cli_plan_flags_out_of_range_are_one_line_errors(capsys, extra, message):
    assert main(["plan", "--workload", "W1", *extra]) == 2
    err = capsys.readouterr().err
    assert re.search(message, err) and len(err.strip().splitlines()) == 1, err
