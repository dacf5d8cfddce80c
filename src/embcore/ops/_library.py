"""An engine's lookup and fused update as PyTorch custom operators, ``torch.ops.embcore``.

``torch.compile`` (and ``torch.export``) see an engine's step as two opaque operators whose
fake implementations give the output shapes from the input shapes, so the model around them
compiles into one graph (docs/architecture.md, "Custom operators")::

    embcore::lookup(handle, values, offsets, weights, combiners, stacked, training, anchor)
        -> Tensor[]
    embcore::update(handle, values, offsets, weights, combiners, stacked, grads) -> Tensor

* ``handle`` names an engine in this module's registry (:func:`register`, held weakly): the
  tables, optimizers, pipeline and checks stay the engine's, the operators carry only tensors;
* the features are tensors per feature, in the engine's feature order: a prepared batch's
  ``values`` ``(N_f,) int64``, ``offsets`` ``(S_f+1,) int64``, ``weights`` ``(N_f,) float32``
  or ``None`` and ``combiners`` (indices into :data:`COMBINERS`); or, with ``offsets`` empty,
  raw dense ids ``(S_f,)`` / ``(S_f, 1)``, which the operator validates and converts (every id
  checked, errors as from an eager call);
* ``lookup`` returns one ``(S_f, dim_f) float32`` activation per feature, or with ``stacked``
  one ``(S, F, dim)`` tensor; ``training`` marks a training lookup (dynamic tables count and
  admit its keys); ``anchor``, a 0-element float tensor, only carries autograd;
* the lookup's backward calls ``update`` with d(loss)/d(activations): the engine's whole update
  (gradient checks, the non-finite policy, learning rates, the store's fused update, the step
  counter). Its result, an empty tensor, is the anchor's gradient, which keeps it in the graph.

The kernels behind them are the engine's store and backend (CPU / Numba, Triton, reference).
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Sequence
from typing import Any, Protocol

import torch
from torch import Tensor

from embcore.inputs import FeatureBatch
from embcore.ops._known_batches import KnownBatches
from embcore.ops._op_inputs import OpFeature, check_grads, check_inputs

__all__ = [
    "COMBINERS",
    "OpFeature",
    "OpTarget",
    "lookup",
    "register",
    "remember_prepared",
    "target",
    "update",
]

#: The combiner of each code in the operators' ``combiners`` argument.
COMBINERS = ("sum", "mean", "sqrtn")


class OpTarget(Protocol):
    """What an engine registers: the work behind the operators, on :class:`FeatureBatch` es."""

    def op_dims(self) -> Sequence[int]:
        """The activation width of each feature."""
        ...

    def op_device(self) -> torch.device:
        """Where activations live."""
        ...

    def op_features(self) -> Sequence[OpFeature]:
        """What the checks of the operators' arguments need to know of each feature."""
        ...

    def op_convert(self, ids: Sequence[Tensor], observe: bool) -> list[FeatureBatch]:
        """Validate and convert raw dense ids (``observe``: sample lookup statistics)."""
        ...

    def op_convert_raw(
        self, tensors: Sequence[Tensor], layout: str, observe: bool
    ) -> list[FeatureBatch]:
        """Validate and convert raw input given as tensors and a layout
        (:mod:`embcore.ops._raw_library`), with the engine's eager conversion."""
        ...

    def op_lookup(self, batches: list[FeatureBatch], stacked: bool, training: bool) -> list[Tensor]:
        """The activations (flat per feature, or one stacked tensor in a list)."""
        ...

    def op_update(self, batches: list[FeatureBatch], grads: list[Tensor], stacked: bool) -> None:
        """The engine's update with the activations' gradients (shapes as ``op_lookup``'s)."""
        ...


_TARGETS: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
_HANDLES = itertools.count(1)
#: per target whose operators are in use, the batches they need not check (:mod:`._known_batches`)
_KNOWN: weakref.WeakKeyDictionary[Any, KnownBatches] = weakref.WeakKeyDictionary()


def register(op_target: OpTarget) -> int:
    """A new handle for ``op_target`` (held weakly: the caller keeps it alive)."""
    handle = next(_HANDLES)
    _TARGETS[handle] = op_target
    return handle


def target(handle: int) -> OpTarget:
    """The target registered as ``handle``."""
    found = _TARGETS.get(handle)
    if found is None:
        raise RuntimeError(
            f"embcore::lookup / update: no engine has handle {handle} in this process (the "
            "engine was deleted; a compiled or exported program runs only beside its engine)"
        )
    return found


def remember_prepared(op_target: OpTarget, batches: Sequence[FeatureBatch]) -> None:
    """Hold ``batches``, just prepared (so validated) by ``op_target``'s engine, as known good
    to its operators, once they are in use (traced into a graph, or called): before that,
    nothing is held, at no cost to an engine used only in eager mode."""
    known = _KNOWN.get(op_target)
    if known is not None:
        known.remember(
            [b.values for b in batches],
            [b.offsets for b in batches],
            [b.weights for b in batches],
            [COMBINERS.index(b.combiner) for b in batches],
        )


def _known(op_target: OpTarget) -> KnownBatches:
    known = _KNOWN.get(op_target)
    return known if known is not None else _KNOWN.setdefault(op_target, KnownBatches())


def _batches(
    op: str,
    op_target: OpTarget,
    values: list[Tensor],
    offsets: list[Tensor],
    weights: list[Tensor | None],
    combiners: list[int],
    stacked: bool,
    observe: bool,
) -> list[FeatureBatch]:
    """The operator's batch, checked as the engine's conversion checks one (:mod:`._op_inputs`:
    the operators are public entry points, the kernels trust what they get), but for the
    per-feature checks of a batch known good (the engine's prepared batches, the lookup's
    tensors in its backward's update)."""
    known = _known(op_target)
    held = bool(offsets) and known.holds(values, offsets, weights, combiners)
    features, device = op_target.op_features(), op_target.op_device()
    check_inputs(op, features, values, offsets, weights, combiners, stacked, device, held)
    if offsets and not held:
        known.remember(values, offsets, weights, combiners)
    if not offsets:  # raw dense ids
        return op_target.op_convert(values, observe)
    return [
        FeatureBatch(v, o, w, COMBINERS[c], (o.shape[0] - 1,))
        for v, o, w, c in zip(values, offsets, weights, combiners, strict=True)
    ]


@torch.library.custom_op("embcore::lookup", mutates_args=())
def lookup(
    handle: int,
    values: list[Tensor],
    offsets: list[Tensor],
    weights: list[Tensor | None],
    combiners: list[int],
    stacked: bool,
    training: bool,
    anchor: Tensor,
) -> list[Tensor]:
    """The activations of every feature (see the module docstring)."""
    op_target = target(handle)
    batches = _batches("lookup", op_target, values, offsets, weights, combiners, stacked, True)
    return op_target.op_lookup(batches, stacked, training)


def _samples(values: list[Tensor], offsets: list[Tensor]) -> list[Any]:
    if offsets:
        return [o.shape[0] - 1 for o in offsets]
    return [v.numel() for v in values]  # raw dense ids: one id per sample


@lookup.register_fake
def _lookup_fake(
    handle: int,
    values: list[Tensor],
    offsets: list[Tensor],
    weights: list[Tensor | None],
    combiners: list[int],
    stacked: bool,
    training: bool,
    anchor: Tensor,
) -> list[Tensor]:
    op_target = target(handle)
    _known(op_target)  # traced: the engine's prepared batches are held from now on
    dims, device, samples = op_target.op_dims(), op_target.op_device(), _samples(values, offsets)
    if stacked:
        shape = (samples[0], len(dims), dims[0])
        return [torch.empty(shape, dtype=torch.float32, device=device)]
    return [
        torch.empty((s, d), dtype=torch.float32, device=device)
        for s, d in zip(samples, dims, strict=True)
    ]


@torch.library.custom_op("embcore::update", mutates_args=())
def update(
    handle: int,
    values: list[Tensor],
    offsets: list[Tensor],
    weights: list[Tensor | None],
    combiners: list[int],
    stacked: bool,
    grads: list[Tensor],
) -> Tensor:
    """The engine's update with ``grads`` (shaped as the lookup's outputs); returns an empty
    tensor (the anchor's gradient). Writes the engine's tables, which are not arguments."""
    op_target = target(handle)
    check_grads(op_target.op_features(), offsets, values, grads, stacked)
    batches = _batches("update", op_target, values, offsets, weights, combiners, stacked, False)
    op_target.op_update(batches, list(grads), stacked)
    return torch.zeros(0)


@update.register_fake
def _update_fake(
    handle: int,
    values: list[Tensor],
    offsets: list[Tensor],
    weights: list[Tensor | None],
    combiners: list[int],
    stacked: bool,
    grads: list[Tensor],
) -> Tensor:
    return torch.zeros(0)


def _setup_context(ctx: Any, inputs: tuple, output: Any) -> None:
    handle, values, offsets, weights, combiners, stacked, _training, _ = inputs
    ctx.handle, ctx.combiners, ctx.stacked = handle, combiners, stacked
    ctx.counts = (len(values), len(offsets))
    ctx.weighted = [w is not None for w in weights]
    # the gradients' structure autograd expects: a list for each list of tensors (empty
    # included), one None for anything else
    ctx.structure = [
        len(x) if isinstance(x, list) and all(isinstance(t, Tensor) for t in x) else None
        for x in inputs
    ]
    ctx.save_for_backward(*values, *offsets, *[w for w in weights if w is not None])


def _backward(ctx: Any, grads: list[Tensor | None]) -> tuple:
    saved = list(ctx.saved_tensors)
    n, m = ctx.counts
    values, offsets, rest = saved[:n], saved[n : n + m], iter(saved[n + m :])
    weights = [next(rest) if given else None for given in ctx.weighted]
    grads = [g if g is not None else torch.zeros(0) for g in grads]
    done = update(ctx.handle, values, offsets, weights, ctx.combiners, ctx.stacked, grads)
    return (*[None if k is None else [None] * k for k in ctx.structure[:-1]], done)


torch.library.register_autograd("embcore::lookup", _backward, setup_context=_setup_context)
