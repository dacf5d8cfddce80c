"""The key state of one dynamic table: which keys hold which rows, counted and aged by step.

A :class:`KeySpace` applies a table's admission and eviction rules over a sequence of
training lookups and step boundaries, and hands the row storage the row numbers to read and
the rows to initialise. It owns no embedding values::

    train(keys)      training lookup: count, admit, refresh      -> rows (-1: no row), new rows
    lookup(keys)     evaluation lookup: read only                -> rows (-1: no row)
    end_step()       after the step's update: evict, step += 1   -> evicted keys and rows

Rows are numbered ``0 .. num_rows - 1``; a row freed by eviction is handed to a later new key
(smallest first), which the store must re-initialise like any new row. See
docs/dynamic_tables.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import is_not
from typing import Any

import numpy as np

from embcore.dynamic.index import KeyIndex, check_keys, grown
from embcore.dynamic.pending import EXACT_LIMIT, PendingCounts
from embcore.dynamic.policy import CountAdmission, Eviction, expired, least_used

__all__ = ["Admitted", "Evicted", "KeySpace"]


@dataclass(frozen=True)
class Admitted:
    """A training lookup's result.

    Attributes:
        rows: ``(N,) int64``, the row of each looked-up key, -1 for keys still pending.
        new_keys: ``(A,) int64``, the keys admitted in this lookup, ascending.
        new_rows: ``(A,) int64``, their rows (to initialise, with fresh optimizer slots).
    """

    rows: np.ndarray
    new_keys: np.ndarray
    new_rows: np.ndarray


@dataclass(frozen=True)
class Evicted:
    """The keys removed at a step boundary, ``(E,) int64`` ascending, and their freed rows."""

    keys: np.ndarray
    rows: np.ndarray


class KeySpace:
    """Keys, counts, last-seen steps and rows of one dynamic table.

    Args:
        table: the table's name, for error messages.
        admission: ``None`` admits on first sight.
        eviction: ``None`` never evicts.
        capacity: keys to make room for up front.
        exact_pending: pending keys counted exactly (see :mod:`.pending`).
    """

    def __init__(
        self,
        table: str,
        admission: CountAdmission | None = None,
        eviction: Eviction | None = None,
        capacity: int = 0,
        exact_pending: int = EXACT_LIMIT,
    ) -> None:
        for name, value, kind in (
            ("admission", admission, CountAdmission),
            ("eviction", eviction, Eviction),
        ):
            if value is not None and not isinstance(value, kind):
                raise TypeError(
                    f"table '{table}': {name} must be a {kind.__name__} or None, got {value!r}"
                )
        self.table = table
        self.admission = admission or CountAdmission()
        self.eviction = eviction or Eviction()
        self.step = 0  # the steps completed: lookups now belong to step ``self.step``
        self._index = KeyIndex(table, capacity)
        self._key = np.zeros(0, np.int64)  # by row: its key, frequency and last-seen step
        self._freq = np.zeros(0, np.int64)
        self._last = np.zeros(0, np.int64)
        self._live = np.zeros(0, np.bool_)  # by row: whether a key holds it
        self._pending = (
            PendingCounts(table, exact_pending) if self.admission.min_count > 1 else None
        )
        #: the arrays :meth:`addresses` last described and their addresses
        self._described: tuple[tuple[np.ndarray, ...], list[int]] | None = None

    def __len__(self) -> int:
        """Keys holding a row."""
        return len(self._index)

    @property
    def num_rows(self) -> int:
        """Rows the row storage must have (held and free)."""
        return self._index.num_rows

    @property
    def num_free(self) -> int:
        """Rows freed by eviction, which new keys take before new rows are added."""
        return self._index.num_free

    def addresses(self) -> list[int]:
        """The data addresses of the index's ``ctrl``, ``keys``, ``rows`` and ``free`` arrays
        and of the row metadata ``key``, ``freq``, ``last``, ``live``, for the kernels that
        take every table of a step (:mod:`.batch`, :mod:`.boundary`): taken again only for
        an array replaced since (growth, eviction), as each costs a microsecond."""
        index = self._index
        arrays = (index._ctrl, index._keys, index._rows, index._free)
        arrays += (self._key, self._freq, self._last, self._live)
        held = self._described
        if held is None:
            self._described = arrays, [a.ctypes.data for a in arrays]
        elif any(map(is_not, arrays, held[0])):
            was = zip(arrays, *held, strict=True)
            self._described = arrays, [x if a is h else a.ctypes.data for a, h, x in was]
        return self._described[1]  # type: ignore[index]

    def __getstate__(self) -> dict[str, Any]:
        """Without the described addresses: a copy has arrays of its own."""
        return self.__dict__ | {"_described": None}

    @property
    def pending(self) -> PendingCounts | None:
        """The pending keys' counts (``None`` when every key is admitted on first sight)."""
        return self._pending

    # ---------------------------------------------------------------- lookups

    def lookup(self, keys: np.ndarray) -> np.ndarray:
        """Evaluation lookup of ``keys: (N,) int64``: rows ``(N,) int64``, -1 without a row.
        Inserts nothing and counts nothing."""
        return self._index.find(check_keys(keys, self.table, "KeySpace.lookup"))

    def train(self, keys: np.ndarray) -> Admitted:
        """Training lookup of ``keys: (N,) int64`` (every feature sharing the table, one
        array): counts every occurrence, admits the keys whose count reaches ``min_count``,
        and marks every key with a row as seen in this step.

        Raises:
            IndexMemoryError: no memory for the new rows or counts; nothing was changed.
        """
        keys = check_keys(keys, self.table, "KeySpace.train")
        rows = self._index.find(keys)  # (N,): every occurrence; held keys need no sorting
        held = np.flatnonzero(rows >= 0)
        miss = np.flatnonzero(rows < 0)
        uniq, inverse, mult = np.unique(keys[miss], return_inverse=True, return_counts=True)
        totals = mult.astype(np.int64)  # counts after this lookup, of keys without a row
        if self._pending is not None and uniq.size:
            totals += self._pending.counts(uniq)
        admit = totals >= self.admission.min_count
        new_keys = uniq[admit]  # ascending, as ``uniq`` is
        # allocate everything first, so that a failure leaves the state unchanged
        top = self._index.num_rows + max(0, new_keys.size - self._index.num_free)
        meta = [self._grown(a, top) for a in (self._key, self._freq, self._last, self._live)]
        if self._pending is not None:
            self._pending.reserve(int((~admit).sum()))
        new_rows = self._index.insert(new_keys)  # the last step that can fail
        self._key, self._freq, self._last, self._live = meta
        # keys held before: one more use per occurrence
        np.add.at(self._freq, rows[held], 1)
        self._last[rows[held]] = self.step
        # keys admitted now: their frequency includes their pending count
        self._key[new_rows] = new_keys
        self._freq[new_rows] = totals[admit]
        self._last[new_rows] = self.step
        self._live[new_rows] = True
        if self._pending is not None and uniq.size:
            self._pending.add(uniq[~admit], totals[~admit], self.step)
            self._pending.discard(new_keys)
        got = np.full(uniq.size, -1, np.int64)
        got[admit] = new_rows
        rows[miss] = got[inverse.reshape(-1)]
        return Admitted(rows, new_keys, new_rows)

    def reserve(self, new_keys: int) -> None:
        """Allocate now the index slots and row metadata that ``new_keys`` new keys may need
        (not the pending counts', which :meth:`train` reserves for the keys it leaves
        pending), so that a store can make room in several tables before changing any.

        Raises:
            IndexMemoryError: the memory cannot be had; nothing was changed.
        """
        self._index.reserve(new_keys)
        top = self._index.num_rows + max(0, new_keys - self._index.num_free)
        meta = [self._grown(a, top) for a in (self._key, self._freq, self._last, self._live)]
        self._key, self._freq, self._last, self._live = meta

    def hold(self, keys: int) -> None:
        """Room for ``keys`` keys in all (a table's ``initial_capacity``): index slots and row
        metadata allocated now and their unused parts written (zeros), so that lookups pay
        neither growth nor first touches of memory until the table holds that many keys.
        Changes no key, row or count.

        Raises:
            IndexMemoryError: the memory cannot be had; nothing was changed.
        """
        if keys <= 0:
            return
        self.reserve(max(0, keys - len(self)))
        self._index.write_empty()
        for array in (self._key, self._freq, self._last, self._live):
            array[self._index.num_rows :] = 0

    def reserve_rows(self, rows: int) -> None:
        """Room in the row metadata for ``rows`` rows (handed out, held or free).

        Raises:
            IndexMemoryError: the memory cannot be had; nothing was changed.
        """
        if rows <= self._key.size:
            return
        meta = [self._grown(a, rows) for a in (self._key, self._freq, self._last, self._live)]
        self._key, self._freq, self._last, self._live = meta

    def fits(self, new_keys: int) -> bool:
        """Whether a training lookup admitting ``new_keys`` keys allocates nothing here (index
        slots and row metadata; pending counts aside)."""
        top = self._index.num_rows + max(0, new_keys - self._index.num_free)
        return self._index.fits(new_keys) and top <= self._key.size

    def count_new(self, keys: np.ndarray) -> int:
        """The distinct keys of ``keys: (N,) int64`` without a row: the most a training lookup
        of them can admit (a batch repeating held keys needs no room)."""
        keys = check_keys(keys, self.table, "KeySpace.count_new")
        return int(np.unique(keys[self._index.find(keys) < 0]).size)

    # ---------------------------------------------------------------- step boundaries

    def end_step(self) -> Evicted:
        """The end of step ``self.step`` (after its update): remove expired keys, then the
        least used beyond ``max_rows``; forget expired pending counts; ``step += 1``.

        Costs one pass over the row metadata when an eviction limit is set, none otherwise.
        """
        ev = self.eviction
        if self._pending is None and ev.steps_to_live is None and ev.max_rows is None:
            self.step += 1  # nothing can expire or be evicted
            return Evicted(np.empty(0, np.int64), np.empty(0, np.int64))
        gone = np.empty(0, np.int64)
        if ev.steps_to_live is not None or ev.max_rows is not None:
            n = self._index.num_rows
            live = self._live[:n]
            old = expired(self._last[:n], self.step, ev.steps_to_live)
            gone = np.flatnonzero(live & old)
            left = len(self) - gone.size
            if ev.max_rows is not None and left > ev.max_rows:
                rest = np.flatnonzero(live & ~old) if gone.size else np.flatnonzero(live)
                pick = least_used(
                    self._key[rest], self._freq[rest], self._last[rest], left - ev.max_rows
                )
                gone = np.concatenate([gone, rest[pick]])
        out_keys = np.sort(self._key[gone])
        out_rows = self._index.remove(out_keys)  # every key is held: its row, in key order
        self._live[out_rows] = False
        if self._pending is not None and ev.steps_to_live is not None:
            self._pending.expire(self.step, ev.steps_to_live)
        self.step += 1
        return Evicted(out_keys, out_rows)

    # ---------------------------------------------------------------- views

    def keys(self) -> np.ndarray:
        """The keys holding a row, ``(R,) int64`` ascending."""
        return self._index.items()[0]

    def items(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``(keys, rows, freq, last_seen)`` of the keys holding a row, by ascending key."""
        keys, rows = self._index.items()
        return keys, rows, self._freq[rows], self._last[rows]

    # ---------------------------------------------------------------- checkpoints

    def state(self) -> dict[str, np.ndarray]:
        """Everything but the row values, as arrays by ascending key (for checkpoints).

        ``step`` ``() int64``; ``keys``, ``rows``, ``freq``, ``last_seen`` ``(R,) int64`` (the
        store saves its row values in this order, gathering ``rows``); and the pending counts
        under ``pending/<name>`` (see :meth:`.PendingCounts.state`).
        """
        keys, rows, freq, last = self.items()
        out = {"step": np.array(self.step, np.int64), "keys": keys, "rows": rows}
        out |= {"freq": freq, "last_seen": last}
        if self._pending is not None:
            out |= {f"pending/{k}": v for k, v in self._pending.state().items()}
        return out

    @classmethod
    def from_state(
        cls,
        table: str,
        state: dict[str, np.ndarray],
        admission: CountAdmission | None = None,
        eviction: Eviction | None = None,
        exact_pending: int = EXACT_LIMIT,
    ) -> KeySpace:
        """A key space restored from :meth:`state`: key ``keys[i]`` holds row ``i`` (the store
        loads its saved row values in that order; rows are compacted, free rows dropped)."""
        keys = np.asarray(state["keys"])
        n = keys.size
        for name in ("keys", "freq", "last_seen"):
            value = np.asarray(state[name])
            if value.dtype != np.int64 or value.shape != (n,):
                raise ValueError(
                    f"table '{table}': saved '{name}' must be ({n},) int64, got "
                    f"{value.shape} {value.dtype}"
                )
        if n > 1 and not bool(np.all(keys[1:] > keys[:-1])):
            raise ValueError(f"table '{table}': saved 'keys' must be strictly ascending")
        out = cls(table, admission, eviction, capacity=n, exact_pending=exact_pending)
        out.step = int(state["step"])
        out._index.insert(keys)
        out._key, out._freq, out._last = (
            keys.copy(),
            state["freq"].copy(),
            state["last_seen"].copy(),
        )
        out._live = np.ones(n, np.bool_)
        if out._pending is not None and "pending/keys" in state:
            saved = {k[len("pending/") :]: v for k, v in state.items() if k.startswith("pending/")}
            out._pending.load(saved)
        return out

    def _grown(self, array: np.ndarray, size: int) -> np.ndarray:
        return grown(array, size, f"table '{self.table}': row metadata ({len(self)} keys held)")
