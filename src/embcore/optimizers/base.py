"""The optimizer contract: a frozen spec plus a readable per-row update.

An embedding optimizer lives inside the engine (docs/semantics.md §3). Each step, for every table,
the engine sums the gradient of every occurrence of every touched row (over all features sharing the
table), then calls :meth:`Optimizer.apply` once on the touched rows:

    g = clamp(g, clip_gradient_min, clip_gradient_max)            # clipvalue, per element
    w = w - wd_eff * w                                              # weight decay, touched rows
    (w, slots) = rule(w, slots, g, lr)                              # the optimizer's own rule
    w = clamp(w, clip_weight_min, clip_weight_max)                  # weight clipping

with ``wd_eff = weight_decay_factor * (lr if multiply_..._by_learning_rate else 1)``.
Subclasses define their hyperparameters, their slots and :meth:`rule`; fast kernels implement the
same contract and are tested against it.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import numbers
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor

from embcore._validate import check_bool, check_real, describe

__all__ = ["LearningRate", "Optimizer", "SlotSpec"]

LearningRate = float | Callable[[], float]
"""A constant rate, or a zero-argument callable evaluated once per step (a dynamic rate)."""


@dataclass(frozen=True)
class SlotSpec:
    """One optimizer slot of a table.

    Attributes:
        name: the TensorFlow slot name (``accumulators``, ``momenta``, ``velocities``, ``linears``).
        initial_value: the constant every element starts at.
        rowwise: one value per row, shape ``(vocab,)``, instead of ``(vocab, dim)``.
    """

    name: str
    initial_value: float
    rowwise: bool = False

    def shape(self, vocabulary_size: int, dim: int) -> tuple[int, ...]:
        return (vocabulary_size,) if self.rowwise else (vocabulary_size, dim)


def _check_learning_rate(owner: str, value: Any, positive: bool) -> LearningRate:
    """A finite rate ``>= 0`` (``> 0`` where the update divides by it), or a zero-argument
    callable (its values are checked at each step, by :meth:`Optimizer.learning_rate_at`)."""
    if not callable(value):
        return check_real(owner, "learning_rate", value, minimum=0.0, strict_minimum=positive)
    try:
        inspect.signature(value).bind()
    except TypeError:
        raise ValueError(
            f"{owner}: learning_rate must be a number or a callable taking no arguments, got "
            f"{value!r}; wrap a schedule of the step as `lambda: schedule(step())`"
        ) from None
    except ValueError:  # no signature to inspect (some builtins): checked when called
        pass
    return value


def _as_rate(value: Any) -> Any:
    """A callable's result as a Python number when it is a one-element real tensor or array."""
    if isinstance(value, Tensor) and value.numel() == 1:
        if not (value.dtype == torch.bool or value.is_complex()):
            return value.item()
    elif isinstance(value, np.ndarray) and value.size == 1 and value.dtype.kind in "iuf":
        return value.item()
    return value


def _check_optional_real(owner: str, field: str, value: Any, **bounds: Any) -> float | None:
    return None if value is None else check_real(owner, field, value, **bounds)


@dataclass(frozen=True, kw_only=True)
class Optimizer:
    """Fields shared by every embedding optimizer (docs/semantics.md §1.1).

    Attributes:
        use_gradient_accumulation: accepted for compatibility. embcore always sums a row's
            gradients before one update (the TensorFlow default); ``False`` warns and changes
            nothing (docs/semantics.md §3.9, §6 pitfall 32).
        clip_weight_min, clip_weight_max: clamp the updated rows after the update; ``None`` is
            unbounded.
        weight_decay_factor: decoupled decay of the touched rows before the update; ``None`` or
            ``0`` is off.
        multiply_weight_decay_factor_by_learning_rate: scale the decay by the current rate.
        clipvalue: element-wise gradient clipping of the summed row gradient: ``c`` means
            ``(-c, c)``; a ``(min, max)`` tuple or list may leave either side ``None``.
        slot_variable_creation_fn: optional ``fn(table, slot_names, slot_initializers) ->
            {name: tensor}`` that creates the slots instead of the built-in constants;
            ``slot_initializers[i](shape, dtype)`` returns the built-in initial value.
        low_dimensional_packing_status: accepted and ignored; a TPU memory layout with no
            numerical effect in a correct implementation (docs/semantics.md §3.17).
    """

    use_gradient_accumulation: bool = True
    clip_weight_min: float | None = None
    clip_weight_max: float | None = None
    weight_decay_factor: float | None = None
    multiply_weight_decay_factor_by_learning_rate: bool | None = None
    clipvalue: float | tuple[float | None, float | None] | list[float | None] | None = None
    slot_variable_creation_fn: Callable[..., dict[str, Tensor]] | None = None
    low_dimensional_packing_status: bool = False

    #: False for optimizers that update every row every step (non-lazy Adam).
    lazy: ClassVar[bool] = True
    #: True for optimizers whose update divides by the learning rate (FTRL): 0 is refused.
    positive_learning_rate: ClassVar[bool] = False

    # ------------------------------------------------------------------ validation
    def __post_init__(self) -> None:
        owner = self._owner()
        lr = _check_learning_rate(
            owner, getattr(self, "learning_rate", 0.0), self.positive_learning_rate
        )
        object.__setattr__(self, "learning_rate", lr)
        check_bool(owner, "use_gradient_accumulation", self.use_gradient_accumulation)
        check_bool(owner, "low_dimensional_packing_status", self.low_dimensional_packing_status)
        lo = _check_optional_real(owner, "clip_weight_min", self.clip_weight_min)
        hi = _check_optional_real(owner, "clip_weight_max", self.clip_weight_max)
        if lo is not None and hi is not None and lo > hi:
            raise ValueError(
                f"{owner}: clip_weight_min must be <= clip_weight_max, got {lo} > {hi}"
            )
        object.__setattr__(self, "clip_weight_min", lo)
        object.__setattr__(self, "clip_weight_max", hi)
        wd = _check_optional_real(owner, "weight_decay_factor", self.weight_decay_factor, minimum=0)
        object.__setattr__(self, "weight_decay_factor", wd)
        mult = self.multiply_weight_decay_factor_by_learning_rate
        if mult is not None:
            check_bool(owner, "multiply_weight_decay_factor_by_learning_rate", mult)
        object.__setattr__(self, "clipvalue", self._normalized_clipvalue(owner))
        if self.clipvalue is not None and not self.use_gradient_accumulation:
            raise ValueError(
                f"{owner}: clipvalue={self.clipvalue} requires use_gradient_accumulation=True "
                "(gradients are clipped after they are summed per row)"
            )
        fn = self.slot_variable_creation_fn
        if fn is not None and not callable(fn):
            raise ValueError(f"{owner}: slot_variable_creation_fn must be callable, got {fn!r}")
        if not self.use_gradient_accumulation:
            warnings.warn(
                f"{owner}: use_gradient_accumulation=False is accepted for compatibility, but "
                "embcore always sums a row's gradients before a single update",
                UserWarning,
                stacklevel=3,
            )

    def _normalized_clipvalue(self, owner: str) -> tuple[float | None, float | None] | None:
        value = self.clipvalue
        if value is None:
            return None
        if isinstance(value, (tuple, list)):
            if len(value) != 2:
                raise ValueError(
                    f"{owner}: clipvalue as a range must be (min, max), got {describe(value)}"
                )
            lo = _check_optional_real(owner, "clipvalue[0]", value[0])
            hi = _check_optional_real(owner, "clipvalue[1]", value[1])
        elif isinstance(value, numbers.Real) and not isinstance(value, bool):
            c = check_real(owner, "clipvalue", value, minimum=0.0)
            lo, hi = -c, c
        else:
            raise ValueError(
                f"{owner}: clipvalue must be a number or a (min, max) tuple, got {describe(value)}"
            )
        if lo is not None and hi is not None and lo > hi:
            raise ValueError(f"{owner}: clipvalue must have min <= max, got ({lo}, {hi})")
        return (lo, hi)

    def _owner(self) -> str:
        return type(self).__name__

    # ------------------------------------------------------------------ the contract
    def slot_specs(self) -> tuple[SlotSpec, ...]:
        """The slots this optimizer keeps per table, in checkpoint order."""
        return ()

    def learning_rate_at(
        self,
        step: int | Tensor,
        *,
        table: str | None = None,
        evaluated: dict[int, Any] | None = None,
    ) -> float:
        """The learning rate of update ``step``: the constant, or the callable's value, checked
        against the range the update takes (finite, ``>= 0``, or ``> 0`` for FTRL).

        Args:
            step: the 1-based update count of this step, an int or a 0-d tensor (read only
                for the error message, so that a device-side counter costs no sync).
            table: the name of the table being updated (for the error message).
            evaluated: the values of the callables called so far this step, by ``id``; a
                callable shared by several tables is called once per step
                (docs/semantics.md §3.13). Pass one dict per step.

        Raises:
            ValueError: the callable returned NaN, an infinity, a negative number (or 0 where
                the update divides by the rate) or something that is not a real number. Call
                this before changing any state: then a bad rate leaves everything unchanged.
        """
        lr = self.learning_rate  # type: ignore[attr-defined]
        if not callable(lr):
            return float(lr)
        if evaluated is None:
            evaluated = {}
        if id(lr) not in evaluated:
            evaluated[id(lr)] = lr()
        value = _as_rate(evaluated[id(lr)])
        if isinstance(value, numbers.Real) and not isinstance(value, bool):
            rate = float(value)
            in_range = rate > 0 or (rate == 0 and not self.positive_learning_rate)
            if math.isfinite(rate) and in_range:
                return rate
            problem = f"returned {rate}"
        else:
            problem = f"returned {describe(value)}"
        where = self._owner() + ("" if table is None else f" of table '{table}'")
        op = ">" if self.positive_learning_rate else ">="
        raise ValueError(
            f"{where}: the learning_rate callable {lr!r} {problem} at step {int(step)}; it must "
            f"return a finite real number {op} 0 (nothing was updated)"
        )

    def rule(
        self, weights: Tensor, slots: dict[str, Tensor], grad: Tensor, lr: float, step: int
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """The optimizer's own update of touched rows.

        Args:
            weights: ``(U, dim) float32`` rows before the update (after weight decay).
            slots: name -> ``(U, dim)`` (or ``(U,)`` for row-wise slots) ``float32``.
            grad: ``(U, dim) float32`` summed, clipped gradient of each row.
            lr: the learning rate of this step.
            step: 1-based count of updates applied to the table, this one included.

        Returns:
            The new rows and the new slot rows (new tensors; inputs are not modified).
        """
        raise NotImplementedError

    def apply(
        self, weights: Tensor, slots: dict[str, Tensor], grad: Tensor, lr: float, step: int
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """The full per-row update: gradient clip, weight decay, :meth:`rule`, weight clip."""
        if self.clipvalue is not None:
            lo, hi = self.clipvalue
            grad = torch.clamp(grad, min=lo, max=hi)
        if self.weight_decay_factor:
            scale = lr if self.multiply_weight_decay_factor_by_learning_rate else 1.0
            weights = weights - (self.weight_decay_factor * scale) * weights
        weights, slots = self.rule(weights, slots, grad, lr, step)
        if self.clip_weight_min is not None or self.clip_weight_max is not None:
            weights = torch.clamp(weights, min=self.clip_weight_min, max=self.clip_weight_max)
        return weights, slots

    def hyperparameters(self) -> dict[str, Any]:
        """Every field as a plain dict (for manifests and error messages)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
