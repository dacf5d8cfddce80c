"""Keyed records: how a checkpoint sees a dynamic table, and what a delta is made of.

A dynamic table's state is a set of *records*, one per key: ``keys (K,) int64`` plus columns
``(K, ...)`` (weight, optimizer slots, frequency, last-seen step), and, for pending keys, their
counts and last-seen steps. A record carries no row number, so any number of ranks can write
or read the set (a reader sorts by key). Each record has a 128-bit *digest* of its key and
every column's bytes; a delta holds the records whose digest changed since its base (inserted
or updated) and the keys that left (evicted). The digest of a whole set is the sum of its
records' digests (mod 2**64 per lane): independent of order and of how the set is split over
writers, so a reader can check that replaying a chain gave exactly the saved set. See
docs/dynamic_tables.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from embcore._numba import threads
from embcore._numba.digests import fold as _fold
from embcore._numba.digests import start as _start

__all__ = ["Records", "apply", "changed", "digests", "set_digest", "sorted_records"]


def _words(column: np.ndarray) -> np.ndarray:
    """``column (K, ...)`` as ``(K, W) uint32`` (its bytes, zero-padded to whole words)."""
    flat = np.ascontiguousarray(column).reshape(column.shape[0], -1).view(np.uint8)
    pad = -flat.shape[1] % 4
    if pad:
        flat = np.concatenate([flat, np.zeros((flat.shape[0], pad), np.uint8)], axis=1)
    return flat.view(np.uint32)


def digests(keys: np.ndarray, columns: list[np.ndarray]) -> np.ndarray:
    """The digest of each record: ``(K, 2) uint64`` from ``keys (K,) int64`` and ``columns``
    (each ``(K, ...)``, in a fixed order)."""
    a = np.empty(keys.size, np.uint64)
    b = np.empty(keys.size, np.uint64)
    _start(np.ascontiguousarray(keys), a, b)
    workers = threads.num_workers(keys.size)
    for column in columns:
        if column.size:
            threads.run(_fold, _words(column), a, b, workers=workers)
    return np.stack([a, b], axis=1)


def set_digest(record_digests: np.ndarray) -> str:
    """The digest of a set of records (hex, 32 digits): each lane's sum mod 2**64, so the
    same set gives the same digest in any order and split over any number of parts."""
    with np.errstate(over="ignore"):
        lanes = record_digests.astype(np.uint64).sum(axis=0, dtype=np.uint64)
    lanes = np.zeros(2, np.uint64) if record_digests.size == 0 else lanes
    return b"".join(int(v).to_bytes(8, "little") for v in lanes).hex()


@dataclass
class Records:
    """A set of records by ascending key.

    Attributes:
        keys: ``(K,) int64``, strictly ascending.
        digests: ``(K, 2) uint64``, each record's digest.
        columns: ``{name: (K, ...) array}`` (may be empty: keys and digests only).
    """

    keys: np.ndarray
    digests: np.ndarray
    columns: dict[str, np.ndarray] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.keys.size)

    def take(self, index: np.ndarray) -> Records:
        """The records at ``index (n,) int64`` (ascending positions keep the key order)."""
        return Records(
            self.keys[index], self.digests[index], {n: c[index] for n, c in self.columns.items()}
        )


def sorted_records(keys: np.ndarray, digests_: np.ndarray, columns: dict) -> Records:
    """Records from arrays in any key order (as several writers store them), sorted by key.

    Raises:
        ValueError: a key appears twice.
    """
    order = np.argsort(keys, kind="stable")
    keys = keys[order]
    if keys.size > 1 and not bool(np.all(keys[1:] > keys[:-1])):
        dup = keys[1:][keys[1:] == keys[:-1]][:3].tolist()
        raise ValueError(f"keys {dup} are stored twice")
    return Records(keys, digests_[order], {n: c[order] for n, c in columns.items()})


def changed(base: Records, now: Records) -> tuple[np.ndarray, np.ndarray]:
    """What a delta from ``base`` to ``now`` holds: the positions in ``now`` of records new or
    changed since ``base`` ``(U,) int64``, and the keys of ``base`` that ``now`` lacks
    ``(D,) int64`` (both ascending)."""
    at = np.searchsorted(base.keys, now.keys)
    at_c = np.minimum(at, max(len(base) - 1, 0))
    found = (at < len(base)) & (base.keys[at_c] == now.keys) if len(base) else at < 0
    same = np.zeros(len(now), np.bool_)
    if len(base):
        same[found] = np.all(base.digests[at_c[found]] == now.digests[found], axis=1)
    upserts = np.flatnonzero(~same)
    kept = np.zeros(len(base), np.bool_)
    kept[at[found]] = True
    return upserts, base.keys[~kept]


def apply(base: Records, upserts: Records, deleted: np.ndarray) -> Records:
    """``base`` with the keys ``deleted`` removed and ``upserts`` inserted or replacing
    (what a delta does). Columns are those of ``upserts`` (``base`` must have them).

    Raises:
        ValueError: a deleted key is not in ``base``, or is also upserted.
    """
    gone = np.isin(deleted, base.keys, assume_unique=True)
    if not bool(gone.all()):
        raise ValueError(f"deletes keys {deleted[~gone][:3].tolist()} that its base does not hold")
    if bool(np.isin(deleted, upserts.keys, assume_unique=True).any()):
        raise ValueError("deletes keys it also stores")
    keep = ~np.isin(base.keys, deleted, assume_unique=True) & ~np.isin(
        base.keys, upserts.keys, assume_unique=True
    )
    kept = base.take(np.flatnonzero(keep))
    keys = np.concatenate([kept.keys, upserts.keys])
    order = np.argsort(keys, kind="stable")
    return Records(
        keys[order],
        np.concatenate([kept.digests, upserts.digests])[order],
        {n: np.concatenate([kept.columns[n], c])[order] for n, c in upserts.columns.items()},
    )
