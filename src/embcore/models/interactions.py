"""Feature interactions between the dense vector and the embeddings, behind one interface.

Each takes the bottom MLP's output and the looked-up embeddings and returns the top MLP's input::

    dense   (B, d)       bottom MLP output
    sparse  (B, F, d)    one pooled embedding per categorical feature
    ->      (B, output_dim)

* ``dot``: DLRM's pairwise dot products (Naumov et al., 2019);
* ``dcn``: a DCN-v2 cross network (Wang et al., 2021), low-rank when ``rank > 0``.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["INTERACTIONS", "CrossInteraction", "DotInteraction"]


class DotInteraction(nn.Module):
    """The dense vector followed by every pairwise dot product of the ``F + 1`` vectors.

    ``output_dim = d + (F + 1) F / 2``.
    """

    def __init__(self, num_sparse: int, dim: int) -> None:
        super().__init__()
        vectors = num_sparse + 1
        rows, cols = torch.tril_indices(vectors, vectors, offset=-1)
        # Flat positions in the (F + 1) x (F + 1) Gram matrix: index_select is much faster on
        # CPU than advanced indexing gram[:, rows, cols].
        self.register_buffer("_pairs", rows * vectors + cols, persistent=False)
        # For the backward: each Gram position -> its pair's column, the diagonal -> a zero
        # column appended after the pairs (the Gram gradient is symmetric).
        pair_of = torch.full((vectors, vectors), rows.numel(), dtype=torch.int64)
        pair_of[rows, cols] = pair_of[cols, rows] = torch.arange(rows.numel())
        self.register_buffer("_pair_of", pair_of.flatten(), persistent=False)
        self.output_dim = dim + rows.numel()

    def forward(self, dense: Tensor, sparse: Tensor) -> Tensor:
        vectors = torch.cat([dense[:, None, :], sparse], dim=1)  # (B, F + 1, d)
        if torch.is_grad_enabled() and vectors.requires_grad:
            pairs = _PairDots.apply(vectors, self._pairs, self._pair_of)
        else:
            pairs = _pair_dots(vectors, self._pairs)
        return torch.cat([dense, pairs], dim=1)


def _pair_dots(vectors: Tensor, pairs: Tensor) -> Tensor:
    """``(B, V, d) -> (B, P)``: the dot products of the pairs at flat Gram positions ``pairs``."""
    gram = torch.bmm(vectors, vectors.transpose(1, 2))  # (B, V, V)
    return gram.flatten(1).index_select(1, pairs)


class _PairDots(torch.autograd.Function):
    """:func:`_pair_dots` with a one-``bmm`` backward: ``dL/dvectors = S @ vectors``, ``S``
    the symmetric ``(B, V, V)`` matrix holding each pair's gradient at both of its positions
    (autograd's own backward of ``bmm(v, v^T)`` takes two ``bmm`` and an add)."""

    @staticmethod
    def forward(ctx, vectors: Tensor, pairs: Tensor, pair_of: Tensor) -> Tensor:
        ctx.save_for_backward(vectors, pair_of)
        return _pair_dots(vectors, pairs)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None]:
        vectors, pair_of = ctx.saved_tensors
        batch, count = vectors.shape[0], vectors.shape[1]
        padded = torch.nn.functional.pad(grad, (0, 1))  # (B, P + 1), the last column 0
        sym = padded.index_select(1, pair_of).view(batch, count, count)
        return torch.bmm(sym, vectors), None, None


class CrossInteraction(nn.Module):
    """DCN-v2 cross layers on ``x0 = [dense, sparse...]`` flattened, ``(B, (F + 1) d)``::

        x_{l+1} = x0 * (W_l x_l + b_l) + x_l         W_l = U_l V_l when rank > 0

    ``output_dim = (F + 1) d``.
    """

    def __init__(self, num_sparse: int, dim: int, *, layers: int = 3, rank: int = 64) -> None:
        super().__init__()
        width = (num_sparse + 1) * dim
        if rank > 0:
            self.mixers = nn.ModuleList(
                nn.Sequential(nn.Linear(width, rank, bias=False), nn.Linear(rank, width))
                for _ in range(layers)
            )
        else:
            self.mixers = nn.ModuleList(nn.Linear(width, width) for _ in range(layers))
        self.output_dim = width

    def forward(self, dense: Tensor, sparse: Tensor) -> Tensor:
        x0 = torch.cat([dense, sparse.flatten(1)], dim=1)  # (B, (F + 1) d)
        x = x0
        for mix in self.mixers:
            x = x0 * mix(x) + x
        return x


#: Interaction name -> class, for configs.
INTERACTIONS: dict[str, type[nn.Module]] = {"dot": DotInteraction, "dcn": CrossInteraction}
