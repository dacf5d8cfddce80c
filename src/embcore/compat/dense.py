"""TensorFlow 1's dense optimizers (``tf.compat.v1.train.AdagradOptimizer`` & co) as torch ones.

A TPUEstimator ``model_fn`` ends with::

    optimizer = tf.compat.v1.train.AdagradOptimizer(learning_rate=0.05)
    optimizer = tf.compat.v1.tpu.CrossShardOptimizer(optimizer)
    train_op = optimizer.minimize(loss, global_step=tf.compat.v1.train.get_global_step())

Here ``minimize(loss)`` returns a ``torch.optim`` optimizer over the ``nn.Parameter`` tensors
``loss`` depends on (the dense model; the engine's tables are trained by the engine). A
``model_fn`` builds a new TensorFlow optimizer object every call, so the torch optimizer is
made once per (rule, hyperparameters, parameters) and returned again after: its state lives
across steps, as the Estimator requires. ``global_step`` is ignored (the Estimator counts).

=======================================  ========================================================
TensorFlow 1                             torch
=======================================  ========================================================
``GradientDescentOptimizer(lr)``         ``SGD(lr)``
``MomentumOptimizer(lr, m, nesterov)``   ``SGD(lr, momentum=m, nesterov=...)`` (the same update)
``AdagradOptimizer(lr, init=0.1)``       ``Adagrad(lr, initial_accumulator_value=init, eps=0)``
``AdamOptimizer(lr, b1, b2, eps)``       ``Adam(lr, betas=(b1, b2), eps=eps)`` (torch adds
                                         ``eps`` before the bias correction of the step size)
=======================================  ========================================================
"""

from __future__ import annotations

import math
import weakref
from typing import Any

import torch
from torch import Tensor, nn

__all__ = [
    "AdagradOptimizer",
    "AdamOptimizer",
    "CrossShardOptimizer",
    "DenseOptimizer",
    "GradientDescentOptimizer",
    "MomentumOptimizer",
    "get_global_step",
]

#: (rule, hyperparameters, parameter ids) -> the torch optimizer made for them, while someone
#: (the Estimator) holds it. It holds its parameters, so their ids are not reused meanwhile.
_MADE: weakref.WeakValueDictionary[tuple[Any, ...], torch.optim.Optimizer] = (
    weakref.WeakValueDictionary()
)


def _positive(owner: str, name: str, value: Any, zero_ok: bool = False) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (value == 0 and not zero_ok):
        raise ValueError(
            f"{owner}: {name} must be a finite number {'>= 0' if zero_ok else '> 0'}, got {value!r}"
        )
    return float(value)


def _parameters(loss: Tensor) -> list[Tensor]:
    """The ``nn.Parameter`` leaves ``loss`` depends on, in graph order (other leaves, such as
    the engine's own placeholders, are not the dense model's weights)."""
    found: dict[int, Tensor] = {}
    stack, seen = [loss.grad_fn], set()
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        variable = getattr(node, "variable", None)  # AccumulateGrad: a leaf
        if isinstance(variable, nn.Parameter):
            found.setdefault(id(variable), variable)
        stack.extend(next_node for next_node, _ in node.next_functions)
    return list(found.values())


class DenseOptimizer:
    """A TensorFlow 1 optimizer's rule and hyperparameters (see the module docstring)."""

    torch_class: type[torch.optim.Optimizer]

    def __init__(self, name: str, **hyperparameters: Any) -> None:
        self.name = name
        self.hyperparameters = hyperparameters

    def minimize(self, loss: Tensor, global_step: Any = None, var_list: Any = None) -> Any:
        """The torch optimizer of the dense tensors ``loss`` depends on (or of ``var_list``);
        ``None`` (nothing to run) where gradients are off.

        A ``model_fn`` may build its ``train_op`` in every mode, as TensorFlow allows: in
        ``evaluate`` and ``predict`` the Estimator runs ``model_fn`` under ``torch.no_grad()``,
        where TensorFlow would build the op and never run it; here it is ``None``.

        Raises:
            ValueError: ``loss`` is not a tensor, or, with gradients on, depends on no
                trainable tensor.
        """
        if not isinstance(loss, Tensor):
            raise ValueError(f"{self.name}.minimize: loss must be a tensor, got {loss!r}")
        if not torch.is_grad_enabled():
            return None  # evaluate / predict: a train_op nobody runs
        params = list(var_list) if var_list is not None else _parameters(loss)
        if not params:
            raise ValueError(
                f"{self.name}.minimize: the loss depends on no trainable tensor (gradients "
                "are on, so this is a training step); build the dense model once as an "
                "nn.Module (model_fn itself, or a value of params)"
            )
        key = (
            type(self),
            tuple(sorted(self.hyperparameters.items())),
            tuple(id(p) for p in params),
        )
        made = _MADE.get(key)
        if made is None:
            made = self.torch_class(params, **self.hyperparameters)
            _MADE[key] = made
        return made


class GradientDescentOptimizer(DenseOptimizer):
    torch_class = torch.optim.SGD

    def __init__(self, learning_rate: float, use_locking: bool = False, name: str = "") -> None:
        owner = "GradientDescentOptimizer"
        super().__init__(owner, lr=_positive(owner, "learning_rate", learning_rate))


class MomentumOptimizer(DenseOptimizer):
    torch_class = torch.optim.SGD

    def __init__(
        self,
        learning_rate: float,
        momentum: float,
        use_locking: bool = False,
        name: str = "",
        use_nesterov: bool = False,
    ) -> None:
        owner = "MomentumOptimizer"
        super().__init__(
            owner,
            lr=_positive(owner, "learning_rate", learning_rate),
            momentum=_positive(owner, "momentum", momentum, zero_ok=True),
            nesterov=bool(use_nesterov),
        )


class AdagradOptimizer(DenseOptimizer):
    torch_class = torch.optim.Adagrad

    def __init__(
        self,
        learning_rate: float,
        initial_accumulator_value: float = 0.1,
        use_locking: bool = False,
        name: str = "",
    ) -> None:
        owner = "AdagradOptimizer"
        super().__init__(
            owner,
            lr=_positive(owner, "learning_rate", learning_rate),
            initial_accumulator_value=_positive(
                owner, "initial_accumulator_value", initial_accumulator_value
            ),
            eps=0.0,  # TensorFlow 1's Adagrad has no epsilon; the accumulator starts > 0
        )


class AdamOptimizer(DenseOptimizer):
    torch_class = torch.optim.Adam

    def __init__(
        self,
        learning_rate: float = 0.001,
        beta1: float = 0.9,
        beta2: float = 0.999,
        epsilon: float = 1e-8,
        use_locking: bool = False,
        name: str = "",
    ) -> None:
        owner = "AdamOptimizer"
        for label, beta in (("beta1", beta1), ("beta2", beta2)):
            if not 0 <= _positive(owner, label, beta, zero_ok=True) < 1:
                raise ValueError(f"{owner}: {label} must be in [0, 1), got {beta!r}")
        super().__init__(
            owner,
            lr=_positive(owner, "learning_rate", learning_rate),
            betas=(float(beta1), float(beta2)),
            eps=_positive(owner, "epsilon", epsilon),
        )


def CrossShardOptimizer(optimizer: DenseOptimizer, *args: Any, **kwargs: Any) -> DenseOptimizer:
    """``tf.compat.v1.tpu.CrossShardOptimizer``: one process has no shards to average over."""
    if not isinstance(optimizer, DenseOptimizer):
        raise ValueError(
            f"CrossShardOptimizer: expected a tf.compat.v1.train optimizer, got {optimizer!r}"
        )
    return optimizer


def get_global_step() -> None:
    """``tf.compat.v1.train.get_global_step``: ``None`` (``minimize`` ignores it)."""
    return None
