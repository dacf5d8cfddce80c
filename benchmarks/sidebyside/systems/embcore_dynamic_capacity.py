"""embcore with dynamic tables on W3, as :mod:`.embcore_dynamic` (default initializer), but each
table built with ``initial_capacity`` = its fixed twin's vocabulary (the rows W1's fixed table
allocates), or with ``max_rows`` (W3-evict) the most it can hold, ``max_rows`` plus a batch of
new keys, if fewer: its key index, row metadata, rows and slots reserved and their pages
written when the engine is built (untimed), so the timed steps pay no growth and no first
touch of memory. What a user who knows the size of the vocabulary gets; the same numbers as
without.
"""

from __future__ import annotations

from sidebyside.systems.embcore_dynamic import OPTIMIZERS, Run, supports, unavailable
from sidebyside.workloads import Batch, Workload

NAME = "embcore, dynamic tables, initial_capacity"
__all__ = ["NAME", "OPTIMIZERS", "build", "supports", "unavailable"]


def build(workload: Workload, optimizer: str, batches: list[Batch]) -> Run:
    most = workload.vocab
    if workload.max_rows is not None:  # held after a step boundary, plus one step's new keys
        most = tuple(min(v, workload.max_rows + workload.batch) for v in most)
    return Run(workload, optimizer, batches, capacity=most)
