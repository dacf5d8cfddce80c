"""Per-optimizer row rules of the Triton backend, one module per optimizer.

Each module defines ``update(state, plan, grad, lr, step)``: one launch of its kernel that,
per unique row of ``plan`` (every row for non-lazy Adam), sums the row's gradient, applies
gradient clip, weight decay, its rule and weight clip (:mod:`._common`), and writes the row and
its slots in place. Adding an optimizer adds a module and one line to :data:`RULES`.
"""

from __future__ import annotations

from types import ModuleType

from embcore.ops.triton.rules import adagrad, adagrad_momentum, adam, ftrl, rowwise_adagrad, sgd
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
