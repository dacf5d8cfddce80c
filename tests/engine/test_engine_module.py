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
