"""Adam as the TPU embedding engine runs it (docs/semantics.md §1.5, §3.6): no bias correction by
default."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from embcore._validate import check_bool, check_real
from embcore.optimizers.base import LearningRate, Optimizer, SlotSpec

__all__ = ["Adam"]


@dataclass(frozen=True)
class Adam(Optimizer):
    """Adam without bias correction, lazy by default::

        m <- beta_1 * m + (1 - beta_1) * g
        v <- beta_2 * v + (1 - beta_2) * g^2
        w <- w - lr * m / sqrt(v + epsilon^2)     if sum_inside_sqrt (default)
        w <- w - lr * m / (sqrt(v) + epsilon)     otherwise

    Args:
        lazy_adam: True updates only touched rows; False updates every row every step, the
            untouched ones with ``g = 0`` (their moments decay and the weights keep moving).
        sum_inside_sqrt: where epsilon goes, as above.
        bias_correction: an embcore convenience (off by default, as on TPU): scale the rate by
            ``sqrt(1 - beta_2^t) / (1 - beta_1^t)`` with ``t`` the table's update count.
    """

    learning_rate: LearningRate = 0.001
    beta_1: float = 0.9
    beta_2: float = 0.999
    epsilon: float = 1e-07
    lazy_adam: bool = True
    sum_inside_sqrt: bool = True
    bias_correction: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        owner = "Adam"
        object.__setattr__(
            self, "beta_1", check_real(owner, "beta_1", self.beta_1, minimum=0, below=1)
        )
        object.__setattr__(
            self, "beta_2", check_real(owner, "beta_2", self.beta_2, minimum=0, below=1)
        )
        eps = check_real(owner, "epsilon", self.epsilon, minimum=0.0, strict_minimum=True)
        object.__setattr__(self, "epsilon", eps)
        for field in ("lazy_adam", "sum_inside_sqrt", "bias_correction"):
            check_bool(owner, field, getattr(self, field))
        if not self.lazy_adam and not self.use_gradient_accumulation:
            raise ValueError(
                f"{owner}: lazy_adam=False (non-lazy Adam) needs use_gradient_accumulation=True; "
                "set use_gradient_accumulation=True or lazy_adam=True"
            )

    @property
    def lazy(self) -> bool:  # type: ignore[override]
        return self.lazy_adam

    def slot_specs(self) -> tuple[SlotSpec, ...]:
        return (SlotSpec("momenta", 0.0), SlotSpec("velocities", 0.0))

    def rule(
        self, weights: Tensor, slots: dict[str, Tensor], grad: Tensor, lr: float, step: int
    ) -> tuple[Tensor, dict[str, Tensor]]:
        if self.bias_correction:
            lr = lr * math.sqrt(1 - self.beta_2**step) / (1 - self.beta_1**step)
        m = self.beta_1 * slots["momenta"] + (1 - self.beta_1) * grad
        v = self.beta_2 * slots["velocities"] + (1 - self.beta_2) * grad * grad
        if self.sum_inside_sqrt:
            denom = torch.sqrt(v + self.epsilon * self.epsilon)
        else:
            denom = torch.sqrt(v) + self.epsilon
        return weights - lr * m / denom, {"momenta": m, "velocities": v}
