"""Ragged and TorchRec input under ``torch.compile``: traced as one ``embcore::lookup_raw``.

Converting a :class:`~embcore.inputs.RaggedIds` or a ``KeyedJaggedTensor`` reads its values
(offsets checked, ids pruned, sequence positions), which ``torch.compile`` cannot trace
without graph breaks. So the traced code only takes the input apart, reading nothing but
shapes (:func:`raw_lookup`): its tensors, a ``layout`` string saying how to rebuild it, and each
feature's output shape. The operator (:mod:`embcore.ops._raw_library`) rebuilds the input
(:func:`rebuild`) and the engine converts it with its eager code, so results and errors are an
eager call's. A layout is, per engine feature in order and comma-separated, ``d`` (dense ids:
one tensor), ``r`` (``RaggedIds``: values, row_splits) or ``rw`` (``RaggedIds`` and ragged
weights: four tensors); or, for a ``KeyedJaggedTensor``, ``kjt`` followed by the engine
feature of each of its keys, in its order, as comma-separated indices (tensors: values, offsets
and, when it has them, weights).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import Tensor

from embcore import nest
from embcore.config import ResolvedFeature
from embcore.engine._batch import is_feature
from embcore.inputs import RaggedIds
from embcore.keyed_jagged import is_keyed_jagged

__all__ = ["RawBatch", "dense_shape", "raw_batch", "rebuild"]

RawBatch = tuple[list[Tensor], str, list[tuple[Any, ...]]]  # tensors, layout, output shapes


def _ragged_shape(feature: ResolvedFeature, rows: Any) -> tuple[Any, ...] | None:
    """The output shape the eager conversion gives ``rows`` ragged rows (``rows`` may be
    symbolic); ``None`` where it raises (the eager path then names the problem)."""
    cfg = feature.config
    if cfg.output_shape is None:
        length = cfg.max_sequence_length
        return (rows, length) if length > 0 else (rows,)
    known = 1
    for d in cfg.output_shape:
        known *= 1 if d is None else d
    if None not in cfg.output_shape:  # the batch, or sequences of a multiple of it
        fits = known == rows or (rows > 0 and known % rows == 0)
        return tuple(cfg.output_shape) if fits else None
    if known == 0 or rows % known:
        return None
    return tuple(rows // known if d is None else d for d in cfg.output_shape)


def dense_shape(feature: ResolvedFeature, ids: Tensor) -> tuple[Any, ...] | None:
    """The output shape of dense ids, one per sample (``(B,)`` or ``(B, ..., 1)`` integers), of
    a pooled feature without a configured output shape; ``None`` for any other dense input."""
    cfg = feature.config
    if ids.is_floating_point() or ids.is_complex() or ids.dim() == 0:
        return None
    if cfg.max_sequence_length > 0 or cfg.output_shape is not None:
        return None
    if ids.dim() == 1:
        return tuple(ids.shape)
    return tuple(ids.shape[:-1]) if ids.shape[-1] == 1 else None


def _strided(x: Any) -> bool:
    return isinstance(x, Tensor) and not x.is_sparse


def _leaves(engine: Any, features: Any, weights: Any) -> RawBatch | None:
    """Dense and ragged leaves of a nest of features (``None``: other input)."""
    ids = engine._flatten(features, "features")
    ws = (
        [None] * len(ids)
        if weights is None
        else nest.map_up_to(
            engine._structure, weights, "weights", is_leaf=is_feature, missing_ok=True
        )
    )
    tensors: list[Tensor] = []
    codes, shapes = [], []
    for f, x, w in zip(engine._features, ids, ws, strict=True):
        if isinstance(x, RaggedIds) and (w is None or isinstance(w, RaggedIds)):
            shape = _ragged_shape(f, x.row_splits.shape[0] - 1)
            codes.append("r" if w is None else "rw")
            tensors += [x.values, x.row_splits] + ([] if w is None else [w.values, w.row_splits])
        elif _strided(x) and w is None:
            shape = dense_shape(f, x)
            codes.append("d")
            tensors.append(x)
        else:
            return None
        if shape is None:
            return None
        shapes.append(shape)
    return tensors, ",".join(codes), shapes


def _keyed_jagged(engine: Any, kjt: Any, weights: Any) -> RawBatch | None:
    """A ``KeyedJaggedTensor`` whose keys are the engine's flat feature dict (``None``:
    anything the eager path refuses, which it names)."""
    structure = engine._structure
    if weights is not None or not isinstance(structure, dict):
        return None
    variable = getattr(kjt, "variable_stride_per_key", None)
    if callable(variable) and variable():
        return None
    keys = list(kjt.keys())
    if not keys or not all(isinstance(k, str) for k in keys) or len(set(keys)) != len(keys):
        return None
    if set(keys) != set(structure):
        return None
    if not all(is_feature(v) for v in structure.values()):
        return None
    values, offsets = kjt.values(), kjt.offsets()
    w = kjt.weights_or_none() if callable(getattr(kjt, "weights_or_none", None)) else None
    tensors = [values, offsets] + ([] if w is None else [w])
    if not all(_strided(t) for t in tensors) or offsets.dim() != 1:
        return None
    rows = offsets.shape[0] - 1
    if rows % len(keys):
        return None
    shapes = [_ragged_shape(f, rows // len(keys)) for f in engine._features]
    if any(s is None for s in shapes):
        return None
    order = _feature_keys(engine)
    layout = "kjt" + ",".join(str(order.index(k)) for k in keys)
    return tensors, layout, shapes  # type: ignore[return-value]


def _feature_keys(engine: Any) -> list[Any]:
    """The keys of the engine's flat feature dict, in the engine's feature order."""
    return engine._flatten({k: k for k in engine._structure}, "features")


def raw_batch(engine: Any, features: Any, weights: Any) -> RawBatch | None:
    """Under ``torch.compile``: ``(tensors, layout, output shapes)`` of raw dense, ragged or
    TorchRec input, reading only shapes; ``None`` for anything else (sparse tensors, NumPy
    arrays, input the eager path refuses), which then runs the eager path."""
    if isinstance(features, (Tensor, RaggedIds, dict, list, tuple)):  # the usual nests first:
        return _leaves(engine, features, weights)  # dynamo cannot trace callable() on a dict's
    if is_keyed_jagged(features):  # methods
        return _keyed_jagged(engine, features, weights)
    return None


class _KeyedJagged:
    """A ``KeyedJaggedTensor`` rebuilt from its tensors: what the eager conversion reads."""

    def __init__(self, keys: list[str], tensors: Sequence[Tensor]) -> None:
        self._keys = keys
        self._values, self._offsets = tensors[0], tensors[1]
        self._weights = tensors[2] if len(tensors) > 2 else None

    def keys(self) -> list[str]:
        return self._keys

    def values(self) -> Tensor:
        return self._values

    def offsets(self) -> Tensor:
        return self._offsets

    def lengths(self) -> Tensor:
        return self._offsets[1:] - self._offsets[:-1]

    def weights_or_none(self) -> Tensor | None:
        return self._weights


def _ragged(values: Tensor, row_splits: Tensor) -> RaggedIds:
    """The caller's ``RaggedIds`` again: its checked attributes, not checked anew (the eager
    conversion checks them, naming the feature, as it does for the caller's object)."""
    ragged = object.__new__(RaggedIds)
    object.__setattr__(ragged, "values", values)
    object.__setattr__(ragged, "row_splits", row_splits)
    return ragged


def rebuild(engine: Any, tensors: Sequence[Tensor], layout: str) -> tuple[Any, Any]:
    """``(features, weights)`` as the caller gave them (a KJT, or the engine's nest of
    features), from :func:`raw_batch`'s tensors and layout.

    Raises:
        ValueError: the layout does not describe the tensors.
    """
    if layout.startswith("kjt"):
        keys = _feature_keys(engine) if isinstance(engine._structure, dict) else []
        order = layout[3:].split(",")
        if sorted(order) != sorted(str(i) for i in range(len(keys))) or len(tensors) not in (2, 3):
            raise ValueError(
                f"embcore::lookup_raw: layout {layout!r} with {len(tensors)} tensors is not "
                f"'kjt' and a permutation of 0..{len(keys) - 1} with 2 or 3 tensors"
            )
        return _KeyedJagged([keys[int(i)] for i in order], tensors), None
    codes = layout.split(",")
    sizes = {"d": 1, "r": 2, "rw": 4}
    if len(codes) != len(engine._features) or any(c not in sizes for c in codes):
        raise ValueError(
            f"embcore::lookup_raw: layout {layout!r} is not one of d, r, rw per feature for "
            f"{len(engine._features)} features"
        )
    if sum(sizes[c] for c in codes) != len(tensors):
        raise ValueError(
            f"embcore::lookup_raw: layout {layout!r} does not take {len(tensors)} tensors"
        )
    ids, ws, at = [], [], 0
    for code in codes:
        t = tensors[at : at + sizes[code]]
        at += sizes[code]
        ids.append(t[0] if code == "d" else _ragged(t[0], t[1]))
        ws.append(_ragged(t[2], t[3]) if code == "rw" else None)
    structure = engine._structure
    weights = None if all(w is None for w in ws) else nest.pack(structure, ws, is_leaf=is_feature)
    return nest.pack(structure, ids, is_leaf=is_feature), weights
