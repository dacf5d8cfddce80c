"""A small DLRM of the main job (``embcore.train.model.build_model``) and its batches, and a
two-feature model with ragged, sparse, weighted and TorchRec inputs, for the torch.compile
tests."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from kjt_stand_in import StandInKJT

import embcore as ec
from embcore.data.batch import NUM_DENSE, SPARSE_NAMES
from embcore.models import DLRM
from embcore.train.config import ModelConfig
from embcore.train.model import build_model

VOCAB = 50


def small_dlrm(seed: int = 0, **engine_options: object) -> DLRM:
    """The main job's model at a small size (26 tables of 50 rows, dim 8)."""
    cfg = ModelConfig(embedding_dim=8, bottom_mlp=(16,), top_mlp=(16,))
    return build_model(
        cfg,
        [VOCAB] * len(SPARSE_NAMES),
        optimizer=ec.Adagrad(learning_rate=0.1),
        seed=seed,
        engine_options=engine_options,
    )


def batches(sizes: list[int], seed: int = 1) -> list[tuple[torch.Tensor, ...]]:
    """``(dense (B, 13), sparse (B, 26) ids, labels (B,))`` per batch size."""
    g = torch.Generator().manual_seed(seed)
    return [
        (
            torch.randn(b, NUM_DENSE, generator=g),
            torch.randint(0, VOCAB, (b, len(SPARSE_NAMES)), generator=g),
            torch.randint(0, 2, (b,), generator=g).float(),
        )
        for b in sizes
    ]


class TwoFeatures(torch.nn.Module):
    """Two pooled features ``a`` (sum) and ``b`` (mean) of 50 rows, dim 4, under a linear
    layer; returns the loss."""

    def __init__(self) -> None:
        super().__init__()
        tables = {
            n: ec.TableConfig(vocabulary_size=50, dim=4, name=n, combiner=c)
            for n, c in (("a", "sum"), ("b", "mean"))
        }
        features = {n: ec.FeatureConfig(table=t) for n, t in tables.items()}
        self.engine = ec.EmbeddingEngine(features, optimizer=ec.Adagrad(learning_rate=0.1))
        self.head = torch.nn.Linear(8, 1)

    def forward(self, features: Any, weights: Any = None) -> torch.Tensor:
        acts = self.engine(features, weights)
        return self.head(torch.cat([acts["a"], acts["b"]], 1)).sum()


RAGGED = {
    "a": ec.RaggedIds.from_lists([[1, 2], [], [3]]),
    "b": ec.RaggedIds.from_lists([[4], [5], [6, 7]]),
}
KJT_VALUES, KJT_LENGTHS = torch.tensor([1, 2, 3, 4, 5, 6, 7]), torch.tensor([2, 0, 1, 1, 1, 2])
KJT_WEIGHTS = torch.tensor([0.5, 2.0, 1.0, 1.5, 3.0, 0.25, 4.0])
#: ``(features, weights)`` of TwoFeatures by input kind
INPUTS: dict[str, Callable[[], tuple[Any, Any]]] = {
    "ragged": lambda: (RAGGED, None),
    "weighted_ragged": lambda: (RAGGED, {"a": ec.RaggedIds.from_lists([[1.0, 2.0], [], [3.0]])}),
    "dense_and_ragged": lambda: ({"a": torch.tensor([1, 0, 3]), "b": RAGGED["b"]}, None),
    "sparse": lambda: (
        {"a": torch.tensor([[1, 0], [3, 4], [0, 6]]).to_sparse(), "b": RAGGED["b"]}, None
    ),
    "kjt": lambda: (StandInKJT(["a", "b"], KJT_VALUES, KJT_LENGTHS), None),
    "weighted_kjt": lambda: (StandInKJT(["b", "a"], KJT_VALUES, KJT_LENGTHS, KJT_WEIGHTS), None),
}  # fmt: skip
