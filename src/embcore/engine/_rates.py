"""Each step's learning rates: one per table, read with the step's gradients.

A learning rate is a number or a callable; each distinct callable is called once per step,
however many tables share it (docs/semantics.md §3.13).
"""

from __future__ import annotations

from collections.abc import Sequence

from embcore.config import ResolvedTable

__all__ = ["learning_rates"]


def learning_rates(tables: Sequence[ResolvedTable]) -> list[float]:
    """One rate per table (every table has an optimizer)."""
    values: dict[int, float] = {}
    rates = []
    for t in tables:
        lr = t.optimizer.learning_rate  # type: ignore[union-attr]
        if callable(lr):
            if id(lr) not in values:
                values[id(lr)] = float(lr())
            rates.append(values[id(lr)])
        else:
            rates.append(float(lr))
    return rates
