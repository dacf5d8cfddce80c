"""Column-wise sharding: a wide table's columns split over ranks.

Each column shard is a table-wise table of its own columns: its owner looks up every rank's
ids in those columns and updates them; a rank's activation is the concatenation of the column
shards' answers. Pooling and element-wise optimizers act on each column independently, so this
is exact. Optimizers with row-wise slots (RowwiseAdagrad) need whole rows and are refused by
the plan check.

The ids of a feature travel to every column shard, so this pays off for wide tables whose
pooled activations cost more than their ids.
See ``docs/sharding.md`` ("Sharding schemes").
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from embcore.config import ResolvedTable
from embcore.sharding import maps
from embcore.sharding.schemes._base import Shard, ShardDict, served_by
from embcore.sharding.schemes._cost import PlannedTable
from embcore.sharding.schemes.table_wise import TableWise

__all__ = ["ColumnWise"]


class ColumnWise(TableWise):
    """``shard.column_sizes[k]`` columns on ``shard.ranks[k]``, left to right.

    The step protocol and the cost are table-wise's, once per column slice.
    """

    scheme = "column_wise"
    shard_fields = ("column_sizes",)

    # ------------------------------------------------------------ the plan format
    @classmethod
    def check_shard(cls, owner: str, shard: Shard) -> None:
        sizes = shard.column_sizes or ()
        if len(sizes) != len(shard.ranks):
            raise ValueError(
                f"{owner}: column_sizes needs one width per rank ({len(shard.ranks)}), got "
                f"{list(sizes)}"
            )

    @classmethod
    def check_table(cls, shard: Shard, table: ResolvedTable) -> None:
        """The column shards cover the dim, and the optimizer is element-wise (a row-wise
        slot such as RowwiseAdagrad's needs whole rows)."""
        if sum(shard.column_sizes or ()) != table.dim:
            raise ValueError(
                f"ShardingPlan: column-wise table '{table.name}' has dim {table.dim}, but its "
                f"column_sizes {list(shard.column_sizes or ())} sum to "
                f"{sum(shard.column_sizes or ())}"
            )
        opt = table.optimizer
        rowwise = [s.name for s in opt.slot_specs() if s.rowwise] if opt else []
        if rowwise:
            raise ValueError(
                f"ShardingPlan: table '{table.name}' cannot be column-wise: its optimizer "
                f"{type(opt).__name__} keeps row-wise slots {rowwise}, which need "
                "whole rows; use row_wise or table_wise"
            )

    @classmethod
    def describe(cls, shard: Shard) -> str:
        sizes = "+".join(map(str, shard.column_sizes or ()))
        return f"column_wise({sizes}) on {','.join(map(str, shard.ranks))}"

    # ------------------------------------------------------------------ planning
    @classmethod
    def candidates(cls, t: PlannedTable, world: int, min_column_width: int) -> list[ShardDict]:
        """All ranks, for element-wise tables at least ``min_column_width`` columns per rank."""
        if world > 1 and t.element_wise and t.dim >= world * min_column_width:
            return cls.parse_override("", t, world) or []
        return []

    @classmethod
    def parse_override(cls, arg: str, t: PlannedTable, world: int) -> list[ShardDict] | None:
        """``column_wise``: over all ranks, the first ``dim % world`` shards one column wider."""
        if arg:
            return None
        sizes = maps.shard_sizes(t.dim, world)
        return [{"scheme": cls.scheme, "ranks": list(range(world)), "column_sizes": sizes}]

    @classmethod
    def lookup_load(
        cls, shard: Shard, vocabulary_size: int, world_size: int, rank: int
    ) -> Callable[[np.ndarray], np.ndarray]:
        """Every column owner serves every id (its columns of the row)."""
        return served_by(list(shard.ranks), world_size)
