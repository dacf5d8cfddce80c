"""Reading and moving a key-hash (dynamic) table's content: keys, rows, whole state.

The collectives behind ``table_keys``, ``table_rows``, ``table_info``, ``embedding_tables`` /
``slot_variables`` (every key's values in ascending key order) and ``state_dict`` of a sharded
engine (a scheme's reads by key, declared by :class:`~embcore.sharding.schemes.Scheme`), and
the loading of a whole table's state onto this world's shards (each rank keeps the keys its
hash picks, whatever number of ranks wrote it). A mixin of
:class:`~embcore.sharding.schemes.key_hash.KeyHash`. See ``docs/sharding.md`` ("Dynamic
tables").
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor

from embcore._comm import Comm, Exchange, Inbox
from embcore.config import ResolvedTable
from embcore.rows._contract import whole_tensor_error
from embcore.sharding._wire import F32, I64
from embcore.sharding.keyhash import key_shard
from embcore.sharding.schemes._base import ShardEnv

if TYPE_CHECKING:
    from embcore.rows.keyed import KeyedRows

__all__ = ["KeyViews", "merge_states"]


class KeyViews:
    """The content collectives of a key-hash table (mixed into ``KeyHash``)."""

    table: ResolvedTable
    env: ShardEnv
    comm: Comm
    rows: KeyedRows | None
    owner: list[int]
    num_shards: int
    rank: int
    world: int
    step: int
    _trained: deque

    if TYPE_CHECKING:  # KeyHash's

        def _ask(self, batches: list, keys: Tensor, ex: Exchange, training: bool) -> Any: ...

        def lookup(self, inbox: Inbox, ex: Exchange, ctx: Any) -> None: ...

    # ------------------------------------------------------------- table views
    def gather_send(self, name: str, ex: Exchange) -> None:
        """Gathering ``weight`` or a slot (a collective): this shard's keys and values to
        every rank."""
        if self.rows is not None:
            keys, values = self.rows.keys(), self.rows.read(name).float()
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
                keys.append(self.rows.keys())
                values.append(self.rows.read(name).float())  # by key, caching nothing
            else:
                keys.append(inbox.take(src, I64).reshape(-1))
                tail = self.logical_tail(name)
                values.append(inbox.take(src, F32, *tail))
        order = torch.argsort(torch.cat(keys))
        return torch.cat(values)[order.to(self.env.device)]

    def load_full(self, name: str, full: Tensor) -> None:
        """Refused on every rank: keyed rows are loaded with their keys."""
        raise whole_tensor_error(self.table.name)

    def logical_tail(self, name: str) -> tuple[int, ...]:
        """The shape of one key's ``weight`` or slot value."""
        if name == "weight":
            return (self.table.dim,)
        spec = {s.name: s for s in self.table.optimizer.slot_specs()}[name]  # type: ignore[union-attr]
        return () if spec.rowwise else (self.table.dim,)

    def held(self) -> int:
        """Keys holding a row on this rank."""
        return 0 if self.rows is None else len(self.rows.space)

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

    def rows_send(self, keys: Tensor, ex: Exchange) -> Any:
        """Reading the rows of ``keys`` (a collective; never inserts): ask the owners."""
        return self._ask([], keys, ex, training=False)

    def rows_serve(self, inbox: Inbox, ex: Exchange, ctx: Any) -> None:
        self.lookup(inbox, ex, ctx)

    def rows_take(self, inbox: Inbox, ctx: Any) -> Tensor:
        """``(K, dim) float32``: the rows of the keys asked for, zeros for keys without one."""
        dim = self.table.dim
        fetched = torch.cat([inbox.take(self.owner[p], F32, dim) for p in range(self.num_shards)])
        rows = torch.empty_like(fetched)
        rows[ctx.order] = fetched
        return rows[ctx.inverse]

    def info(self) -> dict[str, int]:
        """``rows``, ``pending`` and ``dropped_gradients`` summed over the shards, and the key
        spaces' ``step`` (a collective), as one process's ``table_info`` gives them; a table
        in ``DiskStorage`` adds its shards' cache and file counters, summed."""
        mine = {} if self.rows is None else self.rows.info()
        mine = {k: v for k, v in mine.items() if k != "step"}
        everyone: list[Any] = [mine]
        if self.comm.distributed and self.comm.world > 1:
            everyone = [None] * self.comm.world
            dist.all_gather_object(everyone, mine, group=self.comm.group)
        total = {k: sum(i.get(k, 0) for i in everyone) for i in everyone for k in i}
        return {"rows": 0, "pending": 0, "dropped_gradients": 0, **total, "step": self.step}

    # ------------------------------------------------------------- whole content
    def content(self) -> dict[str, np.ndarray]:
        """The whole table's content, every shard's :meth:`KeyedRows.shard_content` gathered
        onto every rank (a collective), as one process's ``dynamic_state`` gives it."""
        mine = self.rows.shard_content() if self.rows is not None else None
        everyone: list[Any] = [mine]
        if self.comm.distributed and self.comm.world > 1:
            everyone = [None] * self.comm.world
            dist.all_gather_object(everyone, mine, group=self.comm.group)
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
            self.rows.load_shard(state, mine, pending_mine)
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


def merge_states(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The whole table's content from every shard's :meth:`KeyedRows.shard_content`: arrays by
    ascending key (pending entries by ascending pending key). Shards' pending-count sketches
    (in use past ``exact_pending`` pending keys on a shard) are summed: every count stays an
    upper bound."""
    out: dict[str, np.ndarray] = {"step": parts[0]["step"]}
    for prefix in ("", "pending/"):
        if f"{prefix}keys" not in parts[0]:
            continue
        order = np.argsort(np.concatenate([p[f"{prefix}keys"] for p in parts]), kind="stable")
        for name in parts[0]:
            group = "pending/" if name.startswith("pending/") else ""
            if group == prefix and np.ndim(parts[0][name]) > 0 and name != "pending/sketch":
                out[name] = np.concatenate([p[name] for p in parts])[order]
    sketches = [p for p in parts if "pending/sketch" in p]
    if sketches:
        out["pending/sketch"] = np.sum([p["pending/sketch"] for p in sketches], axis=0)
        out["pending/sketched"] = np.array(
            sum(int(p["pending/sketched"]) for p in sketches), np.int64
        )
    return out
