"""Stochastic gradient descent (docs/semantics.md §1.2, §3.2)."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from embcore.optimizers.base import LearningRate, Optimizer

__all__ = ["SGD"]


@dataclass(frozen=True)
class SGD(Optimizer):
    """``w <- w - lr * g``. No slots.

    Args:
        learning_rate: a float, or a zero-argument callable evaluated once per step.
    """

    learning_rate: LearningRate = 0.01

    def rule(
        self, weights: Tensor, slots: dict[str, Tensor], grad: Tensor, lr: float, step: int
    ) -> tuple[Tensor, dict[str, Tensor]]:
        return weights - lr * grad, {}
