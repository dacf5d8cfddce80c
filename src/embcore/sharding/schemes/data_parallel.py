"""Data-parallel replication: small tables copied on every rank.

::

    forward   each rank looks up its own batch in its replica; no communication
    backward  each rank sums its contributions per row into a dense (vocab, dim + 1) buffer
              whose last column counts occurrences; one all-reduce (fused over every
              data-parallel table) sums them over ranks; every rank then updates the rows
              that any rank touched, identically

A row touched only on another rank is still updated on this replica, and a touched row whose
gradients cancel to zero still counts as touched (``docs/semantics.md`` §3.1). The dense
buffer costs ``vocab * (dim + 1)`` floats per step, which is why the planner keeps this scheme
for small tables. Summing per rank before the all-reduce changes the order of float additions,
so the result equals the single-process step up to rounding.
See ``docs/sharding.md`` ("Sharding schemes").
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor

from embcore import ops
from embcore._comm import Exchange, Inbox, Reducer
from embcore.inputs import FeatureBatch
from embcore.rows._piece import Piece
from embcore.sharding._wire import contributions, occurrences
from embcore.sharding.schemes._base import Scheme, Shard, ShardDict, UpdateJob, served_by
from embcore.sharding.schemes._cost import F32_BYTES, Cost, PlannedTable

__all__ = ["DataParallel"]


class DataParallel(Scheme):
    """A full replica of the table on every rank."""

    scheme = "data_parallel"

    # ------------------------------------------------------------ the plan format
    @classmethod
    def check_in_plan(cls, table: str, shard: Shard, world_size: int) -> None:
        if shard.ranks != tuple(range(world_size)):
            raise ValueError(
                f"ShardingPlan: data-parallel table '{table}' must be on every rank "
                f"{list(range(world_size))}, got {list(shard.ranks)}"
            )

    @classmethod
    def describe(cls, shard: Shard) -> str:
        return "data_parallel on all"

    # ------------------------------------------------------------------ planning
    @classmethod
    def candidates(cls, t: PlannedTable, world: int, min_column_width: int) -> list[ShardDict]:
        return [cls.on_every_rank(world)] if world > 1 else []

    @classmethod
    def parse_override(cls, arg: str, t: PlannedTable, world: int) -> list[ShardDict] | None:
        return None if arg else [cls.on_every_rank(world)]

    @staticmethod
    def on_every_rank(world: int) -> ShardDict:
        """The one data-parallel placement on ``world`` ranks."""
        return {"scheme": DataParallel.scheme, "ranks": list(range(world))}

    @classmethod
    def cost(cls, t: PlannedTable, shard: Shard, world: int) -> Cost:
        """A replica everywhere and a ring all-reduce of ``(vocab, dim + 1)`` floats."""
        cost = Cost.zeros(world)
        ring = 2 * (world - 1) / world * F32_BYTES * t.vocab * (t.dim + 1)
        for r in range(world):
            cost.memory[r] += t.bytes(t.vocab, t.dim)
            cost.sent[r] += ring
            cost.received[r] += ring
        return cost

    @classmethod
    def lookup_load(
        cls, shard: Shard, vocabulary_size: int, world_size: int, rank: int
    ) -> Callable[[np.ndarray], np.ndarray]:
        """Each rank looks up its own batch in its replica."""
        return served_by([rank], world_size)

    # ------------------------------------------------------------------- runtime
    def piece(self, rank: int) -> Piece | None:
        return Piece.range(0, self.table.vocabulary_size, (0, self.table.dim))

    def input_dist(
        self, batches: list[FeatureBatch], ex: Exchange, training: bool = False
    ) -> list[FeatureBatch]:
        assert self.rows is not None
        return self.rows.map(batches, training)

    def output_dist(self, inbox: Inbox, ctx: list[FeatureBatch]) -> list[Tensor]:
        assert self.rows is not None
        return ops.lookup(self.env.backend, [self.rows.state()], [ctx])[0]

    def grad_dist(
        self, batches: list[FeatureBatch], grads: list[Tensor], ex: Exchange, reducer: Reducer
    ) -> int:
        vocab, dim = self.table.vocabulary_size, self.table.dim
        dense = torch.zeros(vocab, dim + 1, dtype=torch.float32, device=self.env.device)
        for batch, grad in zip(batches, grads, strict=True):
            dense[:, :dim].index_add_(0, batch.values, contributions(batch, grad))
            ones = torch.ones(batch.values.numel(), dtype=torch.float32, device=dense.device)
            dense[:, dim].index_add_(0, batch.values, ones)
        return reducer.add(dense)

    def update(self, inbox: Inbox, reduced: list[Tensor], ctx: int) -> UpdateJob | None:
        dense = reduced[ctx]
        dim = self.table.dim
        touched = torch.nonzero(dense[:, dim] > 0).reshape(-1)
        return self.job([occurrences(touched)], [dense[touched, :dim]])

    # ------------------------------------------------------------- whole tensors
    def gather_send(self, name: str, ex: Exchange) -> None:
        pass  # every rank holds the whole table

    def gather_take(self, name: str, inbox: Inbox) -> Tensor:
        mine = self.local(name)
        assert mine is not None
        return mine.clone()

    def save_chunks(self, name: str) -> list[tuple[tuple[int, ...], Tensor]]:
        # One copy of a replicated table (docs/semantics.md §5.1).
        return super().save_chunks(name) if self.rank == 0 else []

    def load_chunks(self, name: str) -> list[tuple[tuple[int, ...], Tensor]]:
        return super().save_chunks(name)  # every replica reads the whole tensor
