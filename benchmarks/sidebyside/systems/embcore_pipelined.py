"""embcore with ``pipeline=True``: step N's update runs in the background during step N+1's
loss and backward. One step stale (docs/semantics.md §4.5), so not the same numerics as the
others."""

from __future__ import annotations

from sidebyside.systems.embcore_engine import Run, unavailable
from sidebyside.workloads import Batch, Workload

__all__ = ["NAME", "OPTIMIZERS", "build", "unavailable"]

NAME = "embcore, pipelined"
OPTIMIZERS = {"adagrad": "Adagrad"}


def build(workload: Workload, optimizer: str, batches: list[Batch]) -> Run:
    return Run(workload, optimizer, batches, pipeline=True)
