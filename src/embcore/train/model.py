"""Build the DLRM of a config, its two optimizers and the dense learning-rate schedule.

``model.tables = "fixed"`` gives one table of ``min(cardinality, data.vocab_cap)`` rows per
feature (raw 64-bit ids, ``data.raw_ids``, are folded into them: :class:`FoldedDLRM`);
``"dynamic"`` gives dynamic tables that key any id directly (docs/dynamic_tables.md).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

import embcore as ec
from embcore.data.layout import CRITEO_LAYOUT, Layout
from embcore.errors import UserError
from embcore.models import DLRM, CrossInteraction, DotInteraction
from embcore.train.config import ModelConfig, OptimConfig

__all__ = [
    "FixedRows",
    "FoldedDLRM",
    "UniformRows",
    "build_model",
    "dense_lr",
    "dense_optimizer",
    "embedding_optimizer",
    "embedding_rows",
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


class FoldedDLRM(DLRM):
    """A DLRM whose fixed tables take raw 64-bit ids: column ``f`` is folded into its table's
    rows as ``id mod rows_f`` (the floored modulo: negative ids too), the hashing trick a fixed
    table needs for ids it has no row for (colliding ids share a row)."""

    def __init__(self, *, rows: Sequence[int], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.register_buffer("rows", torch.tensor(list(rows), dtype=torch.int64), persistent=False)

    def features(self, sparse: Tensor) -> dict[str, Tensor]:
        """``{name: (B,) rows}`` for ``(B, F) int64`` raw ids."""
        folded = torch.remainder(sparse, self.rows)
        return {name: folded[:, f] for f, name in enumerate(self.sparse_names)}


def embedding_rows(model: DLRM) -> int:
    """Rows the engine's tables hold now: a fixed table's size, a dynamic table's keys."""
    engine = model.engine
    return sum(
        t.vocabulary_size
        if t.vocabulary_size is not None
        else int(engine.table_keys(t.name).numel())
        for t in engine.tables
    )


def _table(cfg: ModelConfig, name: str, vocab: int, init: Any) -> ec.TableConfig:
    if cfg.tables == "fixed":
        return ec.TableConfig(
            vocabulary_size=vocab, dim=cfg.embedding_dim, initializer=init, name=name
        )
    evict = cfg.steps_to_live or cfg.max_rows
    return ec.TableConfig(
        vocabulary_size=None,
        dim=cfg.embedding_dim,
        name=name,
        admission=ec.CountAdmission(min_count=cfg.min_count) if cfg.min_count > 1 else None,
        eviction=ec.Eviction(steps_to_live=cfg.steps_to_live or None, max_rows=cfg.max_rows or None)
        if evict
        else None,
        initial_capacity=cfg.initial_capacity or None,
    )


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
    raw_ids: bool = False,
    layout: Layout = CRITEO_LAYOUT,
    pad: int = 0,
) -> DLRM:
    """The DLRM of ``cfg`` with one table per categorical feature.

    Args:
        cfg: the ``[model]`` section.
        vocab_sizes: one table size per feature of ``layout.sparse_names``.
        optimizer: the engine's optimizer (``None``: lookup-only, for serving).
        seed: seeds the dense weights and the tables' initial values; the global RNG is left
            as it was.
        tables: starting rows per feature name instead of the random ones (serving).
        engine_options: more :class:`embcore.EmbeddingEngine` keyword arguments
            (``pipeline``, ``profile_data_directory``, ...).
        raw_ids: the ids are raw 64-bit values (``data.raw_ids``): fixed tables fold them
            (:class:`FoldedDLRM`); dynamic tables take them as they are.
        layout: the columns of the input (default Criteo's); one with bags gives a
            :class:`~embcore.train.bag_model.LayoutDLRM`, whose bag tables (combiner "mean",
            the default) average their rows.
        pad: the bags' padding id (the source's missing id).
    """
    from embcore.train.bag_model import LayoutDLRM  # it builds on this module's DLRM

    names = layout.sparse_names
    if tables is not None and cfg.tables == "dynamic":
        raise UserError(
            'model.tables = "dynamic": starting rows for dynamic tables cannot be given as '
            "fixed-size tensors (a serving bundle of dynamic tables holds keys and rows)"
        )
    features = {}
    for name, vocab in zip(names, vocab_sizes, strict=True):
        init = (
            FixedRows(tables[name])
            if tables is not None
            else UniformRows(cfg.embedding_init, seed, name)
        )
        features[name] = ec.FeatureConfig(table=_table(cfg, name, vocab, init), name=name)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        engine = ec.EmbeddingEngine(
            features, optimizer=optimizer, seed=seed, **dict(engine_options or {})
        )
        if cfg.interaction == "dot":
            interaction: torch.nn.Module = DotInteraction(len(names), cfg.embedding_dim)
        else:
            interaction = CrossInteraction(
                len(names), cfg.embedding_dim, layers=cfg.dcn_layers, rank=cfg.dcn_rank
            )
        parts = {
            "engine": engine,
            "sparse_names": names,
            "num_dense": len(layout.dense_names),
            "bottom": cfg.bottom_mlp,
            "top": cfg.top_mlp,
            "interaction": interaction,
        }
        fold = raw_ids and cfg.tables == "fixed"
        if layout.bags:
            return LayoutDLRM(
                widths=layout.widths, pad=pad, fold=vocab_sizes if fold else None, **parts
            )
        if fold:
            return FoldedDLRM(rows=vocab_sizes, **parts)
        return DLRM(**parts)
