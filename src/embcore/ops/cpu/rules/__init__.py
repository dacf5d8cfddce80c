"""Per-optimizer row rules of the CPU backend, one module per optimizer.

Each module defines ``hyperparameters(optimizer, lr, step) -> list[float]`` (one float32 row
per table, the rule's constants for this step) and a Numba kernel ``update(tables, features,
plan, hp, common)`` that applies gradient clip, weight decay, its rule and weight clip once to
every unique row of ``plan``. A module may also define ``update_all`` for optimizers that move
every row (non-lazy Adam), and ``fused(tables, features, first, plan, order, fuse, hp,
common)``: the dedup of every table, each ``fuse[t]`` table's rule right after its own (used
when every table of a step has that optimizer), and ``update_listed(tables, plan, occ, hp,
common, active)``: the rule on tables deduplicated into occurrence lists
(:mod:`embcore.ops.cpu.occurrences`, tables of bags of several ids), summing each chunk of
rows in cache first.
Adding an optimizer adds a module and one line to :data:`RULES`.
"""

from __future__ import annotations

from types import ModuleType

from embcore.ops.cpu.rules import adagrad, adagrad_momentum, adam, ftrl, rowwise_adagrad, sgd
from embcore.optimizers import FTRL, SGD, Adagrad, AdagradMomentum, Adam, RowwiseAdagrad

__all__ = ["RULES"]

#: optimizer class -> the module with its row rule
RULES: dict[type, ModuleType] = {
    SGD: sgd,
    Adagrad: adagrad,
    RowwiseAdagrad: rowwise_adagrad,
    AdagradMomentum: adagrad_momentum,
    Adam: adam,
    FTRL: ftrl,
}
