"""Adagrad (docs/semantics.md §1.3, §3.3)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from embcore._validate import check_real
from embcore.optimizers.base import LearningRate, Optimizer, SlotSpec

__all__ = ["Adagrad"]


@dataclass(frozen=True)
class Adagrad(Optimizer):
    """Element-wise Adagrad, without epsilon::

        acc <- acc + g^2
        w   <- w - lr * g / sqrt(acc)

    Args:
        learning_rate: a float, or a zero-argument callable evaluated once per step.
        initial_accumulator_value: the value ``accumulators`` start at; must be > 0 (it is
            what keeps the division finite).
    """

    learning_rate: LearningRate = 0.001
    initial_accumulator_value: float = 0.1

    def __post_init__(self) -> None:
        super().__post_init__()
        value = check_real(
            "Adagrad",
            "initial_accumulator_value",
            self.initial_accumulator_value,
            minimum=0.0,
            strict_minimum=True,
        )
        object.__setattr__(self, "initial_accumulator_value", value)

    def slot_specs(self) -> tuple[SlotSpec, ...]:
        return (SlotSpec("accumulators", self.initial_accumulator_value),)

    def rule(
        self, weights: Tensor, slots: dict[str, Tensor], grad: Tensor, lr: float, step: int
    ) -> tuple[Tensor, dict[str, Tensor]]:
        acc = slots["accumulators"] + grad * grad
        return weights - lr * grad / torch.sqrt(acc), {"accumulators": acc}
