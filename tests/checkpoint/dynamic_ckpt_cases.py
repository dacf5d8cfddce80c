"""Shared by the dynamic-table checkpoint tests: an engine mixing dynamic tables (admission,
eviction, two optimizers) with a fixed one, a deterministic training step over raw 64-bit
keys, and the engine's whole state as plain tensors (keys, rows, slots, counts, last-seen
steps, pending counts; fixed tables and the step)."""

from __future__ import annotations

import os

import numpy as np
import torch

import embcore as ec

#: raw 64-bit keys, extremes and negatives included; training draws from them
POOL = torch.tensor(
    [
        -(2**63),
        2**63 - 1,
        -1,
        0,
        1,
        *[(i * 0x9E3779B97F4A7C15) % 2**63 - 2**62 for i in range(1, 43)],
    ],
    dtype=torch.int64,
)


def make_engine(
    pipeline: bool = False,
    dim: int = 4,
    lookup_only: bool = False,
    item_optimizer: ec.Optimizer | None = None,
    rows: os.PathLike | None = None,
) -> ec.EmbeddingEngine:
    """``lookup_only``: no optimizer anywhere (a serving engine); ``item_optimizer``: the
    dynamic table ``item``'s, instead of Adam; ``rows``: both dynamic tables in DiskStorage
    there, with caches of a few rows."""
    disk = {} if rows is None else {"storage": ec.DiskStorage(rows, cache_bytes=3 * 100)}
    user = ec.TableConfig(
        vocabulary_size=None,
        dim=dim,
        name="user",
        admission=ec.CountAdmission(min_count=2),
        eviction=ec.Eviction(steps_to_live=3, max_rows=20),
        **disk,
    )
    item = ec.TableConfig(
        vocabulary_size=None,
        dim=3,
        name="item",
        combiner="sum",
        optimizer=None if lookup_only else item_optimizer or ec.Adam(learning_rate=0.05),
        eviction=ec.Eviction(steps_to_live=4),
        **disk,
    )
    fixed = ec.TableConfig(vocabulary_size=7, dim=2, name="fixed")
    features = {
        "user": ec.FeatureConfig(table=user),
        "item": ec.FeatureConfig(table=item),
        "item_seq": ec.FeatureConfig(table=item, max_sequence_length=2),
        "fixed": ec.FeatureConfig(table=fixed),
    }
    return ec.EmbeddingEngine(
        features,
        None if lookup_only else ec.Adagrad(learning_rate=0.1),
        seed=3,
        pipeline=pipeline,
        backend="reference",
    )


def train_step(engine: ec.EmbeddingEngine, step: int) -> None:
    """Step ``step``'s batch and gradients depend on ``step`` only (the data order)."""
    g = torch.Generator().manual_seed(2000 + step)
    n = len(POOL)

    def keys(size: int, spread: int) -> torch.Tensor:
        # a window of the pool that moves with the step: keys arrive and go cold
        return POOL[(torch.randint(0, spread, (size,), generator=g) + 3 * step) % n]

    lengths = torch.randint(0, 3, (5,), generator=g)
    splits = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    features = {
        "user": keys(5, 12),
        "item": keys(5, 8),
        "item_seq": ec.RaggedIds(keys(int(splits[-1]), 8), splits),
        "fixed": torch.randint(0, 7, (5,), generator=g),
    }
    if step % 2:
        engine.enqueue(features)
        acts = engine.dequeue()
        engine.apply_gradients({k: torch.randn(v.shape, generator=g) for k, v in acts.items()})
    else:
        acts = engine(features)
        sum((v * torch.randn(v.shape, generator=g)).sum() for v in acts.values()).backward()


def snapshot(engine: ec.EmbeddingEngine) -> dict[str, torch.Tensor]:
    """Everything a checkpoint must restore, as tensors (no row numbers: they are internal)."""
    engine.flush()
    out: dict[str, torch.Tensor] = {"step": torch.tensor(engine.step)}
    dynamic = {t.name for t in engine.tables if t.dynamic}
    for t in engine.tables:
        if t.dynamic:
            for k, v in engine.store.dynamic_state(t.index).items():
                if k != "rows":
                    out[f"{t.name}:{k}"] = torch.as_tensor(np.asarray(v)).clone()
    for k, v in engine.state_dict().items():
        if k.split(".")[0] not in dynamic and k != "step":
            out[k] = v.clone()
    return out


def assert_same(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert sorted(got) == sorted(want)
    for key, value in want.items():
        assert got[key].dtype == value.dtype and torch.equal(got[key], value), key


def dir_bytes(path: str | os.PathLike[str]) -> int:
    return sum(e.stat().st_size for e in os.scandir(path))
