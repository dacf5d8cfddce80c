"""The planner: a pure function from tables and a world size to a :class:`ShardingPlan`.

It places tables one at a time, largest first, each where the schemes' cost model (memory
and bytes per step, per rank) says the whole placement is best balanced; tables with lookup
statistics are replicated or not by the hot-table rule. Nothing here touches a process group;
``embcore plan`` prints a plan and its estimates. See ``docs/sharding.md`` ("Plans") and
``docs/pipelining_and_stats.md`` ("How the planner uses statistics").
"""

from embcore.sharding.planner._estimate import RankLoad, TableLoad, estimate
from embcore.sharding.planner._greedy import ASSUMED_MEMORY_PER_RANK
from embcore.sharding.planner._plan import plan
from embcore.sharding.planner._replication import (
    REPLICATE_MAX_BYTES,
    REPLICATE_MIN_LOOKUPS_PER_ROW,
    Replication,
    replication,
)

__all__ = [
    "ASSUMED_MEMORY_PER_RANK",
    "REPLICATE_MAX_BYTES",
    "REPLICATE_MIN_LOOKUPS_PER_ROW",
    "RankLoad",
    "Replication",
    "TableLoad",
    "estimate",
    "plan",
    "replication",
]
