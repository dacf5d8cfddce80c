"""Training and held-out rows for a run, from the ``[data]`` config.

Both kinds of source give training batch ``i`` as a pure function of the config and ``i``, so a
run resumed at step ``i`` reads exactly the rows an uninterrupted run would:

* synthetic: batch ``i`` of :class:`~embcore.data.synthetic.SyntheticCriteo`'s train split;
  with ``data.raw_ids`` its ids mixed into raw 64-bit ids (:func:`raw_ids`);
* files: rows ``[i B, (i + 1) B)`` of the training file read in a loop (epoch after epoch),
  their hashes folded into the fixed tables or, for dynamic tables and ``data.raw_ids``, as
  raw 64-bit keys (:mod:`embcore.train.contract`);
* movielens: :mod:`embcore.train.movielens_source` (finite: epochs).
"""

from __future__ import annotations

import abc
import itertools
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch

from embcore.data.bad_rows import BadRows
from embcore.data.batch import Batch, capped_vocab_sizes, rebatch
from embcore.data.criteo_tsv import open_text, read_criteo_tsv
from embcore.data.layout import CRITEO_LAYOUT, Layout
from embcore.data.parquet import read_criteo_parquet
from embcore.data.synthetic import SyntheticCriteo
from embcore.errors import UserError, reading
from embcore.train.config import Config, DataConfig

__all__ = [
    "EvalSet",
    "FileSource",
    "Source",
    "SyntheticSource",
    "build_source",
    "raw_ids",
    "run_source",
]

#: Rows per forward pass when scoring held-out data.
EVAL_BATCH = 8192


@dataclass(frozen=True)
class EvalSet:
    """Held-out rows, and the true click probabilities when the source knows them."""

    batches: list[Batch]
    true_probs: np.ndarray | None

    @property
    def labels(self) -> np.ndarray:
        return np.concatenate([b.labels.numpy() for b in self.batches])

    @property
    def rows(self) -> int:
        return sum(b.size for b in self.batches)


class Source(abc.ABC):
    """What the training loop reads."""

    vocab_sizes: list[int]
    layout: Layout = CRITEO_LAYOUT

    @abc.abstractmethod
    def train_batches(self, start_step: int) -> Iterator[Batch]:
        """Training batches ``start_step, start_step + 1, ...`` without end."""

    @abc.abstractmethod
    def eval_set(self) -> EvalSet:
        """The held-out rows, read once."""

    @abc.abstractmethod
    def describe(self) -> str:
        """One line for the run's log."""

    def skipped_rows(self) -> dict[str, int]:
        """Malformed rows skipped so far per file (``data.bad_rows = "skip"``)."""
        return {}

    def run_config(self, config: Config) -> Config:
        """The config the run uses: ``config`` itself, but a finite source sets the steps."""
        return config


def raw_ids(sparse: np.ndarray) -> np.ndarray:
    """``(B, F) int64`` ids -> ``(B, F) int64`` raw 64-bit ids, negatives included: SplitMix64's
    finalizer of ``id + 2**40 f`` for column ``f``. A bijection per column, so distinct ids
    stay distinct (and the hidden model, which sees the ids, is unchanged)."""
    salt = (np.arange(sparse.shape[1], dtype=np.uint64) << np.uint64(40))[None, :]
    z = sparse.astype(np.uint64) + salt + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return (z ^ (z >> np.uint64(31))).view(np.int64)


def _raw(batch: Batch) -> Batch:
    return Batch(batch.dense, torch.from_numpy(raw_ids(batch.sparse.numpy())), batch.labels)


class SyntheticSource(Source):
    def __init__(self, cfg: DataConfig) -> None:
        self.cfg = cfg
        self.data = SyntheticCriteo(
            seed=cfg.seed, vocab_cap=cfg.vocab_cap, zipf_a=cfg.zipf_a, hot_ids=cfg.hot_ids
        )
        self.vocab_sizes = self.data.vocab_sizes

    def train_batches(self, start_step: int) -> Iterator[Batch]:
        for step in itertools.count(start_step):
            batch = self.data.batch("train", step, self.cfg.batch_size)
            yield _raw(batch) if self.cfg.raw_ids else batch

    def eval_set(self) -> EvalSet:
        batches, probs = [], []
        for i, start in enumerate(range(0, self.cfg.eval_rows, EVAL_BATCH)):
            batch, p = self.data.sample("eval", i, min(EVAL_BATCH, self.cfg.eval_rows - start))
            batches.append(_raw(batch) if self.cfg.raw_ids else batch)
            probs.append(p)
        return EvalSet(batches, np.concatenate(probs))

    def describe(self) -> str:
        raw = ", as raw 64-bit ids" if self.cfg.raw_ids else ""
        return self.data.describe() + raw


Reader = Callable[..., Iterator[Batch]]


def _count_tsv_rows(path: str) -> int:
    with reading(path, "a Criteo TSV file, plain or gzip"), open_text(path) as f:
        return sum(1 for line in f if line.strip())


def _count_parquet_rows(path: str) -> int:
    import pyarrow.parquet as pq  # the reader already checked that pyarrow imports

    with reading(path, "a Parquet file"):
        return int(pq.ParquetFile(path).metadata.num_rows)


class FileSource(Source):
    """Criteo TSV or Parquet files; ``keys``: hand the hashes over as raw 64-bit keys."""

    def __init__(
        self,
        cfg: DataConfig,
        reader: Reader,
        count_rows: Callable[[str], int],
        keys: bool = False,
    ) -> None:
        for name in ("path", "eval_path"):
            where = getattr(cfg, name)
            if not os.path.exists(where):
                raise FileNotFoundError(f"[data] {name}: no such file {where!r}")
            if not os.path.isfile(where):
                raise UserError(f"[data] {name}: {where!r} is not a file (a directory?)")
        self.cfg = cfg
        self.reader = reader
        self.count_rows = count_rows
        self.vocab_sizes = capped_vocab_sizes(cfg.vocab_cap)
        self.keys = keys
        skip = cfg.bad_rows == "skip"
        self.bad = {cfg.path: BadRows(skip), cfg.eval_path: BadRows(skip)}

    def skipped_rows(self) -> dict[str, int]:
        return {path: bad.count for path, bad in self.bad.items()}

    def _read(self, path: str, skip_rows: int = 0) -> Iterator[Batch]:
        return self.reader(
            path,
            batch_size=self.cfg.batch_size,
            vocab_sizes=None if self.keys else self.vocab_sizes,
            skip_rows=skip_rows,
            bad_rows=self.bad[path],
        )

    def train_batches(self, start_step: int) -> Iterator[Batch]:
        def epochs() -> Iterator[Batch]:
            skip = start_step * self.cfg.batch_size
            if skip:  # only a resumed run needs the file's length, to wrap around
                total = self._count(self.cfg.path)
                if total == 0:
                    raise UserError(f"[data] path: {self.cfg.path}: has no rows")
                skip %= total
            while True:
                rows = 0
                for batch in self._read(self.cfg.path, skip):
                    rows += batch.size
                    yield batch
                if rows == 0 and skip == 0:
                    raise UserError(f"[data] path: {self.cfg.path}: has no well-formed rows")
                skip = 0

        return rebatch(epochs(), self.cfg.batch_size)

    def eval_set(self) -> EvalSet:
        batches, rows = [], 0
        for batch in self._read(self.cfg.eval_path):
            if self.cfg.eval_rows and rows + batch.size > self.cfg.eval_rows:
                batch = batch.slice(0, self.cfg.eval_rows - rows)
            batches.append(batch)
            rows += batch.size
            if self.cfg.eval_rows and rows >= self.cfg.eval_rows:
                break
        if not rows:
            raise UserError(f"[data] eval_path: {self.cfg.eval_path}: has no well-formed rows")
        return EvalSet(batches, None)

    def _count(self, path: str) -> int:
        """Rows of ``path`` that batches hold (only well-formed ones when skipping)."""
        if not self.bad[path].skip:
            return self.count_rows(path)
        return sum(batch.size for batch in self._read(path))

    def describe(self) -> str:
        return f"{self.cfg.source} file {self.cfg.path} (held out: {self.cfg.eval_path})"


def build_source(cfg: DataConfig, *, keys: bool = False) -> Source:
    """The source named by ``cfg.source``; ``keys``: a file source hands raw 64-bit keys over
    (for a whole run, :func:`run_source` decides)."""
    if cfg.source == "synthetic":
        return SyntheticSource(cfg)
    if cfg.source == "movielens":
        from embcore.data.movielens import TABLE_ROWS
        from embcore.train.movielens_source import MovieLensSource

        vocab = capped_vocab_sizes(cfg.vocab_cap, TABLE_ROWS)
        return MovieLensSource(cfg, keys=keys or cfg.raw_ids, vocab_sizes=vocab)
    if cfg.source == "criteo_tsv":
        return FileSource(cfg, read_criteo_tsv, _count_tsv_rows, keys)
    return FileSource(cfg, read_criteo_parquet, _count_parquet_rows, keys)


def run_source(config: Config) -> Source:
    """The source of a run: its ids in the run's id mode (:mod:`embcore.train.contract`)."""
    from embcore.train.contract import source_gives_keys, vocab_sizes_for
    from embcore.train.movielens_source import MovieLensSource

    keys = source_gives_keys(config)
    if config.data.source == "movielens":
        return MovieLensSource(config.data, keys=keys, vocab_sizes=vocab_sizes_for(config))
    return build_source(config.data, keys=keys)
