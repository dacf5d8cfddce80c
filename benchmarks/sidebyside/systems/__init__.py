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
* optionally ``supports(workload) -> bool``: whether it runs that workload; without it a
  system runs the fixed-vocabulary workloads only (not W3's raw 64-bit keys).

Adding a peer adds a module and one line to :data:`SYSTEMS`.
"""

from __future__ import annotations

from types import ModuleType

from sidebyside.systems import (
    embcore_dict,
    embcore_dynamic,
    embcore_dynamic_capacity,
    embcore_dynamic_w1init,
    embcore_engine,
    embcore_pipelined,
    embcore_prepared,
    fbgemm_tbe,
    plain_torch,
    torch_dict,
    torchrec_mc,
)
from sidebyside.workloads import Workload

__all__ = ["SYSTEMS", "supports"]

#: run order within a workload: embcore first, then its peers
SYSTEMS: list[ModuleType] = [
    embcore_engine,
    embcore_prepared,
    embcore_dict,
    embcore_pipelined,
    plain_torch,
    fbgemm_tbe,
    embcore_dynamic,
    embcore_dynamic_w1init,
    embcore_dynamic_capacity,
    torch_dict,
    torchrec_mc,
]


def supports(system: ModuleType, workload: Workload) -> bool:
    """Whether ``system`` runs ``workload`` (its ``supports``; by default fixed tables only)."""
    check = getattr(system, "supports", None)
    return check(workload) if check is not None else not workload.raw_keys
