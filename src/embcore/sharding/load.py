"""Which ranks serve a table's lookups under a placement: the load lookup statistics record.

A sharded engine profiles each rank's own batch (SPEC 4.6) and counts, for every id looked up,
the rank(s) that serve it under the table's :class:`~embcore.sharding.spec.TableShard`. The
ranks' counts are summed when the statistics are written, so ``shard_load[r]`` is the number of
id occurrences rank ``r`` served in the sampled steps:

=================  ==========================================================================
``table_wise``     every id on the owner rank
``row_wise``       each id on the rank of its ``div``/``mod`` shard (SPEC 4.1): shard ``p``
                   lives on ``ranks[p]``; ranks outside ``ranks`` serve nothing
``column_wise``    every column owner serves every id (its columns of the row), so each of
                   ``ranks`` counts every id and the load sums to ``ids * len(ranks)``
``data_parallel``  each rank looks up its own batch in its replica: rank ``r`` counts its own
                   ids; the update then touches the union of all ranks' rows on every replica
=================  ==========================================================================

Occurrences are counted, not unique ids: row-wise deduplicates a rank's ids before fetching
them, but the backward sends every occurrence's contribution, and pooling reads every one.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from embcore.sharding import maps
from embcore.sharding.spec import TableShard

__all__ = ["lookup_load"]


def lookup_load(
    shard: TableShard, vocabulary_size: int, world_size: int, rank: int
) -> Callable[[np.ndarray], np.ndarray]:
    """The load function of one table on rank ``rank``: ``ids (N,) int64 -> (world_size,)
    int64`` id occurrences each rank serves when ``rank`` looks up ``ids``."""

    def one_rank(owner: int) -> Callable[[np.ndarray], np.ndarray]:
        def load(ids: np.ndarray) -> np.ndarray:
            out = np.zeros(world_size, dtype=np.int64)
            out[owner] = ids.size
            return out

        return load

    if shard.scheme == "table_wise":
        return one_rank(shard.ranks[0])
    if shard.scheme == "data_parallel":
        return one_rank(rank)
    owners = np.asarray(shard.ranks, dtype=np.int64)
    if shard.scheme == "column_wise":

        def every_owner(ids: np.ndarray) -> np.ndarray:
            out = np.zeros(world_size, dtype=np.int64)
            out[owners] = ids.size
            return out

        return every_owner
    strategy = shard.partition_strategy or "div"

    def row_wise(ids: np.ndarray) -> np.ndarray:
        p = maps.shard_of(torch.from_numpy(ids), vocabulary_size, len(owners), strategy).numpy()
        return np.bincount(owners[p], minlength=world_size)

    return row_wise
