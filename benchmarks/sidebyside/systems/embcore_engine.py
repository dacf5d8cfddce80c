"""embcore: one ``EmbeddingEngine``, one feature per table, the default (fused CPU) backend.

Its output is ``engine.stacked(batch)``, the ``(B, T, dim)`` tensor a DLRM interaction takes
(FBGEMM's natural output is likewise one ``(B, T * dim)`` tensor). The variants
:mod:`.embcore_dict` (one activation per feature, the TPU API's structure) and
:mod:`.embcore_pipelined` (``pipeline=True``: one step stale, not the same numerics) and
:mod:`.embcore_prepared` (inputs prepared before the clock, as FBGEMM's are) are reported
beside it.
"""

from __future__ import annotations

import torch

import embcore as ec
from sidebyside.workloads import Batch, Workload, projection

NAME = "embcore"
OPTIMIZERS = {"adagrad": "Adagrad", "rowwise_adagrad": "RowwiseAdagrad"}


def unavailable() -> str | None:
    return None


def _uniform(shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype).uniform_(-0.05, 0.05)


class Run:
    def __init__(
        self,
        workload: Workload,
        optimizer: str,
        batches: list[Batch],
        *,
        stacked: bool = True,
        pipeline: bool = False,
        prepared: bool = False,
    ) -> None:
        opt: ec.Optimizer
        if optimizer == "adagrad":
            opt = ec.Adagrad(learning_rate=0.01, initial_accumulator_value=0.1)
        else:
            opt = ec.RowwiseAdagrad(learning_rate=0.01, initial_accumulator_value=0.1)
        tables = [
            ec.TableConfig(
                vocabulary_size=v,
                dim=workload.dim,
                combiner="sum",
                initializer=_uniform,
                name=f"table_{t}",
            )
            for t, v in enumerate(workload.vocab)
        ]
        config = {f"f{t:02d}": ec.FeatureConfig(table=table) for t, table in enumerate(tables)}
        self.engine = ec.EmbeddingEngine(config, optimizer=opt, pipeline=pipeline)
        self.stacked = stacked
        self.backend = self.engine.backend
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
        if prepared:  # converted and checked once, before any step is timed
            self.inputs = [self.engine.prepare(x) for x in self.inputs]
        slots = sum(s.numel() for t in self.engine.slot_variables.values() for s in t.values())
        weights = sum(w.numel() for w in self.engine.embedding_tables.values())
        self.state_bytes = 4 * (slots + weights)
        self.projection = projection(workload.dim)

    def step(self, i: int) -> None:
        if self.stacked:
            loss = ((self.engine.stacked(self.inputs[i]) @ self.projection) ** 2).sum()
        else:
            acts = self.engine(self.inputs[i])
            loss = sum(((a @ self.projection) ** 2).sum() for a in acts.values())
        loss.backward()  # type: ignore[union-attr]


def build(workload: Workload, optimizer: str, batches: list[Batch]) -> Run:
    return Run(workload, optimizer, batches)
