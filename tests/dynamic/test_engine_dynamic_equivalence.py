"""A dynamic table that admits on first sight and never evicts computes what a fixed table
computes with key ``KEYS[k]`` <-> row ``k``: the same activations at every step and the same
rows and slots after, for every optimizer of the conformance list, every combiner and both
API styles. The fixed engine is the yardstick (it is checked against the NumPy model in
tests/engine and tests/optimizers).

The shared scenario (two shared tables, a sequence feature, weights, sparse, ragged and dense
input) runs on both engines; the dynamic engine reads each id ``k`` as the key ``KEYS[k]``, a
spread of int64 values including both extremes and negatives.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
from engine_cases import (
    DIM_A,
    DIM_B,
    FEATURE_PATHS,
    FEATURE_TABLE,
    OPTIMIZER_CASES,
    OPTIMIZER_IDS,
    VOCAB_A,
    VOCAB_B,
    OptCase,
    get_path,
    initializer_from,
    nested,
    random_gradients,
    scenario_batch,
    scenario_features,
    scenario_step,
)

import embcore as ec
from embcore.dynamic.init import default_rows

I64_MIN, I64_MAX = -(2**63), 2**63 - 1
#: the key of id k, per table (distinct, unordered: rows are not handed out in key order)
KEYS = {
    "a": np.array(
        [I64_MAX, -3, 0, 8_231_778_211_409, I64_MIN, 7, -(2**40), 2**62, 1, -1, 123456789],
        dtype=np.int64,
    ),
    "b": np.array([5, I64_MIN + 1, I64_MAX - 1, -77, 2**33, 0, 42, -(2**62), 3], dtype=np.int64),
}
VOCABS, DIMS = {"a": VOCAB_A, "b": VOCAB_B}, {"a": DIM_A, "b": DIM_B}
STEPS = (4, 3, 5)
STYLES = ("backward", "apply_gradients")


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def zeros(shape: Any, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.zeros(tuple(shape), dtype=dtype)


def build(
    case: OptCase, combiners: tuple[str, str], start: str, backend: str = "auto", **options
) -> tuple[ec.EmbeddingEngine, ec.EmbeddingEngine]:
    """The fixed engine and the dynamic one; ``start``: ``"zeros"`` (both start at zero) or
    ``"default"`` (the dynamic default initializer; the fixed table holds those values)."""
    fixed, dynamic = [], []
    for name, combiner in zip(("a", "b"), combiners, strict=True):
        if start == "zeros":
            values = np.zeros((VOCABS[name], DIMS[name]), np.float32)
            init = zeros
        else:
            values = default_rows(0, name, KEYS[name], DIMS[name])
            init = None
        fixed.append(
            ec.TableConfig(
                VOCABS[name],
                DIMS[name],
                initializer=initializer_from(values),
                combiner=combiner,
                name=name,
            )
        )
        dynamic.append(
            ec.TableConfig(None, DIMS[name], initializer=init, combiner=combiner, name=name)
        )
    return (
        ec.EmbeddingEngine(scenario_features(*fixed), case.make(), backend=backend, **options),
        ec.EmbeddingEngine(scenario_features(*dynamic), case.make(), backend=backend, **options),
    )


def as_keys(x: Any, table: str) -> Any:
    """The same input with every id ``k`` replaced by ``KEYS[table][k]``."""
    lut = torch.from_numpy(KEYS[table])
    if isinstance(x, ec.RaggedIds):
        return ec.RaggedIds(lut[x.values], x.row_splits)
    if x.layout == torch.sparse_coo:
        return torch.sparse_coo_tensor(
            x._indices(), lut[x._values()], x.shape, check_invariants=True
        )
    return lut[x]


def run_and_compare(
    fixed: ec.EmbeddingEngine, dynamic: ec.EmbeddingEngine, style: str, seed: int = 3
) -> dict[str, set[int]]:
    """Train both on the same steps, comparing activations; returns the ids looked up."""
    rng = np.random.default_rng(seed)
    seen: dict[str, set[int]] = {"a": set(), "b": set()}
    for size in STEPS:
        batch = scenario_batch(rng, size)
        grads = random_gradients(rng, batch)
        keyed = nested(
            {p: as_keys(get_path(batch.features, p), FEATURE_TABLE[p]) for p in FEATURE_PATHS}
        )
        want = scenario_step(fixed, batch.features, batch.weights, grads, style)
        got = scenario_step(dynamic, keyed, batch.weights, grads, style)
        for p in FEATURE_PATHS:
            assert torch.equal(got[p], want[p]), (p, got[p], want[p])
            seen[FEATURE_TABLE[p]] |= {i for sample in batch.samples[p] for i, _ in sample}
    return seen


def assert_same_tables(
    fixed: ec.EmbeddingEngine, dynamic: ec.EmbeddingEngine, seen: dict[str, set[int]]
) -> None:
    assert dynamic.step == fixed.step == len(STEPS)
    for name in ("a", "b"):
        ids = np.array(sorted(seen[name]), np.int64)
        keys = KEYS[name][ids]
        order = np.argsort(keys)
        held = dynamic.table_keys(name)
        assert held.dtype == torch.int64
        assert held.tolist() == sorted(keys.tolist())  # exactly the keys looked up, ascending
        weight = fixed.embedding_tables[name]
        assert torch.equal(dynamic.table_rows(name, torch.from_numpy(keys)), weight[ids])
        assert torch.equal(dynamic.embedding_tables[name], weight[ids[order]])
        for slot, value in fixed.slot_variables[name].items():
            assert torch.equal(dynamic.slot_variables[name][slot], value[ids[order]]), slot
        unseen = np.setdiff1d(np.arange(VOCABS[name]), ids)
        rows = dynamic.table_rows(name, torch.from_numpy(KEYS[name][unseen]))
        assert torch.equal(rows, torch.zeros(unseen.size, DIMS[name]))
    # training moved the rows, so the comparisons were not vacuous
    assert bool(fixed.embedding_tables["a"].abs().sum() > 0)


@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize("case", OPTIMIZER_CASES, ids=OPTIMIZER_IDS)
def test_dynamic_equals_fixed_from_zeros(case: OptCase, style: str) -> None:
    fixed, dynamic = build(case, ("sqrtn", "mean"), "zeros")
    seen = run_and_compare(fixed, dynamic, style)
    assert_same_tables(fixed, dynamic, seen)


@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize("combiners", [("sum", "mean"), ("mean", "sqrtn"), ("sqrtn", "sum")])
def test_dynamic_equals_fixed_every_combiner(combiners: tuple[str, str], style: str) -> None:
    case = next(c for c in OPTIMIZER_CASES if c.id == "adagrad-init-clipmax-wclip")
    fixed, dynamic = build(case, combiners, "zeros")
    assert_same_tables(fixed, dynamic, run_and_compare(fixed, dynamic, style))


# Non-lazy Adam moves every row of a fixed table, also those of keys a dynamic table has not
# admitted yet; from zeros they stay at zero, from other values they may decay or be clipped.
LAZY_CASES = [c for c in OPTIMIZER_CASES if c.hp.get("lazy_adam", True)]


@pytest.mark.parametrize("case", LAZY_CASES, ids=[c.id for c in LAZY_CASES])
def test_dynamic_equals_fixed_from_default_rows(case: OptCase) -> None:
    """The default initial rows are a function of the key alone: a fixed table initialised
    with them row by row computes the same."""
    fixed, dynamic = build(case, ("sqrtn", "mean"), "default")
    assert_same_tables(fixed, dynamic, run_and_compare(fixed, dynamic, "backward", seed=5))


PIPELINE_CASES = [
    c for c in OPTIMIZER_CASES if c.id in {"adagrad", "adam-non-lazy-decay-wclip", "ftrl"}
]


@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize("case", PIPELINE_CASES, ids=[c.id for c in PIPELINE_CASES])
def test_pipelined_dynamic_equals_pipelined_fixed(case: OptCase, style: str) -> None:
    """Without eviction, a pipelined engine keeps pipelining with dynamic tables: one step
    stale, exactly as the pipelined fixed table (new rows are admitted at the lookup, before
    the previous step's update lands)."""
    fixed, dynamic = build(case, ("sqrtn", "mean"), "zeros", pipeline=True)
    seen = run_and_compare(fixed, dynamic, style)
    fixed.flush()
    dynamic.flush()
    assert_same_tables(fixed, dynamic, seen)


def test_reference_backend_too() -> None:
    case = next(c for c in OPTIMIZER_CASES if c.id == "adam-non-lazy-decay-wclip")
    fixed, dynamic = build(case, ("sqrtn", "mean"), "zeros", backend="reference")
    assert_same_tables(fixed, dynamic, run_and_compare(fixed, dynamic, "apply_gradients"))


def test_stacked_equals_fixed() -> None:
    """``stacked()`` reads and trains dynamic tables as ``forward`` does."""
    case = next(c for c in OPTIMIZER_CASES if c.id == "ftrl")
    engines = []
    for vocab, init in ((10, initializer_from(np.zeros((10, 4), np.float32))), (None, zeros)):
        table = ec.TableConfig(vocab, 4, initializer=init, name="t")
        features = {"x": ec.FeatureConfig(table), "y": ec.FeatureConfig(table)}
        engines.append(ec.EmbeddingEngine(features, case.make()))
    rng = np.random.default_rng(0)
    for _ in range(3):
        ids = {f: torch.from_numpy(rng.integers(10, size=6)) for f in ("x", "y")}
        grad = torch.from_numpy(rng.standard_normal((6, 2, 4)).astype(np.float32))
        outs = []
        for engine, lut in zip(engines, (None, torch.from_numpy(KEYS["a"])), strict=True):
            batch = ids if lut is None else {f: lut[v] for f, v in ids.items()}
            out = engine.stacked(batch)
            (out * grad).sum().backward()
            outs.append(out.detach())
        assert torch.equal(outs[0], outs[1])
    seen = np.unique(np.concatenate([v.numpy() for v in ids.values()]))
    rows = engines[1].table_rows("t", torch.from_numpy(KEYS["a"][seen]))
    assert torch.equal(rows, engines[0].embedding_tables["t"][seen])
