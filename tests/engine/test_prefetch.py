"""The prefetching helper yields exactly the batches, in order, and surfaces errors."""

from __future__ import annotations

import pytest
import torch

import embcore as ec


def engine() -> ec.EmbeddingEngine:
    t = ec.TableConfig(vocabulary_size=20, dim=4, name="t")
    return ec.EmbeddingEngine({"f": ec.FeatureConfig(table=t)}, optimizer=ec.SGD(learning_rate=0.1))


def loader(n: int):
    for i in range(n):
        yield torch.tensor([float(i)]), {"f": torch.tensor([i % 20, (3 * i) % 20])}


def test_prefetched_training_equals_direct_training():
    a, b = engine(), engine()
    labels = []
    with ec.Prefetcher(a, loader(12), split=lambda item: item, depth=3) as batches:
        for label, prepared in batches:
            labels.append(float(label))
            (a(prepared)["f"] ** 2).sum().backward()
    for _, feats in loader(12):
        (b(feats)["f"] ** 2).sum().backward()
    assert labels == [float(i) for i in range(12)]
    assert torch.equal(a.embedding_tables["t"], b.embedding_tables["t"]) and a.step == 12


def test_errors_in_the_thread_are_raised_at_their_batch():
    def bad():
        yield {"f": torch.tensor([1])}
        yield {"f": torch.tensor([99])}

    emb = engine()
    got = []
    with pytest.raises(ValueError, match="id 99"):
        for _, prepared in ec.Prefetcher(emb, bad()):
            got.append(prepared)
    assert len(got) == 1


def test_depth_is_validated():
    with pytest.raises(ValueError, match="depth must be >= 1"):
        ec.Prefetcher(engine(), [], depth=0)
