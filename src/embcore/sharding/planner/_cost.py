"""The planner's cost model: what the schemes report for a table, summed over placements.

Each scheme proposes its placements and estimates their per-rank memory and traffic; see
``docs/sharding.md`` ("Plans").
"""

from __future__ import annotations

from embcore.sharding.plan import TableShard
from embcore.sharding.schemes import SCHEMES, Cost, PlannedTable

__all__ = ["allowed", "candidates", "cost"]


def cost(t: PlannedTable, shard: TableShard, world: int) -> Cost:
    """Per-rank memory and per-step traffic of one table under one placement."""
    return shard.scheme_class.cost(t, shard, world)


def candidates(t: PlannedTable, world: int, min_column_width: int) -> list[TableShard]:
    """Every scheme's placements for ``t``, in :data:`SCHEMES` order (ties go to the first):
    the schemes for dynamic tables if ``t`` is one, else the others; only those its row
    storage can hold (:func:`allowed`)."""
    shards = [
        TableShard.from_dict(p)
        for scheme in SCHEMES.values()
        if scheme.dynamic == t.dynamic
        for p in scheme.candidates(t, world, min_column_width)
    ]
    return [s for s in shards if allowed(t, s)]


def allowed(t: PlannedTable, shard: TableShard) -> bool:
    """Whether ``t``'s row storage can hold the pieces ``shard`` gives the ranks."""
    return t.placements is None or shard.placement in t.placements
