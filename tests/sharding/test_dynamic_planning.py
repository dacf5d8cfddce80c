"""Plans and the planner with dynamic tables (no process group): dynamic tables are placed by
key hash, fixed ones never; the cost model sizes a dynamic table by the rows it is expected
to hold."""

from __future__ import annotations

import json
import re

import pytest
import torch

import embcore as ec
from embcore.cli.main import main
from embcore.config import resolve
from embcore.sharding import ShardingPlan, TableShard, estimate, plan
from embcore.sharding.planner import replication
from embcore.sharding.planner._tables import DYNAMIC_EXPECTED_ROWS, planned_tables
from embcore.sharding.schemes import KeyHash
from embcore.sharding.schemes.key_hash import INDEX_BYTES_PER_KEY

ADAGRAD = ec.Adagrad(learning_rate=0.1)


def features(max_rows: int | None = 100_000) -> dict[str, ec.FeatureConfig]:
    eviction = None if max_rows is None else ec.Eviction(max_rows=max_rows)
    user = ec.TableConfig(vocabulary_size=None, dim=16, name="user", eviction=eviction)
    item = ec.TableConfig(vocabulary_size=50_000, dim=16, name="item")
    tiny = ec.TableConfig(vocabulary_size=3, dim=4, name="tiny")
    return {
        "user": ec.FeatureConfig(table=user),
        "item": ec.FeatureConfig(table=item),
        "tiny": ec.FeatureConfig(table=tiny),
    }


def test_key_hash_placements_round_trip_and_describe_themselves():
    shard = TableShard.key_hash([1, 0])
    assert shard.to_dict() == {"scheme": "key_hash", "ranks": [1, 0]}
    assert TableShard.from_dict(shard.to_dict()) == shard
    assert shard.describe() == "key_hash on 1,0"
    p = ShardingPlan(world_size=2, tables={"user": shard})
    assert ShardingPlan.from_json(p.to_json()) == p


@pytest.mark.parametrize("world", [1, 2, 3])
def test_the_planner_places_dynamic_tables_by_key_hash_and_fixed_ones_otherwise(world: int):
    stats = {"tiny": {"ids_per_example": 5}, "user": {"ids_per_example": 50}}
    for kwargs in ({}, {"stats": stats}):  # the hot-table rule never replicates a dynamic table
        p = plan(features(), world, optimizer=ADAGRAD, **kwargs)
        assert p["user"] == TableShard.key_hash(range(world))
        assert p["item"].scheme != "key_hash" and p["tiny"].scheme != "key_hash"
        p.check(resolve(features(), ADAGRAD)[1], world)
    (verdict,) = [
        r for r in replication(features(), 2, optimizer=ADAGRAD, stats=stats) if r.table == "user"
    ]
    assert not verdict.replicate and "dynamic" in verdict.reason


def test_overrides_and_plans_must_match_the_kind_of_table():
    with pytest.raises(ValueError, match=re.escape("override 'row_wise' for table 'user'")):
        plan(features(), 2, overrides={"user": "row_wise"})
    with pytest.raises(ValueError, match="fixed tables take the schemes"):
        plan(features(), 2, overrides={"item": TableShard.key_hash([0, 1])})
    assert plan(features(), 2, overrides={"user": "key_hash"})["user"].scheme == "key_hash"
    tables = resolve(features(), ADAGRAD)[1]
    wrong = ShardingPlan(
        world_size=2,
        tables={
            "user": TableShard.row_wise([0, 1]),
            "item": TableShard.table_wise(0),
            "tiny": TableShard.table_wise(1),
        },
    )
    with pytest.raises(ValueError, match=r"table 'user' is a dynamic table .*\['key_hash'\]"):
        wrong.check(tables, 2)


def test_a_dynamic_table_is_planned_at_its_max_rows_or_the_default():
    for max_rows, rows in ((100_000, 100_000), (None, DYNAMIC_EXPECTED_ROWS)):
        config = resolve(features(max_rows), ADAGRAD)
        (user,) = [t for t in planned_tables(config, 256, None) if t.name == "user"]
        assert user.dynamic and user.vocab == rows
        # memory: weights and Adagrad's slot (2 x 16 floats) plus the index per row, an even
        # share on each of the 2 ranks (max_rows is the table's total)
        _, per_table = estimate(plan(features(max_rows), 2, optimizer=ADAGRAD), config)
        (load,) = [t for t in per_table if t.table == "user"]
        assert load.memory_bytes == pytest.approx(rows * (2 * 16 * 4 + INDEX_BYTES_PER_KEY))
        cost = KeyHash.cost(user, TableShard.key_hash([0, 1]), 2)
        assert cost.memory[0] == pytest.approx(cost.memory[1])
        # traffic: the unique keys and their counts out, their rows and row numbers back,
        # then per occurrence its key, looked-up row and 16-float contribution; each rank
        # sends the other's half
        ids = unique = 256.0
        out = (2 * 8 * unique + (8 + 8 + 4 * 16) * ids) / 2
        back = (4 * 16 + 8) * unique / 2
        assert cost.sent == pytest.approx([out + back, out + back])


def test_engines_refuse_plans_placing_a_table_by_the_wrong_kind():
    wrong = ShardingPlan(
        world_size=1,
        tables={
            "user": TableShard.table_wise(0),
            "item": TableShard.table_wise(0),
            "tiny": TableShard.table_wise(0),
        },
    )
    with pytest.raises(ValueError, match="table 'user' is a dynamic table"):
        ec.EmbeddingEngine(features(), ADAGRAD, plan=wrong)
    slot_fn = ec.Adagrad(
        learning_rate=0.1, slot_variable_creation_fn=lambda table, names, specs: {}
    )
    with pytest.raises(ValueError, match="slot_variable_creation_fn is not supported"):
        ec.EmbeddingEngine(features(), slot_fn, plan=plan(features(), 1))


def test_one_rank_sharded_engine_equals_one_process():
    # The protocol without a process group (world 1): lookups, training with admission and
    # eviction, keys, rows and state equal the single-process engine.
    def config() -> dict[str, ec.FeatureConfig]:
        user = ec.TableConfig(
            vocabulary_size=None, dim=3, name="user",
            admission=ec.CountAdmission(min_count=2), eviction=ec.Eviction(max_rows=4),
        )  # fmt: skip
        return {"u": ec.FeatureConfig(table=user), "v": ec.FeatureConfig(table=user)}

    one = ec.EmbeddingEngine(config(), ADAGRAD, backend="reference")
    sharded = ec.EmbeddingEngine(config(), ADAGRAD, backend="reference", plan=plan(config(), 1))
    assert type(sharded.store).__name__ == "ShardedStore"
    g = torch.Generator().manual_seed(3)
    for _ in range(4):
        batch = {k: torch.randint(-4, 4, (5,), generator=g) * (2**61 + 3) for k in ("u", "v")}
        acts = [e(batch) for e in (one, sharded)]
        for a in acts:
            sum(v.square().sum() for v in a.values()).backward()
        for k in batch:
            assert torch.equal(acts[0][k], acts[1][k])
        assert torch.equal(one.table_keys("user"), sharded.table_keys("user"))
    assert one.table_keys("user").numel() == 4
    probe = torch.tensor([0, 2**61 + 3, 99])
    assert torch.equal(one.table_rows("user", probe), sharded.table_rows("user", probe))
    want, got = one.state_dict(), sharded.state_dict()
    assert want.keys() == got.keys()
    for k in want:
        assert torch.equal(torch.as_tensor(want[k]), torch.as_tensor(got[k])), k


def test_cli_plan_places_a_dynamic_table_of_a_config_by_key_hash(tmp_path, capsys):
    config = tmp_path / "tables.json"
    tables = [
        {"name": "user", "vocabulary_size": None, "dim": 16, "max_rows": 50_000},
        {"name": "item", "vocabulary_size": 9, "dim": 4},
    ]
    config.write_text(json.dumps({"tables": tables}))
    assert main(["plan", "--config", str(config), "-w", "2", "--json"]) == 0
    p = ShardingPlan.from_json(capsys.readouterr().out)
    assert p["user"] == TableShard.key_hash([0, 1]) and p["item"].scheme != "key_hash"
    tables[1]["max_rows"] = 5
    config.write_text(json.dumps({"tables": tables}))
    assert main(["plan", "--config", str(config), "-w", "2"]) == 2
    assert "tables[1]: max_rows is for dynamic tables" in capsys.readouterr().err
