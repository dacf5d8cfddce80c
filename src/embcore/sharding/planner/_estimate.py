"""A plan's estimated memory and per-step traffic, per rank and per table (the cost model of
the schemes, summed). See ``docs/sharding.md`` ("Plans")."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from embcore._validate import check_int
from embcore.optimizers.base import Optimizer
from embcore.sharding.plan import ShardingPlan, TableShard
from embcore.sharding.planner._cost import cost
from embcore.sharding.planner._tables import planned_tables, resolved

__all__ = ["RankLoad", "TableLoad", "estimate"]


@dataclass(frozen=True)
class RankLoad:
    """One rank's estimated memory (bytes) and traffic (bytes per training step)."""

    rank: int
    memory_bytes: int
    bytes_sent: int
    bytes_received: int


@dataclass(frozen=True)
class TableLoad:
    """One table's placement and its estimated totals over all ranks."""

    table: str
    shard: TableShard
    memory_bytes: int
    bytes_sent: int


def estimate(
    sharding: ShardingPlan,
    feature_config: Any,
    *,
    optimizer: Optimizer | None = None,
    batch_size: int = 1024,
    stats: Mapping[str, Any] | None = None,
) -> tuple[list[RankLoad], list[TableLoad]]:
    """Estimated memory and per-step traffic of a plan, per rank and per table.

    Arguments as :func:`~embcore.sharding.plan`.
    """
    batch = check_int("estimate", "batch_size", batch_size, minimum=1)
    world = sharding.world_size
    per_rank = [[0.0, 0.0, 0.0] for _ in range(world)]
    per_table = []
    for t in planned_tables(resolved(feature_config, optimizer), batch, stats):
        shard = sharding[t.name]
        m, s, r = cost(t, shard, world)
        for i in range(world):
            per_rank[i][0] += m[i]
            per_rank[i][1] += s[i]
            per_rank[i][2] += r[i]
        per_table.append(TableLoad(t.name, shard, round(sum(m)), round(sum(s))))
    ranks = [RankLoad(i, round(m), round(s), round(r)) for i, (m, s, r) in enumerate(per_rank)]
    return ranks, per_table
