"""embcore with dynamic tables (``TableConfig(vocabulary_size=None)``) for the raw 64-bit keys
of W3: one ``EmbeddingEngine``, one feature per table, empty tables at the start, every key
admitted on first sight; the workload's ``steps_to_live`` / ``max_rows`` turn eviction on.
Its output is ``engine.stacked(batch)``, as for :mod:`.embcore_engine` on W1, so the two step
times compare directly (the W3/W1 ratio of BENCHMARKS.md). New rows take the dynamic tables'
default initializer (a function of seed, table and key, drawn inside the lookup's kernel);
:mod:`.embcore_dynamic_w1init` is the same with W1's initializer (uniform in [-0.05, 0.05],
called with ``(n_new, dim)`` for the keys admitted in a lookup).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

import embcore as ec
from sidebyside.workloads import Batch, Workload, projection

NAME = "embcore, dynamic tables"
OPTIMIZERS = {"adagrad": "Adagrad", "rowwise_adagrad": "RowwiseAdagrad"}


def unavailable() -> str | None:
    try:
        ec.TableConfig(vocabulary_size=None, dim=1, name="probe")
    except Exception as exc:  # an embcore without dynamic tables
        return f"this embcore has no dynamic tables ({type(exc).__name__}: {exc})"
    return None


def supports(workload: Workload) -> bool:
    return workload.raw_keys


class Run:
    def __init__(
        self,
        workload: Workload,
        optimizer: str,
        batches: list[Batch],
        initializer: Callable[..., torch.Tensor] | None = None,
        capacity: Sequence[int] | None = None,
    ) -> None:
        opt: ec.Optimizer
        if optimizer == "adagrad":
            opt = ec.Adagrad(learning_rate=0.01, initial_accumulator_value=0.1)
        else:
            opt = ec.RowwiseAdagrad(learning_rate=0.01, initial_accumulator_value=0.1)
        evict = workload.steps_to_live is not None or workload.max_rows is not None
        eviction = (
            ec.Eviction(steps_to_live=workload.steps_to_live, max_rows=workload.max_rows)
            if evict
            else None
        )
        tables = [
            ec.TableConfig(
                vocabulary_size=None,
                dim=workload.dim,
                combiner="sum",
                initializer=initializer,
                name=f"table_{t}",
                eviction=eviction,
                initial_capacity=None if capacity is None else capacity[t],
            )
            for t in range(workload.tables)
        ]
        config = {f"f{t:02d}": ec.FeatureConfig(table=table) for t, table in enumerate(tables)}
        self.engine = ec.EmbeddingEngine(config, optimizer=opt)
        one_hot = workload.min_ids == workload.max_ids == 1
        self.inputs = [
            {
                f"f{t:02d}": torch.from_numpy(values)
                if one_hot
                else ec.RaggedIds(torch.from_numpy(values), torch.from_numpy(offsets))
                for t, (values, offsets) in enumerate(zip(b.values, b.offsets, strict=True))
            }
            for b in batches
        ]
        self.names = [t.name for t in tables]
        self.reserved = 0 if capacity is None else sum(capacity)  # rows, held or not
        self.slot_floats = workload.dim if optimizer == "adagrad" else 1
        self.dim = workload.dim
        self.projection = projection(workload.dim)

    @property
    def rows_held(self) -> int:
        """Rows the tables hold now (after the last step's eviction)."""
        return sum(int(self.engine.table_keys(name).numel()) for name in self.names)

    @property
    def state_bytes(self) -> int:
        """The rows held (or reserved by ``initial_capacity``, when more) and their optimizer
        slots (not the index)."""
        return 4 * max(self.rows_held, self.reserved) * (self.dim + self.slot_floats)

    def step(self, i: int) -> None:
        loss = ((self.engine.stacked(self.inputs[i]) @ self.projection) ** 2).sum()
        loss.backward()  # type: ignore[union-attr]


def build(workload: Workload, optimizer: str, batches: list[Batch]) -> Run:
    return Run(workload, optimizer, batches)
