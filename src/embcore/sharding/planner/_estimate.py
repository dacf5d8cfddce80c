"""A plan's estimated memory and per-step traffic, per rank and per table (the cost model of
the schemes, summed). See ``docs/sharding.md`` ("Plans")."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from embcore._validate import check_int
from embcore.optimizers.base import Optimizer
from embcore.sharding.plan import ShardingPlan, TableShard
from embcore.sharding.planner._cost import cost
from embcore.sharding.planner._tables import planned_tables, resolved
from embcore.sharding.schemes import PlannedTable

__all__ = ["RankLoad", "TableLoad", "estimate", "tier_memory"]


@dataclass(frozen=True)
class RankLoad:
    """One rank's estimated memory (bytes: RAM, or the GPU's for a CUDA engine) and traffic
    (bytes per training step); ``tiers``: bytes per tier (``"ram"``, ``"disk"``)."""

    rank: int
    memory_bytes: int
    bytes_sent: int
    bytes_received: int
    tiers: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class TableLoad:
    """One table's placement and its estimated totals over all ranks (``tiers``: bytes per
    tier)."""

    table: str
    shard: TableShard
    memory_bytes: int
    bytes_sent: int
    tiers: dict[str, int] = field(default_factory=dict)


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
    rank_tiers: list[dict[str, int]] = [{} for _ in range(world)]
    per_table = []
    for t in planned_tables(resolved(feature_config, optimizer), batch, stats):
        shard = sharding[t.name]
        m, s, r = cost(t, shard, world)
        for i in range(world):
            per_rank[i][0] += m[i]
            per_rank[i][1] += s[i]
            per_rank[i][2] += r[i]
        tiers = tier_memory(t, shard, world)
        for tier, per in tiers.items():
            for i in range(world):
                rank_tiers[i][tier] = rank_tiers[i].get(tier, 0) + per[i]
        totals = {tier: sum(per) for tier, per in tiers.items()}
        per_table.append(TableLoad(t.name, shard, round(sum(m)), round(sum(s)), totals))
    ranks = [
        RankLoad(i, round(m), round(s), round(r), rank_tiers[i])
        for i, (m, s, r) in enumerate(per_rank)
    ]
    return ranks, per_table


def tier_memory(t: PlannedTable, shard: TableShard, world: int) -> dict[str, list[int]]:
    """Tier -> bytes of ``t`` on each rank under ``shard``: the scheme's memory estimate
    (:meth:`~embcore.sharding.schemes.Scheme.cost`) with ``t`` counting only that tier."""
    out = {}
    for tier in t.tiers(t.vocab, t.dim):

        def counted(rows: int, cols: int, tier: str = tier) -> dict[str, int]:
            return {"counted": t.tiers(rows, cols)[tier]}  # any tier but "disk" is counted

        one = replace(t, memory_of=counted, index_bytes=0)  # the index is in t's "ram"
        out[tier] = [round(m) for m in cost(one, shard, world).memory]
    return out
