"""The sharding schemes, one module each, and :data:`SCHEMES`: the one list of them.

A scheme class owns all its knowledge (plan-format rules, planner candidates and overrides,
cost, lookup load, and the step protocol); plans, the planner, the engine and the statistics
look schemes up here. Adding a scheme is one module (a :class:`Scheme` subclass) and its entry
in :data:`SCHEMES`. See ``docs/sharding.md``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from embcore.rows._piece import Piece
from embcore.sharding.schemes._base import (
    Scheme,
    Shard,
    ShardDict,
    ShardEnv,
    UpdateJob,
    is_dynamic,
)
from embcore.sharding.schemes._cost import Cost, PlannedTable
from embcore.sharding.schemes.column_wise import ColumnWise
from embcore.sharding.schemes.data_parallel import DataParallel
from embcore.sharding.schemes.key_hash import KeyHash
from embcore.sharding.schemes.row_wise import RowWise
from embcore.sharding.schemes.table_wise import TableWise

__all__ = [
    "SCHEMES",
    "ColumnWise",
    "Cost",
    "DataParallel",
    "KeyHash",
    "Piece",
    "PlannedTable",
    "RowWise",
    "Scheme",
    "Shard",
    "ShardDict",
    "ShardEnv",
    "TableWise",
    "UpdateJob",
    "is_dynamic",
    "lookup_load",
]

#: Scheme name -> implementation, in the order the planner tries them (the first of equally
#: good placements wins). The conformance list: shared tests run over every entry. Fixed
#: tables take the schemes whose ``dynamic`` is false, dynamic tables the others (key_hash).
SCHEMES: dict[str, type[Scheme]] = {
    s.scheme: s for s in (TableWise, RowWise, ColumnWise, DataParallel, KeyHash)
}


def lookup_load(
    shard: Shard, vocabulary_size: int | None, world_size: int, rank: int
) -> Callable[[np.ndarray], np.ndarray]:
    """The load function of one table placed by ``shard``, on rank ``rank``: ``ids (N,)
    int64 -> (world_size,) int64`` id occurrences each rank serves (see
    :meth:`Scheme.lookup_load`)."""
    return SCHEMES[shard.scheme].lookup_load(shard, vocabulary_size, world_size, rank)
