"""The engine against a step-by-step Python model of a dynamic table, on random steps.

Two features share a table of dim 1, combiner ``sum``, trained by SGD(1) with gradient 1 per
occurrence: a held key's value falls by the number of its occurrences in each step, so the
model (dicts, one key at a time, the rules of docs/dynamic_tables.md) predicts every
activation, every value and the exact key set after every step, through admission, pending
keys reading zero, eviction by age and by count, and keys admitted again.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from dynamic_model import Model

import embcore as ec
from embcore.dynamic.init import default_rows

POOL = np.array([-(2**63), -5, -1, 0, 1, 2, 3, 7, 2**31, 2**40 + 3, 2**63 - 1], np.int64)


def start(key: int) -> np.float32:
    return default_rows(0, "t", np.array([key], np.int64), 1)[0, 0]


@pytest.mark.parametrize(
    ("k", "ttl", "cap"),
    [(1, None, None), (2, None, None), (1, 2, None), (1, None, 4), (3, 3, 5), (2, 1, 3)],
)
@pytest.mark.parametrize("seed", [0, 1])
def test_engine_follows_the_model(k: int, ttl: int | None, cap: int | None, seed: int) -> None:
    run_against_the_model(k, ttl, cap, seed, pipeline=False)


@pytest.mark.parametrize(("k", "ttl", "cap"), [(1, None, 4), (2, 2, None), (2, 1, 3)])
def test_a_pipelined_engine_that_evicts_follows_the_model(
    k: int, ttl: int | None, cap: int | None
) -> None:
    """An eviction rule (either one alone) makes a pipelined engine apply each pending update
    before the next training lookup, whose step boundary could free the rows: its training
    lookups then read what the model holds, as an unpipelined engine's do. (Reads between
    steps see the tables before the pending update: they are checked after a flush.)"""
    run_against_the_model(k, ttl, cap, 0, pipeline=True)


@pytest.mark.parametrize("hint", [3, 64])  # keys reserved up front: fewer, more than held
@pytest.mark.parametrize(("k", "ttl", "cap"), [(1, None, None), (1, 2, 4), (2, 1, 3)])
def test_a_table_with_initial_capacity_follows_the_model(
    k: int, ttl: int | None, cap: int | None, hint: int
) -> None:
    run_against_the_model(k, ttl, cap, 0, pipeline=False, hint=hint)


def run_against_the_model(
    k: int, ttl: int | None, cap: int | None, seed: int, pipeline: bool, hint: int | None = None
) -> None:
    table = ec.TableConfig(
        None,
        1,
        combiner="sum",
        name="t",
        admission=ec.CountAdmission(min_count=k),
        eviction=ec.Eviction(steps_to_live=ttl, max_rows=cap),
        initial_capacity=hint,
    )
    emb = ec.EmbeddingEngine(
        {"x": ec.FeatureConfig(table), "y": ec.FeatureConfig(table)}, ec.SGD(1.0), pipeline=pipeline
    )
    model = Model(k, ttl, cap, start)
    rng = np.random.default_rng(seed)
    dropped = 0
    for _ in range(12):
        x = rng.choice(POOL[rng.permutation(POOL.size)[:6]], size=int(rng.integers(1, 6)))
        y = rng.choice(POOL, size=int(rng.integers(1, 4)))
        if rng.random() < 0.3 and not pipeline:  # an evaluation lookup changes nothing
            emb.eval()
            with torch.no_grad():
                got = emb({"x": torch.from_numpy(x), "y": torch.from_numpy(y)})["x"]
            assert got[:, 0].tolist() == [float(model.value(int(i))) for i in x]
            emb.train()
        acts = emb({"x": torch.from_numpy(x), "y": torch.from_numpy(y)})
        touched = model.lookup([int(i) for i in np.concatenate([x, y])])
        for name, ids in (("x", x), ("y", y)):
            assert acts[name][:, 0].tolist() == [float(model.value(int(i))) for i in ids]
        dropped += x.size + y.size - sum(touched.values())
        (acts["x"].sum() + acts["y"].sum()).backward()
        model.update(touched)
        if pipeline:
            continue
        check_state(emb, model, dropped)
    emb.flush()
    check_state(emb, model, dropped)


def check_state(emb: ec.EmbeddingEngine, model: Model, dropped: int) -> None:
    """The keys holding a row, their values, the pending keys and the dropped gradients."""
    assert emb.table_keys("t").tolist() == sorted(model.held)
    held = sorted(model.held)
    rows = emb.table_rows("t", torch.tensor(held, dtype=torch.int64))
    assert rows[:, 0].tolist() == [float(model.held[key][0]) for key in held]
    info = emb.table_info("t")
    assert (info["pending"], info["dropped_gradients"]) == (len(model.pending), dropped)
