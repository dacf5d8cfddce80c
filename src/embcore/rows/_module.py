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

    :meth:`state` is rebuilt only after a buffer was replaced (``.to()``, growth, an
    assignment): backends cache per-state work (descriptors, checks) on the object.
    """

    def __init__(self, table: ResolvedTable, stochastic_rounding: bool) -> None:
        super().__init__()
        self.table = table
        self.stochastic_rounding = stochastic_rounding
        opt = table.optimizer
        self.slot_names = [s.name for s in opt.slot_specs()] if opt else []
        self._state_cache: ops.TableState | None = None

    def tensor(self, name: str) -> Tensor:
        """The live ``weight`` or slot tensor, by slot."""
        return getattr(self, "weight" if name == "weight" else f"slot_{name}")

    def put(self, name: str, value: Tensor) -> None:
        """Register or replace the ``weight`` or slot tensor."""
        self.register_buffer("weight" if name == "weight" else f"slot_{name}", value)
        self._state_cache = None

    def __setattr__(self, name: str, value: object) -> None:
        if name in self.__dict__.get("_buffers", ()):
            self.__dict__["_state_cache"] = None  # a buffer replaced by assignment
        super().__setattr__(name, value)

    def _apply(self, fn: Any, recurse: bool = True) -> nn.Module:
        self._state_cache = None  # moves and casts replace the buffers
        return super()._apply(fn, recurse)

    def state(self) -> ops.TableState:
        if self._state_cache is None:
            self._state_cache = ops.TableState(
                self.table.name,
                self.tensor("weight"),
                {n: self.tensor(n) for n in self.slot_names},
                self.table.optimizer,
                self.stochastic_rounding,
            )
        return self._state_cache

    def memory(self) -> dict[str, int]:
        tier = "gpu" if self.tensor("weight").is_cuda else "ram"
        return {tier: sum(b.numel() * b.element_size() for b in self._buffers.values())}

    def _save_to_state_dict(self, destination: dict, prefix: str, keep_vars: bool) -> None:
        """Nothing: the engine writes the tables under its own keys."""

    def _load_from_state_dict(self, *args: Any, **kwargs: Any) -> None:
        """Nothing: the engine loads the tables from its own keys."""
