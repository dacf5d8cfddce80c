"""Embedding optimizers: frozen specs with a readable per-row update (docs/semantics.md §3)."""

from embcore.optimizers.adagrad import Adagrad
from embcore.optimizers.adagrad_momentum import AdagradMomentum
from embcore.optimizers.adam import Adam
from embcore.optimizers.base import LearningRate, Optimizer, SlotSpec
from embcore.optimizers.ftrl import FTRL
from embcore.optimizers.rowwise_adagrad import RowwiseAdagrad
from embcore.optimizers.sgd import SGD

__all__ = [
    "FTRL",
    "SGD",
    "Adagrad",
    "AdagradMomentum",
    "Adam",
    "LearningRate",
    "Optimizer",
    "RowwiseAdagrad",
    "SlotSpec",
]
