"""The engine is an ``nn.Module``: module-wide operations keep it working and training."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

import embcore as ec

LR = 0.5


def make_engine() -> ec.EmbeddingEngine:
    table = ec.TableConfig(
        vocabulary_size=5, dim=2, name="t", initializer=lambda shape: torch.ones(shape)
    )
    return ec.EmbeddingEngine({"f": ec.FeatureConfig(table=table)}, optimizer=ec.SGD(LR))


def train_once(emb: ec.EmbeddingEngine, ids: list[int]) -> None:
    emb({"f": torch.tensor(ids)})["f"].sum().backward()


def expected_after(steps: list[list[int]]) -> np.ndarray:
    """SGD on loss = sum(act): each occurrence of a row subtracts LR from it."""
    w = np.ones((5, 2), dtype=np.float32)
    for ids in steps:
        for i in ids:
            w[i] -= LR
    return w


def test_module_wide_operations_keep_the_engine_training():
    emb = make_engine()
    model = nn.Sequential(nn.ModuleDict({"emb": emb}))
    train_once(emb, [1, 1])
    model.to("cpu")
    model.float()
    emb.share_memory()  # moves every buffer's storage in place: new addresses
    assert emb.embedding_tables["t"].is_shared()
    train_once(emb, [1, 3])
    np.testing.assert_array_equal(
        emb.embedding_tables["t"].numpy(), expected_after([[1, 1], [1, 3]])
    )


def test_a_replaced_buffer_is_what_the_engine_updates():
    emb = make_engine()
    train_once(emb, [0])
    emb.load_state_dict({k: v.clone() for k, v in emb.state_dict().items()})
    model = nn.ModuleDict({"emb": emb}).double().float()  # replaces every buffer
    train_once(model["emb"], [0, 4])
    np.testing.assert_array_equal(emb.embedding_tables["t"].numpy(), expected_after([[0], [0, 4]]))


def test_module_wide_dtype_casts_keep_tables_and_slots_as_configured():
    """``model.half()``, ``.double()`` and ``.to(torch.float64)`` cast the dense layers only:
    the engine's tables and slots keep their float32 values bit for bit and keep training."""
    third = np.float32(1.0 / 3.0)  # not a float16 value: a round trip through half would show
    table = ec.TableConfig(
        vocabulary_size=5, dim=2, name="t", initializer=lambda shape: torch.full(shape, third)
    )
    emb = ec.EmbeddingEngine(
        {"f": ec.FeatureConfig(table=table)}, optimizer=ec.Adagrad(learning_rate=LR)
    )
    model = nn.ModuleDict({"emb": emb, "dense": nn.Linear(2, 1)})
    model.half()
    assert model["dense"].weight.dtype == torch.float16
    model.double()
    assert model["dense"].weight.dtype == torch.float64
    model.to(torch.float64)
    assert emb.embedding_tables["t"].dtype == torch.float32
    assert emb.slot_variables["t"]["accumulators"].dtype == torch.float32
    np.testing.assert_array_equal(emb.embedding_tables["t"].numpy(), np.full((5, 2), third))

    train_once(emb, [2])  # d(loss)/d(row 2) = 1 per column: Adagrad from accumulator 0.1
    acc = np.float32(0.1) + np.float32(1.0)
    want = np.full((5, 2), third)
    want[2] = third - np.float32(LR) / np.sqrt(acc)
    np.testing.assert_allclose(emb.embedding_tables["t"].numpy(), want, rtol=1e-6)
    assert emb.embedding_tables["t"].dtype == torch.float32
    state = emb.state_dict()
    assert state["t.weight"].dtype == state["t.accumulators"].dtype == torch.float32


def test_a_half_precision_store_stays_half_through_float_and_moves():
    """A store keeps each table in the dtype it was built with (here float16 rows, float32
    slots) through ``.float()`` / ``.double()``, while ``share_memory`` and moves apply."""
    from embcore import ops
    from embcore.config import resolve
    from embcore.engine._local import LocalStore
    from embcore.engine._store import StoreConfig

    table = ec.TableConfig(vocabulary_size=4, dim=3, name="t")
    features = {"f": ec.FeatureConfig(table=table)}
    _, tables = resolve(features, ec.Adagrad(learning_rate=LR))
    config = StoreConfig(
        tuple(tables),
        0,
        torch.device("cpu"),
        ops.resolve("reference"),
        torch.float16,
        features,
        None,
    )
    store = LocalStore(config)
    before = store.gather([(0, "weight")])[0].clone()
    store.float().double().to("cpu").share_memory()
    weight, acc = store.gather([(0, "weight"), (0, "accumulators")])
    assert weight.dtype == torch.float16 and acc.dtype == torch.float32
    assert weight.is_shared() and torch.equal(weight, before)
