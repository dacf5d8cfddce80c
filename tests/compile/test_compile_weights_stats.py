"""A compiled training step where the engine's other features meet the operators: per-id
weights reach the update in the backward (checked against the NumPy model), and lookup
statistics are sampled once per step, as in eager mode."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import numpy_reference as ref
import pytest
import torch
import torch._dynamo
from engine_cases import initializer_from, ragged_input, ragged_samples, table_values

import embcore as ec

VOCAB, DIM = 12, 3


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> None:
    torch._dynamo.reset()


def _engine(values: np.ndarray, combiner: str, **options: object) -> ec.EmbeddingEngine:
    table = ec.TableConfig(
        VOCAB, DIM, initializer=initializer_from(values), combiner=combiner, name="t"
    )
    features = {"x": ec.FeatureConfig(table), "y": ec.FeatureConfig(table)}
    return ec.EmbeddingEngine(features, ec.Adagrad(learning_rate=0.3), **options)


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
def test_a_compiled_step_trains_with_the_per_id_weights(combiner: str) -> None:
    rng = np.random.default_rng(0)
    values = table_values(rng, VOCAB, DIM)
    engine = _engine(values, combiner)
    forward = torch.compile(engine, backend="aot_eager", fullgraph=True)
    table = values.astype(np.float64)
    slots = ref.initial_slots("adagrad", {}, VOCAB, DIM)
    for step in range(1, 4):
        rows = {
            name: [
                [(int(rng.integers(VOCAB)), float(np.float32(rng.uniform(0.2, 3.0))))
                 for _ in range(int(rng.integers(1, 4)))]
                for _ in range(5)
            ]
            for name in ("x", "y")
        }  # fmt: skip
        ids, weights = {}, {}
        for name, r in rows.items():
            ids[name], weights[name] = ragged_input(r)
        acts = forward(engine.prepare(ids, weights=weights))
        grads = {n: rng.standard_normal((5, DIM)).astype(np.float32) for n in rows}
        features = []
        for name, r in rows.items():
            samples = ragged_samples(r)
            want = ref.lookup(table, samples, combiner)
            np.testing.assert_allclose(acts[name].detach().numpy(), want, rtol=1e-5, atol=1e-6)
            features.append((samples, combiner, grads[name]))
        sum((acts[n] * torch.from_numpy(grads[n])).sum() for n in rows).backward()
        g, touched = ref.row_gradients(VOCAB, DIM, features)
        ref.apply_update("adagrad", {}, table, slots, g, touched, 0.3, step)
        engine.flush()
        np.testing.assert_allclose(
            engine.embedding_tables["t"].numpy(), table, rtol=1e-5, atol=1e-6
        )


def _statistics(directory: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(directory.rglob("*.json"))]


def test_a_compiled_step_samples_lookup_statistics_once(tmp_path: Path) -> None:
    """Raw dense ids: the operator converts them and samples the statistics in the forward;
    the backward's conversion must not sample them again."""
    values = table_values(np.random.default_rng(1), VOCAB, DIM)
    dirs = {"eager": tmp_path / "eager", "compiled": tmp_path / "compiled"}
    engines = {
        k: _engine(values, "sum", profile_data_directory=str(d), profile_sample_rate=1.0)
        for k, d in dirs.items()
    }
    forward = {"eager": engines["eager"], "compiled": torch.compile(engines["compiled"],
               backend="aot_eager", fullgraph=True)}  # fmt: skip
    g = torch.Generator().manual_seed(2)
    steps = 4
    for _ in range(steps):
        ids = {n: torch.randint(0, VOCAB, (6,), generator=g) for n in ("x", "y")}
        for name in ("eager", "compiled"):
            acts = forward[name](ids)
            (acts["x"].sum() + 2 * acts["y"].sum()).backward()
    for engine in engines.values():
        engine.write_statistics()
    eager, compiled = _statistics(dirs["eager"]), _statistics(dirs["compiled"])
    assert len(eager) == 1 and eager[0]["batches"] == steps and eager[0]["ids"] == steps * 12
    assert compiled == eager
