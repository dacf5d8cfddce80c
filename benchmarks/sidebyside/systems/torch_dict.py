"""Plain PyTorch for W3's raw 64-bit keys: a Python ``dict`` from key to row in front of each
``nn.EmbeddingBag(mode="sum", sparse=True)``, trained by ``optim.Adagrad``. A new key takes
the next free row (admission on first sight, no eviction); the tables are sized for the
workload's distinct-key bound up front, as a fixed ``nn.EmbeddingBag`` must be. The key -> row
mapping (``dict.setdefault`` per key) is part of the timed step."""

from __future__ import annotations

import torch

from sidebyside.systems.plain_torch import bags_and_optimizer
from sidebyside.workloads import Batch, Workload, projection

NAME = "plain PyTorch + dict"
OPTIMIZERS = {"adagrad": "EmbeddingBag + optim.Adagrad"}


def unavailable() -> str | None:
    return None


def supports(workload: Workload) -> bool:
    return workload.raw_keys and workload.steps_to_live is None and workload.max_rows is None


class Run:
    def __init__(self, workload: Workload, optimizer: str, batches: list[Batch]) -> None:
        self.bags, self.opt = bags_and_optimizer(workload)
        self.rows: list[dict[int, int]] = [{} for _ in workload.vocab]
        self.inputs = [
            [
                (v.tolist(), torch.from_numpy(o[:-1]))
                for v, o in zip(b.values, b.offsets, strict=True)
            ]
            for b in batches
        ]
        self.state_bytes = 2 * 4 * sum(b.weight.numel() for b in self.bags)
        self.projection = projection(workload.dim)

    def _rows(self, table: int, keys: list[int]) -> torch.Tensor:
        rows = self.rows[table]
        return torch.tensor([rows.setdefault(k, len(rows)) for k in keys], dtype=torch.int64)

    def step(self, i: int) -> None:
        outs = [
            bag(self._rows(t, keys), offsets)
            for t, (bag, (keys, offsets)) in enumerate(zip(self.bags, self.inputs[i], strict=True))
        ]
        loss = sum(((a @ self.projection) ** 2).sum() for a in outs)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[union-attr]
        self.opt.step()


def build(workload: Workload, optimizer: str, batches: list[Batch]) -> Run:
    return Run(workload, optimizer, batches)
