"""DLRM: a bottom MLP for dense features, the embedding engine for categorical ones, an
interaction, and a top MLP that outputs one click logit per row::

    dense (B, 13) --bottom MLP--> (B, d) --+
                                           +--interaction--> (B, k) --top MLP--> (B,) logits
    sparse (B, 26) --engine--> (B, 26, d) -+

The engine writes the ``(B, 26, d)`` tensor directly (``EmbeddingEngine.stacked``, no copy),
its features in the engine's order (``engine.feature_names``: sorted names).

The engine holds the tables as buffers and trains them with its own optimizer inside
``loss.backward()``; ``model.parameters()`` are only the dense weights, for a torch optimizer.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import embcore as ec

__all__ = ["DLRM", "Linear", "mlp"]


class Linear(nn.Linear):
    """``nn.Linear`` (same parameters and state dict) whose backward computes the input
    gradient into rows padded to a multiple of 16 floats when ``in_features`` is not one:
    MKL multiplies into a ``(B, 367)`` row-major output (the dot interaction's width) much
    more slowly than into ``(B, 368)``. Same values; a plain ``nn.Linear`` without autograd."""

    def forward(self, x: Tensor) -> Tensor:
        if self.in_features % _ALIGN == 0 or x.dim() != 2 or not torch.is_grad_enabled():
            return super().forward(x)
        return _PaddedGradLinear.apply(x, self.weight, self.bias)


_ALIGN = 16  # floats: 64-byte rows


class _PaddedGradLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        x, weight = ctx.saved_tensors
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            k = weight.shape[1]
            padded = F.pad(weight, (0, -k % _ALIGN))  # (out, k rounded up), zero columns
            grad_x = grad.mm(padded)[:, :k]
        if ctx.needs_input_grad[1]:
            grad_w = grad.t().mm(x)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = grad.sum(0)
        return grad_x, grad_w, grad_b


def mlp(sizes: Sequence[int], *, final_activation: bool) -> nn.Sequential:
    """``Linear -> ReLU`` for each consecutive pair of ``sizes``, without the last ReLU unless
    ``final_activation``."""
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(itertools.pairwise(sizes)):
        layers.append(Linear(a, b))
        if final_activation or i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class DLRM(nn.Module):
    """The model of the module docstring.

    Args:
        engine: an :class:`embcore.EmbeddingEngine` with one pooled feature per name in
            ``sparse_names``, all of dimension ``d``.
        sparse_names: feature names in the column order of the ``sparse`` input.
        num_dense: number of dense input features.
        bottom: hidden sizes of the bottom MLP; its output size is ``d``.
        top: hidden sizes of the top MLP (a final layer of size 1 is added).
        interaction: a module of :mod:`embcore.models.interactions`, built for ``F`` and ``d``.
    """

    def __init__(
        self,
        *,
        engine: ec.EmbeddingEngine,
        sparse_names: Sequence[str],
        num_dense: int,
        bottom: Sequence[int],
        top: Sequence[int],
        interaction: nn.Module,
    ) -> None:
        super().__init__()
        dims = {t.dim for t in engine.tables}
        if len(dims) != 1:
            raise ValueError(f"DLRM: every table must have the same dim, got dims {sorted(dims)}")
        dim = dims.pop()
        if sorted(sparse_names) != sorted(engine.feature_names):
            raise ValueError(
                f"DLRM: sparse_names {list(sparse_names)} must be the engine's features "
                f"{engine.feature_names}"
            )
        self.engine = engine
        self.sparse_names = tuple(sparse_names)
        self.bottom = mlp([num_dense, *bottom, dim], final_activation=True)
        self.interaction = interaction
        self.top = mlp([interaction.output_dim, *top, 1], final_activation=False)

    def features(self, sparse: Tensor) -> dict[str, Tensor]:
        """The engine's input for ``(B, F) int64`` ids: ``{name: (B,) ids}``."""
        return {name: sparse[:, f] for f, name in enumerate(self.sparse_names)}

    def forward(self, dense: Tensor, sparse: Tensor | ec.PreparedBatch) -> Tensor:
        """Click logits.

        Args:
            dense: ``(B, num_dense) float32``.
            sparse: ``(B, F) int64`` ids, column ``f`` for feature ``sparse_names[f]``, or
                ``engine.prepare(model.features(ids))`` done ahead (e.g. by ``ec.Prefetcher``).

        Returns:
            ``(B,) float32`` logits.
        """
        x = self.bottom(dense)  # (B, d)
        ids = sparse if isinstance(sparse, ec.PreparedBatch) else self.features(sparse)
        emb = self.engine.stacked(ids)  # (B, F, d), features in engine.feature_names order
        return self.top(self.interaction(x, emb)).squeeze(1)
