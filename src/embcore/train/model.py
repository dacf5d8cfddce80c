"""Build the DLRM of a config, its two optimizers and the dense learning-rate schedule."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

import embcore as ec
from embcore.data.batch import NUM_DENSE, SPARSE_NAMES
from embcore.models import DLRM, CrossInteraction, DotInteraction
from embcore.train.config import ModelConfig, OptimConfig

__all__ = [
    "FixedRows",
    "UniformRows",
    "build_model",
    "dense_lr",
    "dense_optimizer",
    "embedding_optimizer",
]


class UniformRows:
    """A table initializer: uniform in ``[-scale, scale]``, seeded by ``(seed, table name)``.

    Cheap for large tables, and independent of the order tables are built in.
    """

    def __init__(self, scale: float, seed: int, name: str) -> None:
        self.scale, self.seed, self.name = scale, seed, name

    def __call__(self, shape: Sequence[int], dtype: torch.dtype = torch.float32) -> Tensor:
        digest = hashlib.blake2b(f"{self.seed}/{self.name}".encode(), digest_size=8).digest()
        gen = torch.Generator().manual_seed(int.from_bytes(digest, "little") >> 1)
        return torch.empty(tuple(shape), dtype=dtype).uniform_(
            -self.scale, self.scale, generator=gen
        )


class FixedRows:
    """A table initializer returning given rows (loading a serving bundle)."""

    def __init__(self, rows: Tensor) -> None:
        self.rows = rows

    def __call__(self, shape: Sequence[int], dtype: torch.dtype = torch.float32) -> Tensor:
        return self.rows


def embedding_optimizer(cfg: OptimConfig) -> ec.Optimizer:
    """The engine's optimizer for every table."""
    if cfg.embedding_optimizer == "adagrad":
        return ec.Adagrad(
            learning_rate=cfg.embedding_lr, initial_accumulator_value=cfg.initial_accumulator
        )
    if cfg.embedding_optimizer == "rowwise_adagrad":
        return ec.RowwiseAdagrad(
            learning_rate=cfg.embedding_lr, initial_accumulator_value=cfg.initial_accumulator
        )
    return ec.SGD(learning_rate=cfg.embedding_lr)


def dense_optimizer(model: torch.nn.Module, cfg: OptimConfig) -> torch.optim.Adam:
    """Adam on the dense weights at ``dense_lr`` (the loop sets each step's rate): the fused
    kernel, one pass over all weights instead of a dozen small ops per tensor."""
    return torch.optim.Adam(model.parameters(), lr=cfg.dense_lr, fused=True)


def dense_lr(cfg: OptimConfig, step: int, steps: int) -> float:
    """Adam's rate at 1-based ``step`` of ``steps``: linear warmup, then cosine decay from
    ``dense_lr`` to ``decay_to * dense_lr`` at the last step."""
    if step <= cfg.warmup_steps:
        return cfg.dense_lr * step / cfg.warmup_steps
    span = max(steps - cfg.warmup_steps, 1)
    progress = min((step - cfg.warmup_steps) / span, 1.0)
    floor = cfg.decay_to
    return cfg.dense_lr * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


def build_model(
    cfg: ModelConfig,
    vocab_sizes: Sequence[int],
    *,
    optimizer: ec.Optimizer | None,
    seed: int,
    tables: dict[str, Tensor] | None = None,
    engine_options: Mapping[str, Any] | None = None,
) -> DLRM:
    """The DLRM of ``cfg`` with one table per categorical feature.

    Args:
        cfg: the ``[model]`` section.
        vocab_sizes: one table size per feature of ``SPARSE_NAMES``.
        optimizer: the engine's optimizer (``None``: lookup-only, for serving).
        seed: seeds the dense weights and the tables' initial values; the global RNG is left
            as it was.
        tables: starting rows per feature name instead of the random ones (serving).
        engine_options: more :class:`embcore.EmbeddingEngine` keyword arguments
            (``pipeline``, ``profile_data_directory``, ...).
    """
    features = {}
    for name, vocab in zip(SPARSE_NAMES, vocab_sizes, strict=True):
        init = (
            FixedRows(tables[name])
            if tables is not None
            else UniformRows(cfg.embedding_init, seed, name)
        )
        table = ec.TableConfig(
            vocabulary_size=vocab, dim=cfg.embedding_dim, initializer=init, name=name
        )
        features[name] = ec.FeatureConfig(table=table, name=name)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        engine = ec.EmbeddingEngine(
            features, optimizer=optimizer, seed=seed, **dict(engine_options or {})
        )
        if cfg.interaction == "dot":
            interaction: torch.nn.Module = DotInteraction(len(SPARSE_NAMES), cfg.embedding_dim)
        else:
            interaction = CrossInteraction(
                len(SPARSE_NAMES), cfg.embedding_dim, layers=cfg.dcn_layers, rank=cfg.dcn_rank
            )
        return DLRM(
            engine=engine,
            sparse_names=SPARSE_NAMES,
            num_dense=NUM_DENSE,
            bottom=cfg.bottom_mlp,
            top=cfg.top_mlp,
            interaction=interaction,
        )
