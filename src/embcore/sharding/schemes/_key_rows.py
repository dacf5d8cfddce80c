"""One rank's shard of a dynamic table: the key space of its keys and the rows behind it.

The owner side of :mod:`~embcore.sharding.schemes.key_hash`: a
:class:`~embcore.dynamic.keyspace.KeySpace` over the keys hashed to this shard, and growable
row and optimizer-slot tensors that the fused kernels update like any table. ``max_rows`` is a
limit on the whole table, so this shard's key space evicts only by ``steps_to_live``; the
table's least used keys beyond ``max_rows`` are chosen over every shard at once
(:mod:`~embcore.sharding.schemes._key_steps`) and handed to :meth:`KeyRows.end_step`. See
``docs/sharding.md`` ("Dynamic tables").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from embcore import ops
from embcore.config import ResolvedTable
from embcore.dynamic.index import IndexMemoryError
from embcore.dynamic.init import new_rows
from embcore.dynamic.keyspace import KeySpace
from embcore.dynamic.policy import Eviction, expired

__all__ = ["KeyRows", "merge_states"]


@dataclass(frozen=True)
class _StepLimits:
    """What :meth:`KeySpace.end_step` reads of an eviction, for one step: the table's
    ``steps_to_live`` and this shard's part of the table's ``max_rows`` eviction (which may
    be 0: every survivor of this shard goes)."""

    steps_to_live: int | None
    max_rows: int | None


class KeyRows:
    """This rank's shard of a dynamic table.

    Args:
        table: the dynamic table (its config's ``admission``, ``eviction``, ``initializer``).
        seed: the engine's seed (the default initial values depend on it, the table's name
            and the key only).
        device: where the rows and slots live (the key space is on the CPU).
    """

    def __init__(self, table: ResolvedTable, seed: int, device: torch.device) -> None:
        cfg = table.config
        eviction = cfg.eviction or Eviction()
        self.table = table
        self.seed = seed
        self.device = device
        self.steps_to_live = eviction.steps_to_live
        self.keyspace = self._keyspace()
        dim, opt = table.dim, table.optimizer
        self.slot_init = {s.name: s.initial_value for s in opt.slot_specs()} if opt else {}
        self.weight = torch.zeros(0, dim, device=device)
        self.slots = {
            s.name: torch.zeros((0,) if s.rowwise else (0, dim), device=device)
            for s in (opt.slot_specs() if opt else ())
        }
        #: gradient occurrences dropped: keys pending admission, or evicted since the lookup
        self.dropped_gradients = 0
        #: the last training lookup's new keys (ascending) and their rows
        self.new = (np.zeros(0, np.int64), np.zeros(0, np.int64))

    def _keyspace(self, state: dict[str, np.ndarray] | None = None) -> KeySpace:
        cfg, limits = self.table.config, Eviction(steps_to_live=self.steps_to_live)
        if state is None:
            return KeySpace(self.table.name, cfg.admission, limits)
        return KeySpace.from_state(self.table.name, state, cfg.admission, limits)

    # ---------------------------------------------------------------- lookups
    def train(self, keys: Tensor, mult: Tensor, defer: bool = False) -> Tensor:
        """One training lookup of ``keys: (K,) int64``, key ``i`` occurring ``mult[i]`` times
        (every rank's occurrences): counts, admits, initialises new rows (``defer``: leaves
        that to :meth:`initialise`, with every shard's new keys). Returns ``(K,) int64`` rows,
        -1 for keys still pending.

        Raises:
            IndexMemoryError: no memory for the new rows; nothing was changed.
        """
        k, m = keys.cpu().numpy(), mult.cpu().numpy()
        space = self.keyspace  # rows for the keys without one (before any change of state)
        self._grow(space.num_rows + max(0, space.count_new(k) - space.num_free))
        admitted = self.keyspace.train(np.repeat(k, m))
        self.new = (admitted.new_keys, admitted.new_rows)
        if not defer:
            self.initialise(admitted.new_keys)
        first = np.cumsum(m) - m  # each key's first occurrence
        return torch.from_numpy(admitted.rows[first]).to(self.device)

    def initialise(self, every_new_key: np.ndarray) -> None:
        """Initial values and slots of the rows the last training lookup gave to new keys.

        Args:
            every_new_key: ``(A,) int64`` ascending, the keys admitted in the lookup on every
                shard (a user initializer is called once with ``(A, dim)`` and each shard
                takes its keys' rows, as one process draws them); ``A = 0``: no call.
        """
        keys, rows = self.new
        if every_new_key.size == 0:
            return
        at = torch.from_numpy(rows).to(self.device)
        for name, value in self.slot_init.items():
            self.slots[name][at] = value
        try:
            values = new_rows(
                every_new_key, table=self.table.name, dim=self.table.dim, seed=self.seed,
                initializer=self.table.config.initializer,
            )  # fmt: skip
        except BaseException:
            # the keys are admitted: never leave a reused row with an evicted key's values
            self.weight[at] = 0.0
            raise
        mine = values[np.searchsorted(every_new_key, keys)]
        self.weight[at] = torch.from_numpy(mine).to(self.device, self.weight.dtype)

    def find(self, keys: Tensor) -> Tensor:
        """``(K,) int64`` rows of ``keys``, -1 without a row; reads only."""
        rows = self.keyspace.lookup(np.ascontiguousarray(keys.cpu().numpy()))
        return torch.from_numpy(rows).to(self.device)

    def read(self, rows: Tensor, name: str = "weight") -> Tensor:
        """The ``weight`` (float32) or slot values of ``rows``: zeros for -1 (a slot: its
        initial value)."""
        src = self.weight if name == "weight" else self.slots[name]
        out = src.new_full((rows.numel(), *src.shape[1:]), self.slot_init.get(name, 0.0))
        held = rows >= 0
        out[held] = src[rows[held]]
        return out.float()

    def state(self) -> ops.TableState:
        """The rows and slots as a table the kernels update (rows by row number)."""
        return ops.TableState(self.table.name, self.weight, self.slots, self.table.optimizer)

    # ---------------------------------------------------------------- step boundaries
    def survivors(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(keys, freq, last_seen)`` of the keys that outlive this step's ``steps_to_live``
        eviction, by ascending key."""
        keys, _, freq, last = self.keyspace.items()
        keep = ~expired(last, self.keyspace.step, self.steps_to_live)
        return keys[keep], freq[keep], last[keep]

    def candidates(self, count: int) -> np.ndarray:
        """``(k, 3) int64`` ``(freq, last_seen, key)`` of this shard's ``k = min(count,
        survivors)`` least used survivors, in eviction order."""
        keys, freq, last = self.survivors()
        order = np.lexsort((keys, last, freq))[:count]
        return np.stack([freq[order], last[order], keys[order]], axis=1).astype(np.int64)

    def end_step(self, evict: int) -> None:
        """The end of the step: ``steps_to_live`` eviction, then this shard's ``evict`` least
        used survivors go (its part of the table's ``max_rows`` eviction)."""
        keep = len(self.survivors()[0]) - evict if evict > 0 else None
        self.keyspace.eviction = _StepLimits(self.steps_to_live, keep)  # type: ignore[assignment]
        try:
            self.keyspace.end_step()
        finally:
            self.keyspace.eviction = Eviction(steps_to_live=self.steps_to_live)

    # ---------------------------------------------------------------- content
    def keys(self) -> Tensor:
        """``(R,) int64``: the keys holding a row, ascending."""
        return torch.from_numpy(self.keyspace.keys())

    def content(self) -> dict[str, np.ndarray]:
        """This shard's :meth:`KeySpace.state` without ``rows``, plus ``weight`` and every
        slot as ``(R, ...)`` arrays in key order."""
        state = dict(self.keyspace.state())
        rows = torch.from_numpy(state.pop("rows")).to(self.device)
        for name in ("weight", *self.slot_init):
            state[name] = self.read(rows, name).cpu().numpy()
        return state

    def load(self, state: dict[str, Any], mine: np.ndarray, pending_mine: np.ndarray) -> None:
        """Replace the content with the entries ``mine`` (and pending ``pending_mine``) of a
        whole table's state (key order; checked by the caller)."""
        part = {
            k: np.asarray(v)[pending_mine if k.startswith("pending/") else mine]
            for k, v in state.items()
            if np.ndim(v) > 0 and k not in ("pending/sketch",)
        }
        part |= {k: np.asarray(v) for k, v in state.items() if np.ndim(v) == 0}
        if "pending/sketch" in state:
            part["pending/sketch"] = np.asarray(state["pending/sketch"])
        space = self._keyspace(part)
        n = part["keys"].size
        weight = torch.as_tensor(part.pop("weight")).to(self.device, torch.float32)
        slots = {
            name: torch.as_tensor(part.pop(name)).to(self.device, torch.float32)
            for name in self.slot_init
        }
        self.keyspace, self.weight, self.slots = space, weight.reshape(n, -1), slots

    # ---------------------------------------------------------------- rows
    def _grow(self, rows: int) -> None:
        have = self.weight.shape[0]
        if rows <= have:
            return
        size = max(rows, have * 3 // 2 + 16)
        try:
            weight = self.weight.new_zeros(size, self.table.dim)
            slots = {n: s.new_zeros(size, *s.shape[1:]) for n, s in self.slots.items()}
        except (MemoryError, RuntimeError) as e:  # torch reports an allocation as either
            raise IndexMemoryError(
                f"table '{self.table.name}': could not grow this rank's rows and optimizer "
                f"slots from {have} to {size} rows of dim {self.table.dim} "
                f"({len(self.keyspace)} keys held); nothing was changed"
            ) from e
        weight[:have] = self.weight
        for n, s in slots.items():
            s[:have] = self.slots[n]
        self.weight, self.slots = weight, slots


def merge_states(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The whole table's content from every shard's :meth:`KeyRows.content`: arrays by
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
