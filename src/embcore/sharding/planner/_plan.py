"""``plan``: place every table of a feature config on the ranks, as a :class:`ShardingPlan`.

Overrides first, then the tables the hot-table rule replicates, then the rest largest first
by the balance score. See ``docs/sharding.md`` ("Plans").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from embcore._validate import check_int
from embcore.optimizers.base import Optimizer
from embcore.sharding.plan import ShardingPlan, TableShard
from embcore.sharding.planner._cost import allowed, candidates, cost
from embcore.sharding.planner._greedy import GreedyPlacement
from embcore.sharding.planner._replication import (
    REPLICATE_MAX_BYTES,
    REPLICATE_MIN_LOOKUPS_PER_ROW,
    replication,
)
from embcore.sharding.planner._tables import planned_tables, resolved
from embcore.sharding.schemes import SCHEMES, DataParallel, PlannedTable

__all__ = ["plan"]


def _override(t: PlannedTable, value: Any, world: int) -> list[TableShard]:
    """The candidates an override allows: a TableShard, or a scheme name (``row_wise:mod``,
    ``table_wise:1``) that the scheme parses."""
    if isinstance(value, TableShard):
        _check_kind(t, value.scheme)
        if not allowed(t, value):
            raise ValueError(
                f"plan: override {value.describe()} for table '{t.name}': its row storage "
                f"(TableConfig.storage) takes only the placements {list(t.placements or ())}"
            )
        return [value]
    if not isinstance(value, str):
        raise ValueError(
            f"plan: override for table '{t.name}' must be a TableShard or a scheme name, got "
            f"{type(value).__name__}"
        )
    name, _, arg = value.partition(":")
    scheme = SCHEMES.get(name)
    if scheme is not None:
        _check_kind(t, name)
    placements = None if scheme is None else scheme.parse_override(arg, t, world)
    if placements is None:
        raise ValueError(
            f"plan: unknown override {value!r} for table '{t.name}'; use one of {list(SCHEMES)}, "
            "'row_wise:div', 'row_wise:mod' or 'table_wise:<rank>'"
        )
    shards = [TableShard.from_dict(p) for p in placements]
    if not any(allowed(t, s) for s in shards):
        raise ValueError(
            f"plan: override {value!r} for table '{t.name}': its row storage "
            f"(TableConfig.storage) takes only the placements {list(t.placements or ())}"
        )
    return shards


def _check_kind(t: PlannedTable, scheme: str) -> None:
    if SCHEMES[scheme].dynamic != t.dynamic:
        kind = "dynamic" if t.dynamic else "fixed"
        allowed = [n for n, s in SCHEMES.items() if s.dynamic == t.dynamic]
        raise ValueError(
            f"plan: override {scheme!r} for table '{t.name}': {kind} tables take the schemes "
            f"{allowed}"
        )


def plan(
    feature_config: Any,
    world_size: int,
    *,
    optimizer: Optimizer | None = None,
    batch_size: int = 1024,
    stats: Mapping[str, Any] | None = None,
    overrides: Mapping[str, TableShard | str] | None = None,
    memory_per_rank: int | None = None,
    min_column_width: int = 32,
    replicate_max_bytes: int = REPLICATE_MAX_BYTES,
    replicate_min_lookups_per_row: float = REPLICATE_MIN_LOOKUPS_PER_ROW,
) -> ShardingPlan:
    """Place every table of a feature config on ``world_size`` ranks.

    Args:
        feature_config: the structure of :class:`FeatureConfig` the engine is built from, or
            the ``(features, tables)`` pair :func:`embcore.config.resolve` returns for it
            (not resolved again; its tables carry their optimizers).
        world_size: number of ranks.
        optimizer: the engine's global optimizer (its slots count as memory).
        batch_size: the per-rank batch size the traffic is estimated for.
        stats: table name -> lookup statistics: an ``embcore.stats.TableStats`` or a dict with
            ``ids_per_example`` (summed over the table's features) and ``unique_ratio``.
        overrides: table name -> a :class:`TableShard`, or a scheme name: ``"table_wise"``
            (the planner picks the rank), ``"table_wise:<rank>"``, ``"row_wise"``
            (``"row_wise:div"``), ``"row_wise:mod"``, ``"column_wise"``, ``"data_parallel"``.
        memory_per_rank: bytes a rank may hold; placements beyond it are not considered.
        min_column_width: the narrowest column shard the planner proposes.
        replicate_max_bytes, replicate_min_lookups_per_row: the hot-table rule's size and
            heat thresholds; it decides replication for every table in ``stats`` that has no
            override.

    Raises:
        ValueError: an override names an unknown table or scheme, or a table fits nowhere
            within ``memory_per_rank``.
    """
    world = check_int("plan", "world_size", world_size, minimum=1)
    batch = check_int("plan", "batch_size", batch_size, minimum=1)
    config = resolved(feature_config, optimizer)
    tables = planned_tables(config, batch, stats)
    names = [t.name for t in tables]
    overrides = dict(overrides or {})
    unknown = [n for n in overrides if n not in names]
    if unknown:
        raise ValueError(f"plan: overrides name unknown tables {unknown}; tables are {names}")

    # C: the traffic of every table row-wise over all ranks, spread evenly.
    everyone = TableShard.row_wise(list(range(world))) if world > 1 else None
    comm_total = sum(sum(cost(t, everyone, world).sent) if everyone else 0.0 for t in tables)
    placed = GreedyPlacement(world, memory_per_rank, max(comm_total / world, 1.0))

    verdicts = {
        r.table: r.replicate
        for r in replication(
            config,
            world,
            optimizer=optimizer,
            batch_size=batch,
            stats={n: v for n, v in (stats or {}).items() if n not in overrides},
            replicate_max_bytes=replicate_max_bytes,
            replicate_min_lookups_per_row=replicate_min_lookups_per_row,
            min_column_width=min_column_width,
        )
    }
    for t in tables:
        if t.name in overrides:
            placed.place(t, _override(t, overrides[t.name], world))
    replica = TableShard.data_parallel(world)
    for t in tables:  # replicas load every rank alike: place them before balancing the rest
        if verdicts.get(t.name) and allowed(t, replica) and placed.fits(t, replica):
            placed.place(t, [replica])
    for t in sorted(tables, key=lambda t: -t.bytes(t.vocab, t.dim)):
        if t.name not in placed.chosen:
            options = candidates(t, world, min_column_width)
            if t.name in verdicts:  # the rule has decided against replicating it
                options = [o for o in options if o.scheme != DataParallel.scheme]
            placed.place(t, options)
    return ShardingPlan(world_size=world, tables={n: placed.chosen[n] for n in names})
