"""FTRL-Proximal (docs/semantics.md §1.6, §3.7), in both of TensorFlow's forms."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from embcore._validate import check_bool, check_real
from embcore.optimizers.base import LearningRate, Optimizer, SlotSpec

__all__ = ["FTRL"]


@dataclass(frozen=True)
class FTRL(Optimizer):
    """FTRL-Proximal. With ``p = -learning_rate_power``, ``a = lr``::

        acc_new = acc + g^2
        lin    <- lin + g - (acc_new^p - acc^p) / a * w
        w      <- (clamp(lin, -l1, l1) - lin) / ((acc_new^p + beta) / a + 2 * l2)
        acc    <- acc_new

    With ``multiply_linear_by_learning_rate=True`` the ``linears`` slot stores ``a * lin``::

        lin    <- lin + a * g - (acc_new^p - acc^p) * w
        w      <- (clamp(lin, -a * l1, a * l1) - lin) / (acc_new^p + beta + 2 * a * l2)

    The new weight is recomputed from the slots, so a touched row forgets its initial value
    (docs/semantics.md §6 pitfall 28). ``accumulators`` start at ``initial_accumulator_value`` (>=
    0; zero is supported, unlike TF2's check), ``linears`` at 0. ``allow_zero_accumulator`` is
    accepted and ignored (deprecated in TensorFlow; zero accumulators always work here).

    The learning rate must be > 0, as TensorFlow's ``ApplyFtrl`` requires: the update divides
    by it (a constant 0 is refused here, a callable returning 0 at the step).
    """

    positive_learning_rate: ClassVar[bool] = True

    learning_rate: LearningRate = 0.001
    learning_rate_power: float = -0.5
    l1_regularization_strength: float = 0.0
    l2_regularization_strength: float = 0.0
    beta: float = 0.0
    initial_accumulator_value: float = 0.1
    multiply_linear_by_learning_rate: bool = False
    allow_zero_accumulator: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        owner = "FTRL"
        power = check_real(owner, "learning_rate_power", self.learning_rate_power)
        if power > 0:
            raise ValueError(f"{owner}: learning_rate_power must be <= 0, got {power}")
        object.__setattr__(self, "learning_rate_power", power)
        for field in (
            "l1_regularization_strength",
            "l2_regularization_strength",
            "beta",
            "initial_accumulator_value",
        ):
            object.__setattr__(
                self, field, check_real(owner, field, getattr(self, field), minimum=0)
            )
        check_bool(owner, "multiply_linear_by_learning_rate", self.multiply_linear_by_learning_rate)
        check_bool(owner, "allow_zero_accumulator", self.allow_zero_accumulator)

    def slot_specs(self) -> tuple[SlotSpec, ...]:
        return (SlotSpec("accumulators", self.initial_accumulator_value), SlotSpec("linears", 0.0))

    def rule(
        self, weights: Tensor, slots: dict[str, Tensor], grad: Tensor, lr: float, step: int
    ) -> tuple[Tensor, dict[str, Tensor]]:
        p = -self.learning_rate_power
        l1, l2, beta = (
            self.l1_regularization_strength,
            self.l2_regularization_strength,
            self.beta,
        )
        acc = slots["accumulators"]
        acc_new = acc + grad * grad
        acc_pow_new, acc_pow = acc_new**p, acc**p
        if self.multiply_linear_by_learning_rate:
            lin = slots["linears"] + lr * grad - (acc_pow_new - acc_pow) * weights
            limit = lr * l1
            quad = acc_pow_new + beta + 2 * lr * l2
        else:
            lin = slots["linears"] + grad - (acc_pow_new - acc_pow) / lr * weights
            limit = l1
            quad = (acc_pow_new + beta) / lr + 2 * l2
        # w = 0 where |lin| <= limit (docs/semantics.md §3.7). Spelled out because with a zero
        # accumulator and a zero gradient (beta = l2 = 0) quad is 0 too, and 0 / 0 would give NaN.
        numer = torch.clamp(lin, -limit, limit) - lin
        new_weights = torch.where(numer == 0, torch.zeros_like(numer), numer / quad)
        return new_weights, {"accumulators": acc_new, "linears": lin}
