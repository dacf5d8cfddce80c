"""A checkpoint written with another optimizer for a table is refused where its slots would be
restored (slot names overlap: AdagradMomentum's and FTRL's ``accumulators`` are Adagrad's),
unless ``allow_optimizer_change=True``: then weights and step load and the slots stay."""

from __future__ import annotations

import pytest
import torch
from ckpt_craft import assert_state, make_engine, snapshot, train

import embcore as ec
from embcore.sharding import ShardingPlan, TableShard

PLANS = {
    "local": None,
    "sharded": ShardingPlan(
        world_size=1,
        tables={"a": TableShard.row_wise([0], "mod"), "b": TableShard.column_wise([0], 3)},
    ),
}


@pytest.mark.parametrize("written", [ec.AdagradMomentum(0.1, momentum=0.9), ec.FTRL(0.1)])
@pytest.mark.parametrize("plan", PLANS, ids=str)
def test_another_optimizers_slots_are_refused_unless_allowed(tmp_path, written, plan):
    ec.checkpoint.save(train(make_engine(b_optimizer=written), steps=3), tmp_path / "c")
    reference = make_engine(b_optimizer=written)
    ec.checkpoint.load(reference, tmp_path / "c")
    want = snapshot(reference)

    def engine() -> ec.EmbeddingEngine:
        a = ec.TableConfig(vocabulary_size=9, dim=4, name="a", combiner="sum")
        b = ec.TableConfig(vocabulary_size=6, dim=3, name="b", optimizer=ec.Adagrad(0.3))
        features = {"x": ec.FeatureConfig(table=a), "y": ec.FeatureConfig(table=b)}
        return ec.EmbeddingEngine(features, ec.Adagrad(learning_rate=0.1), plan=PLANS[plan], seed=5)

    adagrad = engine()
    before = {k: v.clone() for k, v in adagrad.state_dict().items()}
    name = type(written).__name__
    with pytest.raises(
        ec.checkpoint.CheckpointError,
        match=rf"table 'b': the checkpoint's optimizer is {name}, the engine's Adagrad; its "
        r"slots would be restored into another optimizer's \(pass allow_optimizer_change=True",
    ):
        ec.checkpoint.load(adagrad, tmp_path / "c")
    assert_state(adagrad, before)

    ec.checkpoint.load(adagrad, tmp_path / "c", allow_optimizer_change=True)
    got = adagrad.state_dict()
    for key in ("step", "a.weight", "a.accumulators", "b.weight"):  # restored
        assert torch.equal(got[key], want[key]), key
    assert torch.equal(got["b.accumulators"], before["b.accumulators"])  # kept as it was
    assert torch.equal(got["b.accumulators"], torch.full((6, 3), 0.1))  # Adagrad's initial


def test_the_same_optimizer_with_other_hyperparameters_loads(tmp_path):
    trained = train(make_engine(b_optimizer=ec.Adam(0.2)))
    ec.checkpoint.save(trained, tmp_path / "c")
    engine = make_engine(b_optimizer=ec.Adam(0.01, beta_1=0.5))
    ec.checkpoint.load(engine, tmp_path / "c")
    assert_state(engine, snapshot(trained))
