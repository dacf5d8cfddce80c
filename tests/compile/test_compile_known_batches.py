"""A compiled training step does not check a prepared batch again (the engine validated it; the
update in the backward is given aliases of the lookup's tensors), but a batch changed in place
after ``engine.prepare``, or one the engine never prepared, is checked inside the compiled
model and refused with the operators' usual error, before any table changes."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch._dynamo
import torch.nn.functional as F
from compile_cases import VOCAB, batches, small_dlrm

import embcore as ec

pytestmark = [
    pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:.*should not be instantiated:DeprecationWarning"),
]


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> None:
    torch._dynamo.reset()


def _step(model, forward, dense, ids, labels) -> None:
    loss = F.binary_cross_entropy_with_logits(forward(dense, ids), labels)
    loss.backward()


def _tables(model) -> list[torch.Tensor]:
    return [t.clone() for t in model.engine.embedding_tables.values()]


@pytest.mark.slow
def test_a_prepared_batch_is_checked_only_when_changed_in_place(op_feature_checks) -> None:
    """Inductor, the main job's compile: after the step that compiles, steps run no
    per-feature check; a batch changed in place after it was prepared is refused."""
    model = small_dlrm()
    forward = torch.compile(model, fullgraph=True)
    steps = batches([16, 16, 16, 16])
    for dense, sparse, labels in steps[:3]:
        _step(model, forward, dense, model.engine.prepare(model.features(sparse)), labels)
    assert op_feature_checks == ["lookup"]  # the first lookup, before the operators were in use
    dense, sparse, labels = steps[3]
    prepared = model.engine.prepare(model.features(sparse))
    prepared.batches[5].values[3] = VOCAB + 7
    before = _tables(model)
    name = model.engine.feature_names[5]
    with pytest.raises(ValueError, match=rf"embcore::lookup: feature '{name}': id {VOCAB + 7} "):
        _step(model, forward, dense, prepared, labels)
    assert all(torch.equal(a, b) for a, b in zip(before, _tables(model), strict=True))
    assert model.engine.step == 3


def test_a_batch_the_engine_did_not_prepare_is_checked() -> None:
    """A ``PreparedBatch`` put together by hand from a prepared one with an id edited out of
    place (so new tensors, never checked) is refused; the prepared one still trains."""
    model = small_dlrm()
    forward = torch.compile(model, backend="aot_eager", fullgraph=True)
    (dense, sparse, labels), (dense2, sparse2, labels2) = batches([8, 8])
    _step(model, forward, dense, model.engine.prepare(model.features(sparse)), labels)
    good = model.engine.prepare(model.features(sparse2))
    bad = list(good.batches)
    bad[2] = replace(bad[2], values=bad[2].values.clone().index_fill_(0, torch.tensor([1]), -4))
    name = model.engine.feature_names[2]
    with pytest.raises(
        ValueError, match=rf"embcore::lookup: feature '{name}': id -4 at position 1"
    ):
        _step(model, forward, dense2, ec.PreparedBatch(tuple(bad), id(model.engine)), labels2)
    assert model.engine.step == 1
    _step(model, forward, dense2, good, labels2)
    assert model.engine.step == 2
