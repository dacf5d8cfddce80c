"""Each step's learning rates: one per table, read with the step's gradients.

A learning rate is a number or a callable; each distinct callable is called once per step,
however many tables share it (docs/semantics.md §3.13), and its value is checked before any
state changes (docs/reliability.md, "Hyperparameters").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import Tensor

from embcore.config import ResolvedTable

__all__ = ["learning_rates"]


def learning_rates(tables: Sequence[ResolvedTable], step: int | Tensor) -> list[float]:
    """One rate per table (every table has an optimizer) for update ``step`` (1-based; read
    only for an error message, so a device-side counter costs no sync)."""
    called: dict[int, Any] = {}
    return [
        t.optimizer.learning_rate_at(step, table=t.name, evaluated=called)  # type: ignore[union-attr]
        for t in tables
    ]
