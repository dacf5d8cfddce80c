"""The systems run side by side. Each module defines:

* ``NAME``: how the report labels it;
* ``OPTIMIZERS``: ``{optimizer key: label}`` it can run (``"adagrad"``, ``"rowwise_adagrad"``);
* ``unavailable() -> str | None``: why it cannot run here (a missing package), else ``None``;
* ``build(workload, optimizer, batches) -> Run``: tables, optimizer and the batches converted
  to its own input format (all untimed); ``Run.step(i)`` does one training step on batch
  ``i``: forward lookup, the loss ``sum((act @ p) ** 2)`` with a fixed random projection
  ``p`` (:func:`sidebyside.workloads.projection`) over each system's natural output (one
  tensor per bag for plain PyTorch; embcore's stacked ``(B, T, dim)`` and FBGEMM's
  ``(B, T * dim)`` tensors), backward and the optimizer update;
  ``Run.state_bytes`` is the bytes of its tables plus optimizer state.

Adding a peer adds a module and one line to :data:`SYSTEMS`.
"""

from __future__ import annotations

from types import ModuleType

from sidebyside.systems import (
    embcore_dict,
    embcore_engine,
    embcore_pipelined,
    fbgemm_tbe,
    plain_torch,
)

__all__ = ["SYSTEMS"]

#: run order within a workload: embcore first, then its peers
SYSTEMS: list[ModuleType] = [
    embcore_engine,
    embcore_dict,
    embcore_pipelined,
    plain_torch,
    fbgemm_tbe,
]
