"""The owner's side of a key-hash sharded table: one key shard of :class:`KeyedRows` (or of
:class:`~embcore.rows.disk_keyed.DiskKeyedRows`, a dynamic table on disk).

``embcore.sharding.schemes.key_hash`` routes each key to the shard its hash picks; the owner
looks up every rank's keys at once (``train_keys`` with each key's occurrence count, or ``find``),
reads rows by key-space row (``read_rows``: ``-1`` is a key without a row), updates the rows
``slots_of`` gives (one call for every row of an update), and at the end of a step evicts its
part of the table's ``max_rows`` (``survivors``, ``candidates``, then ``end_step(evict)``).
In memory key-space row ``r`` is row ``r + 1`` of the tensors (row 0 is the sink); on disk
``read_rows`` and ``slots_of`` go through the row cache. See docs/sharding.md ("Dynamic
tables").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from embcore.dynamic.policy import expired

if TYPE_CHECKING:
    from embcore.dynamic.keyspace import Evicted, KeySpace
    from embcore.dynamic.policy import Eviction

__all__ = ["KeyShard"]


class KeyShard:
    """Key-shard methods of :class:`~embcore.rows.keyed.KeyedRows` and
    :class:`~embcore.rows.disk_keyed.DiskKeyedRows` (a mixin)."""

    space: KeySpace
    steps_to_live: int | None
    new: tuple[np.ndarray, np.ndarray]
    _slot_init: dict[str, float]
    #: the table's eviction as a shard's key space holds it (``steps_to_live`` only)
    _eviction: Eviction | None

    if TYPE_CHECKING:  # the row storage's

        @property
        def _device(self) -> torch.device: ...
        def tensor(self, name: str) -> Tensor: ...
        def _reserve_keys(self, keys: np.ndarray) -> None: ...
        def content(self) -> dict[str, Any]: ...
        def load_content(self, state: dict[str, Any]) -> None: ...
        def _initialise(
            self, new_keys: np.ndarray, rows: np.ndarray, drawn: np.ndarray | None = None
        ) -> None: ...

    def train_keys(self, keys: Tensor, mult: Tensor, defer: bool = False) -> Tensor:
        """One training lookup of ``keys: (K,) int64``, key ``i`` occurring ``mult[i]`` times
        (every rank's occurrences): counts, admits, initialises new rows (``defer``: leaves
        that to :meth:`initialise`, with every shard's new keys). Returns ``(K,) int64``
        key-space rows, -1 for keys still pending.

        Raises:
            IndexMemoryError: no memory for the new rows; nothing was changed.
        """
        k, m = keys.cpu().numpy(), mult.cpu().numpy()
        self._reserve_keys(k)  # rows for the keys without one, before any change of state
        admitted = self.space.train(np.repeat(k, m))
        self.new = (admitted.new_keys, admitted.new_rows)
        if not defer:
            self.initialise(admitted.new_keys)
        first = np.cumsum(m) - m  # each key's first occurrence
        return torch.from_numpy(admitted.rows[first]).to(self._device)

    def initialise(self, every_new_key: np.ndarray) -> None:
        """Initial values and slots of the rows the last training lookup gave to new keys.

        Args:
            every_new_key: ``(A,) int64`` ascending, the keys admitted in the lookup on every
                shard (a user initializer is called once with ``(A, dim)`` and each shard
                takes its keys' rows, as one process draws them); ``A = 0``: no call.
        """
        keys, rows = self.new
        self._initialise(keys, rows, drawn=every_new_key)

    def find(self, keys: Tensor) -> Tensor:
        """``(K,) int64`` key-space rows of ``keys``, -1 without a row; reads only."""
        rows = self.space.lookup(np.ascontiguousarray(keys.cpu().numpy()))
        return torch.from_numpy(rows).to(self._device)

    def read_rows(self, rows: Tensor, name: str = "weight") -> Tensor:
        """The ``weight`` (float32) or slot values of key-space ``rows``: zeros for -1 (a
        slot: its initial value)."""
        src = self.tensor(name)
        out = src.new_full((rows.numel(), *src.shape[1:]), self._slot_init.get(name, 0.0))
        held = rows >= 0
        out[held] = src[rows[held] + 1]
        return out.float()

    @staticmethod
    def slots_of(rows: Tensor) -> Tensor:
        """The rows of :meth:`state`'s tensors holding key-space ``rows`` (all ``>= 0``)."""
        return rows + 1

    def survivors(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(keys, freq, last_seen)`` of the keys that outlive this step's ``steps_to_live``
        eviction, by ascending key."""
        keys, _, freq, last = self.space.items()
        keep = ~expired(last, self.space.step, self.steps_to_live)
        return keys[keep], freq[keep], last[keep]

    def candidates(self, count: int) -> np.ndarray:
        """``(k, 3) int64`` ``(freq, last_seen, key)`` of this shard's ``k = min(count,
        survivors)`` least used survivors, in eviction order."""
        keys, freq, last = self.survivors()
        order = np.lexsort((keys, last, freq))[:count]
        return np.stack([freq[order], last[order], keys[order]], axis=1).astype(np.int64)

    def _end_shard_step(self, evict: int) -> Evicted:
        """End the key space's step as a shard: evict by ``steps_to_live``, and, ``evict >
        0``, this shard's part of the table's ``max_rows`` eviction (its ``evict`` least used
        survivors). Returns the keys and rows evicted."""
        keep = len(self.survivors()[0]) - evict if evict > 0 else None
        self.space.eviction = _StepLimits(self.steps_to_live, keep)  # type: ignore[assignment]
        try:
            return self.space.end_step()
        finally:
            self.space.eviction = self._eviction  # type: ignore[assignment]

    def shard_content(self) -> dict[str, np.ndarray]:
        """:meth:`KeyedRows.content` as NumPy arrays (what the ranks exchange)."""
        return {
            k: v.cpu().numpy() if isinstance(v, Tensor) else v for k, v in self.content().items()
        }

    def load_shard(self, state: dict[str, Any], mine: np.ndarray, pending_mine: np.ndarray) -> None:
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
        self.load_content(part)


@dataclass(frozen=True)
class _StepLimits:
    """What :meth:`KeySpace.end_step` reads of an eviction, for one step of a key shard: the
    table's ``steps_to_live`` and this shard's part of the table's ``max_rows`` eviction
    (which may be 0: every survivor of this shard goes)."""

    steps_to_live: int | None
    max_rows: int | None
