"""Shared helpers of the tests of the engine's joint input conversions (one-id dense inputs in
tests/engine/test_dense_batch.py, ragged inputs in tests/engine/test_ragged_batch.py): the
per-feature conversion they must equal, and how two lists of batches are compared."""

from __future__ import annotations

import torch

import embcore as ec
from embcore.inputs import FeatureBatch, to_feature_batch


def per_feature(engine: ec.EmbeddingEngine, batch: dict) -> list[FeatureBatch]:
    """The batches of the per-feature conversion (the reference), in feature order."""
    return [
        to_feature_batch(f, engine.tables[f.table], batch[f.name], None, engine.device)
        for f in engine.features
    ]


def assert_same(got: list[FeatureBatch], want: list[FeatureBatch]) -> None:
    """Equal ids and offsets (values and dtypes), weights, combiners and output shapes."""
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g.values, w.values) and g.values.dtype == w.values.dtype
        assert torch.equal(g.offsets, w.offsets) and g.offsets.dtype == w.offsets.dtype
        assert (g.weights, g.combiner, g.output_shape) == (w.weights, w.combiner, w.output_shape)


def shares_one_copy(batches: tuple[FeatureBatch, ...]) -> bool:
    """Whether every batch's ids lie in one block of memory (the joint conversion's copy)."""
    return len({b.values.untyped_storage().data_ptr() for b in batches}) == 1
