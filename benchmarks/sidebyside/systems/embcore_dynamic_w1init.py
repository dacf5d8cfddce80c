"""embcore with dynamic tables on W3, as :mod:`.embcore_dynamic`, but new rows take W1's
initializer (uniform in [-0.05, 0.05], a user initializer called once per lookup with
``(n_new, dim)`` for the keys admitted in it, in ascending key order): the figure before the
default initializer was drawn inside the lookup's kernel.
"""

from __future__ import annotations

from sidebyside.systems.embcore_dynamic import OPTIMIZERS, Run, supports, unavailable
from sidebyside.systems.embcore_engine import _uniform
from sidebyside.workloads import Batch, Workload

NAME = "embcore, dynamic tables, W1's initializer"
__all__ = ["NAME", "OPTIMIZERS", "build", "supports", "unavailable"]


def build(workload: Workload, optimizer: str, batches: list[Batch]) -> Run:
    return Run(workload, optimizer, batches, initializer=_uniform)
