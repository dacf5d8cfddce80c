"""The PyTorch training path: a lookup whose backward applies the engine's update.

``EmbeddingEngine.forward`` in training mode returns the activations of
:class:`LookupWithUpdate`, and ``EmbeddingEngine.stacked`` the one tensor of
:class:`StackedLookupWithUpdate`; autograd's backward hands them d(loss)/d(activation)
(``None`` for unused outputs, read as zeros) and they run the same update as
``apply_gradients``, once (refusing a PreparedBatch changed in place since the lookup). See
docs/architecture.md.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

__all__ = ["LookupWithUpdate", "StackedLookupWithUpdate"]


def _apply_once(
    ctx: Any, grads: list[Tensor | None], whole: Tensor | None = None, checked: bool = False
) -> None:
    """Run the engine's update, once per lookup, with one gradient per feature (``None``:
    zeros); ``checked``: they are ``(S_f, dim) float32`` slices of ``whole`` already (a
    stacked gradient autograd shaped), so only the finiteness pass runs."""
    if ctx.applied:
        raise RuntimeError(
            "EmbeddingEngine: backward ran twice through one lookup; its update was already "
            "applied (do not retain_graph through the engine)"
        )
    engine: Any = ctx.engine
    if ctx.prepared is not None:  # changed in place since the lookup? (nothing is updated)
        ctx.prepared.check_unchanged(engine._ops, engine._features, "backward")
    shaped = (
        grads
        if checked
        else [
            g if g is None else g.reshape(*b.output_shape, engine._tables[f.table].dim)
            for f, b, g in zip(engine._features, ctx.batches, grads, strict=True)
        ]
    )
    engine._apply_gradients(ctx.batches, shaped, whole, checked=checked)
    ctx.applied = True
    ctx.engine = ctx.batches = ctx.prepared = (
        None  # the node may outlive this step: let the engine go
    )


class LookupWithUpdate(torch.autograd.Function):
    """Forward: the lookup, one activation per feature. Backward: the engine's update."""

    @staticmethod
    def forward(ctx: Any, anchor: Tensor, engine: Any, batches: list, prepared: Any) -> Any:
        ctx.engine, ctx.batches, ctx.prepared, ctx.applied = engine, batches, prepared, False
        ctx.set_materialize_grads(False)
        return tuple(engine._lookup(batches, training=True))

    @staticmethod
    def backward(ctx: Any, *grads: Tensor | None) -> Any:
        _apply_once(ctx, list(grads))
        return None, None, None, None


class StackedLookupWithUpdate(torch.autograd.Function):
    """Forward: the lookup into one ``(*shape, F, dim)`` tensor. Backward: the engine's update
    with the gradient's ``[..., f, :]`` slice for feature ``f`` (no copy)."""

    @staticmethod
    def forward(
        ctx: Any, anchor: Tensor, engine: Any, batches: list, shape: tuple, prepared: Any
    ) -> Tensor:
        ctx.engine, ctx.batches, ctx.prepared, ctx.applied = engine, batches, prepared, False
        ctx.set_materialize_grads(False)
        out = torch.empty(shape, dtype=torch.float32, device=engine.device)
        engine._lookup(batches, out=out, training=True)
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor | None) -> Any:
        if grad is None:
            _apply_once(ctx, [None] * len(ctx.batches))
            return None, None, None, None, None
        # autograd gave the output's shape and device: the gradient is checked once, whole,
        # rather than feature by feature (every feature's slice is (S, dim) of it)
        grad = grad.detach().to(torch.float32)
        flat = grad.reshape(-1, grad.shape[-2], grad.shape[-1])  # (S, F, dim)
        whole = flat if flat.is_contiguous() else None
        _apply_once(ctx, list(flat.unbind(1)), whole, checked=True)
        return None, None, None, None, None
