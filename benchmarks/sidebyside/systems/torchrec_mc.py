"""TorchRec's managed-collision module on CPU, for W3's raw 64-bit keys: one
``MCHManagedCollisionModule`` per table (``zch_size`` = the workload's distinct-key bound, LRU
eviction, ``eviction_interval=1`` so a key seen in a step has its slot in that step) in front
of an unsharded ``EmbeddingBagCollection``, wrapped in ``ManagedCollisionEmbeddingBagCollection``.

Unsharded TorchRec has no fused optimizer on CPU (that needs ``DistributedModelParallel``
sharding); its ``nn.EmbeddingBag`` modules are switched to sparse gradients and trained by
``torch.optim.Adagrad``, as the plain-PyTorch peer is. Optional: skipped with a notice where
``torchrec`` does not import.
"""

from __future__ import annotations

import torch

from sidebyside.workloads import Batch, Workload, projection

NAME = "TorchRec managed collisions"
OPTIMIZERS = {"adagrad": "MCH + EmbeddingBagCollection + optim.Adagrad"}


def unavailable() -> str | None:
    try:
        import torchrec.modules.mc_embedding_modules
        import torchrec.modules.mc_modules  # noqa: F401
    except Exception as exc:  # ImportError, or an OSError/RuntimeError from a bad build
        return f"torchrec does not import ({type(exc).__name__}: {exc})".splitlines()[0]
    return None


def supports(workload: Workload) -> bool:
    return workload.raw_keys and workload.steps_to_live is None and workload.max_rows is None


class Run:
    def __init__(self, workload: Workload, optimizer: str, batches: list[Batch]) -> None:
        from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
        from torchrec.modules.mc_embedding_modules import (
            ManagedCollisionEmbeddingBagCollection,
        )
        from torchrec.modules.mc_modules import (
            LRU_EvictionPolicy,
            ManagedCollisionCollection,
            MCHManagedCollisionModule,
        )

        torch.sparse.check_sparse_tensor_invariants.disable()
        cpu = torch.device("cpu")
        # + 1: MCH keeps its last slot for keys without a slot
        configs = [
            EmbeddingBagConfig(
                name=f"t{t}",
                embedding_dim=workload.dim,
                num_embeddings=v + 1,
                feature_names=[f"f{t:02d}"],
            )
            for t, v in enumerate(workload.vocab)
        ]
        ebc = EmbeddingBagCollection(tables=configs, device=cpu)
        with torch.no_grad():
            for bag in ebc.embedding_bags.values():
                bag.weight.uniform_(-0.05, 0.05)
                bag.sparse = True
        modules = {
            c.name: MCHManagedCollisionModule(
                zch_size=c.num_embeddings,
                device=cpu,
                eviction_policy=LRU_EvictionPolicy(),
                eviction_interval=1,
                name=c.name,
            )
            for c in configs
        }
        self.model = ManagedCollisionEmbeddingBagCollection(
            ebc, ManagedCollisionCollection(modules, configs)
        )
        self.model.train()
        self.opt = torch.optim.Adagrad(ebc.parameters(), lr=0.01, initial_accumulator_value=0.1)
        keys = [f"f{t:02d}" for t in range(workload.tables)]
        self.inputs = []
        for b in batches:
            lengths = torch.cat([torch.from_numpy(o[1:] - o[:-1]) for o in b.offsets])
            values = torch.cat([torch.from_numpy(v) for v in b.values])
            self.inputs.append(KeyedJaggedTensor(keys=keys, values=values, lengths=lengths))
        weights = sum(c.num_embeddings * c.embedding_dim for c in configs)
        self.state_bytes = 2 * 4 * weights  # tables + Adagrad's dense state_sum
        self.projection = projection(workload.dim)

    def step(self, i: int) -> None:
        out = self.model(self.inputs[i])
        pooled = out[0] if isinstance(out, tuple) else out  # (KeyedTensor, remapped ids)
        acts = pooled.values()  # (B, T * dim)
        acts = acts.view(acts.shape[0], -1, self.projection.numel())
        loss = ((acts @ self.projection) ** 2).sum()
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()


def build(workload: Workload, optimizer: str, batches: list[Batch]) -> Run:
    return Run(workload, optimizer, batches)
