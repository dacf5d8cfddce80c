"""The planner: a pure function from tables and a world size to a :class:`ShardingPlan`.

It places tables one at a time, largest first, each where a cost model says the whole
placement is best balanced. For a candidate placement the model estimates, per rank,

* **memory**: the rows (weights plus optimizer slots) the rank holds;
* **traffic**: bytes the rank sends plus receives per training step, from the batch size, the
  ids per example and their unique fraction (lookup statistics, SPEC 4.6, when given; else one
  id per sample), following each scheme's protocol;

and scores the placement by ``sum_r (traffic_r / C)^2 + sum_r (memory_r / M)^2``, with ``C``
the traffic of all tables row-wise spread evenly over the ranks and ``M`` the memory of a rank
(``memory_per_rank``, else :data:`ASSUMED_MEMORY_PER_RANK`): small, even traffic first, and
memory balance as it nears a rank's capacity.
Tiny tables come out data-parallel (an all-reduce of a few rows costs less than shipping
activations), big one-hot tables row-wise, and multi-hot tables table- or column-wise (pooled
activations are smaller than their ids' rows).

**Hot-table replication.** For a table with lookup statistics (SPEC 4.6), replication is
decided by one rule instead of the balance score (:func:`replication`): the table is made
data-parallel when all three hold,

1. it is small: weights plus optimizer slots at most ``replicate_max_bytes``
   (:data:`REPLICATE_MAX_BYTES`, 16 MiB), the memory every rank then spends on a replica;
2. it is hot: its lookups per step over all ranks are at least
   ``replicate_min_lookups_per_row`` (:data:`REPLICATE_MIN_LOOKUPS_PER_ROW`, 1) per row, so
   the dense all-reduce of the replicas' gradients carries rows that were actually read
   (for one-hot tables the cost condition below already needs about 2 lookups per row on 2
   ranks and 4 on 4; this bar keeps a table the statistics show cold from ever being
   replicated, and can be raised);
3. replication costs less: the all-reduce of its ``(vocab, dim + 1)`` gradient buffer moves
   fewer bytes per step (summed over ranks) than its cheapest sharded placement's all-to-alls
   of ids, rows, activations and gradients, in the cost model below.

Otherwise the table is not replicated. Tables without statistics keep the balance score.

Nothing here touches a process group; ``embcore plan`` prints a plan and its estimates.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from embcore._validate import check_int
from embcore.config import resolve
from embcore.optimizers.base import Optimizer
from embcore.sharding import maps
from embcore.sharding.spec import SCHEMES, ShardingPlan, TableShard

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

F32, I64 = 4, 8

#: The memory a rank is assumed to have for tables when ``memory_per_rank`` is not given.
ASSUMED_MEMORY_PER_RANK = 16 << 30

#: The largest table (weights plus optimizer slots, one replica) the hot-table rule replicates.
REPLICATE_MAX_BYTES = 16 << 20

#: Lookups per row and step (over all ranks) from which the hot-table rule counts a table hot.
REPLICATE_MIN_LOOKUPS_PER_ROW = 1.0


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


@dataclass(frozen=True)
class _Table:
    name: str
    vocab: int
    dim: int
    col_bytes: int  # per row and column: the weight and each element-wise slot
    row_bytes: int  # per row: row-wise slots
    samples: float  # per rank and step, over the table's features
    ids: float
    unique: float
    element_wise: bool

    def bytes(self, rows: int, cols: int) -> int:
        return rows * (cols * self.col_bytes + self.row_bytes)


def _tables(
    feature_config: Any, optimizer: Optimizer | None, batch_size: int, stats: Mapping | None
) -> list[_Table]:
    features, tables = resolve(feature_config, optimizer)
    out = []
    for t in tables:
        specs = t.optimizer.slot_specs() if t.optimizer else ()
        lengths = [features[i].config.max_sequence_length or 1 for i in t.features]
        samples = batch_size * sum(lengths)
        ids_per_example, unique_ratio = float(sum(lengths)), 1.0
        if stats is not None and t.name in stats:
            ids_per_example, unique_ratio = _stat(stats[t.name], t.name)
        ids = batch_size * ids_per_example
        out.append(
            _Table(
                name=t.name,
                vocab=t.vocabulary_size,
                dim=t.dim,
                col_bytes=F32 * (1 + sum(not s.rowwise for s in specs)),
                row_bytes=F32 * sum(s.rowwise for s in specs),
                samples=float(samples),
                ids=ids,
                unique=min(float(t.vocabulary_size), ids * unique_ratio),
                element_wise=not any(s.rowwise for s in specs),
            )
        )
    return out


def _stat(value: Any, name: str) -> tuple[float, float]:
    """``(ids per example, unique fraction)`` from an ``embcore.stats.TableStats`` or a dict."""
    if isinstance(value, Mapping):
        ipe, uniq = value.get("ids_per_example"), value.get("unique_ratio", 1.0)
    else:
        ipe, uniq = (
            getattr(value, "mean_ids_per_example", None),
            getattr(value, "unique_ratio", 1.0),
        )
    if not isinstance(ipe, (int, float)) or ipe < 0 or not 0 <= uniq <= 1:
        raise ValueError(
            f"plan: statistics of table '{name}' need ids_per_example >= 0 and unique_ratio in "
            f"[0, 1], got {ipe!r} and {uniq!r}"
        )
    return float(ipe), float(uniq)


# --------------------------------------------------------------------------- cost model
_DP = TableShard.data_parallel


def _loads(
    t: _Table, shard: TableShard, world: int
) -> tuple[list[float], list[float], list[float]]:
    """Per-rank (memory, sent, received) of one table under one placement."""
    mem, sent, recv = [0.0] * world, [0.0] * world, [0.0] * world
    batch_msg = I64 * (t.samples + 1) + (I64 + F32) * t.ids  # offsets, ids, gains
    if shard.scheme in ("table_wise", "column_wise"):
        # Forward: batch out, activations back; backward: batch again with the gradients.
        for owner, (lo, hi) in zip(shard.ranks, shard.column_bounds(t.dim), strict=True):
            mem[owner] += t.bytes(t.vocab, hi - lo)
            acts = F32 * t.samples * (hi - lo)
            for r in range(world):
                if r == owner:
                    continue
                out, back = 2 * batch_msg + acts, acts
                sent[r] += out
                recv[owner] += out
                sent[owner] += back
                recv[r] += back
    elif shard.scheme == "row_wise":
        n = len(shard.ranks)
        for p, (owner, rows) in enumerate(
            zip(shard.ranks, maps.shard_sizes(t.vocab, n), strict=True)
        ):
            del p
            mem[owner] += t.bytes(rows, t.dim)
            share = rows / t.vocab
            for r in range(world):
                if r == owner:
                    continue
                # ids to fetch, then every occurrence's (row, contribution) in the backward
                out = share * (I64 * t.unique + (I64 + F32 * t.dim) * t.ids)
                back = share * F32 * t.dim * t.unique
                sent[r] += out
                recv[owner] += out
                sent[owner] += back
                recv[r] += back
    else:  # data_parallel: a replica everywhere, an all-reduce of (vocab, dim + 1) floats
        ring = 2 * (world - 1) / world * F32 * t.vocab * (t.dim + 1)
        for r in range(world):
            mem[r] += t.bytes(t.vocab, t.dim)
            sent[r] += ring
            recv[r] += ring
    return mem, sent, recv


def _candidates(t: _Table, world: int, min_column_width: int) -> list[TableShard]:
    everyone = list(range(world))
    out = [TableShard.table_wise(r) for r in everyone]
    if world > 1:
        out.append(TableShard.row_wise(everyone, "div"))
        if t.element_wise and t.dim >= world * min_column_width:
            out.append(TableShard.column_wise(everyone, t.dim))
        out.append(TableShard.data_parallel(world))
    return out


def _replication(
    t: _Table, world: int, min_column_width: int, max_bytes: int, min_lookups_per_row: float
) -> Replication:
    """The hot-table rule (module docstring) for one table."""
    size = t.bytes(t.vocab, t.dim)
    lookups = world * t.ids / t.vocab
    sent = {
        shard.scheme: sum(_loads(t, shard, world)[1])
        for shard in _candidates(t, world, min_column_width)
    }
    replicated = sent.pop("data_parallel", 0.0)
    sharded = min(sent.values())
    if world == 1:
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

    Arguments as :func:`plan`; tables without an entry in ``stats`` are left out.
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
        _replication(t, world, min_column_width, max_bytes, float(replicate_min_lookups_per_row))
        for t in _tables(feature_config, optimizer, batch, stats)
        if stats is not None and t.name in stats
    ]


def _override(t: _Table, value: Any, world: int) -> list[TableShard]:
    """The candidates an override allows: a TableShard, or a scheme name (``row_wise:mod``,
    ``table_wise:1``)."""
    if isinstance(value, TableShard):
        return [value]
    if not isinstance(value, str):
        raise ValueError(
            f"plan: override for table '{t.name}' must be a TableShard or a scheme name, got "
            f"{type(value).__name__}"
        )
    scheme, _, arg = value.partition(":")
    everyone = list(range(world))
    if scheme == "table_wise":
        return (
            [TableShard.table_wise(int(arg))]
            if arg
            else [TableShard.table_wise(r) for r in everyone]
        )
    if scheme == "row_wise":
        return [TableShard.row_wise(everyone, arg or "div")]
    if scheme == "column_wise" and not arg:
        return [TableShard.column_wise(everyone, t.dim)]
    if scheme == "data_parallel" and not arg:
        return [TableShard.data_parallel(world)]
    raise ValueError(
        f"plan: unknown override {value!r} for table '{t.name}'; use one of {list(SCHEMES)}, "
        "'row_wise:div', 'row_wise:mod' or 'table_wise:<rank>'"
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
        feature_config: the structure of :class:`FeatureConfig` the engine is built from.
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
            heat thresholds (module docstring); it decides replication for every table in
            ``stats`` that has no override.

    Raises:
        ValueError: an override names an unknown table or scheme, or a table fits nowhere
            within ``memory_per_rank``.
    """
    world = check_int("plan", "world_size", world_size, minimum=1)
    batch = check_int("plan", "batch_size", batch_size, minimum=1)
    tables = _tables(feature_config, optimizer, batch, stats)
    names = [t.name for t in tables]
    overrides = dict(overrides or {})
    unknown = [n for n in overrides if n not in names]
    if unknown:
        raise ValueError(f"plan: overrides name unknown tables {unknown}; tables are {names}")

    comm_total = sum(
        sum(_loads(t, TableShard.row_wise(list(range(world))), world)[1]) if world > 1 else 0.0
        for t in tables
    )
    norm_m = float(memory_per_rank or ASSUMED_MEMORY_PER_RANK)
    norm_c = max(comm_total / world, 1.0)
    mem, traffic = [0.0] * world, [0.0] * world
    chosen: dict[str, TableShard] = {}

    def place(t: _Table, options: list[TableShard]) -> None:
        best, best_score = None, math.inf
        for shard in options:
            m, s, r = _loads(t, shard, world)
            new_mem = [a + b for a, b in zip(mem, m, strict=True)]
            if memory_per_rank is not None and max(new_mem) > memory_per_rank:
                continue
            new_traffic = [a + b + c for a, b, c in zip(traffic, s, r, strict=True)]
            score = sum((x / norm_m) ** 2 for x in new_mem) + sum(
                (x / norm_c) ** 2 for x in new_traffic
            )
            if score < best_score * (1 - 1e-9):
                best, best_score = shard, score
        if best is None:
            fullest = min(
                (
                    (max(a + b for a, b in zip(mem, _loads(t, o, world)[0], strict=True)), o)
                    for o in options
                ),
                key=lambda pair: pair[0],
            )
            raise ValueError(
                f"plan: table '{t.name}' ({t.vocab}x{t.dim}) does not fit in "
                f"memory_per_rank={memory_per_rank} bytes on {world} ranks: placed "
                f"{fullest[1].describe()}, a rank would hold {fullest[0]:.0f} bytes with the "
                "tables placed before it; add ranks, raise memory_per_rank or use a lighter "
                "optimizer"
            )
        m, s, r = _loads(t, best, world)
        for i in range(world):
            mem[i] += m[i]
            traffic[i] += s[i] + r[i]
        chosen[t.name] = best

    verdicts = {
        r.table: r.replicate
        for r in replication(
            feature_config,
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
            place(t, _override(t, overrides[t.name], world))
    for t in tables:  # replicas load every rank alike: place them before balancing the rest
        if verdicts.get(t.name) and (
            memory_per_rank is None
            or max(a + b for a, b in zip(mem, _loads(t, _DP(world), world)[0], strict=True))
            <= memory_per_rank
        ):
            place(t, [_DP(world)])
    for t in sorted(tables, key=lambda t: -t.bytes(t.vocab, t.dim)):
        if t.name not in chosen:
            options = _candidates(t, world, min_column_width)
            if t.name in verdicts:  # the rule has decided against replicating it
                options = [o for o in options if o.scheme != "data_parallel"]
            place(t, options)
    return ShardingPlan(world_size=world, tables={n: chosen[n] for n in names})


def estimate(
    sharding: ShardingPlan,
    feature_config: Any,
    *,
    optimizer: Optimizer | None = None,
    batch_size: int = 1024,
    stats: Mapping[str, Any] | None = None,
) -> tuple[list[RankLoad], list[TableLoad]]:
    """Estimated memory and per-step traffic of a plan, per rank and per table."""
    batch = check_int("estimate", "batch_size", batch_size, minimum=1)
    world = sharding.world_size
    per_rank = [[0.0, 0.0, 0.0] for _ in range(world)]
    per_table = []
    for t in _tables(feature_config, optimizer, batch, stats):
        shard = sharding[t.name]
        m, s, r = _loads(t, shard, world)
        for i in range(world):
            per_rank[i][0] += m[i]
            per_rank[i][1] += s[i]
            per_rank[i][2] += r[i]
        per_table.append(TableLoad(t.name, shard, round(sum(m)), round(sum(s))))
    ranks = [RankLoad(i, round(m), round(s), round(r)) for i, (m, s, r) in enumerate(per_rank)]
    return ranks, per_table
