"""A DLRM over any :class:`~embcore.data.layout.Layout`: one-id features and bags (multi-hot).

Feature ``f`` takes ``widths[f]`` columns of the ``(B, S) int64`` sparse input. A bag's
columns hold up to ``width`` ids, padded with ``pad``; its table (combiner ``"mean"``) averages
the rows of the ids that are not padding, zeros for an empty bag, as
``nn.EmbeddingBag(mode="mean", padding_idx=...)`` does. The engine gets a bag as ragged ids of
``width`` per row with weight 0 at the padded positions (their id replaced by the bag's first,
so that padding adds no key to a dynamic table unless a bag is empty): no shape depends on the
data, so the model exports with ``torch.export`` for any batch size.

With ``fold`` (fixed tables fed raw 64-bit ids, ``data.raw_ids``), column ids are folded into
their table as ``id mod rows`` (floored), padding recognized before folding.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

import embcore as ec
from embcore.models import DLRM

__all__ = ["LayoutDLRM", "engine_inputs"]


class LayoutDLRM(DLRM):
    """The DLRM of the module docstring.

    Args:
        widths: columns per feature of ``sparse_names``.
        pad: the padding id of bags (the source's missing id: 0 for table rows, -1 for raw
            keys).
        fold: table rows per feature to fold raw ids into (``id mod rows``), or None.
        kwargs: as :class:`embcore.models.DLRM`.
    """

    def __init__(
        self, *, widths: Sequence[int], pad: int, fold: Sequence[int] | None = None, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        if len(widths) != len(self.sparse_names):
            raise ValueError(
                f"LayoutDLRM: one width per feature of {list(self.sparse_names)}, got {widths}"
            )
        self.widths = tuple(int(w) for w in widths)
        self.pad = int(pad)
        rows = (
            [] if fold is None else [r for r, w in zip(fold, widths, strict=True) for _ in range(w)]
        )
        self.register_buffer("rows", torch.tensor(rows, dtype=torch.int64), persistent=False)

    def inputs(self, sparse: Tensor) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """The engine's ``(features, weights)`` for ``(B, S) int64`` ids (module docstring).

        A bag is :class:`embcore.RaggedIds` (ids and weights) for the engine and the tuple
        ``(values, row_splits, weights)`` for a serving lookup (traceable by ``torch.export``).
        """
        ids = torch.remainder(sparse, self.rows) if self.rows.numel() else sparse
        eager = isinstance(self.engine, ec.EmbeddingEngine)
        features: dict[str, Any] = {}
        weights: dict[str, Any] = {}
        start = 0
        for name, width in zip(self.sparse_names, self.widths, strict=True):
            cols = ids[:, start : start + width]
            if width == 1:
                features[name] = cols[:, 0]
            else:
                kept = sparse[:, start : start + width] != self.pad
                values = torch.where(kept, cols, cols[:, :1]).reshape(-1)  # a padded id: the first
                w = kept.to(torch.float32).reshape(-1)
                splits = torch.arange(cols.shape[0] + 1, dtype=torch.int64) * width
                if eager:
                    features[name] = ec.RaggedIds(values, splits)
                    weights[name] = ec.RaggedIds(w, splits)
                else:
                    features[name] = (values, splits, w)
            start += width
        return features, (weights or None)

    def features(self, sparse: Tensor) -> dict[str, Any]:
        """The engine's features (without the bags' weights: see :meth:`inputs`)."""
        return self.inputs(sparse)[0]

    def forward(self, dense: Tensor, sparse: Tensor | ec.PreparedBatch) -> Tensor:
        """``(B,) float32`` logits of ``dense (B, D) float32`` and ``sparse (B, S) int64``
        (or ``engine.prepare(*model.inputs(ids))`` done ahead)."""
        x = self.bottom(dense)
        if isinstance(sparse, ec.PreparedBatch):
            emb = self.engine.stacked(sparse)
        else:
            emb = self.engine.stacked(*self.inputs(sparse))
        return self.top(self.interaction(x, emb)).squeeze(1)


def engine_inputs(model: DLRM, sparse: Tensor) -> tuple[Any, ...]:
    """``(features,)`` or ``(features, weights)`` of ``sparse`` for ``engine.prepare``."""
    if isinstance(model, LayoutDLRM):
        return model.inputs(sparse)
    return (model.features(sparse),)
