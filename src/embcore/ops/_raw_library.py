"""The engine's lookup and update on raw ragged and TorchRec input, ``torch.ops.embcore``.

:mod:`embcore.ops._library`'s operators take prepared batches or dense ids. Ragged ids
(``RaggedIds``, weighted or not) and TorchRec ``KeyedJaggedTensor`` s must be checked and
converted first, which reads their values (offsets, pruning, sequence positions): under
``torch.compile`` that work happens inside these two operators, so a model given such input
still compiles into one graph (docs/architecture.md, "Custom operators")::

    embcore::lookup_raw(handle, tensors, layout, samples, stacked, training, anchor) -> Tensor[]
    embcore::update_raw(handle, tensors, layout, stacked, grads) -> Tensor

* ``tensors`` and ``layout`` are the input's tensors and a string saying how to rebuild it
  (:mod:`embcore.engine._raw_inputs`); the engine converts the rebuilt input with its eager
  code, so every check and error is an eager call's;
* ``samples`` gives each feature's number of output rows (``prod(output_shape)``), which the
  traced code computes from the input's shapes: the fake implementation's shapes;
* ``handle``, ``stacked``, ``training`` and ``anchor`` are as for ``embcore::lookup``, and the
  lookup's backward calls ``update_raw``, which converts the input again (without sampling
  lookup statistics) and runs the engine's whole update.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from embcore.ops._library import target
from embcore.ops._op_inputs import check_grads

__all__ = ["lookup_raw", "update_raw"]


def _batches(handle: int, tensors: list[Tensor], layout: str, observe: bool) -> tuple[Any, list]:
    op_target = target(handle)
    return op_target, op_target.op_convert_raw(tensors, layout, observe)


@torch.library.custom_op("embcore::lookup_raw", mutates_args=())
def lookup_raw(
    handle: int,
    tensors: list[Tensor],
    layout: str,
    samples: list[int],
    stacked: bool,
    training: bool,
    anchor: Tensor,
) -> list[Tensor]:
    """The activations of every feature (see the module docstring)."""
    op_target, batches = _batches(handle, tensors, layout, True)
    features = op_target.op_features()
    for f, b, s in zip(features, batches, samples, strict=True):
        if b.num_samples != s:
            raise ValueError(
                f"embcore::lookup_raw: feature '{f.name}': the input has {b.num_samples} "
                f"samples, samples says {s}"
            )
    if stacked and len({(f.dim, s) for f, s in zip(features, samples, strict=True)}) > 1:
        raise ValueError("embcore::lookup_raw: stacked needs every feature's samples and dim equal")
    return op_target.op_lookup(batches, stacked, training)


@lookup_raw.register_fake
def _lookup_raw_fake(
    handle: int,
    tensors: list[Tensor],
    layout: str,
    samples: list[int],
    stacked: bool,
    training: bool,
    anchor: Tensor,
) -> list[Tensor]:
    op_target = target(handle)
    dims, device = op_target.op_dims(), op_target.op_device()
    if stacked:
        return [torch.empty((samples[0], len(dims), dims[0]), device=device)]
    return [torch.empty((s, d), device=device) for s, d in zip(samples, dims, strict=True)]


@torch.library.custom_op("embcore::update_raw", mutates_args=())
def update_raw(
    handle: int, tensors: list[Tensor], layout: str, stacked: bool, grads: list[Tensor]
) -> Tensor:
    """The engine's update with ``grads`` (shaped as the lookup's outputs); returns an empty
    tensor (the anchor's gradient). Writes the engine's tables, which are not arguments."""
    op_target, batches = _batches(handle, tensors, layout, False)
    values, offsets = [b.values for b in batches], [b.offsets for b in batches]
    check_grads(op_target.op_features(), offsets, values, grads, stacked)
    op_target.op_update(batches, list(grads), stacked)
    return torch.zeros(0)


@update_raw.register_fake
def _update_raw_fake(
    handle: int, tensors: list[Tensor], layout: str, stacked: bool, grads: list[Tensor]
) -> Tensor:
    return torch.zeros(0)


def _setup_context(ctx: Any, inputs: tuple, output: Any) -> None:
    handle, tensors, layout, _samples, stacked, _training, _anchor = inputs
    ctx.handle, ctx.layout, ctx.stacked, ctx.count = handle, layout, stacked, len(tensors)
    ctx.save_for_backward(*tensors)


def _backward(ctx: Any, grads: list[Tensor | None]) -> tuple:
    tensors = list(ctx.saved_tensors)
    grads = [g if g is not None else torch.zeros(0) for g in grads]
    done = update_raw(ctx.handle, tensors, ctx.layout, ctx.stacked, grads)
    return None, [None] * ctx.count, None, None, None, None, done


torch.library.register_autograd("embcore::lookup_raw", _backward, setup_context=_setup_context)
