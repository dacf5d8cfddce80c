"""Key-hash sharding of dynamic tables: each key on the rank its mixed 64-bit hash picks.

A dynamic table (``vocabulary_size=None``) has no rows to split by range; key ``k`` lives on
shard ``key_shard(k, len(ranks))`` (:mod:`embcore.sharding.keyhash`), on rank
``ranks[shard]``, which holds the key's row, slots, count and last-seen step in its own key
space. The protocol is row-wise's, with keys in place of local rows::

    input_dist   each rank dedups the table's keys over its features and sends each owner its
                 keys (and, in a training lookup, how often each occurs)
    lookup       each owner makes ONE lookup of every rank's keys: a training lookup counts
                 every occurrence, admits and inserts (all ranks' occurrences at once: the
                 single-process lookup of the concatenated batch); then it sends the rows back,
                 zeros for keys without a row
    output_dist  each rank pools its own samples from the fetched rows, with its own weights
                 and combiner (the single-process lookup, bit for bit)
    grad_dist    for every key occurrence, the contribution gain * dL/dact[sample] goes to the
                 key's owner, with the key and the row its training lookup gave it
    update       each owner takes those rows (dropping keys that had none, or lost it since),
                 runs ops.update in feature then rank order; then every shard ends its step
                 (:mod:`._key_steps`: ``max_rows`` is the whole table's, chosen over shards)

Since every occurrence of a key reaches its one owner, counts, admission, steps-to-live and
initial values are those of one process (a user initializer is called with every shard's new
keys: in such a training lookup the owners share their new keys first and reply a phase
later). See ``docs/sharding.md`` ("Dynamic tables").
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from embcore import ops
from embcore._comm import Comm, Exchange, Inbox, Reducer
from embcore.config import ResolvedTable
from embcore.inputs import FeatureBatch
from embcore.rows import RowEnv, make_rows
from embcore.rows._piece import Piece
from embcore.sharding._wire import F32, I64, contributions, occurrences
from embcore.sharding.keyhash import key_shard
from embcore.sharding.schemes._base import Scheme, Shard, ShardDict, ShardEnv, UpdateJob
from embcore.sharding.schemes._cost import F32_BYTES, I64_BYTES, Cost, PlannedTable
from embcore.sharding.schemes._key_steps import end_steps
from embcore.sharding.schemes._key_views import KeyViews

if TYPE_CHECKING:
    from embcore.rows.keyed import KeyedRows

__all__ = ["INDEX_BYTES_PER_KEY", "KeyHash"]

#: The key index's and the row metadata's bytes per key, for the cost model (about 20 + 25).
INDEX_BYTES_PER_KEY = 45


@dataclass
class _Forward:
    batches: list[FeatureBatch]
    inverse: Tensor  # (N_total,) position of each key (all features) in the unique keys
    order: Tensor  # unique keys sorted by shard (stable)
    counts: list[int]  # unique keys per shard
    training: bool
    sizes: list[int] = field(default_factory=list)  # owners: the keys from each rank
    rows: Tensor | None = None  # owners: their rows


#: training lookups (per feature of the table) whose rows are remembered until their update,
#: as one process does
_REMEMBERED = 8
#: how an owner finds the rows of an update's keys: the rows of their training lookup, those
#: rows where their keys still hold them (an eviction came between), or the rows held now
_AS_LOOKED_UP, _IF_STILL_HELD, _HELD_NOW = 0, 1, 2


class KeyHash(KeyViews, Scheme):
    """Shard ``p`` of the key hash on ``shard.ranks[p]``; for dynamic tables only."""

    scheme = "key_hash"
    dynamic = True

    # ------------------------------------------------------------ the plan format
    @classmethod
    def describe(cls, shard: Shard) -> str:
        return f"key_hash on {','.join(map(str, shard.ranks))}"

    @classmethod
    def check_table(cls, shard: Shard, table: ResolvedTable) -> None:
        opt = table.optimizer
        if opt is not None and opt.slot_variable_creation_fn is not None:
            raise ValueError(
                f"table '{table.name}': slot_variable_creation_fn is not supported for dynamic "
                "tables (vocabulary_size=None): new rows take the slots' initial values"
            )

    # ------------------------------------------------------------------ planning
    @classmethod
    def candidates(cls, t: PlannedTable, world: int, min_column_width: int) -> list[ShardDict]:
        return cls.parse_override("", t, world)

    @classmethod
    def parse_override(cls, arg: str, t: PlannedTable, world: int) -> list[ShardDict] | None:
        """``key_hash``: over all ranks."""
        if arg:
            return None
        return [{"scheme": cls.scheme, "ranks": list(range(world))}]

    @classmethod
    def cost(cls, t: PlannedTable, shard: Shard, world: int) -> Cost:
        """Traffic of a training step, an equal share per shard: each unique key and its
        occurrence count out, its row and row number back; each occurrence's key, looked-up
        row and contribution in the backward. Memory: each shard's share of the expected rows
        (``t.vocab``), with the index and row metadata (``t.index_bytes`` a row)."""
        cost = Cost.zeros(world)
        mem, sent, recv = cost
        n = len(shard.ranks)
        rows = t.vocab / n
        for owner in shard.ranks:
            mem[owner] += t.bytes(rows, t.dim)
            for r in range(world):
                if r == owner:
                    continue
                out = (2 * I64_BYTES * t.unique + (2 * I64_BYTES + F32_BYTES * t.dim) * t.ids) / n
                back = (F32_BYTES * t.dim + I64_BYTES) * t.unique / n
                sent[r] += out
                recv[owner] += out
                sent[owner] += back
                recv[r] += back
        return cost

    @classmethod
    def lookup_load(
        cls, shard: Shard, vocabulary_size: int | None, world_size: int, rank: int
    ) -> Callable[[np.ndarray], np.ndarray]:
        """Each key on the rank of its shard."""
        owners = np.asarray(shard.ranks, dtype=np.int64)

        def load(ids: np.ndarray) -> np.ndarray:
            p = key_shard(np.ascontiguousarray(ids, dtype=np.int64), len(owners)).numpy()
            return np.bincount(owners[p], minlength=world_size)

        return load

    # ------------------------------------------------------------------- runtime
    def __init__(self, table: ResolvedTable, shard: Shard, env: ShardEnv) -> None:
        self.owner = list(shard.ranks)
        self.num_shards = len(self.owner)
        super().__init__(table, shard, env)  # no piece: ``state`` stays None
        self.rows: KeyedRows | None = None  # type: ignore[assignment]
        if self.rank in self.owner:  # keyed rows load the index kernels: only if used
            row_env = RowEnv(env.seed, env.device, rank=self.rank)  # a disk shard's directory
            rows = make_rows(table, row_env, shard=True, shards=self.num_shards)
            self.rows = rows  # type: ignore[assignment]
        eviction = table.config.eviction
        self.max_rows: int | None = eviction.max_rows if eviction is not None else None
        self.flush_before_training_lookup = eviction is not None and eviction.evicts
        #: steps ended (every rank counts, owner or not: the key spaces' step)
        self.step = 0
        # (batch, (N,) rows of its keys at its training lookup, step then), oldest first:
        # updates come in the order of their lookups (a batch may be looked up more than once)
        self._trained: deque[tuple[FeatureBatch, Tensor, int]] = deque()

    def piece(self, rank: int) -> Piece | None:
        return None  # a dynamic table has no rows by range: see ``rows``

    @classmethod
    def end_steps(cls, schemes: list[Scheme], comm: Comm) -> None:
        """Eviction decided over every shard (:func:`._key_steps.end_steps`)."""
        end_steps(schemes, comm)  # type: ignore[arg-type]

    def shape(self, name: str) -> tuple[int, ...]:
        """``(keys held on any rank, ...)`` (a collective)."""
        held = sum(r[0] for r in self.comm.all_gather_ints([self.held()]))
        return (held, *self.logical_tail(name))

    def _split(self, keys: Tensor) -> tuple[Tensor, list[int]]:
        """The grouping order of ``keys`` by shard (stable) and the keys per shard."""
        shard = key_shard(keys, self.num_shards)
        order = torch.argsort(shard, stable=True)
        counts = torch.bincount(shard, minlength=self.num_shards).tolist()
        return order.to(keys.device), counts

    # ------------------------------------------------------------------ the step
    def input_dist(
        self, batches: list[FeatureBatch], ex: Exchange, training: bool = False
    ) -> _Forward:
        """Send each owner the unique keys (and, training, how often each occurs)."""
        keys = torch.cat([b.values for b in batches])
        return self._ask(batches, keys, ex, training)

    def _ask(
        self, batches: list[FeatureBatch], keys: Tensor, ex: Exchange, training: bool
    ) -> _Forward:
        unique, inverse, mult = torch.unique(keys, return_inverse=True, return_counts=True)
        order, counts = self._split(unique)
        for p, part in enumerate(torch.split(unique[order], counts)):
            ex.send(self.owner[p], part)
        if training:
            for p, part in enumerate(torch.split(mult[order], counts)):
                ex.send(self.owner[p], part)
        return _Forward(batches, inverse, order, counts, training)

    def lookup(self, inbox: Inbox, ex: Exchange, ctx: _Forward) -> None:
        """Owners: one lookup of every rank's keys; the rows go back (and, training, the row
        numbers, which the update uses as one process does). With a user initializer
        (:meth:`late`), the owners first share their new keys and reply in :meth:`lookup_late`.
        """
        if self.rows is None:
            return
        keys = [inbox.take(src, I64).reshape(-1) for src in range(self.world)]
        ctx.sizes = [k.numel() for k in keys]
        flat = torch.cat(keys)
        if ctx.training:
            mult = torch.cat([inbox.take(src, I64).reshape(-1) for src in range(self.world)])
            ctx.rows = self.rows.train_keys(flat, mult, defer=self.late(ctx))
        else:
            ctx.rows = self.rows.find(flat)
        if not self.late(ctx):
            self._reply(ex, ctx)
            return
        for dest in self.owner:
            if dest != self.rank:
                ex.send(dest, torch.from_numpy(self.rows.new[0]))

    def late(self, ctx: _Forward) -> bool:
        """Whether the owners reply a phase later: a training lookup of a table with a user
        initializer, which is called once with every shard's new keys."""
        return ctx.training and self.table.config.initializer is not None

    def lookup_late(self, inbox: Inbox, ex: Exchange, ctx: _Forward) -> None:
        """Owners: initialise the new rows from every shard's new keys, then reply."""
        if self.rows is None:
            return
        new = [
            self.rows.new[0] if src == self.rank else inbox.take(src, I64).numpy()
            for src in self.owner
        ]
        self.rows.initialise(np.sort(np.concatenate(new)))
        self._reply(ex, ctx)

    def _reply(self, ex: Exchange, ctx: _Forward) -> None:
        assert self.rows is not None and ctx.rows is not None
        values, rows = self.rows.read_rows(ctx.rows), ctx.rows
        for src, (part, numbers) in enumerate(
            zip(torch.split(values, ctx.sizes), torch.split(rows, ctx.sizes), strict=True)
        ):
            ex.send(src, part)
            if ctx.training:
                ex.send(src, numbers)

    def output_dist(self, inbox: Inbox, ctx: _Forward) -> list[Tensor]:
        dim = self.table.dim
        fetched, numbers = [], []
        for p in range(self.num_shards):
            fetched.append(inbox.take(self.owner[p], F32, dim))
            if ctx.training:
                numbers.append(inbox.take(self.owner[p], I64).reshape(-1))
        values = torch.cat(fetched)
        rows = torch.empty_like(values)
        rows[ctx.order] = values  # (U, dim): the row of each unique key (zeros: no row)
        if ctx.training:
            self._remember(ctx, torch.cat(numbers))
        compact = ops.TableState(self.table.name, rows, {}, None)
        remapped, at = [], 0
        for b in ctx.batches:
            n = b.values.numel()
            values = ctx.inverse[at : at + n]
            remapped.append(FeatureBatch(values, b.offsets, b.weights, b.combiner, b.output_shape))
            at += n
        return ops.lookup(self.env.backend, [compact], [remapped])[0]

    def _remember(self, ctx: _Forward, numbers: Tensor) -> None:
        """Keep each batch's row numbers from its training lookup for its update."""
        by_unique = torch.empty_like(numbers)
        by_unique[ctx.order] = numbers
        at = 0
        for b in ctx.batches:
            n = b.values.numel()
            self._trained.append((b, by_unique[ctx.inverse[at : at + n]], self.step))
            at += n
            while len(self._trained) > _REMEMBERED * max(1, len(self.features)):
                self._trained.popleft()

    def grad_dist(
        self, batches: list[FeatureBatch], grads: list[Tensor], ex: Exchange, reducer: Reducer
    ) -> None:
        """Every key occurrence's contribution to the key's owner, with the key and the row
        its training lookup gave it."""
        for batch, grad in zip(batches, grads, strict=True):
            i = next((i for i, e in enumerate(self._trained) if e[0] is batch), None)
            if i is None:  # never looked up for training
                mode, looked_up = _HELD_NOW, torch.full_like(batch.values, -1)
            else:  # its oldest training lookup
                _, looked_up, step = self._trained[i]
                del self._trained[i]
                mode = _AS_LOOKED_UP if step == self.step else _IF_STILL_HELD
            contrib = contributions(batch, grad)  # (N, dim)
            order, counts = self._split(batch.values)
            parts = zip(
                torch.split(batch.values[order], counts),
                torch.split(looked_up[order], counts),
                torch.split(contrib[order], counts),
                strict=True,
            )
            for p, (keys, rows, part) in enumerate(parts):
                ex.send(self.owner[p], torch.tensor([mode], dtype=I64))
                ex.send(self.owner[p], keys)
                ex.send(self.owner[p], rows)
                ex.send(self.owner[p], part)

    def update(self, inbox: Inbox, reduced: list[Tensor], ctx: None) -> UpdateJob | None:
        if self.rows is None:
            return None
        dim = self.table.dim
        held_rows, grads = [], []
        for _ in self.features:  # feature order, then rank order: the single-process order
            rows, parts = [], []
            for src in range(self.world):
                mode = int(inbox.take(src, I64)[0])
                keys = inbox.take(src, I64).reshape(-1)
                looked_up = inbox.take(src, I64).reshape(-1)
                parts.append(inbox.take(src, F32, dim))
                if mode == _AS_LOOKED_UP:
                    rows.append(looked_up)
                else:
                    now = self.rows.find(keys)
                    still = torch.where(now == looked_up, looked_up, -1)
                    rows.append(now if mode == _HELD_NOW else still)
            found = torch.cat(rows)
            held = found >= 0  # no row (pending, or evicted since the lookup): dropped
            self.rows.dropped_gradients += int((~held).sum())
            held_rows.append(found[held])
            grads.append(torch.cat(parts)[held])
        # every feature's rows in one call: a row cache (disk) keeps them all for the update
        slots = self.rows.slots_of(torch.cat(held_rows))
        features = [occurrences(s) for s in torch.split(slots, [r.numel() for r in held_rows])]
        return UpdateJob(self.rows.state(), features, grads, self.table.index)
