"""One-id dense inputs of many features converted at once (engine/_dense_batch.py): the same
batches as the per-feature conversion, owned, and the same errors."""

from __future__ import annotations

import pytest
import torch

import embcore as ec
from embcore.inputs import FeatureBatch, to_feature_batch


def make_engine(safe: bool = False) -> ec.EmbeddingEngine:
    tables = [
        ec.TableConfig(vocabulary_size=v, dim=4, name=f"t{i}", combiner="mean", safe_lookup=safe)
        for i, v in enumerate((10, 30, 7))
    ]
    config = {f"f{i}": ec.FeatureConfig(table=t) for i, t in enumerate(tables)}
    return ec.EmbeddingEngine(config, optimizer=ec.Adagrad(learning_rate=0.1))


def inputs(samples: int = 6) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(samples)
    return {
        f"f{i}": torch.randint(0, v, (samples,), generator=gen) for i, v in enumerate((10, 30, 7))
    }


def per_feature(engine: ec.EmbeddingEngine, batch: dict) -> list[FeatureBatch]:
    return [
        to_feature_batch(f, engine.tables[f.table], batch[f.name], None, engine.device)
        for f in engine.features
    ]


def assert_same(got: list[FeatureBatch], want: list[FeatureBatch]) -> None:
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g.values, w.values) and g.values.dtype == w.values.dtype
        assert torch.equal(g.offsets, w.offsets)
        assert (g.weights, g.combiner, g.output_shape) == (w.weights, w.combiner, w.output_shape)


def shares_one_copy(batches: tuple[FeatureBatch, ...]) -> bool:
    storages = {b.values.untyped_storage().data_ptr() for b in batches}
    return len(storages) == 1


@pytest.mark.parametrize("samples", [6, 0])
def test_one_id_dense_inputs_give_the_per_feature_batches(samples: int) -> None:
    engine, batch = make_engine(), inputs(samples)
    prepared = engine.prepare(batch).batches
    assert shares_one_copy(prepared)  # converted together
    assert_same(list(prepared), per_feature(engine, batch))


def test_batches_do_not_see_later_changes_to_the_inputs() -> None:
    engine, batch = make_engine(), inputs()
    want = [x.clone() for x in batch.values()]
    prepared = engine.prepare(batch).batches
    for x in batch.values():
        x.zero_()
    for b, w in zip(prepared, want, strict=True):
        assert torch.equal(b.values, w)


def test_an_id_out_of_range_names_its_feature() -> None:
    engine, batch = make_engine(), inputs()
    batch["f1"][3] = 30
    with pytest.raises(ValueError, match=r"feature 'f1': id 30 at position 3 .* table 't1'"):
        engine.prepare(batch)


@pytest.mark.parametrize("change", ["int32", "column", "lengths", "safe_lookup"])
def test_other_inputs_take_the_per_feature_path(change: str) -> None:
    engine, batch = make_engine(safe=change == "safe_lookup"), inputs()
    if change == "int32":
        batch["f2"] = batch["f2"].to(torch.int32)
    elif change == "column":
        batch["f0"] = batch["f0"][:, None]  # (B, 1): one id per sample, another shape
    elif change == "lengths":
        batch["f1"] = batch["f1"][:4]
    prepared = engine.prepare(batch).batches
    assert not shares_one_copy(prepared)
    assert_same(list(prepared), per_feature(engine, batch))
