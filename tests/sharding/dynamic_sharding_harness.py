"""Multi-process material for dynamic tables placed by key hash (run with
``sharding_harness.launch("dynamic_sharding_harness:<worker>", world, ...)``).

One scenario, built identically in the test process (one process on the concatenated
batches) and in each rank (its own batch): a dynamic table with admission (keys seen twice)
and both eviction rules (two steps unseen; beyond 8 rows, least used first) over a Zipf-like
pool of raw 64-bit keys, beside a fixed table. Each step records the activations, the keys
holding a row, the rows of probe keys and the whole dynamic-table state.
"""

from __future__ import annotations

from typing import Any

import torch

import embcore as ec
from embcore.sharding import ShardingPlan, TableShard

STEPS = 6
MAX_ROWS = 8
#: 40 raw keys, key i drawn with weight 1 / (i + 1)
POOL = torch.tensor([(i * 0x9E3779B97F4A7C15 + 12345) % 2**64 - 2**63 for i in range(40)])
PROBE = torch.cat([POOL[:12], torch.tensor([2**63 - 1, -(2**63)])])


def feature_config(evict: bool = True, hint: int | None = None) -> dict[str, ec.FeatureConfig]:
    eviction = ec.Eviction(steps_to_live=2, max_rows=MAX_ROWS) if evict else None
    user = ec.TableConfig(
        vocabulary_size=None, dim=4, name="user", combiner="mean",
        admission=ec.CountAdmission(min_count=2), eviction=eviction, initial_capacity=hint,
    )  # fmt: skip
    fixed = ec.TableConfig(vocabulary_size=5, dim=3, name="fixed", combiner="sum")
    return {
        "u1": ec.FeatureConfig(table=user),
        "u2": ec.FeatureConfig(table=user),
        "f": ec.FeatureConfig(table=fixed),
    }


def plan(world: int) -> ShardingPlan:
    return ShardingPlan(
        world_size=world,
        tables={
            "user": TableShard(scheme="key_hash", ranks=tuple(range(world))),
            "fixed": TableShard.row_wise(list(range(world))),
        },
    )


def engine(world: int | None, pipelined: bool = False) -> ec.EmbeddingEngine:
    """The scenario's engine: sharded over ``world`` ranks, or one process (``None``).
    ``pipelined``: ``pipeline=True`` and no eviction (so each update lands after the next
    training lookup, one step stale). The ranks' dynamic table reserves 12 keys up front
    (``initial_capacity``, shared among its key shards; fewer than it holds), the one process's
    none: the same numbers."""
    kwargs: dict[str, Any] = {"backend": "reference", "pipeline": pipelined}
    if world is not None:
        kwargs["plan"] = plan(world)
    opt = ec.Adagrad(learning_rate=0.3)
    hint = None if world is None else 12
    return ec.EmbeddingEngine(feature_config(not pipelined, hint), opt, **kwargs)


def local_batch(step: int, rank: int) -> dict[str, Any]:
    """Rank ``rank``'s batch of ``step``: 4 + rank samples."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    n = 4 + rank
    weights = 1.0 / torch.arange(1, POOL.numel() + 1, dtype=torch.float64)
    lengths = torch.randint(0, 4, (n,), generator=g)
    splits = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(lengths, 0)])
    ragged = POOL[torch.multinomial(weights, int(splits[-1]), replacement=True, generator=g)]
    return {
        "u1": POOL[torch.multinomial(weights, n, replacement=True, generator=g)],
        "u2": ec.RaggedIds(ragged, splits),
        "f": torch.randint(0, 5, (n,), generator=g),
    }


def batch(step: int, ranks: list[int]) -> dict[str, Any]:
    parts = [local_batch(step, r) for r in ranks]
    out = {}
    for name in parts[0]:
        values = [p[name] for p in parts]
        if isinstance(values[0], ec.RaggedIds):
            splits, base = [values[0].row_splits[:1]], 0
            for v in values:
                splits.append(v.row_splits[1:] + base)
                base += v.values.numel()
            out[name] = ec.RaggedIds(torch.cat([v.values for v in values]), torch.cat(splits))
        else:
            out[name] = torch.cat(values)
    return out


def gradient(step: int, ranks: list[int], acts: dict[str, torch.Tensor]) -> dict[str, Any]:
    """Each rank's own gradient rows, concatenated in rank order."""
    out = {}
    for name, value in sorted(acts.items()):
        parts = []
        for r in ranks:
            g = torch.Generator().manual_seed(7000 * step + 10 * r + len(name))
            parts.append(torch.randn((4 + r, value.shape[-1]), generator=g))
        out[name] = torch.cat(parts)
    return out


def observe(e: ec.EmbeddingEngine) -> dict[str, Any]:
    """What a step leaves: keys holding a row, probe rows, the dynamic table's whole state."""
    state = e.state_dict()
    return {
        "info": e.table_info("user"),
        "keys": e.table_keys("user"),
        "probe": e.table_rows("user", PROBE),
        "state": {k: torch.as_tensor(v).clone() for k, v in state.items() if k.startswith("user.")},
    }


def train(e: ec.EmbeddingEngine, ranks: list[int], steps: range) -> list[dict[str, Any]]:
    """Steps alternating the PyTorch style and enqueue / apply_gradients, each followed by an
    evaluation lookup of the step's batch (which must change nothing)."""
    out = []
    for step in steps:
        features = batch(step, ranks)
        if step % 2 == 0:
            acts = e(features)
            grads = gradient(step, ranks, acts)
            sum((acts[k] * grads[k]).sum() for k in acts).backward()
        else:
            e.enqueue(features)
            acts = e.dequeue()
            e.apply_gradients(gradient(step, ranks, acts))
        with torch.no_grad():
            e.eval()
            evaluated = e(batch(step + 100, ranks))  # unseen mixes: nothing may be inserted
            e.train()
        out.append({"acts": acts, "eval": evaluated, **observe(e)})
    return out


def interleaved(e: ec.EmbeddingEngine, ranks: list[int]) -> list[dict[str, Any]]:
    """Two training lookups before their two updates, twice: a key admitted by the second
    lookup reads zeros in the first and its gradient from the first is dropped; the second
    update comes after the first one's eviction."""
    out = []
    for step in (0, 2):
        first, second = e(batch(step, ranks)), e(batch(step + 1, ranks))
        for s, acts in ((step, first), (step + 1, second)):
            grads = gradient(s, ranks, acts)
            sum((acts[k] * grads[k]).sum() for k in acts).backward()
        out.append({"acts": first, "eval": second, **observe(e)})
    return out


def reused(e: ec.EmbeddingEngine, ranks: list[int]) -> dict[str, Any]:
    """Pipelined, three steps on one prepared batch: each lookup runs before the previous
    step's update, which must still use its own lookup's rows."""
    prepared = e.prepare(batch(0, ranks))
    acts = []
    for step in range(3):
        out = e(prepared)
        grads = gradient(step, ranks, out)
        sum((out[k] * grads[k]).sum() for k in out).backward()
        acts.append(out)
    e.flush()
    return {"acts": acts, **observe(e)}


def worker_dynamic(
    rank: int, world: int, reference_state: str, reference_ckpt: str, ckpt: str
) -> dict[str, Any]:
    """Train the scenario and save a checkpoint, train on and save a delta against it; load
    the single-process state dict and
    checkpoint written at ``reference_state`` and ``reference_ckpt`` into fresh sharded
    engines and train on; two lookups before their updates; pipelined training."""
    e = engine(world)
    out: dict[str, Any] = {"steps": train(e, [rank], range(STEPS))}
    out["state_dict"] = {k: torch.as_tensor(v).clone() for k, v in e.state_dict().items()}
    ec.checkpoint.save(e, ckpt)
    out["continued"] = train(e, [rank], range(STEPS, STEPS + 2))
    ec.checkpoint.save(e, ckpt + "-delta", base=ckpt)  # the rows touched since
    resumed = engine(world)
    resumed.load_state_dict(torch.load(reference_state, weights_only=False))
    out["resumed"] = train(resumed, [rank], range(STEPS, STEPS + 2))
    from_ckpt = engine(world)
    ec.checkpoint.load(from_ckpt, reference_ckpt)
    out["resumed_from_checkpoint"] = train(from_ckpt, [rank], range(STEPS, STEPS + 2))
    out["interleaved"] = interleaved(engine(world), [rank])
    out["pipelined"] = train(engine(world, pipelined=True), [rank], range(STEPS))
    out["reused"] = reused(engine(world, pipelined=True), [rank])
    return out


def worker_resume(rank: int, world: int, state: str, ckpt: str) -> dict[str, Any]:
    """Load a state dict and a checkpoint written by another number of ranks; train on."""
    e = engine(world)
    e.load_state_dict(torch.load(state, weights_only=False))
    from_ckpt = engine(world)
    ec.checkpoint.load(from_ckpt, ckpt)
    return {
        "state_dict": train(e, [rank], range(STEPS, STEPS + 2)),
        "checkpoint": train(from_ckpt, [rank], range(STEPS, STEPS + 2)),
    }
