"""MovieLens-100k as a finite source of the main job: epochs of reshuffled training ratings.

The ratings and the split are :func:`~embcore.data.movielens.read_movielens`'s. Epoch ``e``
visits the training ratings in the order of a permutation drawn from ``(data.seed, e)``, in
batches of ``data.batch_size`` (the last one of an epoch may be smaller), so training batch
``i`` is a pure function of the config and ``i``: a resumed run reads exactly the rows an
uninterrupted one would. The run trains ``train.epochs`` epochs (0: :data:`DEFAULT_EPOCHS`)
and evaluates after each (:func:`epoch_config`).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
from collections.abc import Iterator

import numpy as np

from embcore.data.bad_rows import BadRows
from embcore.data.batch import Batch
from embcore.data.movielens import FILES, LAYOUT, movielens_rows, read_movielens
from embcore.train.config import Config, DataConfig
from embcore.train.sources import EVAL_BATCH, EvalSet, Source

__all__ = ["DEFAULT_EPOCHS", "MovieLensSource", "epoch_config"]

#: Epochs of a movielens run with ``train.epochs = 0``.
DEFAULT_EPOCHS = 4


class MovieLensSource(Source):
    """The ratings of ``cfg.path`` (module docstring).

    Args:
        cfg: the ``[data]`` section.
        keys: hand raw 64-bit keys to the model (dynamic tables, ``data.raw_ids``) instead of
            rows of fixed tables of ``vocab_sizes``.
        vocab_sizes: the fixed tables' rows, one per feature of the layout.
    """

    layout = LAYOUT

    def __init__(self, cfg: DataConfig, *, keys: bool, vocab_sizes: list[int]) -> None:
        self.cfg = cfg
        self.vocab_sizes = vocab_sizes
        skip = cfg.bad_rows == "skip"
        self.bad = {os.path.join(cfg.path, name): BadRows(skip) for name in FILES}
        data = read_movielens(cfg.path, self.bad)
        ids = data.keys if keys else movielens_rows(data.keys, vocab_sizes)
        self.keys = keys
        self.train_rows = data.train_rows
        self._dense, self._ids, self._labels = data.dense, ids, data.labels
        self.steps_per_epoch = math.ceil(self.train_rows / cfg.batch_size)
        self._order: tuple[int, np.ndarray] = (-1, np.zeros(0, dtype=np.int64))

    def order(self, epoch: int) -> np.ndarray:
        """The training rows in the order epoch ``epoch`` visits them."""
        if self._order[0] != epoch:
            rng = np.random.default_rng([self.cfg.seed, epoch])
            self._order = (epoch, rng.permutation(self.train_rows))
        return self._order[1]

    def _batch(self, rows: np.ndarray) -> Batch:
        return Batch.from_numpy(self._dense[rows], self._ids[rows], self._labels[rows])

    def train_batches(self, start_step: int) -> Iterator[Batch]:
        size = self.cfg.batch_size
        for step in itertools.count(start_step):
            epoch, index = divmod(step, self.steps_per_epoch)
            yield self._batch(self.order(epoch)[index * size : (index + 1) * size])

    def eval_set(self) -> EvalSet:
        total = len(self._labels) - self.train_rows
        rows = min(total, self.cfg.eval_rows) if self.cfg.eval_rows else total
        start = self.train_rows
        batches = [
            self._batch(np.arange(start + i, start + min(i + EVAL_BATCH, rows)))
            for i in range(0, rows, EVAL_BATCH)
        ]
        return EvalSet(batches, None)

    def skipped_rows(self) -> dict[str, int]:
        return {path: bad.count for path, bad in self.bad.items()}

    def run_config(self, config: Config) -> Config:
        return epoch_config(config, self.steps_per_epoch)

    def describe(self) -> str:
        held = len(self._labels) - self.train_rows
        return (
            f"MovieLens ratings of {self.cfg.path} ({self.train_rows:,} train, {held:,} "
            f"held out, by time; label: rating >= 4), {self.steps_per_epoch} steps per epoch"
        )


def epoch_config(config: Config, steps_per_epoch: int) -> Config:
    """``config`` with ``train.steps`` = epochs x ``steps_per_epoch`` and an evaluation after
    every epoch (``train.epochs``, 0: :data:`DEFAULT_EPOCHS`)."""
    epochs = config.train.epochs or DEFAULT_EPOCHS
    train = dataclasses.replace(
        config.train, steps=epochs * steps_per_epoch, eval_every=steps_per_epoch
    )
    return dataclasses.replace(config, train=train)
