"""Adagrad with momentum (docs/semantics.md §1.4, §3.4; arXiv 2002.11803)."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from embcore._validate import check_bool, check_real
from embcore.optimizers.base import LearningRate, Optimizer, SlotSpec

__all__ = ["AdagradMomentum"]


@dataclass(frozen=True)
class AdagradMomentum(Optimizer):
    """Adagrad whose scaled gradient feeds a momentum::

        acc <- acc + g^2                       if beta2 == 1
        acc <- beta2 * acc + (1 - beta2) * g^2 otherwise
        s   <- g * (acc + epsilon)^(-1/exponent)
        m   <- momentum * m + s
        w   <- w - lr * (momentum * m + s if use_nesterov else m)

    Both slots, ``accumulators`` and ``momenta``, start at 0; ``epsilon`` is added inside the
    power, not used as an initial value. ``beta2`` must be in ``[0, 1]``: outside it the
    accumulator can turn negative and its power NaN. ``momentum`` is any finite number (as in
    TensorFlow, which does not range-check it).
    """

    learning_rate: LearningRate = 0.001
    momentum: float = 0.0
    use_nesterov: bool = False
    exponent: float = 2
    beta2: float = 1
    epsilon: float = 1e-10

    def __post_init__(self) -> None:
        super().__post_init__()
        owner = "AdagradMomentum"
        object.__setattr__(self, "momentum", check_real(owner, "momentum", self.momentum))
        check_bool(owner, "use_nesterov", self.use_nesterov)
        exponent = check_real(owner, "exponent", self.exponent, minimum=0.0, strict_minimum=True)
        object.__setattr__(self, "exponent", exponent)
        beta2 = check_real(owner, "beta2", self.beta2, minimum=0.0)
        if beta2 > 1:
            raise ValueError(
                f"{owner}: beta2 must be in [0, 1] (1 sums squared gradients), got {beta2}"
            )
        object.__setattr__(self, "beta2", beta2)
        eps = check_real(owner, "epsilon", self.epsilon, minimum=0.0, strict_minimum=True)
        object.__setattr__(self, "epsilon", eps)

    def slot_specs(self) -> tuple[SlotSpec, ...]:
        return (SlotSpec("accumulators", 0.0), SlotSpec("momenta", 0.0))

    def rule(
        self, weights: Tensor, slots: dict[str, Tensor], grad: Tensor, lr: float, step: int
    ) -> tuple[Tensor, dict[str, Tensor]]:
        acc = slots["accumulators"]
        if self.beta2 == 1:
            acc = acc + grad * grad
        else:
            acc = self.beta2 * acc + (1 - self.beta2) * grad * grad
        scaled = grad * (acc + self.epsilon) ** (-1.0 / self.exponent)
        m = self.momentum * slots["momenta"] + scaled
        step_dir = self.momentum * m + scaled if self.use_nesterov else m
        return weights - lr * step_dir, {"accumulators": acc, "momenta": m}
