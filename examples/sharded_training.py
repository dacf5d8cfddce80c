"""Sharded training with torchrun, checked against one process.

    torchrun --nproc-per-node 2 examples/sharded_training.py --vocab-cap 100000

W1-shaped tables (26 Criteo-sized tables, dim 64, vocabularies capped at ``--vocab-cap``;
BENCHMARKS.md uses 1,000,000), Adagrad. Every rank trains on its slice of each global batch;
the engine shards the tables over the ranks by the planner's plan. At the end, rank 0 trains
one process on the whole global batches and compares the tables.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
import torch.distributed as dist

import embcore as ec

CRITEO = [
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194,
    27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572,
]  # fmt: skip


def feature_config(cap: int, dim: int) -> dict[str, ec.FeatureConfig]:
    return {
        f"c{i:02d}": ec.FeatureConfig(
            table=ec.TableConfig(vocabulary_size=min(v, cap), dim=dim, name=f"t{i:02d}")
        )
        for i, v in enumerate(CRITEO)
    }


def global_batch(step: int, fc: dict, batch_size: int) -> dict[str, torch.Tensor]:
    """The same global batch on every rank: Zipf(1.05) ids, ``(zipf - 1) % vocab``."""
    rng = np.random.default_rng(step)
    return {
        name: torch.from_numpy((rng.zipf(1.05, batch_size) - 1) % f.table.vocabulary_size)
        for name, f in fc.items()
    }


def train_step(engine: ec.EmbeddingEngine, batch: dict[str, torch.Tensor]) -> float:
    acts = engine(batch)
    loss = sum((a - 0.1).square().sum() for a in acts.values())
    # each rank's gradients; the engine sums them over ranks (docs/semantics.md §3.16)
    loss.backward()
    return loss.item()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--vocab-cap", type=int, default=1_000_000)
    parser.add_argument("--batch-size", type=int, default=4096, help="global batch per step")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--dim", type=int, default=64)
    args = parser.parse_args()

    dist.init_process_group("gloo")  # torchrun sets RANK, WORLD_SIZE, MASTER_ADDR, ...
    rank, world = dist.get_rank(), dist.get_world_size()
    fc = feature_config(args.vocab_cap, args.dim)
    optimizer = ec.Adagrad(learning_rate=0.01)

    engine = ec.EmbeddingEngine(fc, optimizer)  # sharded: a process group is initialized
    if rank == 0:
        print(f"{engine.store.engine_name} over {world} ranks")  # the tables are sharded
        schemes = [s.scheme for s in engine.plan.tables.values()]
        print({s: schemes.count(s) for s in sorted(set(schemes))})
    local = args.batch_size // world
    for step in range(args.steps):
        batch = global_batch(step, fc, args.batch_size)
        mine = {k: v[rank * local : (rank + 1) * local] for k, v in batch.items()}
        loss = train_step(engine, mine)
        print(f"rank {rank} step {step} local loss {loss:.4f}")
    tables = engine.embedding_tables  # gathered: every rank asks
    slots = engine.slot_variables
    schemes = {name: shard.scheme for name, shard in engine.plan.tables.items()}
    del engine
    dist.destroy_process_group()

    if rank == 0:  # one process, no process group: the plain engine on the global batches
        single = ec.EmbeddingEngine(fc, optimizer)
        for step in range(args.steps):
            train_step(single, global_batch(step, fc, world * local))
        worst: dict[str, float] = {}
        for name, value in single.embedding_tables.items():
            pairs = [(tables[name], value)]
            pairs.append((slots[name]["accumulators"], single.slot_variables[name]["accumulators"]))
            for got, want in pairs:
                rel = float(((got - want).abs() / want.abs().clamp_min(1e-3)).max())
                worst[schemes[name]] = max(worst.get(schemes[name], 0.0), rel)
                # Data-parallel rows sum thousands of float32 terms per rank, then across
                # ranks: the same sum in another order, equal to float32 rounding.
                rtol = 1e-4 if schemes[name] == "data_parallel" else 1e-5
                torch.testing.assert_close(got, want, rtol=rtol, atol=1e-6)
        summary = ", ".join(f"{s} {v:.2g}" for s, v in sorted(worst.items()))
        print(f"matches one process: {len(tables)} tables; max relative difference: {summary}")


if __name__ == "__main__":
    main()
