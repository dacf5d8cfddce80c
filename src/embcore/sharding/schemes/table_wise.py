"""Table-wise sharding: the whole table on one rank, which serves every rank's lookups.

::

    input_dist   every rank sends each feature's (offsets, ids, gains) to the owner
    lookup       the owner pools each rank's batch: (S_r, dim) activations, sent back
    output_dist  each rank receives its own activations
    grad_dist    each rank sends the batch again with its (S_r, dim) activation gradients
    update       the owner concatenates all ranks' batches and gradients (rank order) and runs
                 the table's ``ops.update`` once: the single-process step on the global batch

Sending the ids again in the backward costs ``12 bytes per id`` but leaves nothing stored
between a lookup and its update.

The owner's work is written for any set of column slices, so column-wise sharding
(:mod:`embcore.sharding.schemes.column_wise`) is this scheme once per column shard.
See ``docs/sharding.md`` ("Sharding schemes").
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor

from embcore import ops
from embcore._comm import Exchange, Inbox, Reducer
from embcore.config import ResolvedTable
from embcore.inputs import FeatureBatch
from embcore.rows._piece import Piece
from embcore.sharding._wire import F32, concat_batches, send_batch, take_batch
from embcore.sharding.schemes._base import Scheme, Shard, ShardDict, ShardEnv, UpdateJob, served_by
from embcore.sharding.schemes._cost import F32_BYTES, Cost, PlannedTable

__all__ = ["TableWise"]


class TableWise(Scheme):
    """A table on one rank (or, as :class:`ColumnWise`, each column slice on one rank)."""

    scheme = "table_wise"

    # ------------------------------------------------------------ the plan format
    @classmethod
    def check_shard(cls, owner: str, shard: Shard) -> None:
        if len(shard.ranks) != 1:
            raise ValueError(
                f"{owner}: a table-wise table lives on exactly one rank, got {shard.ranks}"
            )

    @classmethod
    def describe(cls, shard: Shard) -> str:
        return f"{cls.scheme} on {','.join(map(str, shard.ranks))}"

    # ------------------------------------------------------------------ planning
    @classmethod
    def candidates(cls, t: PlannedTable, world: int, min_column_width: int) -> list[ShardDict]:
        return [{"scheme": cls.scheme, "ranks": [r]} for r in range(world)]

    @classmethod
    def parse_override(cls, arg: str, t: PlannedTable, world: int) -> list[ShardDict] | None:
        """``table_wise`` (the planner picks the rank) or ``table_wise:<rank>``."""
        if arg:
            return [{"scheme": cls.scheme, "ranks": [int(arg)]}]
        return cls.candidates(t, world, 0)

    @classmethod
    def cost(cls, t: PlannedTable, shard: Shard, world: int) -> Cost:
        """Forward: the batch goes out, activations come back; backward: the batch again with
        its activation gradients. Column-wise: the same once per column slice."""
        cost = Cost.zeros(world)
        mem, sent, recv = cost
        for owner, (lo, hi) in zip(shard.ranks, shard.column_bounds(t.dim), strict=True):
            mem[owner] += t.bytes(t.vocab, hi - lo)
            acts = F32_BYTES * t.samples * (hi - lo)
            for r in range(world):
                if r == owner:
                    continue
                out, back = 2 * t.batch_message + acts, acts
                sent[r] += out
                recv[owner] += out
                sent[owner] += back
                recv[r] += back
        return cost

    @classmethod
    def lookup_load(
        cls, shard: Shard, vocabulary_size: int, world_size: int, rank: int
    ) -> Callable[[np.ndarray], np.ndarray]:
        """Every id on the owner rank."""
        return served_by([shard.ranks[0]], world_size)

    # ------------------------------------------------------------------- runtime
    def __init__(self, table: ResolvedTable, shard: Shard, env: ShardEnv) -> None:
        #: (rank, (lo, hi)) of every column slice; one slice of all columns for table-wise.
        self.owners = list(zip(shard.ranks, shard.column_bounds(table.dim), strict=True))
        super().__init__(table, shard, env)

    def piece(self, rank: int) -> Piece | None:
        for owner, cols in self.owners:
            if owner == rank:
                return Piece.range(0, self.table.vocabulary_size, cols)
        return None

    def input_dist(self, batches: list[FeatureBatch], ex: Exchange, training: bool = False) -> bool:
        for owner, _ in self.owners:
            for batch in batches:
                send_batch(ex, owner, batch)
        return training

    def lookup(self, inbox: Inbox, ex: Exchange, ctx: bool) -> None:
        if self.rows is None:
            return
        n = len(self.features)
        received = [[take_batch(inbox, src) for _ in range(n)] for src in range(self.world)]
        flat = self.rows.map([b for per_rank in received for b in per_rank], ctx)
        acts = ops.lookup(self.env.backend, [self.rows.state()], [flat])[0]
        for i, act in enumerate(acts):
            ex.send(i // n, act)

    def output_dist(self, inbox: Inbox, ctx: bool) -> list[Tensor]:
        out = []
        for _ in self.features:
            parts = [inbox.take(owner, F32, hi - lo) for owner, (lo, hi) in self.owners]
            out.append(parts[0] if len(parts) == 1 else torch.cat(parts, dim=1))
        return out

    def grad_dist(
        self, batches: list[FeatureBatch], grads: list[Tensor], ex: Exchange, reducer: Reducer
    ) -> None:
        for owner, (lo, hi) in self.owners:
            for batch, grad in zip(batches, grads, strict=True):
                send_batch(ex, owner, batch)
                ex.send(owner, grad if len(self.owners) == 1 else grad[:, lo:hi])

    def update(self, inbox: Inbox, reduced: list[Tensor], ctx: None) -> UpdateJob | None:
        if self.rows is None:
            return None
        cols = self.rows.shape("weight")[1]
        features, grads = [], []
        for _ in self.features:  # each feature: all ranks' samples in rank order
            received, parts = [], []
            for src in range(self.world):
                received.append(take_batch(inbox, src))
                parts.append(inbox.take(src, F32, cols))
            features.append(concat_batches(received))
            grads.append(torch.cat(parts))
        return self.job(features, grads)
