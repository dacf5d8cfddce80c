"""The serving lookup and torch.export: the NumPy formulas of docs/semantics.md §2, the same
numbers after an export -> save -> load round trip at other batch sizes, and the engine's own
lookups; the main job's DLRM exported gives the eager model's logits bit for bit."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from engine_cases import (
    dense_samples,
    initializer_from,
    ragged_input,
    ragged_samples,
    ragged_sequence_samples,
    table_values,
)
from kjt_stand_in import StandInKJT
from numpy_reference import Sample, lookup, safe_prune

import embcore as ec
from embcore.data.batch import NUM_DENSE, SPARSE_NAMES
from embcore.serving import (
    ServingLookup,
    compile_package,
    export,
    lookup_dynamic_shapes,
    serving_module,
)
from embcore.train.config import load_config
from embcore.train.model import build_model

VOCAB, DIM, SEQ = 12, 3, 3
#: table name -> (combiner, safe_lookup)
TABLES = {"a": ("sqrtn", False), "b": ("mean", False), "c": ("sum", True), "d": ("mean", True)}
#: feature -> (table, input kind): "dense" (B,), "dense1" (B, 1), "ragged", "weighted", "sequence"
FEATURES = {
    "clicks": ("a", "weighted"),
    "item": ("b", "dense1"),
    "query": ("b", "ragged"),
    "history": ("a", "sequence"),
    "tags": ("c", "weighted"),
    "safe": ("d", "weighted"),
    "user": ("a", "dense"),
}


@pytest.fixture(scope="module")
def engine_and_values() -> tuple[ec.EmbeddingEngine, dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    values = {name: table_values(rng, VOCAB, DIM) for name in TABLES}
    tables = {
        name: ec.TableConfig(
            VOCAB,
            DIM,
            initializer=initializer_from(values[name]),
            combiner=c,
            name=name,
            safe_lookup=safe,
        )
        for name, (c, safe) in TABLES.items()
    }
    features = {
        name: ec.FeatureConfig(tables[t], max_sequence_length=SEQ if kind == "sequence" else 0)
        for name, (t, kind) in FEATURES.items()
    }
    return ec.EmbeddingEngine(features, backend="reference").eval(), values


def _rows(rng: np.random.Generator, batch: int, safe: bool) -> list[Sample]:
    """Ragged rows of 0-4 (id, weight) pairs; empty rows; with ``safe``, ids < 0 and
    weights <= 0 too (what safe_lookup prunes)."""
    rows = []
    for _ in range(batch):
        row = []
        for _ in range(int(rng.integers(0, 5))):
            i = int(rng.integers(-2 if safe else 0, VOCAB))
            w = float(np.float32(rng.uniform(-0.5 if safe else 0.25, 2.0)))
            row.append((i, w))
        rows.append(row)
    return rows


def _batch(values: dict[str, np.ndarray], batch: int, seed: int) -> tuple[dict, dict, dict]:
    """The exported program's inputs, the engine's (RaggedIds, weights), and the NumPy
    expectation per feature."""
    rng = np.random.default_rng(seed)
    program, engine, weights, want = {}, {}, {}, {}
    for name, (t, kind) in FEATURES.items():
        combiner, safe = TABLES[t]
        if kind.startswith("dense"):
            ids = rng.integers(0, VOCAB, size=(batch, 1) if kind == "dense1" else batch)
            program[name] = engine[name] = torch.from_numpy(ids)
            samples = dense_samples(ids)
        else:
            rows = _rows(rng, batch, safe)
            ragged, w = ragged_input(rows, weighted=kind == "weighted")
            engine[name] = ragged
            program[name] = (ragged.values, ragged.row_splits)
            if w is not None:
                weights[name] = w
                program[name] = (*program[name], w.values)
            if kind == "sequence":
                samples = ragged_sequence_samples(rows, SEQ)
            else:
                samples = ragged_samples(rows, weighted=kind == "weighted")
        if safe:
            samples = safe_prune(samples, combiner)
        out = lookup(values[t], samples, "sum" if kind == "sequence" else combiner)
        want[name] = out.reshape(batch, SEQ, DIM) if kind == "sequence" else out
    return program, (engine, weights), want


@pytest.fixture(scope="module")
def exported(engine_and_values, tmp_path_factory) -> torch.nn.Module:
    """The engine exported on a batch of 5, saved and loaded back."""
    engine, values = engine_and_values
    example, _, _ = _batch(values, 5, seed=1)
    program = export(engine, (example,), dynamic_shapes=(lookup_dynamic_shapes(engine, example),))
    path = tmp_path_factory.mktemp("program") / "lookup.pt2"
    torch.export.save(program, path)
    return torch.export.load(path).module()


@pytest.mark.parametrize("batch", [7, 1, 0])
def test_exported_lookup_equals_numpy_eager_and_engine(engine_and_values, exported, batch):
    engine, values = engine_and_values
    program_in, (engine_in, weights), want = _batch(values, batch, seed=10 + batch)
    got = exported(program_in)
    eager = ServingLookup(engine)(program_in)
    engine_out = engine(engine_in, weights)
    for name in FEATURES:
        # float32 against float64 formulas: a few ulps of the (at most 4-term) sums
        np.testing.assert_allclose(got[name].numpy(), want[name], rtol=1e-6, atol=1e-6)
        # the same operations in the same order: the same bits
        assert torch.equal(got[name], eager[name]), name
        assert torch.equal(got[name], engine_out[name]), name  # the reference backend's sums


def test_serving_lookup_accepts_ragged_ids_and_engine_weights(engine_and_values, exported):
    engine, values = engine_and_values
    program_in, (engine_in, weights), _ = _batch(values, 4, seed=3)
    got = ServingLookup(engine)(engine_in, weights)
    for name, want in exported(program_in).items():
        assert torch.equal(got[name], want), name


def test_serving_lookup_takes_a_keyed_jagged_tensor(engine_and_values, exported):
    engine, values = engine_and_values
    program_in, _, _ = _batch(values, 4, seed=4)
    keys, ids, lengths, weights = list(FEATURES), [], [], []
    for name in keys:
        x = program_in[name]
        if isinstance(x, torch.Tensor):  # one id per row
            x = (x.reshape(-1), torch.arange(5))
        ids.append(x[0])
        lengths.append(x[1][1:] - x[1][:-1])
        weights.append(x[2] if len(x) == 3 else torch.ones(x[0].shape))
    kjt = StandInKJT(keys, torch.cat(ids), torch.cat(lengths), torch.cat(weights))
    got = ServingLookup(engine)(kjt)
    for name, want in exported(program_in).items():  # weights of 1 change nothing
        assert torch.equal(got[name], want), name


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        ("id", r"feature 'query': an id is out of range for table 'b' with vocabulary_size 12"),
        ("negative", r"feature 'user': an id is out of range for table 'a'"),
        ("splits", r"feature 'query': row_splits must start at 0, end at len\(values\)"),
        ("weights", r"feature 'clicks': weights must be finite"),
    ],
)
def test_bad_values_raise_naming_the_feature(engine_and_values, exported, damage, message):
    engine, tables = engine_and_values
    program_in, _, _ = _batch(tables, 4, seed=5)
    values, splits = program_in["query"]
    assert values.numel() > 0 and splits[-1] > 0  # the damage below changes something
    if damage == "id":
        program_in["query"] = (torch.full_like(values, VOCAB), splits)
    elif damage == "negative":
        program_in["user"] = torch.full_like(program_in["user"], -1)
    elif damage == "splits":
        program_in["query"] = (values, splits.flip(0))
    else:
        v, s, w = program_in["clicks"]
        program_in["clicks"] = (v, s, torch.full_like(w, float("nan")))
    with pytest.raises(RuntimeError, match=message):
        exported(program_in)
    with pytest.raises(RuntimeError, match=message):
        ServingLookup(engine)(program_in)


def test_features_with_an_output_shape_are_refused() -> None:
    table = ec.TableConfig(4, 2, name="t")
    engine = ec.EmbeddingEngine({"f": ec.FeatureConfig(table, output_shape=[2, 2])})
    with pytest.raises(ValueError, match=r"feature 'f' has output_shape \[2, 2\]"):
        ServingLookup(engine)


@pytest.mark.parametrize("interaction", ["dot", "dcn"])
def test_dlrm_exports_with_the_eager_models_logits(tmp_path: Path, interaction: str) -> None:
    sets = ["model.embedding_dim=4", "model.bottom_mlp=[8]", f"model.interaction={interaction}"]
    config = load_config(None, [*sets, "model.dcn_rank=4"])
    vocab = [7 + i for i in range(len(SPARSE_NAMES))]
    model = build_model(config.model, vocab, optimizer=None, seed=3).eval()
    rng = np.random.default_rng(0)

    def rows(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        dense = torch.from_numpy(rng.random((n, NUM_DENSE), dtype=np.float32))
        sparse = torch.from_numpy(np.stack([rng.integers(0, v, n) for v in vocab], 1))
        return dense, sparse

    batch = torch.export.Dim("batch", min=0)
    program = export(model, rows(3), dynamic_shapes=({0: batch}, {0: batch}))
    torch.export.save(program, tmp_path / "dlrm.pt2")
    served = torch.export.load(tmp_path / "dlrm.pt2").module()
    assert serving_module(model).engine is not model.engine  # the model itself is unchanged
    assert isinstance(model.engine, ec.EmbeddingEngine)
    with torch.no_grad():
        for n in (5, 1, 0, 300):
            dense, sparse = rows(n)
            want = model(dense, sparse)  # the engine's fused CPU kernels
            got = served(dense, sparse)
            assert got.shape == (n,) and torch.equal(got, want), n


@pytest.mark.slow  # a C++ build: about 40 s on a small machine
@pytest.mark.skipif(
    shutil.which(os.environ.get("CXX", "g++")) is None, reason="AOTInductor needs a C++ compiler"
)
def test_aot_inductor_package_gives_the_same_activations(engine_and_values, tmp_path) -> None:
    engine, values = engine_and_values
    example, _, _ = _batch(values, 5, seed=1)
    program = export(engine, (example,), dynamic_shapes=(lookup_dynamic_shapes(engine, example),))
    package = compile_package(program, tmp_path / "lookup.aoti.pt2")
    compiled = torch._inductor.aoti_load_package(str(package))
    eager = ServingLookup(engine)
    for batch in (6, 1):
        program_in, _, want = _batch(values, batch, seed=20 + batch)
        got = compiled(program_in)
        for name in FEATURES:
            # AOTInductor may fuse and reorder the float32 arithmetic: a few ulps
            np.testing.assert_allclose(got[name].numpy(), want[name], rtol=1e-6, atol=1e-6)
            torch.testing.assert_close(got[name], eager(program_in)[name], rtol=1e-6, atol=1e-7)
    program_in["user"] = torch.full_like(program_in["user"], VOCAB)
    with pytest.raises(RuntimeError, match=r"feature 'user': an id is out of range"):
        compiled(program_in)
