"""embcore with one activation per feature (``engine(batch)``, the TPU API's structure)."""

from __future__ import annotations

from sidebyside.systems.embcore_engine import Run, unavailable
from sidebyside.workloads import Batch, Workload

__all__ = ["NAME", "OPTIMIZERS", "build", "unavailable"]

NAME = "embcore, per-feature output"
OPTIMIZERS = {"adagrad": "Adagrad"}


def build(workload: Workload, optimizer: str, batches: list[Batch]) -> Run:
    return Run(workload, optimizer, batches, stacked=False)
