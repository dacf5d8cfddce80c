"""Occurrence counts of the keys of a dynamic table still waiting for admission.

Counts are exact for up to ``exact_limit`` pending keys (default 2**20, about 36 bytes each):
a key index over per-entry arrays of counts and last-seen steps. Keys that arrive while that
many are pending are counted in a count-min sketch instead (``depth`` rows of ``width``
counters, conservative update), which never under-counts: such a key is admitted no later
than exact counting would admit it, and earlier by at most ``e * N / width`` occurrences
with probability ``1 - exp(-depth)`` (``N`` the occurrences the sketch has counted). When an
exact entry frees up, a sketched key moving into it starts from its sketch estimate. Sketch
counts neither expire nor restart. See docs/dynamic_tables.md.
"""

from __future__ import annotations

import numpy as np

from embcore.dynamic.index import IndexMemoryError, KeyIndex, grown

__all__ = ["EXACT_LIMIT", "PendingCounts"]

#: pending keys counted exactly per table, by default
EXACT_LIMIT = 1 << 20
_G, _C1, _C2 = (
    np.uint64(0x9E3779B97F4A7C15),
    np.uint64(0xBF58476D1CE4E5B9),
    np.uint64(0x94D049BB133111EB),
)
_SKETCH_SALTS = (0x243F6A8885A308D3, 0x13198A2E03707344, 0xA4093822299F31D0, 0x082EFA98EC4E6C89)


def _mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer over a ``uint64`` array (as the index's kernels hash)."""
    z = x + _G
    z = (z ^ (z >> np.uint64(30))) * _C1
    z = (z ^ (z >> np.uint64(27))) * _C2
    return z ^ (z >> np.uint64(31))


class PendingCounts:
    """Counts and last-seen steps of pending keys (see the module docstring).

    Args:
        table: the table's name, for error messages.
        exact_limit: pending keys counted exactly before the sketch takes over.
        sketch_width: counters per sketch row; ``sketch_depth``: rows (at most 4).
    """

    def __init__(
        self,
        table: str,
        exact_limit: int = EXACT_LIMIT,
        sketch_width: int = 1 << 20,
        sketch_depth: int = 4,
    ) -> None:
        if not 1 <= sketch_depth <= len(_SKETCH_SALTS):
            raise ValueError(f"table '{table}': sketch_depth must be in [1, 4], got {sketch_depth}")
        if exact_limit < 0 or sketch_width < 1:
            raise ValueError(
                f"table '{table}': exact_limit must be >= 0 and sketch_width >= 1, got "
                f"{exact_limit} and {sketch_width}"
            )
        self.table = table
        self.exact_limit = exact_limit
        self._index = KeyIndex(table)
        self._count = np.zeros(0, np.int64)  # by entry row of the index
        self._last = np.zeros(0, np.int64)
        self._width, self._depth = sketch_width, sketch_depth
        self._sketch: np.ndarray | None = None  # (depth, width) int64, made on first overflow
        self.sketched = 0  # occurrences counted in the sketch (its N)

    def __len__(self) -> int:
        """Keys counted exactly."""
        return len(self._index)

    @property
    def sketch_shape(self) -> tuple[int, int]:
        """``(depth, width)`` of the count-min sketch (what a saved ``sketch`` must have)."""
        return self._depth, self._width

    @property
    def exact(self) -> bool:
        """True while every pending count is exact (the sketch was never used)."""
        return self._sketch is None

    def counts(self, keys: np.ndarray) -> np.ndarray:
        """``keys: (N,) int64`` distinct -> their counts so far ``(N,) int64`` (exact entries,
        else the sketch's estimate, else 0). Changes nothing."""
        rows = self._index.find(keys)
        out = np.zeros(keys.size, np.int64)
        held = rows >= 0
        out[held] = self._count[rows[held]]
        if self._sketch is not None and not held.all():
            out[~held] = self._estimate(keys[~held])
        return out

    def reserve(self, new_keys: int) -> None:
        """Allocate now what adding ``new_keys`` keys not yet counted may need, so that
        :meth:`add` of that many allocates nothing. Raises :class:`IndexMemoryError`."""
        room = max(0, self.exact_limit - len(self._index))
        enter = min(room, new_keys)
        self._index.reserve(enter)
        need = self._index.num_rows + enter
        self._count, self._last = self._grown(self._count, need), self._grown(self._last, need)
        if new_keys > room and self._sketch is None:
            self._make_sketch()

    def add(self, keys: np.ndarray, totals: np.ndarray, step: int) -> None:
        """Set the counts of ``keys: (N,) int64`` (distinct) to ``totals: (N,) int64`` (their
        :meth:`counts` plus this lookup's occurrences) and their last-seen step to ``step``.

        Raises:
            IndexMemoryError: no memory for new entries; nothing was changed.
        """
        rows = self._index.find(keys)
        absent = np.flatnonzero(rows < 0)
        room = max(0, self.exact_limit - len(self._index))
        enter, overflow = absent[:room], absent[room:]
        if overflow.size and self._sketch is None:
            self._make_sketch()
        if enter.size:
            need = self._index.num_rows + enter.size
            count, last = self._grown(self._count, need), self._grown(self._last, need)
            rows[enter] = self._index.insert(keys[enter])  # raises unchanged
            self._count, self._last = count, last
        if overflow.size:
            self._add_to_sketch(keys[overflow], totals[overflow])
        kept = rows >= 0
        self._count[rows[kept]] = totals[kept]
        self._last[rows[kept]] = step

    def discard(self, keys: np.ndarray) -> None:
        """Forget the exact counts of ``keys`` (admitted or expired)."""
        self._index.remove(keys)

    def expire(self, step: int, steps_to_live: int) -> np.ndarray:
        """Forget the keys last seen in step ``step - steps_to_live`` or earlier; returns them
        ``(E,) int64`` sorted."""
        keys, rows = self._index.items(ordered=False)
        gone = np.sort(keys[self._last[rows] <= step - steps_to_live])
        self._index.remove(gone)
        return gone

    def items(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(keys, counts, last_seen)`` of the exact entries, ``(P,) int64`` each, by key."""
        keys, rows = self._index.items()
        return keys, self._count[rows], self._last[rows]

    def state(self) -> dict[str, np.ndarray]:
        """The counts as arrays (for checkpoints): ``keys``, ``counts``, ``last_seen`` by key,
        plus ``sketch`` ``(depth, width) int64`` and ``sketched`` once the sketch is used."""
        keys, counts, last = self.items()
        out = {"keys": keys, "counts": counts, "last_seen": last}
        if self._sketch is not None:
            out["sketch"] = self._sketch.copy()
            out["sketched"] = np.array(self.sketched, np.int64)
        return out

    def load(self, state: dict[str, np.ndarray]) -> None:
        """Replace the counts of an empty instance with :meth:`state`'s arrays."""
        keys = state["keys"]
        if len(self) or self._sketch is not None:
            raise ValueError(f"table '{self.table}': PendingCounts.load needs an empty instance")
        if keys.size > self.exact_limit:
            raise ValueError(
                f"table '{self.table}': {keys.size} pending keys saved, more than exact_limit "
                f"{self.exact_limit}"
            )
        rows = self._index.insert(keys)
        self._count = self._grown(self._count, self._index.num_rows)
        self._last = self._grown(self._last, self._index.num_rows)
        self._count[rows], self._last[rows] = state["counts"], state["last_seen"]
        if "sketch" in state:
            sketch = np.asarray(state["sketch"], np.int64)
            if sketch.shape != (self._depth, self._width):
                raise ValueError(
                    f"table '{self.table}': saved pending sketch has shape {sketch.shape}, "
                    f"expected {(self._depth, self._width)}"
                )
            self._sketch = sketch.copy()
            self.sketched = int(state["sketched"])

    # ---------------------------------------------------------------- internals

    def _grown(self, array: np.ndarray, size: int) -> np.ndarray:
        return grown(array, size, f"table '{self.table}': pending counts")

    def _cells(self, keys: np.ndarray) -> np.ndarray:
        """``(depth, N) int64`` counter positions of each key in each sketch row."""
        hashed = _mix(keys.view(np.uint64))
        out = np.empty((self._depth, keys.size), np.int64)
        for d in range(self._depth):
            h = _mix(hashed ^ np.uint64(_SKETCH_SALTS[d]))
            out[d] = (h >> np.uint64(32)) * np.uint64(self._width) >> np.uint64(32)
        return out

    def _estimate(self, keys: np.ndarray) -> np.ndarray:
        cells = self._cells(keys)
        return np.min(self._sketch[np.arange(self._depth)[:, None], cells], axis=0)

    def _make_sketch(self) -> None:
        try:
            self._sketch = np.zeros((self._depth, self._width), np.int64)
        except MemoryError as e:
            raise IndexMemoryError(
                f"table '{self.table}': could not allocate the pending-count sketch "
                f"({self._depth} x {self._width} counters); nothing was changed"
            ) from e

    def _add_to_sketch(self, keys: np.ndarray, totals: np.ndarray) -> None:
        cells = self._cells(keys)
        before = self._estimate(keys)
        self.sketched += int((totals - before).sum())
        # conservative update: raise each key's counters to its new total, never lower them
        for d in range(self._depth):
            np.maximum.at(self._sketch[d], cells[d], totals)
