"""Plain PyTorch: ``nn.EmbeddingBag(mode="sum", sparse=True)`` per table + ``optim.Adagrad``."""

from __future__ import annotations

import torch
from torch import nn

from sidebyside.workloads import Batch, Workload, projection

NAME = "plain PyTorch"
OPTIMIZERS = {"adagrad": "EmbeddingBag + optim.Adagrad"}


def unavailable() -> str | None:
    return None


def bags_and_optimizer(workload: Workload) -> tuple[nn.ModuleList, torch.optim.Adagrad]:
    """One ``nn.EmbeddingBag(mode="sum", sparse=True)`` per table, uniform in +-0.05, and the
    ``optim.Adagrad`` over them."""
    # opt out of sparse invariant checks explicitly (as the default does, minus its warning)
    torch.sparse.check_sparse_tensor_invariants.disable()
    bags = nn.ModuleList(
        nn.EmbeddingBag(v, workload.dim, mode="sum", sparse=True) for v in workload.vocab
    )
    with torch.no_grad():
        for bag in bags:
            bag.weight.uniform_(-0.05, 0.05)
    return bags, torch.optim.Adagrad(bags.parameters(), lr=0.01, initial_accumulator_value=0.1)


class Run:
    def __init__(self, workload: Workload, optimizer: str, batches: list[Batch]) -> None:
        self.bags, self.opt = bags_and_optimizer(workload)
        self.inputs = [
            [
                (torch.from_numpy(v), torch.from_numpy(o[:-1]))
                for v, o in zip(b.values, b.offsets, strict=True)
            ]
            for b in batches
        ]
        # Adagrad's state_sum is dense, allocated at its first step
        self.state_bytes = 2 * 4 * sum(b.weight.numel() for b in self.bags)
        self.projection = projection(workload.dim)

    def step(self, i: int) -> None:
        outs = [bag(v, o) for bag, (v, o) in zip(self.bags, self.inputs[i], strict=True)]
        loss = sum(((a @ self.projection) ** 2).sum() for a in outs)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[union-attr]
        self.opt.step()


def build(workload: Workload, optimizer: str, batches: list[Batch]) -> Run:
    return Run(workload, optimizer, batches)
