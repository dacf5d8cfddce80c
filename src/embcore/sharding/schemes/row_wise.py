"""Row-wise sharding: rows split over ranks by the ``div`` or ``mod`` map.

The maps are ``docs/semantics.md`` §4.1 (:mod:`embcore.sharding.maps`).

::

    input_dist   each rank dedups the table's ids over its features and sends each shard the
                 local rows it needs
    lookup       each shard owner gathers those rows and sends them back
    output_dist  each rank pools its own samples from the fetched rows, with its own weights
                 and combiner (the single-process lookup, bit for bit)
    grad_dist    for every id occurrence, the contribution gain * dL/dact[sample] goes to the
                 shard owning the id, with the id's local row
    update       each owner runs ops.update on its shard with every rank's contributions, in
                 feature then rank order: the per-row sums of the single-process step

Sending contributions per occurrence (not pre-summed per rank) keeps each row's sum in the
single-process order; a shard with no rows (vocabulary smaller than the number of shards) takes
part in the protocol with empty messages.
See ``docs/sharding.md`` ("Sharding schemes").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from embcore import ops
from embcore._comm import Exchange, Inbox, Reducer
from embcore.config import ResolvedTable
from embcore.inputs import FeatureBatch
from embcore.rows._piece import Piece
from embcore.sharding import maps
from embcore.sharding._wire import F32, I64, contributions, occurrences
from embcore.sharding.schemes._base import Scheme, Shard, ShardDict, ShardEnv, UpdateJob
from embcore.sharding.schemes._cost import F32_BYTES, I64_BYTES, Cost, PlannedTable

__all__ = ["RowWise"]


@dataclass
class _Forward:
    batches: list[FeatureBatch]
    inverse: Tensor  # (N_total,) position of each id (all features) in the unique ids
    order: Tensor  # unique ids sorted by shard (stable)
    counts: list[int]  # unique ids per shard
    training: bool = False


class RowWise(Scheme):
    """Shard ``p`` of the ``div``/``mod`` map on ``shard.ranks[p]``."""

    scheme = "row_wise"
    shard_fields = ("partition_strategy",)

    # ------------------------------------------------------------ the plan format
    @classmethod
    def check_shard(cls, owner: str, shard: Shard) -> None:
        if shard.partition_strategy not in maps.STRATEGIES:
            raise ValueError(
                f"{owner}: partition_strategy must be one of {list(maps.STRATEGIES)}, got "
                f"{shard.partition_strategy!r}"
            )

    @classmethod
    def describe(cls, shard: Shard) -> str:
        return f"row_wise({shard.partition_strategy}) on {','.join(map(str, shard.ranks))}"

    # ------------------------------------------------------------------ planning
    @classmethod
    def candidates(cls, t: PlannedTable, world: int, min_column_width: int) -> list[ShardDict]:
        return cls.parse_override("", t, world) if world > 1 else []

    @classmethod
    def parse_override(cls, arg: str, t: PlannedTable, world: int) -> list[ShardDict]:
        """``row_wise`` (``div``) or ``row_wise:<div|mod>``, over all ranks."""
        return [
            {"scheme": cls.scheme, "ranks": list(range(world)), "partition_strategy": arg or "div"}
        ]

    @classmethod
    def cost(cls, t: PlannedTable, shard: Shard, world: int) -> Cost:
        """The unique ids to fetch and their rows back, then every occurrence's (row,
        contribution) in the backward; each shard's share in proportion to its rows."""
        cost = Cost.zeros(world)
        mem, sent, recv = cost
        n = len(shard.ranks)
        for owner, rows in zip(shard.ranks, maps.shard_sizes(t.vocab, n), strict=True):
            mem[owner] += t.bytes(rows, t.dim)
            share = rows / t.vocab
            for r in range(world):
                if r == owner:
                    continue
                out = share * (I64_BYTES * t.unique + (I64_BYTES + F32_BYTES * t.dim) * t.ids)
                back = share * F32_BYTES * t.dim * t.unique
                sent[r] += out
                recv[owner] += out
                sent[owner] += back
                recv[r] += back
        return cost

    @classmethod
    def lookup_load(
        cls, shard: Shard, vocabulary_size: int, world_size: int, rank: int
    ) -> Callable[[np.ndarray], np.ndarray]:
        """Each id on the rank of its ``div``/``mod`` shard: shard ``p`` lives on
        ``ranks[p]``; ranks outside ``ranks`` serve nothing."""
        owners = np.asarray(shard.ranks, dtype=np.int64)
        strategy = shard.partition_strategy or "div"

        def load(ids: np.ndarray) -> np.ndarray:
            p = maps.shard_of(torch.from_numpy(ids), vocabulary_size, len(owners), strategy)
            return np.bincount(owners[p.numpy()], minlength=world_size)

        return load

    # ------------------------------------------------------------------- runtime
    def __init__(self, table: ResolvedTable, shard: Shard, env: ShardEnv) -> None:
        self.strategy = str(shard.partition_strategy)
        self.num_shards = len(shard.ranks)
        self.owner = list(shard.ranks)
        super().__init__(table, shard, env)

    def _index(self, rank: int) -> int | None:
        return self.owner.index(rank) if rank in self.owner else None

    def piece(self, rank: int) -> Piece | None:
        p = self._index(rank)
        if p is None:
            return None
        vocab, dim = self.table.vocabulary_size, self.table.dim
        if self.strategy == "div":
            starts = maps.div_starts(vocab, self.num_shards)
            return Piece.range(starts[p], starts[p + 1], (0, dim))
        return Piece(maps.global_ids(p, vocab, self.num_shards, "mod"), (0, dim), None)

    def _split(self, ids: Tensor) -> tuple[Tensor, Tensor, list[int]]:
        """Local rows of ``ids`` grouped by shard (stable), the grouping order, counts."""
        vocab = self.table.vocabulary_size
        shard = maps.shard_of(ids, vocab, self.num_shards, self.strategy)
        order = torch.argsort(shard, stable=True)
        counts = torch.bincount(shard, minlength=self.num_shards).tolist()
        local = maps.local_of(ids[order], vocab, self.num_shards, self.strategy)
        return local, order, counts

    # ------------------------------------------------------------------ the step
    def input_dist(
        self, batches: list[FeatureBatch], ex: Exchange, training: bool = False
    ) -> _Forward:
        ids = torch.cat([b.values for b in batches])
        unique, inverse = torch.unique(ids, return_inverse=True)
        local, order, counts = self._split(unique)
        for p, part in enumerate(torch.split(local, counts)):
            ex.send(self.owner[p], part)
        return _Forward(batches, inverse, order, counts, training)

    def lookup(self, inbox: Inbox, ex: Exchange, ctx: _Forward) -> None:
        """Every rank's rows in one call of the row storage (a cache brings each in once)."""
        if self.rows is None:
            return
        asked = [occurrences(inbox.take(src, I64).reshape(-1)) for src in range(self.world)]
        mapped = self.rows.map(asked, ctx.training)
        weight = self.rows.state().weight  # after map: a cache may have grown for the call
        for src, batch in enumerate(mapped):
            ex.send(src, weight.index_select(0, batch.values.to(weight.device)).float())

    def output_dist(self, inbox: Inbox, ctx: _Forward) -> list[Tensor]:
        dim = self.table.dim
        fetched = torch.cat([inbox.take(self.owner[p], F32, dim) for p in range(self.num_shards)])
        rows = torch.empty_like(fetched)
        rows[ctx.order] = fetched  # (U, dim): row of each unique id
        # Pool from the fetched rows with this rank's own weights and combiner.
        compact = ops.TableState(self.table.name, rows, {}, None)
        remapped, at = [], 0
        for b in ctx.batches:
            n = b.values.numel()
            values = ctx.inverse[at : at + n]
            remapped.append(FeatureBatch(values, b.offsets, b.weights, b.combiner, b.output_shape))
            at += n
        return ops.lookup(self.env.backend, [compact], [remapped])[0]

    def grad_dist(
        self, batches: list[FeatureBatch], grads: list[Tensor], ex: Exchange, reducer: Reducer
    ) -> None:
        for batch, grad in zip(batches, grads, strict=True):
            contrib = contributions(batch, grad)  # (N, dim)
            local, order, counts = self._split(batch.values)
            for p, (rows, part) in enumerate(
                zip(torch.split(local, counts), torch.split(contrib[order], counts), strict=True)
            ):
                ex.send(self.owner[p], rows)
                ex.send(self.owner[p], part)

    def update(self, inbox: Inbox, reduced: list[Tensor], ctx: None) -> UpdateJob | None:
        if self.state is None:
            return None
        dim = self.table.dim
        features, grads = [], []
        for _ in self.features:  # feature order, then rank order: the single-process order
            ids, parts = [], []
            for src in range(self.world):
                ids.append(inbox.take(src, I64).reshape(-1))
                parts.append(inbox.take(src, F32, dim))
            features.append(occurrences(torch.cat(ids)))
            grads.append(torch.cat(parts))
        return self.job(features, grads)

    # ------------------------------------------------------------- checkpoints
    def _move(self, tensor: Tensor | None, src: str, dst: str) -> Tensor | None:
        """Re-lay a shard from the ``src`` map to the ``dst`` map (both over ``ranks``)."""
        vocab, n, device = self.table.vocabulary_size, self.num_shards, self.env.device
        ex = self.comm.exchange()
        p = self._index(self.rank)
        if p is not None:
            assert tensor is not None
            dest = maps.shard_of(maps.global_ids(p, vocab, n, src, device), vocab, n, dst)
            for q in range(n):  # ids ascending within each destination
                ex.send(self.owner[q], tensor[dest == q])
        inbox = ex.run()
        if p is None:
            return None
        assert tensor is not None
        tail = tuple(tensor.shape[1:])
        came_from = maps.shard_of(maps.global_ids(p, vocab, n, dst, device), vocab, n, src)
        out = torch.empty(int(came_from.numel()), *tail, dtype=tensor.dtype, device=tensor.device)
        for q in range(n):
            out[came_from == q] = inbox.take(self.owner[q], tensor.dtype, *tail).reshape(-1, *tail)
        inbox.check_empty()
        return out

    def _div_start(self) -> int:
        p = self._index(self.rank)
        assert p is not None
        return maps.div_starts(self.table.vocabulary_size, self.num_shards)[p]

    def save_chunks(self, name: str) -> list[tuple[tuple[int, ...], Tensor]]:
        if self.strategy == "div":
            return super().save_chunks(name)
        # A checkpoint holds the plain (vocab, dim) table (docs/semantics.md §6, pitfall 22):
        # write mod shards as the contiguous div shards they would be.
        laid = self._move(self.local(name), "mod", "div")
        if laid is None or laid.numel() == 0:
            return []
        start = self._div_start()
        return [((start,) if laid.dim() == 1 else (start, 0), laid)]

    def load_chunks(self, name: str) -> list[tuple[tuple[int, ...], Tensor]]:
        if self.strategy == "div":
            return super().load_chunks(name)
        mine = self.local(name)
        if mine is None:
            return []
        p = self._index(self.rank)
        assert p is not None
        rows = maps.shard_sizes(self.table.vocabulary_size, self.num_shards)[p]
        buf = mine.new_empty(rows, *mine.shape[1:])
        if rows == 0:
            return []
        start = self._div_start()
        return [((start,) if buf.dim() == 1 else (start, 0), buf)]

    def finish_load(self, name: str, chunks: list[tuple[tuple[int, ...], Tensor]]) -> None:
        if self.strategy == "div":
            return super().finish_load(name, chunks)
        mine = self.local(name)
        staged = (
            chunks[0][1]
            if chunks
            else (None if mine is None else mine.new_empty(0, *mine.shape[1:]))
        )
        laid = self._move(staged, "div", "mod")
        if mine is not None and laid is not None:
            self.rows.write(name, laid)
