"""A new kind of row storage is one class plus one registration (docs/architecture.md).

``ReversedRows`` (``tests/row_seam_kind.py``) is written outside embcore and stores a table's
rows upside down, so it only works if the stores map ids through it and checkpoints, state
dicts and serving read it through the ``RowStore`` contract. Registered and chosen for a
table, it trains, checkpoints (with deltas, beside a dynamic table) and serves exactly as the
built-in dense rows; ``tests/sharding/test_row_storage_seam_ranks.py`` shards it on 2 ranks.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import row_seam_kind as kind
import torch

import embcore as ec
from embcore.serving import ServingLookup


def make(reversed_tables: Sequence[str] = (), dynamic: bool = False) -> ec.EmbeddingEngine:
    """Tables ``a`` (7 x 3, sum) and ``b`` (5 x 3), and a dynamic ``d`` when asked; the
    tables named get :class:`ReversedRows` (chosen when the engine is built)."""
    before = kind.use(reversed_tables)
    try:
        a = ec.TableConfig(vocabulary_size=7, dim=3, name="a", combiner="sum")
        b = ec.TableConfig(vocabulary_size=5, dim=3, name="b")
        features = {"x": ec.FeatureConfig(table=a), "y": ec.FeatureConfig(table=a)}
        features["z"] = ec.FeatureConfig(table=b)
        if dynamic:
            features["k"] = ec.FeatureConfig(table=ec.TableConfig(None, 3, name="d"))
        return ec.EmbeddingEngine(features, optimizer=ec.Adagrad(learning_rate=0.2), seed=1)
    finally:
        kind.restore(before)


def batch(step: int, dynamic: bool) -> dict[str, object]:
    g = torch.Generator().manual_seed(step)
    out: dict[str, object] = {
        "x": torch.randint(0, 7, (4,), generator=g),
        "y": ec.RaggedIds(torch.randint(0, 7, (6,), generator=g), torch.tensor([0, 2, 2, 5, 6])),
        "z": torch.randint(0, 5, (4,), generator=g),
    }
    if dynamic:
        out["k"] = torch.randint(-50, 50, (4,), generator=g) * 1_000_003
    return out


def train(engine: ec.EmbeddingEngine, steps: range, dynamic: bool = False) -> None:
    for step in steps:
        sum((v * v).sum() for v in engine(batch(step, dynamic)).values()).backward()


def assert_same_state(got: ec.EmbeddingEngine, want: ec.EmbeddingEngine) -> None:
    g, w = got.state_dict(), want.state_dict()
    assert list(g) == list(w)
    for key in w:
        np.testing.assert_array_equal(g[key].numpy(), w[key].numpy(), err_msg=key)


def test_a_registered_kind_trains_like_dense_rows():
    kind.ReversedRows.calls.update(map=0, for_update=0, end_step=0)
    mine, dense = make(["a"]), make()
    assert type(mine.store.rows[0]).__name__ == "ReversedRows"
    assert type(dense.store.rows[0]).__name__ == "DenseRows"
    assert not torch.equal(mine.store.rows[0].state().weight, dense.store.rows[0].state().weight)
    train(mine, range(3))
    train(dense, range(3))
    assert kind.ReversedRows.calls == {"map": 3, "for_update": 3, "end_step": 3}
    assert_same_state(mine, dense)
    mine.eval(), dense.eval()
    for f, act in mine(batch(9, False)).items():
        torch.testing.assert_close(act, dense(batch(9, False))[f], rtol=0, atol=0)


def test_a_registered_kind_checkpoints_with_deltas(tmp_path):
    mine, dense = make(["a"], dynamic=True), make(dynamic=True)
    for e in (mine, dense):
        train(e, range(2), dynamic=True)
    ec.checkpoint.save(mine, tmp_path / "full")
    for e in (mine, dense):
        train(e, range(2, 4), dynamic=True)
    ec.checkpoint.save(mine, tmp_path / "delta", base=tmp_path / "full")
    for loaded in (make(["a"], dynamic=True), make(dynamic=True)):
        ec.checkpoint.load(loaded, tmp_path / "delta")
        assert_same_state(loaded, dense)
        train(loaded, range(4, 6), dynamic=True)
    train(dense, range(4, 6), dynamic=True)
    assert_same_state(loaded, dense)
    ec.checkpoint.save(dense, tmp_path / "dense")  # and the other way
    back = make(["a"], dynamic=True)
    ec.checkpoint.load(back, tmp_path / "dense")
    assert_same_state(back, dense)


def test_a_registered_kind_loads_a_state_dict_and_serves_like_dense_rows():
    dense = make()
    train(dense, range(2))
    mine = make(["a"])
    mine.load_state_dict(dense.state_dict())
    assert_same_state(mine, dense)
    served, want = ServingLookup(mine), ServingLookup(dense)
    inputs = batch(7, False)
    inputs["y"] = (inputs["y"].values, inputs["y"].row_splits)
    for f, act in served(inputs).items():
        torch.testing.assert_close(act, want(inputs)[f], rtol=0, atol=0)
