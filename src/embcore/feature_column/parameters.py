"""The v1 optimization parameter classes (docs/semantics.md §1.19), each mapped onto an embcore
optimizer.

``AdagradParameters(0.1)`` is what TPUEstimator code passes to ``EmbeddingConfigSpec``; the
engine runs ``embcore.Adagrad(learning_rate=0.1, initial_accumulator_value=0.1)``. Field by
field:

=========================================  ====================================================
v1 field                                   embcore optimizer field
=========================================  ====================================================
``initial_accumulator`` (Adagrad)          ``initial_accumulator_value``
``beta1``, ``beta2`` (Adam)                ``beta_1``, ``beta_2``
``clip_gradient_min``, ``clip_gradient_max``  ``clipvalue=(min, max)``
everything else                            the same name
=========================================  ====================================================

The common tail (``use_gradient_accumulation`` onwards) is keyword-only here.
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass
from typing import Any

from embcore._validate import check_real
from embcore.optimizers import FTRL, SGD, Adagrad, Adam, Optimizer

__all__ = [
    "AdagradParameters",
    "AdamParameters",
    "FtrlParameters",
    "OptimizationParameters",
    "StochasticGradientDescentParameters",
    "to_optimizer",
]


@dataclass(frozen=True, kw_only=True)
class OptimizationParameters:
    """Fields every v1 parameter class has. See the embcore optimizer for their meaning."""

    use_gradient_accumulation: bool = True
    clip_weight_min: float | None = None
    clip_weight_max: float | None = None
    weight_decay_factor: float | None = None
    multiply_weight_decay_factor_by_learning_rate: bool | None = None
    clip_gradient_min: float | None = None
    clip_gradient_max: float | None = None

    def __post_init__(self) -> None:
        try:
            self.to_optimizer()  # the embcore optimizer validates every field
        except ValueError as e:
            raise ValueError(f"{type(self).__name__}: {e}") from None
        if self.use_gradient_accumulation is False:
            warnings.warn(
                f"{type(self).__name__}: use_gradient_accumulation=False is accepted for "
                "compatibility, but embcore always sums a row's gradients before one update",
                UserWarning,
                stacklevel=3,
            )

    def _common(self) -> dict[str, Any]:
        lo, hi = self.clip_gradient_min, self.clip_gradient_max
        return {
            "use_gradient_accumulation": self.use_gradient_accumulation,
            "clip_weight_min": self.clip_weight_min,
            "clip_weight_max": self.clip_weight_max,
            "weight_decay_factor": self.weight_decay_factor,
            "multiply_weight_decay_factor_by_learning_rate": (
                self.multiply_weight_decay_factor_by_learning_rate
            ),
            "clipvalue": None if lo is None and hi is None else (lo, hi),
        }

    def _build(self) -> Optimizer:
        raise NotImplementedError

    def to_optimizer(self) -> Optimizer:
        """The embcore optimizer with these hyperparameters."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # warned once, at construction
            return self._build()


@dataclass(frozen=True)
class StochasticGradientDescentParameters(OptimizationParameters):
    """SGD: ``w <- w - lr * g`` (embcore :class:`~embcore.SGD`)."""

    learning_rate: float

    def _build(self) -> Optimizer:
        return SGD(learning_rate=self.learning_rate, **self._common())


@dataclass(frozen=True)
class AdagradParameters(OptimizationParameters):
    """Adagrad (embcore :class:`~embcore.Adagrad`); ``initial_accumulator`` must be > 0."""

    learning_rate: float
    initial_accumulator: float = 0.1

    def __post_init__(self) -> None:
        check_real(
            "AdagradParameters",
            "initial_accumulator",
            self.initial_accumulator,
            minimum=0.0,
            strict_minimum=True,
        )
        super().__post_init__()

    def _build(self) -> Optimizer:
        return Adagrad(
            learning_rate=self.learning_rate,
            initial_accumulator_value=self.initial_accumulator,
            **self._common(),
        )


@dataclass(frozen=True)
class AdamParameters(OptimizationParameters):
    """Adam without bias correction, lazy by default (embcore :class:`~embcore.Adam`)."""

    learning_rate: float
    beta1: float = 0.9
    beta2: float = 0.999
    epsilon: float = 1e-08
    lazy_adam: bool = True
    sum_inside_sqrt: bool = True

    def __post_init__(self) -> None:
        for field in ("beta1", "beta2"):
            check_real("AdamParameters", field, getattr(self, field), minimum=0.0, below=1.0)
        super().__post_init__()

    def _build(self) -> Optimizer:
        return Adam(
            learning_rate=self.learning_rate,
            beta_1=self.beta1,
            beta_2=self.beta2,
            epsilon=self.epsilon,
            lazy_adam=self.lazy_adam,
            sum_inside_sqrt=self.sum_inside_sqrt,
            **self._common(),
        )


@dataclass(frozen=True)
class FtrlParameters(OptimizationParameters):
    """FTRL-Proximal (embcore :class:`~embcore.FTRL`); a zero ``initial_accumulator_value``
    is allowed, as in v1."""

    learning_rate: float
    learning_rate_power: float = -0.5
    initial_accumulator_value: float = 0.1
    l1_regularization_strength: float = 0.0
    l2_regularization_strength: float = 0.0
    multiply_linear_by_learning_rate: bool = False
    beta: float = 0.0
    allow_zero_accumulator: bool = False

    def _build(self) -> Optimizer:
        return FTRL(
            learning_rate=self.learning_rate,
            learning_rate_power=self.learning_rate_power,
            initial_accumulator_value=self.initial_accumulator_value,
            l1_regularization_strength=self.l1_regularization_strength,
            l2_regularization_strength=self.l2_regularization_strength,
            multiply_linear_by_learning_rate=self.multiply_linear_by_learning_rate,
            beta=self.beta,
            allow_zero_accumulator=self.allow_zero_accumulator,
            **self._common(),
        )


def to_optimizer(parameters: OptimizationParameters | Optimizer) -> Optimizer:
    """The embcore optimizer for v1 parameters (an embcore optimizer is returned as is)."""
    if isinstance(parameters, Optimizer):
        return parameters
    return parameters.to_optimizer()


def replace_quietly(optimizer: Optimizer, **changes: Any) -> Optimizer:
    """``dataclasses.replace`` without repeating construction-time warnings."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return dataclasses.replace(optimizer, **changes)
