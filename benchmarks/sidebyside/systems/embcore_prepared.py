"""embcore with its inputs prepared before the clock (``engine.prepare``), as the FBGEMM peer's
indices and offsets are built before its clock: what a training loop with an input pipeline
(``ec.Prefetcher``, or ``embcore train``'s loader thread) pays per step. The ``embcore`` row
beside it converts and checks the raw batch inside the step, as a plain engine call does."""

from __future__ import annotations

from sidebyside.systems.embcore_engine import OPTIMIZERS, Run, unavailable
from sidebyside.workloads import Batch, Workload

__all__ = ["NAME", "OPTIMIZERS", "build", "unavailable"]

NAME = "embcore, inputs prepared ahead"


def build(workload: Workload, optimizer: str, batches: list[Batch]) -> Run:
    return Run(workload, optimizer, batches, prepared=True)
