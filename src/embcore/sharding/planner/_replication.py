"""The hot-table rule: whether a table with lookup statistics is replicated (data-parallel).

A table is replicated when it is small, hot, and its all-reduce costs less than its cheapest
sharded placement's all-to-alls; the rule and its defaults are described in
``docs/pipelining_and_stats.md`` ("How the planner uses statistics").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from embcore._validate import check_int
from embcore.optimizers.base import Optimizer
from embcore.sharding.planner._cost import candidates, cost
from embcore.sharding.planner._tables import planned_tables, resolved
from embcore.sharding.schemes import DataParallel, PlannedTable

__all__ = [
    "REPLICATE_MAX_BYTES",
    "REPLICATE_MIN_LOOKUPS_PER_ROW",
    "Replication",
    "replication",
]

#: The largest table (weights plus optimizer slots, one replica) the hot-table rule replicates.
REPLICATE_MAX_BYTES = 16 << 20

#: Lookups per row and step (over all ranks) from which the hot-table rule counts a table hot.
REPLICATE_MIN_LOOKUPS_PER_ROW = 1.0


@dataclass(frozen=True)
class Replication:
    """The hot-table rule's inputs and verdict for one table with lookup statistics.

    Attributes:
        table: the table's name.
        replica_bytes: weights plus optimizer slots of one replica.
        lookups_per_row: id lookups per step over all ranks, divided by the table's rows.
        all_reduce_bytes: bytes sent per step, summed over ranks, when replicated.
        all_to_all_bytes: the same for the cheapest sharded placement.
        replicate: whether the rule replicates the table.
        reason: why, in a few words.
    """

    table: str
    replica_bytes: int
    lookups_per_row: float
    all_reduce_bytes: int
    all_to_all_bytes: int
    replicate: bool
    reason: str


def _verdict(
    t: PlannedTable, world: int, min_column_width: int, max_bytes: int, min_lookups_per_row: float
) -> Replication:
    """The hot-table rule for one table."""
    size = t.bytes(t.vocab, t.dim)
    lookups = world * t.ids / t.vocab
    sent = {
        shard.scheme: sum(cost(t, shard, world).sent)
        for shard in candidates(t, world, min_column_width)
    }
    replicated = sent.pop(DataParallel.scheme, 0.0)
    sharded = min(sent.values(), default=0.0)
    if t.dynamic:
        verdict, reason = False, "dynamic: placed by key hash"
    elif world == 1:
        verdict, reason = False, "one rank"
    elif size > max_bytes:
        verdict, reason = False, f"over {max_bytes / (1 << 20):g} MiB"
    elif lookups < min_lookups_per_row:
        verdict, reason = False, f"cold: under {min_lookups_per_row:g} lookups/row/step"
    elif replicated >= sharded:
        verdict, reason = False, "all-reduce costs more than all-to-all"
    else:
        verdict, reason = True, "small, hot, all-reduce cheaper"
    return Replication(t.name, size, lookups, round(replicated), round(sharded), verdict, reason)


def replication(
    feature_config: Any,
    world_size: int,
    *,
    optimizer: Optimizer | None = None,
    batch_size: int = 1024,
    stats: Mapping[str, Any] | None = None,
    replicate_max_bytes: int = REPLICATE_MAX_BYTES,
    replicate_min_lookups_per_row: float = REPLICATE_MIN_LOOKUPS_PER_ROW,
    min_column_width: int = 32,
) -> list[Replication]:
    """The hot-table rule's verdict for every table that has statistics, in table order.

    Arguments as :func:`~embcore.sharding.plan`; tables without an entry in ``stats`` are
    left out.
    """
    world = check_int("replication", "world_size", world_size, minimum=1)
    batch = check_int("replication", "batch_size", batch_size, minimum=1)
    max_bytes = check_int("replication", "replicate_max_bytes", replicate_max_bytes, minimum=0)
    if not isinstance(replicate_min_lookups_per_row, (int, float)) or not (
        replicate_min_lookups_per_row >= 0
    ):
        raise ValueError(
            "replication: replicate_min_lookups_per_row must be a number >= 0, got "
            f"{replicate_min_lookups_per_row!r}"
        )
    return [
        _verdict(t, world, min_column_width, max_bytes, float(replicate_min_lookups_per_row))
        for t in planned_tables(resolved(feature_config, optimizer), batch, stats)
        if stats is not None and t.name in stats
    ]
