"""``EmbeddingEngine.stacked``: one ``(*shape, F, dim)`` tensor, trained like ``forward``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import embcore as ec

VOCAB, DIM, B, LR = 12, 5, 6, 0.3


def init(shape, dtype=torch.float32):
    return torch.linspace(-1, 1, shape[0] * shape[1], dtype=dtype).reshape(shape)


def make_engine(backend: str, pipeline: bool = False) -> ec.EmbeddingEngine:
    a = ec.TableConfig(vocabulary_size=VOCAB, dim=DIM, name="a", initializer=init)
    b = ec.TableConfig(vocabulary_size=VOCAB, dim=DIM, name="b", initializer=init, combiner="sum")
    features = {
        "x": ec.FeatureConfig(table=a),
        "y": ec.FeatureConfig(table=b),
        "z": ec.FeatureConfig(table=a),  # shares table a with x
    }
    return ec.EmbeddingEngine(features, optimizer=ec.SGD(LR), backend=backend, pipeline=pipeline)


def batch(rng: np.random.Generator) -> dict:
    lengths = rng.integers(0, 4, size=B)
    ragged = ec.RaggedIds.from_lists([rng.integers(0, VOCAB, n).tolist() for n in lengths])
    return {
        "x": torch.from_numpy(rng.integers(0, VOCAB, B)),
        "y": ragged,
        "z": torch.from_numpy(rng.integers(0, VOCAB, (B, 1))),
    }


@pytest.mark.parametrize("backend", ["cpu", "reference"])
def test_stacked_equals_stacking_forward(backend):
    emb = make_engine(backend).eval()
    inputs = batch(np.random.default_rng(0))
    acts = emb(inputs)
    got = emb.stacked(inputs)
    assert got.shape == (B, 3, DIM)
    assert torch.equal(got, torch.stack([acts[k] for k in emb.feature_names], dim=1))


@pytest.mark.parametrize("backend", ["cpu", "reference"])
@pytest.mark.parametrize("pipeline", [False, True])
def test_training_matches_numpy_sgd(backend, pipeline):
    """loss = sum(stacked * R): each id occurrence of feature f in sample s moves its row by
    -LR * R[s, f] (SGD, sum combiner), applied after the next lookup when pipelined."""
    rng = np.random.default_rng(1)
    emb = make_engine(backend, pipeline)
    w = {"a": init((VOCAB, DIM)).numpy().astype(np.float64)}
    w["b"] = w["a"].copy()
    tables = {"x": "a", "y": "b", "z": "a"}
    for _ in range(3):
        inputs = batch(rng)
        r = torch.from_numpy(rng.standard_normal((B, 3, DIM)).astype(np.float32))
        (emb.stacked(inputs) * r).sum().backward()
        for f, name in enumerate(emb.feature_names):
            ids = inputs[name]
            rows = (
                [[int(i)] for i in ids.reshape(-1)]
                if isinstance(ids, torch.Tensor)
                else [
                    ids.values[ids.row_splits[s] : ids.row_splits[s + 1]].tolist() for s in range(B)
                ]
            )
            for s, sample in enumerate(rows):
                for i in sample:
                    w[tables[name]][i] -= LR * r[s, f].numpy()
    emb.flush()
    for name in ("a", "b"):
        np.testing.assert_allclose(emb.embedding_tables[name].numpy(), w[name], atol=1e-5)


def test_mixed_dims_are_refused_by_name():
    small = ec.TableConfig(vocabulary_size=4, dim=2, name="small")
    wide = ec.TableConfig(vocabulary_size=4, dim=3, name="wide")
    emb = ec.EmbeddingEngine(
        {"p": ec.FeatureConfig(table=small), "q": ec.FeatureConfig(table=wide)},
        optimizer=ec.SGD(0.1),
    )
    before = {k: v.clone() for k, v in emb.state_dict().items()}
    with pytest.raises(ValueError, match=r"feature 'q' has output shape \(2,\) and dim 3"):
        emb.stacked({"p": torch.tensor([0, 1]), "q": torch.tensor([2, 3])})
    assert all(torch.equal(v, emb.state_dict()[k]) for k, v in before.items())


def test_sequence_features_stack_per_position():
    t = ec.TableConfig(vocabulary_size=VOCAB, dim=DIM, name="t", initializer=init)
    feats = {
        "s1": ec.FeatureConfig(table=t, max_sequence_length=3),
        "s2": ec.FeatureConfig(table=t, max_sequence_length=3),
    }
    emb = ec.EmbeddingEngine(feats, optimizer=ec.SGD(0.1)).eval()
    ids = ec.RaggedIds.from_lists([[1, 2], [3], [4, 5, 6, 7]])
    inputs = {"s1": ids, "s2": ids}
    acts = emb(inputs)
    got = emb.stacked(inputs)
    assert got.shape == (3, 3, 2, DIM)
    assert torch.equal(got, torch.stack([acts["s1"], acts["s2"]], dim=-2))


@pytest.mark.parametrize("backend", ["cpu", "reference"])
def test_a_non_finite_stacked_gradient_names_its_feature(backend):
    emb = make_engine(backend)
    before = {k: v.clone() for k, v in emb.state_dict().items()}
    r = torch.ones(B, 3, DIM)
    r[2, 1, 4] = float("nan")  # feature y (table b)
    with pytest.raises(ValueError, match=r"features 'y' \(table 'b'\) have NaN or Inf"):
        (emb.stacked(batch(np.random.default_rng(2))) * r).sum().backward()
    assert all(torch.equal(v, emb.state_dict()[k]) for k, v in before.items())
