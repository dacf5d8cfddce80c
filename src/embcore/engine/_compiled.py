"""The engine inside ``torch.compile``: its lookup and update as ``torch.ops.embcore`` operators.

Under ``torch.compile`` the engine's ``forward`` and ``stacked`` hand the batch's tensors to
``embcore::lookup`` (:mod:`embcore.ops._library`), whose backward is ``embcore::update``; the
work behind both is :class:`EngineOps`, the engine's registered target. Nothing in the traced
code reads a tensor's values: a :class:`PreparedBatch` was validated when it was prepared, and
raw dense ids are validated inside the operator, with the errors of an eager call. Raw ragged
and TorchRec input (weighted or not) goes to ``embcore::lookup_raw``
(:mod:`embcore.ops._raw_library`, :mod:`._raw_inputs`), which converts it inside with the eager
code. Sparse tensors, which ``torch.compile`` does not take, run the eager path.
See docs/architecture.md, "Custom operators".
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch
from torch import Tensor

from embcore import nest
from embcore.engine._batch import PreparedBatch, is_feature, stacked_shape
from embcore.engine._raw_inputs import raw_batch, rebuild
from embcore.inputs import FeatureBatch, to_feature_batch
from embcore.ops import _library, _raw_library  # noqa: F401  (registers the operators)

__all__ = ["EngineOps", "attach_ops", "compiled_lookup"]


class EngineOps:
    """The engine's side of the operators (:class:`embcore.ops._library.OpTarget`); holds
    its engine weakly, so an engine is still freed by reference counting alone."""

    def __init__(self, engine: Any) -> None:
        self._engine = weakref.ref(engine)
        self.handle = _library.register(self)
        # what the activations' autograd hangs on (a tensor made inside a compiled region
        # cannot require grad); its gradient, always empty, is the update's result
        self.anchor = torch.zeros(0, requires_grad=True)
        self._features: list[_library.OpFeature] | None = None

    def __reduce__(self) -> tuple:
        # a copy or a pickle of the engine registers a target of its own (attach_ops, from
        # EmbeddingEngine.__setstate__): nothing of this one travels
        return (_unattached, ())

    @property
    def engine(self) -> Any:
        engine = self._engine()
        if engine is None:
            raise RuntimeError("embcore: the engine of this operator call was deleted")
        return engine

    def op_dims(self) -> list[int]:
        e = self.engine
        return [e._tables[f.table].dim for f in e._features]

    def op_device(self) -> torch.device:
        return self.engine.device

    def op_features(self) -> list[_library.OpFeature]:
        if self._features is None:  # the engine's features and tables never change
            e = self.engine
            self._features = [
                _library.OpFeature(
                    f.name,
                    e._tables[f.table].name,
                    e._tables[f.table].vocabulary_size,
                    "sum" if f.config.max_sequence_length > 0 else e._tables[f.table].combiner,
                    e._tables[f.table].dim,
                )
                for f in e._features
            ]
        return self._features

    def prepared(self, batches: Sequence[FeatureBatch]) -> None:
        """A batch the engine prepared, so validated: the operators will not check it again
        (:func:`embcore.ops._library.remember_prepared`)."""
        _library.remember_prepared(self, batches)

    def op_convert(self, ids: Sequence[Tensor], observe: bool) -> list[FeatureBatch]:
        e = self.engine
        batches = [
            to_feature_batch(f, e._tables[f.table], x, None, e.device)
            for f, x in zip(e._features, ids, strict=True)
        ]
        if observe and e._stats is not None:
            e._stats.maybe_observe(e._by_table(batches))
        return _flat(batches)

    def op_convert_raw(
        self, tensors: Sequence[Tensor], layout: str, observe: bool
    ) -> list[FeatureBatch]:
        features, weights = rebuild(self.engine, tensors, layout)
        return _flat(self.engine._prepare(features, weights, observe))

    def op_lookup(self, batches: list[FeatureBatch], stacked: bool, training: bool) -> list[Tensor]:
        e = self.engine
        if training:  # a training lookup of tables that no update can follow
            e._require_optimizers("embcore::lookup (training)")
        if not stacked:  # an operator's outputs may not share memory (a backend's may)
            outs, storages = [], set()
            for act in e._lookup(batches, training=training):
                storage = act.untyped_storage().data_ptr()
                outs.append(act.clone() if act._base is not None or storage in storages else act)
                storages.add(storage)
            return outs
        dim = e._tables[e._features[0].table].dim
        out = torch.empty(
            (batches[0].num_samples, len(batches), dim), dtype=torch.float32, device=e.device
        )
        e._lookup(batches, out=out, training=training)
        return [out]

    def op_update(self, batches: list[FeatureBatch], grads: list[Tensor], stacked: bool) -> None:
        e = self.engine
        e._require_optimizers("embcore::update")
        whole = None
        if stacked and grads[0].dim() == 3:
            grad = grads[0].detach().to(torch.float32)
            whole = grad if grad.is_contiguous() else None
            if grads[0].is_floating_point() and grad.numel() and grad.device == e.device:
                # (S, F, dim) float32, the shape embcore::update checked: its slices need no
                # check of their own, as in the eager path's backward (StackedLookupWithUpdate)
                e._apply_gradients(batches, list(grad.unbind(1)), whole, checked=True)
                return
            flat: list[Tensor | None] = [grad[:, f, :] for f in range(len(batches))]
        elif stacked:  # the output was not used: zeros
            flat = [None] * len(batches)
        else:
            flat = [g if g.numel() else None for g in grads]  # empty: unused (zeros)
        e._apply_gradients(batches, flat, whole)


def _flat(batches: list[FeatureBatch]) -> list[FeatureBatch]:
    """The batches with output shapes ``(S,)``: the operators' activations and gradients are
    ``(S_f, dim)``, the traced code gives them their shapes."""
    return [
        b if len(b.output_shape) == 1 else replace(b, output_shape=(b.num_samples,))
        for b in batches
    ]


def _unattached() -> None:
    """What a copied :class:`EngineOps` becomes until its engine attaches a new one."""
    return None


def attach_ops(engine: Any) -> None:
    """Give ``engine`` its operator target and handle (``engine._handle``: an int attribute
    of the module, which ``torch.compile`` specializes on, so each engine gets its own graph)."""
    engine._ops = EngineOps(engine)
    engine._handle = engine._ops.handle


def compiled_lookup(engine: Any, features: Any, weights: Any, stacked: bool) -> Any:
    """Under ``torch.compile``, the activations (as ``forward``, or as ``stacked``): through
    ``embcore::lookup`` or ``embcore::lookup_raw``, or, for input neither takes, the eager
    path outside the graph; ``None`` outside ``torch.compile``."""
    if not torch.compiler.is_compiling():
        return None
    if isinstance(features, PreparedBatch):
        if features.engine != id(engine) or weights is not None:
            return _eager(engine, features, weights, stacked)  # which raises its error
        batches = features.batches
        values = [b.values for b in batches]
        offsets = [b.offsets for b in batches]
        ws = [b.weights for b in batches]
        combiners = [_library.COMBINERS.index(b.combiner) for b in batches]
        shapes = [b.output_shape for b in batches]
        layout = None
    else:
        raw = raw_batch(engine, features, weights)
        if raw is None:  # sparse ids, or a mistake the eager path names
            return _eager(engine, features, weights, stacked)
        values, layout, shapes = raw
        offsets, ws, combiners = [], [None] * len(values), []
    dims = [engine._tables[f.table].dim for f in engine._features]
    if stacked:
        stacked_shape(engine._features, engine._tables, shapes)  # raises as the eager path
    training = engine._trains()
    anchor = engine._ops.anchor if training else torch.zeros(0)
    if layout is None or set(layout.split(",")) == {"d"}:  # prepared, or dense ids only
        outs = torch.ops.embcore.lookup(
            engine._handle, values, offsets, ws, combiners, stacked, training, anchor
        )
    else:  # ragged or TorchRec input, converted inside the operator
        samples = [_product(s) for s in shapes]
        outs = torch.ops.embcore.lookup_raw(
            engine._handle, values, layout, samples, stacked, training, anchor
        )
    if stacked:
        return outs[0].view(*shapes[0], len(dims), dims[0])
    shaped = [a.view(*s, d) for a, s, d in zip(outs, shapes, dims, strict=True)]
    return nest.pack(engine._structure, shaped, is_leaf=is_feature)


def _eager(engine: Any, features: Any, weights: Any, stacked: bool) -> Any:
    """The eager path (``torch.compiler.disable``: run by ``torch.compile``'s caller, one graph
    break). Traced, the eager conversion would break the graph at each value it reads, and the
    first call of a Numba kernel in a traced frame crashes dynamo (torch 2.13 cannot build the
    frame to resume in after a graph break in Numba's ``Dispatcher._compile_for_args``)."""
    return (engine._stacked if stacked else engine._forward)(features, weights)


def _product(shape: tuple[Any, ...]) -> Any:
    out = 1
    for d in shape:
        out *= d
    return out
