"""Disk tables in sharding plans: the placements they take (others refused with one error
naming the table and the placement), and the planner's memory per tier (RAM: the cache and
the fixed overhead; disk: the file) against a formula written here from the documented
record layout and row costs, per table and per rank, also as `embcore plan` prints it."""

from __future__ import annotations

import json
import math

import pytest

import embcore as ec
from embcore.cli.main import main
from embcore.config import resolve
from embcore.sharding import ShardingPlan, TableShard, estimate, plan

VOCAB, DIM = 100_000, 64
BLOCK, BOX = 65_536, 8_192  # initializer block rows, rows of a checkpoint box (documented)


def features(cache_bytes: int = 3_000_000) -> dict[str, ec.FeatureConfig]:
    big = ec.TableConfig(
        VOCAB, DIM, name="big", storage=ec.DiskStorage("unused", cache_bytes=cache_bytes)
    )
    small = ec.TableConfig(1000, 16, name="small")
    return {"u": ec.FeatureConfig(table=big), "c": ec.FeatureConfig(table=small)}


def tiers(rows: int, cache_bytes: int) -> dict[str, int]:
    """RowwiseAdagrad, dim 64: a row is 64 weights and 1 slot float."""
    values = 4 * (DIM + 1)
    record = math.ceil((16 + values) / 512) * 512  # 16-byte header, 512-byte records
    cached = values + 40
    capacity = max(1, min(rows, cache_bytes // cached))
    overhead = min(rows, BLOCK) * values + min(rows, BOX) * record + math.ceil(rows / BLOCK)
    overhead += math.ceil(rows / 8)  # a bit per row: touched since the last checkpoint
    return {"ram": capacity * cached + overhead, "disk": rows * record}


@pytest.mark.parametrize(
    "shard",
    [
        lambda dim: TableShard.column_wise([0, 1], dim),
        lambda dim: TableShard.data_parallel(2),
        lambda dim: TableShard.row_wise([0, 1], "mod"),
    ],
    ids=["column_wise", "data_parallel", "row_wise_mod"],
)
def test_a_plan_placing_a_disk_table_otherwise_is_refused_naming_table_and_placement(shard):
    opt = ec.Adagrad(learning_rate=0.1)
    tables = resolve(features(), opt)[1]
    placed = {"big": shard(DIM), "small": TableShard.table_wise(0)}
    with pytest.raises(ValueError, match=r"table 'big'.*'disk'.*table_wise.*row_wise:div") as e:
        ShardingPlan(world_size=2, tables=placed).check(tables, 2)
    assert placed["big"].describe() in str(e.value)
    ok = {"big": TableShard.row_wise([0, 1], "div"), "small": shard(16)}
    ShardingPlan(world_size=2, tables=ok).check(tables, 2)  # fine for a table in memory


def test_the_planner_places_disk_tables_only_where_they_go():
    opt = ec.RowwiseAdagrad(learning_rate=0.1)
    tiny = ec.TableConfig(10, 64, name="tiny", storage=ec.DiskStorage("unused", cache_bytes=999))
    fc = {**features(), "t": ec.FeatureConfig(table=tiny)}
    memory = plan({"t": ec.FeatureConfig(ec.TableConfig(10, 64, name="tiny"))}, 2, optimizer=opt)
    assert memory["tiny"].scheme == "data_parallel"  # what a tiny table in memory gets
    placed = plan(fc, 2, optimizer=opt)
    for name in ("tiny", "big"):
        assert placed[name].placement in ("table_wise", "row_wise:div"), placed[name]
    with pytest.raises(ValueError, match=r"override 'column_wise' for table 'big'"):
        plan(fc, 2, optimizer=opt, overrides={"big": "column_wise"})


@pytest.mark.parametrize("cache_bytes", [3_000_000, 1 << 40])
def test_planned_memory_per_tier_matches_the_formula(cache_bytes):
    opt = ec.RowwiseAdagrad(learning_rate=0.1)
    fc = features(cache_bytes)
    small = 1000 * 16 * 4 + 1000 * 4  # in memory: weights and one row-wise float
    for placed, pieces in (
        ({"big": TableShard.table_wise(1)}, [0, VOCAB]),
        ({"big": TableShard.row_wise([0, 1], "div")}, [VOCAB // 2, VOCAB // 2]),
    ):
        p = ShardingPlan(world_size=2, tables={**placed, "small": TableShard.table_wise(0)})
        ranks, tables = estimate(p, fc, optimizer=opt)
        want = [tiers(n, cache_bytes) if n else {"ram": 0, "disk": 0} for n in pieces]
        by_name = {t.table: t for t in tables}
        assert by_name["big"].tiers == {k: want[0][k] + want[1][k] for k in ("ram", "disk")}
        assert by_name["big"].memory_bytes == want[0]["ram"] + want[1]["ram"]
        assert by_name["small"].tiers == {"ram": small}
        assert [r.tiers for r in ranks] == [
            {"ram": want[0]["ram"] + small, "disk": want[0]["disk"]},
            {"ram": want[1]["ram"], "disk": want[1]["disk"]},
        ]
        assert [r.memory_bytes for r in ranks] == [r.tiers["ram"] for r in ranks]


def test_embcore_plan_prints_the_tiers_per_table_and_rank(tmp_path, capsys):
    config = tmp_path / "tables.json"
    config.write_text(json.dumps({"tables": [
        {"name": "big", "vocabulary_size": VOCAB, "dim": DIM, "storage": "disk",
         "cache_bytes": "3MB"},
        {"name": "small", "vocabulary_size": 1000, "dim": 16}],
        "optimizer": "rowwise_adagrad"}))  # fmt: skip
    args = ["plan", "--config", str(config), "--world-size", "2"]
    assert main([*args, "--override", "big=table_wise:1", "--override", "small=table_wise:0"]) == 0
    out = capsys.readouterr().out
    want = tiers(VOCAB, 3_000_000)
    mib = [f"{want[k] / 2**20:.2f} MiB" for k in ("ram", "disk")]
    big = next(line for line in out.splitlines() if line.startswith("big "))
    assert mib[0] in big and mib[1] in big, big
    rank1 = next(line for line in out.splitlines() if line.startswith("1 "))
    assert mib[0] in rank1 and mib[1] in rank1, rank1
    assert "disk" in out.splitlines()[2]
    spec = json.loads(config.read_text())
    spec["tables"][0]["storage"] = "ssd"
    config.write_text(json.dumps(spec))
    assert main(args) == 2
    err = capsys.readouterr().err
    assert 'tables[0]: storage must be "memory" or "disk", got \'ssd\'' in err
    assert "Traceback" not in err


def test_the_planner_counts_what_a_built_table_in_memory_holds():
    """In memory, the planned bytes of a table are its row storage's ``memory()`` once built."""
    from embcore.rows import planned_memory

    for opt in (ec.Adagrad(learning_rate=0.1), ec.RowwiseAdagrad(learning_rate=0.1), ec.Adam()):
        table = ec.TableConfig(300, 24, name="m")
        engine = ec.EmbeddingEngine({"f": ec.FeatureConfig(table=table)}, opt)
        [resolved] = engine.tables
        assert engine.store.rows[0].memory() == planned_memory(resolved, 300, 24)


def test_a_dynamic_table_on_disk_is_planned_by_key_hash_per_tier():
    """Each key shard: its cache at capacity and its share of the key index in RAM, a record
    per expected row (``max_rows`` over the shards) on disk."""
    from embcore.sharding.schemes.key_hash import INDEX_BYTES_PER_KEY

    opt = ec.RowwiseAdagrad(learning_rate=0.1)
    storage = ec.DiskStorage("unused", cache_bytes=3_000_000)
    table = ec.TableConfig(
        None, DIM, name="d", eviction=ec.Eviction(max_rows=VOCAB), storage=storage
    )
    fc = {"f": ec.FeatureConfig(table=table)}
    placed = plan(fc, 2, optimizer=opt)
    assert placed["d"].scheme == "key_hash"
    ranks, tables = estimate(placed, fc, optimizer=opt)
    values = 4 * (DIM + 1)  # a key's row is never counted in RAM beyond the cache
    cache = (3_000_000 // (values + 40)) * (values + 40)
    shard = {"ram": cache + INDEX_BYTES_PER_KEY * VOCAB // 2, "disk": VOCAB // 2 * 512}
    assert [r.tiers for r in ranks] == [shard, shard]
    assert [r.memory_bytes for r in ranks] == [shard["ram"]] * 2
    assert tables[0].tiers == {k: 2 * v for k, v in shard.items()}
