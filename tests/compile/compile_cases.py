"""A small DLRM of the main job (``embcore.train.model.build_model``) and its batches, for the
torch.compile tests."""

from __future__ import annotations

import torch

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
