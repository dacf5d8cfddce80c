"""A PreparedBatch changed in place after ``prepare`` is refused at every use (fault injection
of docs/reliability.md, "Inputs are owned, not aliased").

``prepare`` checks a batch once and the kernels trust it from then on; its tensors are
reachable (``prepared.batches[i].values`` ...). A change made to one in place afterwards (an
id out of range, offsets past the ids, a NaN weight) must give one clear error naming the
feature and the tensor at forward, stacked, enqueue, dequeue, apply_gradients or the
backward, with tables, slots, step and dynamic keys as they were; the engine stays usable.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import replace

import numpy as np
import pytest
import torch
from numpy.testing import assert_allclose

import embcore as ec

VOCAB, DIM, LR = 10, 3, 0.5
REFUSED = r"PreparedBatch was changed in place after prepare\(\) \({} of feature 'f'"


def _engine(vocab: int | None = VOCAB) -> ec.EmbeddingEngine:
    table = ec.TableConfig(vocabulary_size=vocab, dim=DIM, name="t", combiner="sum")
    features = {"f": ec.FeatureConfig(table=table), "g": ec.FeatureConfig(table=table)}
    return ec.EmbeddingEngine(features, optimizer=ec.Adagrad(learning_rate=LR))


def _inputs() -> tuple[dict, dict]:
    """``f``: weighted ragged ids of 3 samples; ``g``: 3 dense ids (so ``stacked`` works)."""
    ids = ec.RaggedIds.from_lists([[1, 4], [], [7, 7, 2]])
    weights = ec.RaggedIds(torch.tensor([0.5, 2.0, 1.0, 3.0, 0.25]), ids.row_splits)
    return {"f": ids, "g": torch.tensor([3, 1, 4])}, {"f": weights}


def _snapshot(engine: ec.EmbeddingEngine) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in engine.state_dict().items()}


def _assert_unchanged(engine: ec.EmbeddingEngine, before: dict[str, torch.Tensor]) -> None:
    after = engine.state_dict()
    assert after.keys() == before.keys()
    for key, value in before.items():
        assert torch.equal(after[key], value), key


CHANGES: dict[str, tuple[str, Callable[[ec.PreparedBatch], None]]] = {
    "id-out-of-range": ("ids", lambda p: p.batches[0].values.__setitem__(1, VOCAB + 5)),
    "offsets-past-ids": ("offsets", lambda p: p.batches[0].offsets.__setitem__(-1, 10**6)),
    "weight-nan": ("weights", lambda p: p.batches[0].weights.__setitem__(0, float("nan"))),
}


def _use(engine: ec.EmbeddingEngine, prepared: ec.PreparedBatch, style: str, change) -> None:
    """Use ``prepared`` in ``style``, with ``change`` made at the point that style tests."""
    if style in ("forward", "stacked"):
        change(prepared)
        getattr(engine, style)(prepared)
    elif style in ("forward-backward", "stacked-backward"):
        acts = getattr(engine, style.split("-")[0])(prepared)
        change(prepared)
        loss = sum(a.sum() for a in acts.values()) if isinstance(acts, dict) else acts.sum()
        loss.backward()
    elif style == "enqueue":
        change(prepared)
        engine.enqueue(prepared)
    elif style == "dequeue":
        engine.enqueue(prepared)
        change(prepared)
        engine.dequeue()
    else:  # apply_gradients
        engine.enqueue(prepared)
        acts = engine.dequeue()
        change(prepared)
        engine.apply_gradients({k: torch.ones_like(v) for k, v in acts.items()})


STYLES = ["forward", "stacked", "forward-backward", "stacked-backward", "enqueue", "dequeue"]


@pytest.mark.parametrize("style", [*STYLES, "apply_gradients"])
@pytest.mark.parametrize("change", list(CHANGES))
def test_a_prepared_batch_changed_in_place_is_refused(change: str, style: str) -> None:
    engine = _engine()
    features, weights = _inputs()
    engine(features, weights)["f"].sum().backward()  # slots away from their initial values
    prepared = engine.prepare(features, weights)
    before = _snapshot(engine)
    part, mutate = CHANGES[change]
    caller = style.split("-")[1] if "-" in style else style
    message = f"EmbeddingEngine.{caller}: this " + REFUSED.format(part)
    with pytest.raises(ValueError, match=message):
        _use(engine, prepared, style, mutate)
    _assert_unchanged(engine, before)
    assert engine._pending is None
    with pytest.raises(ValueError, match=REFUSED.format(part)):  # and at every later use
        engine(prepared)
    engine(engine.prepare(features, weights))["f"].sum().backward()  # still usable
    assert engine.step == 2


@pytest.mark.parametrize("style", ["forward", "stacked", "enqueue", "dequeue"])
def test_a_dynamic_table_admits_no_key_of_a_changed_batch(style: str) -> None:
    engine = _engine(vocab=None)
    features, weights = _inputs()
    engine(features, weights)["f"].sum().backward()
    keys = engine.table_keys("t").clone()
    prepared = engine.prepare(features, weights)
    before = _snapshot(engine)
    with pytest.raises(ValueError, match=REFUSED.format("ids")):
        _use(engine, prepared, style, lambda p: p.batches[0].values.__setitem__(0, 12345))
    assert torch.equal(engine.table_keys("t"), keys)
    assert 12345 not in engine.table_keys("t").tolist()
    _assert_unchanged(engine, before)


def test_an_unchanged_prepared_batch_is_accepted_at_every_use() -> None:
    engine = _engine()
    features, weights = _inputs()
    table = engine.embedding_tables["t"].detach().numpy().copy()
    prepared = engine.prepare(features, weights)
    expected_f = np.stack(
        [
            0.5 * table[1] + 2.0 * table[4],
            np.zeros(DIM, np.float32),
            1.0 * table[7] + 3.0 * table[7] + 0.25 * table[2],
        ]
    )
    expected_g = table[[3, 1, 4]]
    with torch.no_grad():
        for _ in range(2):  # a prepared batch may be used again while it is unchanged
            acts = engine(prepared)
            assert_allclose(acts["f"].numpy(), expected_f, rtol=1e-6)
            assert_allclose(acts["g"].numpy(), expected_g, rtol=1e-6)
            stacked = engine.stacked(prepared)
            assert_allclose(stacked.numpy(), np.stack([expected_f, expected_g], 1), rtol=1e-6)
    engine.enqueue(prepared)
    acts = engine.dequeue()
    engine.apply_gradients({k: torch.ones_like(v) for k, v in acts.items()})
    engine(prepared)["g"].sum().backward()
    assert engine.step == 2


def test_a_batch_prepared_under_inference_mode_is_guarded_too() -> None:
    """Inference tensors have no version counter: ``prepare`` makes normal ones."""
    engine = _engine()
    features, weights = _inputs()
    with torch.inference_mode():
        prepared = engine.prepare(features, weights)
        engine(prepared)  # accepted while unchanged
        prepared.batches[1].values[0] = VOCAB
        with pytest.raises(ValueError, match=r"\(ids of feature 'g'\)"):
            engine(prepared)


def test_shared_one_id_offsets_changed_in_place_are_never_handed_out_again() -> None:
    """Dense ids of one id per sample share ``arange(S + 1)`` offsets across batches: a
    change to them through one prepared batch refuses that batch and no later one gets it."""
    engine = _engine()
    ids = {"f": torch.tensor([1, 2, 3]), "g": torch.tensor([4, 5, 6])}
    prepared = engine.prepare(ids)
    prepared.batches[0].offsets[-1] = 10**6
    with pytest.raises(ValueError, match=REFUSED.format("offsets")):
        engine(prepared)
    table = engine.embedding_tables["t"].detach().numpy().copy()
    again = engine.prepare(ids)
    assert again.batches[0].offsets.tolist() == [0, 1, 2, 3]
    with torch.no_grad():
        assert_allclose(engine(again)["f"].numpy(), table[[1, 2, 3]], rtol=1e-6)


@pytest.mark.parametrize("style", ["forward", "stacked", "enqueue"])
def test_a_prepared_batch_put_together_by_hand_is_refused(style: str) -> None:
    """New tensors (an id edited out of place) in a PreparedBatch built by hand were never
    checked: the eager path refuses it, as it does one of a copy of the engine."""
    engine = _engine()
    features, weights = _inputs()
    good = engine.prepare(features, weights)
    bad = list(good.batches)
    bad[0] = replace(bad[0], values=bad[0].values.clone().index_fill_(0, torch.tensor([1]), -4))
    before = _snapshot(engine)
    forged = ec.PreparedBatch(tuple(bad), id(engine))
    with pytest.raises(ValueError, match=r"PreparedBatch was not made by this engine's prepare"):
        _use(engine, forged, style, lambda p: None)
    with pytest.raises(ValueError, match=r"not made by this engine's prepare"):  # not even same
        _use(engine, ec.PreparedBatch(good.batches, id(engine)), style, lambda p: None)
    _assert_unchanged(engine, before)
    assert engine._pending is None
    with pytest.raises(ValueError, match="prepared by another engine"):
        copy.deepcopy(engine)(good)
    engine(good)["f"].sum().backward()
    assert engine.step == 1
