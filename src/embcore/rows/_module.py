"""What every built-in row storage shares: buffers by name, a cached kernel state, no
``state_dict`` entries of its own."""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from embcore import ops
from embcore.config import ResolvedTable

__all__ = ["RowModule"]


class RowModule(nn.Module):
    """A row storage's tensors as buffers ``weight`` and ``slot_{name}``.

    :meth:`state` is rebuilt only when a buffer was replaced (``.to()``, growth): backends
    cache per-state work (descriptors, checks) on the object.
    """

    def __init__(self, table: ResolvedTable, stochastic_rounding: bool) -> None:
        super().__init__()
        self.table = table
        self.stochastic_rounding = stochastic_rounding
        opt = table.optimizer
        self.slot_names = [s.name for s in opt.slot_specs()] if opt else []
        self._state_cache: tuple[tuple[Tensor, ...], ops.TableState] | None = None

    def tensor(self, name: str) -> Tensor:
        """The live ``weight`` or slot tensor, by slot."""
        return getattr(self, "weight" if name == "weight" else f"slot_{name}")

    def put(self, name: str, value: Tensor) -> None:
        """Register or replace the ``weight`` or slot tensor."""
        self.register_buffer("weight" if name == "weight" else f"slot_{name}", value)

    def state(self) -> ops.TableState:
        buffers = tuple(self._buffers.values())
        cached = self._state_cache
        if cached is None or any(a is not b for a, b in zip(cached[0], buffers, strict=True)):
            state = ops.TableState(
                self.table.name,
                self.tensor("weight"),
                {n: self.tensor(n) for n in self.slot_names},
                self.table.optimizer,
                self.stochastic_rounding,
            )
            cached = self._state_cache = (buffers, state)
        return cached[1]

    def memory(self) -> dict[str, int]:
        tier = "gpu" if self.tensor("weight").is_cuda else "ram"
        return {tier: sum(b.numel() * b.element_size() for b in self._buffers.values())}

    def _save_to_state_dict(self, destination: dict, prefix: str, keep_vars: bool) -> None:
        """Nothing: the engine writes the tables under its own keys."""

    def _load_from_state_dict(self, *args: Any, **kwargs: Any) -> None:
        """Nothing: the engine loads the tables from its own keys."""
