"""A dropped engine frees its tables at once: nothing it owns points back at it.

A reference cycle through the engine (its pipeline holding a bound method of it, say) keeps
gigabytes of tables alive until the garbage collector happens to run, and a cycle through an
autograd node only on its second pass.
"""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

import embcore as ec


@pytest.mark.parametrize("pipeline", [False, True])
@pytest.mark.parametrize("api", ["forward", "stacked", "enqueue"])
def test_an_engine_is_freed_when_its_last_reference_goes(pipeline: bool, api: str) -> None:
    table = ec.TableConfig(vocabulary_size=50, dim=4, name="t")
    features = {"a": ec.FeatureConfig(table=table), "b": ec.FeatureConfig(table=table)}
    engine = ec.EmbeddingEngine(features, optimizer=ec.Adagrad(0.1), pipeline=pipeline)
    batch = {"a": torch.tensor([1, 2, 3]), "b": torch.tensor([4, 5, 6])}
    for _ in range(3):
        if api == "forward":
            sum(a.sum() for a in engine(batch).values()).backward()
        elif api == "stacked":
            engine.stacked(batch).sum().backward()
        else:
            engine.enqueue(batch, training=True)
            acts = engine.dequeue()
            engine.apply_gradients({k: torch.ones_like(v) for k, v in acts.items()})
            del acts
    engine.flush()
    ref = weakref.ref(engine)
    gc.disable()  # freed by reference counting alone, not by a collector pass
    try:
        del engine
        assert ref() is None
    finally:
        gc.enable()
