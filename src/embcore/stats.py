"""Lookup statistics (``profile_data_directory``, docs/semantics.md §4.6): cheap, sampled,
mergeable.

About 3% of batches are sampled (configurable). For each table, a sampled batch adds:

* a histogram of ids per example (summed over the table's features), for mean/p50/p99;
* the fraction of unique ids among the batch's ids, and their number (unique keys per step);
* for a dynamic table, the rows it holds (the most seen at a sampled batch);
* its id counts to a bounded heavy-hitter sketch (Misra-Gries, mergeable): every id whose true
  count exceeds ``total / (capacity + 1)`` is kept, and each kept count is an underestimate by
  at most that much;
* the lookups each rank serves under the current placement (``load_of``; each scheme's
  :meth:`~embcore.sharding.schemes.Scheme.lookup_load` says what load means for it).

For a table in ``DiskStorage`` every step (not a sample) counts: its cache's hits and misses
and the rows and bytes its working file read and wrote (:data:`CACHE_COUNTERS`), over the
steps that ended, summed over the ranks holding pieces of it.

Statistics never change numerics. Each table's statistics go to one JSON file, written
atomically, named by a hash of the table's parameters and of the global configuration
(sharding strategy, world size), so one directory can serve many models; a second run with the
same key merges into the file.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from embcore import _atomic
from embcore._cache_counts import CACHE_COUNTERS, added, counters
from embcore._sketch import merged_sketch
from embcore.inputs import FeatureBatch

__all__ = ["CACHE_COUNTERS", "StatsCollector", "TableStats", "load_stats", "stats_path"]

FORMAT_VERSION = 1
MAX_IDS_PER_EXAMPLE = 4096  # histogram bins; larger counts land in the last bin


@dataclass
class TableStats:
    """Mergeable statistics of one table's lookups.

    Attributes:
        table: the table name; ``key``: the parameters hashed into the file name.
        batches: sampled batches; ``examples``: examples in them; ``ids``: ids in them.
        ids_per_example: ``(MAX_IDS_PER_EXAMPLE + 1,)`` histogram (last bin: that many or more).
        unique_ratio_sum: sum over sampled batches of ``unique ids / ids``.
        sketch: Misra-Gries counters ``{id: count}``, at most ``capacity`` entries.
        sketch_total: ids the sketch has seen (its error bound is ``total / (capacity + 1)``).
        shard_load: lookups each rank served (one entry per rank; a single entry for the
            unsharded engine), summed over sampled batches.
        unique_ids: sum over sampled batches of the batch's distinct ids (keys per step).
        rows_held: a dynamic table's rows, the most seen at a sampled batch (0: a fixed
            table, or none seen yet).
        cache: a disk table's :data:`CACHE_COUNTERS` over every step (not sampled); empty
            for a table in memory.
    """

    table: str
    key: dict[str, Any]
    capacity: int = 256
    batches: int = 0
    examples: int = 0
    ids: int = 0
    ids_per_example: np.ndarray = field(
        default_factory=lambda: np.zeros(MAX_IDS_PER_EXAMPLE + 1, dtype=np.int64)
    )
    unique_ratio_sum: float = 0.0
    sketch: dict[int, int] = field(default_factory=dict)
    sketch_total: int = 0
    shard_load: list[int] = field(default_factory=list)
    unique_ids: int = 0
    rows_held: int = 0
    cache: dict[str, int] = field(default_factory=dict)

    # ------------------------------------------------------------------ summaries
    def quantile(self, q: float) -> int:
        """The ``q`` quantile of ids per example (exact, from the histogram)."""
        if self.examples == 0:
            return 0
        cumulative = np.cumsum(self.ids_per_example)
        return int(np.searchsorted(cumulative, q * self.examples, side="left"))

    @property
    def mean_ids_per_example(self) -> float:
        return self.ids / self.examples if self.examples else 0.0

    @property
    def unique_ratio(self) -> float:
        return self.unique_ratio_sum / self.batches if self.batches else 0.0

    @property
    def mean_unique_ids(self) -> float:
        """Distinct ids per sampled batch (unique keys per step), on average."""
        return self.unique_ids / self.batches if self.batches else 0.0

    @property
    def hit_rate(self) -> float | None:
        """A disk table's cache hits per distinct id looked up (``None``: no lookups)."""
        looked = self.cache.get("hits", 0) + self.cache.get("misses", 0)
        return self.cache["hits"] / looked if looked else None

    def per_step(self, counter: str) -> float | None:
        """A disk table's :data:`CACHE_COUNTERS` entry per step (``None``: no step ended)."""
        steps = self.cache.get("steps", 0)
        return self.cache.get(counter, 0) / steps if steps else None

    @property
    def sketch_error(self) -> float:
        """The largest amount by which a sketch count may undercount its id."""
        return self.sketch_total / (self.capacity + 1)

    def hottest(self, k: int | None = None) -> list[tuple[int, int]]:
        """``[(id, estimated count), ...]``, hottest first (ties by id)."""
        items = sorted(self.sketch.items(), key=lambda kv: (-kv[1], kv[0]))
        return items if k is None else items[:k]

    # ------------------------------------------------------------------ updates
    def add_counts(self, ids: np.ndarray, counts: np.ndarray) -> None:
        """Merge a batch's exact id counts into the Misra-Gries sketch."""
        self.sketch_total += int(counts.sum())
        self.sketch = merged_sketch(self.sketch, ids, counts, self.capacity)

    def merge(self, other: TableStats) -> None:
        """Add another run's statistics (same key) into this one."""
        if other.key != self.key:
            raise ValueError(f"table '{self.table}': cannot merge statistics of another key")
        self.batches += other.batches
        self.examples += other.examples
        self.ids += other.ids
        self.ids_per_example = self.ids_per_example + other.ids_per_example
        self.unique_ratio_sum += other.unique_ratio_sum
        self.capacity = min(self.capacity, other.capacity)
        self.sketch = merged_sketch(
            self.sketch,
            np.fromiter(other.sketch.keys(), dtype=np.int64, count=len(other.sketch)),
            np.fromiter(other.sketch.values(), dtype=np.int64, count=len(other.sketch)),
            self.capacity,
        )
        self.sketch_total += other.sketch_total
        self.unique_ids += other.unique_ids
        self.rows_held = max(self.rows_held, other.rows_held)
        self.cache = added(self.cache, other.cache)
        if len(other.shard_load) == len(self.shard_load):
            self.shard_load = [
                a + b for a, b in zip(self.shard_load, other.shard_load, strict=True)
            ]

    # ------------------------------------------------------------------ JSON
    def to_json(self) -> dict[str, Any]:
        nonzero = np.nonzero(self.ids_per_example)[0]
        return {
            "format_version": FORMAT_VERSION,
            "table": self.table,
            "key": self.key,
            "capacity": self.capacity,
            "batches": self.batches,
            "examples": self.examples,
            "ids": self.ids,
            "ids_per_example": {str(i): int(self.ids_per_example[i]) for i in nonzero},
            "unique_ratio_sum": self.unique_ratio_sum,
            "sketch": [[i, c] for i, c in self.hottest()],
            "sketch_total": self.sketch_total,
            "shard_load": self.shard_load,
            "unique_ids": self.unique_ids,
            "rows_held": self.rows_held,
            "cache": dict(self.cache),
            "summary": {
                "mean_ids_per_example": self.mean_ids_per_example,
                "p50_ids_per_example": self.quantile(0.5),
                "p99_ids_per_example": self.quantile(0.99),
                "unique_ratio": self.unique_ratio,
                "mean_unique_ids": self.mean_unique_ids,
                "rows_held": self.rows_held,
                **self._cache_summary(),
            },
        }

    def _cache_summary(self) -> dict[str, Any]:
        if not self.cache:
            return {}
        return {
            "hit_rate": self.hit_rate,
            **{f"{c}_per_step": self.per_step(c) for c in CACHE_COUNTERS[3:]},
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TableStats:
        if data.get("format_version") != FORMAT_VERSION:
            raise ValueError(
                f"lookup statistics: format_version {data.get('format_version')!r} is not "
                f"{FORMAT_VERSION}"
            )
        hist = np.zeros(MAX_IDS_PER_EXAMPLE + 1, dtype=np.int64)
        for i, c in data["ids_per_example"].items():
            hist[int(i)] = c
        return cls(
            table=data["table"],
            key=data["key"],
            capacity=data["capacity"],
            batches=data["batches"],
            examples=data["examples"],
            ids=data["ids"],
            ids_per_example=hist,
            unique_ratio_sum=data["unique_ratio_sum"],
            sketch={int(i): int(c) for i, c in data["sketch"]},
            sketch_total=data["sketch_total"],
            shard_load=list(data["shard_load"]),
            unique_ids=int(data.get("unique_ids", 0)),  # absent in files of older versions
            rows_held=int(data.get("rows_held", 0)),
            cache={str(k): int(v) for k, v in data.get("cache", {}).items()},
        )


def table_key(
    name: str,
    vocabulary_size: int | None,
    dim: int,
    num_features: int,
    strategy: str,
    world_size: int,
) -> dict[str, Any]:
    """What a statistics file is keyed by: the table's and the global parameters."""
    return {
        "table": name,
        "vocabulary_size": vocabulary_size,
        "dim": dim,
        "num_features": num_features,
        "sharding_strategy": strategy,
        "world_size": world_size,
    }


def stats_path(directory: str | os.PathLike[str], key: dict[str, Any]) -> Path:
    """``DIR/<table>-<hash of key>.json``; the table part is sanitized for file systems."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", key["table"])[:80]
    return Path(directory) / f"{safe}-{digest}.json"


def _write_atomic(path: Path, text: str) -> None:
    _atomic.write_atomic(path, text.encode())


def load_stats(directory: str | os.PathLike[str], key: dict[str, Any]) -> TableStats | None:
    """The statistics stored for ``key`` in ``directory``, or ``None`` if there are none."""
    path = stats_path(directory, key)
    if not path.exists():
        return None
    stats = TableStats.from_json(json.loads(path.read_text()))
    if stats.key != key:
        raise ValueError(f"lookup statistics {path}: stored key {stats.key} is not {key}")
    return stats


@dataclass(frozen=True)
class StatsTable:
    """What the collector needs of one table.

    Attributes:
        name, vocabulary_size, dim, num_features: the table's parameters (part of its key;
            ``vocabulary_size`` is ``None`` for a dynamic table).
        load_of: ``ids (N,) int64 -> (num_shards,) int64``, the lookups each rank serves for
            these ids under the table's placement; ``None``: all on one shard.
        num_shards: entries of :attr:`TableStats.shard_load` (the world size when sharded).
        strategy: the table's placement, part of its key (``None``: the collector's).
        rows_held: ``() -> int``, a dynamic table's rows now (over all ranks); ``None`` for a
            fixed table.
        cache_counters: ``() -> {counter: int}``, a disk table's :data:`CACHE_COUNTERS`
            since it was made, on this rank; ``None`` for a table in memory.
    """

    name: str
    vocabulary_size: int | None
    dim: int
    num_features: int
    load_of: Callable[[np.ndarray], np.ndarray] | None = None
    num_shards: int = 1
    strategy: str | None = None
    rows_held: Callable[[], int] | None = None
    cache_counters: Callable[[], dict[str, int]] | None = None


class StatsCollector:
    """Samples batches and accumulates :class:`TableStats` per table.

    Args:
        directory: where :meth:`flush` writes one file per table.
        tables: the tables, in engine order.
        sample_rate: the fraction of batches profiled (about 3% by default).
        strategy, world_size: the global configuration, part of every file's key.
        capacity: heavy-hitter sketch size per table.
        seed: seeds the sampling decisions (a private generator; global RNGs are untouched).
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        tables: Sequence[StatsTable],
        *,
        sample_rate: float = 0.03,
        strategy: str = "div",
        world_size: int = 1,
        capacity: int = 256,
        seed: int = 0,
    ) -> None:
        if not 0.0 < sample_rate <= 1.0:
            raise ValueError(f"StatsCollector: sample_rate must be in (0, 1], got {sample_rate}")
        self.directory = Path(directory)
        self.sample_rate = sample_rate
        self._tables = list(tables)
        self._options = {"strategy": strategy, "capacity": capacity, "seed": seed}
        self._rng = np.random.default_rng(seed)
        self.stats = [
            TableStats(
                t.name,
                table_key(
                    t.name,
                    t.vocabulary_size,
                    t.dim,
                    t.num_features,
                    t.strategy or strategy,
                    world_size,
                ),
                capacity=capacity,
                shard_load=[0] * t.num_shards,
            )
            for t in self._tables
        ]
        self._cache_seen = [counters(t.cache_counters) for t in self._tables]

    def count_cache(self) -> None:
        """Add what each disk table counted since the last call to its statistics."""
        for i, t in enumerate(self._tables):
            now, before = counters(t.cache_counters), self._cache_seen[i]
            if now is not None and before is not None:
                delta = {k: now[k] - before[k] for k in CACHE_COUNTERS}
                self.stats[i].cache = added(self.stats[i].cache, delta)
                self._cache_seen[i] = now

    def regrouped(self, tables: Sequence[StatsTable], *, world_size: int) -> StatsCollector:
        """A fresh collector with this one's directory, rate and seed for another layout of
        the same tables (the sharded engine's placements and world size)."""
        return StatsCollector(
            self.directory,
            tables,
            sample_rate=self.sample_rate,
            world_size=world_size,
            **self._options,
        )

    def maybe_observe(self, features_by_table: Sequence[Sequence[FeatureBatch]]) -> bool:
        """Profile this batch with probability ``sample_rate``; return whether it was.
        Disk tables' counters are brought up to date at every batch."""
        self.count_cache()
        if self._rng.random() >= self.sample_rate:
            return False
        self.observe(features_by_table)
        return True

    def observe(self, features_by_table: Sequence[Sequence[FeatureBatch]]) -> None:
        """Add one batch: ``features_by_table[t]`` are table ``t``'s features of the batch."""
        for table, stats, batches in zip(self._tables, self.stats, features_by_table, strict=True):
            if not batches:
                continue
            per_row = [_ids_per_row(b) for b in batches]
            if all(r.shape == per_row[0].shape for r in per_row):
                per_example = np.sum(per_row, axis=0)  # features of one batch share its rows
            else:
                per_example = np.concatenate(per_row)
            ids = np.concatenate([b.values.cpu().numpy() for b in batches])
            stats.batches += 1
            stats.examples += int(per_example.size)
            stats.ids += int(ids.size)
            stats.ids_per_example += np.bincount(
                np.minimum(per_example, MAX_IDS_PER_EXAMPLE), minlength=MAX_IDS_PER_EXAMPLE + 1
            )
            if table.rows_held is not None:
                stats.rows_held = max(stats.rows_held, int(table.rows_held()))
            if ids.size:
                unique, counts = np.unique(ids, return_counts=True)
                stats.unique_ratio_sum += unique.size / ids.size
                stats.unique_ids += int(unique.size)
                stats.add_counts(unique, counts)
                if table.load_of is None:
                    stats.shard_load[0] += int(ids.size)
                else:
                    load = table.load_of(ids)
                    stats.shard_load = [
                        a + int(b) for a, b in zip(stats.shard_load, load, strict=True)
                    ]

    def flush(
        self, *, others: Sequence[Sequence[TableStats]] = (), write: bool = True
    ) -> list[Path]:
        """Write (merging with what is stored under the same key) one file per table, then
        start counting afresh.

        Args:
            others: other collectors' statistics of the same tables (the other ranks of a
                sharded engine), added to this one's before writing.
            write: ``False`` only resets (a rank that leaves the writing to another); the
                paths that are written elsewhere are still returned.
        """
        self.count_cache()
        paths = []
        for i, stats in enumerate(self.stats):
            total = TableStats.from_json(stats.to_json())
            for other in others:
                total.merge(other[i])
            if total.cache:  # every rank ends the same steps: counted once
                steps = [stats.cache.get("steps", 0)] + [o[i].cache.get("steps", 0) for o in others]
                total.cache["steps"] = max(steps)
            if total.batches == 0 and not total.cache:
                continue
            path = stats_path(self.directory, total.key)
            if write:
                stored = load_stats(self.directory, total.key)
                if stored is not None:
                    stored.merge(total)
                    total = stored
                _write_atomic(path, json.dumps(total.to_json(), indent=1))
            paths.append(path)
        for i, stats in enumerate(self.stats):  # written: start counting afresh
            self.stats[i] = TableStats(
                stats.table,
                stats.key,
                capacity=stats.capacity,
                shard_load=[0] * len(stats.shard_load),
            )
        return paths


def _ids_per_row(batch: FeatureBatch) -> np.ndarray:
    """``(B,)``: ids of each example (row) of a feature, its samples summed."""
    lengths = (batch.offsets[1:] - batch.offsets[:-1]).cpu().numpy()
    rows = batch.output_shape[0] if batch.output_shape else 1
    return lengths.reshape(rows, -1).sum(axis=1) if rows else lengths[:0]
