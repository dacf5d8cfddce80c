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
                 key's owner, with the key
    update       each owner finds the keys' rows (dropping keys without one), runs ops.update
                 in feature then rank order, then ends the step of its key space (eviction)

Since every occurrence of a key reaches its one owner, counts, admission, steps-to-live and
initial values are those of one process. ``max_rows`` is split over the shards; see
``docs/sharding.md`` ("Dynamic tables").
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from embcore import ops
from embcore.config import ResolvedTable
from embcore.inputs import FeatureBatch
from embcore.sharding._wire import F32, I64, contributions, occurrences
from embcore.sharding.comm import Exchange, Inbox, Reducer
from embcore.sharding.keyhash import key_shard
from embcore.sharding.schemes._base import Scheme, Shard, ShardDict, ShardEnv, UpdateJob
from embcore.sharding.schemes._cost import F32_BYTES, I64_BYTES, Cost, PlannedTable
from embcore.sharding.schemes._piece import Piece

if TYPE_CHECKING:
    from embcore.sharding.schemes._key_rows import KeyRows

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


#: training lookups whose rows are remembered until their update (as one process does)
_REMEMBERED = 8
#: how an owner finds the rows of an update's keys: the rows of their training lookup, those
#: rows where their keys still hold them (an eviction came between), or the rows held now
_AS_LOOKED_UP, _IF_STILL_HELD, _HELD_NOW = 0, 1, 2


class KeyHash(Scheme):
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
        (``t.vocab``), with the index and row metadata."""
        cost = Cost.zeros(world)
        mem, sent, recv = cost
        n = len(shard.ranks)
        rows = t.vocab / n
        for owner in shard.ranks:
            mem[owner] += t.bytes(1, t.dim) * rows + INDEX_BYTES_PER_KEY * rows
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
        self.rows: KeyRows | None = None
        if self.rank in self.owner:  # the dynamic package loads its kernels: only if used
            from embcore.sharding.schemes._key_rows import KeyRows

            self.rows = KeyRows(table, env.seed, env.device)
        self.max_rows: int | None = table.config.eviction and table.config.eviction.max_rows
        #: steps ended (every rank counts, owner or not: the key spaces' step)
        self.step = 0
        # id(batch) -> (batch, (N,) rows of its keys at its training lookup, step then)
        self._trained: OrderedDict[int, tuple[FeatureBatch, Tensor, int]] = OrderedDict()

    def piece(self, rank: int) -> Piece | None:
        return None  # a dynamic table has no rows by range: see ``rows``

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
        numbers, which the update uses as one process does)."""
        if self.rows is None:
            return
        keys = [inbox.take(src, I64).reshape(-1) for src in range(self.world)]
        sizes = [k.numel() for k in keys]
        flat = torch.cat(keys)
        if ctx.training:
            mult = torch.cat([inbox.take(src, I64).reshape(-1) for src in range(self.world)])
            rows = self.rows.train(flat, mult)
        else:
            rows = self.rows.find(flat)
        for src, (part, numbers) in enumerate(
            zip(torch.split(self.rows.read(rows), sizes), torch.split(rows, sizes), strict=True)
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
            self._trained[id(b)] = (b, by_unique[ctx.inverse[at : at + n]], self.step)
            at += n
            while len(self._trained) > _REMEMBERED:
                self._trained.popitem(last=False)

    def grad_dist(
        self, batches: list[FeatureBatch], grads: list[Tensor], ex: Exchange, reducer: Reducer
    ) -> None:
        """Every key occurrence's contribution to the key's owner, with the key and the row
        its training lookup gave it."""
        for batch, grad in zip(batches, grads, strict=True):
            entry = self._trained.pop(id(batch), None)
            if entry is None or entry[0] is not batch:  # never looked up for training
                mode, looked_up = _HELD_NOW, torch.full_like(batch.values, -1)
            else:
                mode = _AS_LOOKED_UP if entry[2] == self.step else _IF_STILL_HELD
                looked_up = entry[1]
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
        features, grads = [], []
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
            features.append(occurrences(found[held]))
            grads.append(torch.cat(parts)[held])
        return UpdateJob(self.rows.state(), features, grads, self.table.index)

    # ------------------------------------------------------------- table views
    def gather_send(self, name: str, ex: Exchange) -> None:
        """Gathering ``weight`` or a slot (a collective): this shard's keys and values to
        every rank."""
        if self.rows is not None:
            keys = self.rows.keys()
            values = self.rows.read(self.rows.find(keys), name)
            for dest in range(self.world):
                if dest != self.rank:
                    ex.send(dest, keys)
                    ex.send(dest, values)

    def gather_take(self, name: str, inbox: Inbox) -> Tensor:
        """``(R, ...)``: the values of every key holding a row, in ascending key order (as
        one process's ``embedding_tables`` and ``slot_variables`` give a dynamic table)."""
        keys, values = [], []
        for src in self.owner:
            if src == self.rank:
                assert self.rows is not None
                k = self.rows.keys()
                keys.append(k)
                values.append(self.rows.read(self.rows.find(k), name))
            else:
                keys.append(inbox.take(src, I64).reshape(-1))
                tail = self.logical_tail(name)
                values.append(inbox.take(src, F32, *tail))
        order = torch.argsort(torch.cat(keys))
        return torch.cat(values)[order.to(self.env.device)]

    def logical_tail(self, name: str) -> tuple[int, ...]:
        """The shape of one key's ``weight`` or slot value."""
        if name == "weight":
            return (self.table.dim,)
        spec = {s.name: s for s in self.table.optimizer.slot_specs()}[name]  # type: ignore[union-attr]
        return () if spec.rowwise else (self.table.dim,)

    def held(self) -> int:
        """Keys holding a row on this rank."""
        return 0 if self.rows is None else len(self.rows.keyspace)

    def keys_send(self, ex: Exchange) -> None:
        """Gathering the table's keys (a collective): this shard's keys to every rank."""
        if self.rows is not None:
            mine = self.rows.keys()
            for dest in range(self.world):
                if dest != self.rank:
                    ex.send(dest, mine)

    def keys_take(self, inbox: Inbox) -> Tensor:
        """``(R,) int64``: every shard's keys, ascending."""
        parts = [
            self.rows.keys() if src == self.rank and self.rows is not None else inbox.take(src, I64)
            for src in self.owner
        ]
        return torch.sort(torch.cat(parts).reshape(-1)).values

    def rows_send(self, keys: Tensor, ex: Exchange) -> _Forward:
        """Reading the rows of ``keys`` (a collective; never inserts): ask the owners."""
        return self._ask([], keys, ex, training=False)

    def rows_serve(self, inbox: Inbox, ex: Exchange, ctx: _Forward) -> None:
        self.lookup(inbox, ex, ctx)

    def rows_take(self, inbox: Inbox, ctx: _Forward) -> Tensor:
        """``(K, dim) float32``: the rows of the keys asked for, zeros for keys without one."""
        dim = self.table.dim
        fetched = torch.cat([inbox.take(self.owner[p], F32, dim) for p in range(self.num_shards)])
        rows = torch.empty_like(fetched)
        rows[ctx.order] = fetched
        return rows[ctx.inverse]

    # ------------------------------------------------------------- whole content
    def content(self, everyone: list[Any]) -> dict[str, np.ndarray]:
        """The whole table's content from every rank's :meth:`KeyRows.content` (``None`` from
        ranks that hold no shard), as one process's ``dynamic_state`` gives it."""
        from embcore.sharding.schemes._key_rows import merge_states

        return merge_states([c for c in everyone if c is not None])

    def load_content(self, state: dict[str, Any]) -> None:
        """Keep this shard's keys of a whole table's content (every rank gets the same; keys
        are hashed onto this world's shards, whatever wrote the state)."""
        self._check_content(state)
        keys = np.asarray(state["keys"], dtype=np.int64)
        pending = np.asarray(state.get("pending/keys", np.zeros(0, np.int64)), dtype=np.int64)
        if self.rows is not None:
            p = self.owner.index(self.rank)
            mine = (key_shard(keys, self.num_shards) == p).numpy()
            pending_mine = (key_shard(pending, self.num_shards) == p).numpy()
            self.rows.load(state, mine, pending_mine)
        self.step = int(np.asarray(state["step"]))
        self._trained.clear()

    def _check_content(self, state: dict[str, Any]) -> None:
        """Raise ``ValueError`` naming the table and the part unless ``state`` is a whole
        content of this table (checked on every rank, before any change)."""
        name = self.table.name
        for part in ("step", "keys", "freq", "last_seen", "weight", *self._slot_names()):
            if part not in state:
                raise ValueError(f"table '{name}': a dynamic table's state needs '{part}'")
        keys = np.asarray(state["keys"])
        if keys.ndim != 1 or keys.dtype != np.int64:
            raise ValueError(f"table '{name}': saved 'keys' must be (R,) int64")
        n = keys.size
        for part in ("freq", "last_seen", "weight", *self._slot_names()):
            want = (n, *self.logical_tail(part)) if part not in ("freq", "last_seen") else (n,)
            got = tuple(np.shape(state[part]))
            if got != want:
                raise ValueError(
                    f"table '{name}': saved '{part}' must have shape {want}, got {got}"
                )

    def _slot_names(self) -> list[str]:
        opt = self.table.optimizer
        return [s.name for s in opt.slot_specs()] if opt else []
