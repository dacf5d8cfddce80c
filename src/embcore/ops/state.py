"""The state one table's kernels read and write."""

from __future__ import annotations

from collections.abc import Container, Sequence
from dataclasses import dataclass

from torch import Tensor

from embcore.optimizers.base import Optimizer

__all__ = ["TableState", "check_updatable"]


@dataclass(frozen=True, eq=False)
class TableState:
    """One table's tensors, updated in place by ``ops.update``.

    Attributes:
        name: the table name, for messages.
        weight: ``(vocab, dim) float32``, contiguous.
        slots: slot name -> ``(vocab, dim)`` or ``(vocab,)`` ``float32``, contiguous.
        optimizer: the table's optimizer (``None`` for a lookup-only table).
        stochastic_rounding: round a float16 / bfloat16 weight stochastically when storing
            it (backends that store half-precision tables; see docs/gpu_backend.md).
    """

    name: str
    weight: Tensor
    slots: dict[str, Tensor]
    optimizer: Optimizer | None
    stochastic_rounding: bool = False


def check_updatable(backend: str, states: Sequence[TableState], kernels: Container[type]) -> None:
    """Raise before any work if a table has no optimizer, or one ``backend`` has no kernel for
    (``kernels``: the optimizer classes it implements)."""
    for state in states:
        if state.optimizer is None:
            raise RuntimeError(f"table '{state.name}' has no optimizer and cannot be updated")
        if type(state.optimizer) not in kernels:
            raise NotImplementedError(
                f"embcore.ops.update: backend {backend!r} has no kernel for "
                f"{type(state.optimizer).__name__} (table '{state.name}'); supported: "
                f"{sorted(c.__name__ for c in kernels)}; use backend='reference'"
            )
