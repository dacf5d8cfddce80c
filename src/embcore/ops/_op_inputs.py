"""Checks of what the custom operators ``torch.ops.embcore.lookup`` / ``update`` are given.

The operators are public entry points: anyone can call them with any tensors, and the kernels
behind them trust ``values``, ``offsets`` and ``weights`` completely (they read them through
raw pointers). So both operators check their arguments here, as the engine's own input
conversion (:func:`embcore.inputs.to_feature_batch`) checks a batch, before any kernel runs:
one feature per engine feature, ``(N,) int64`` ids inside the table, ``(S+1,) int64`` offsets
from 0 to ``N`` never decreasing, ``(N,) float32`` finite weights, the feature's combiner, and
gradients of the activations' shapes. Each check is one vectorised pass (they run every step);
every error names the operator, the feature and the bad value (docs/reliability.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from embcore._input_checks import check_range, check_splits

__all__ = ["OpFeature", "check_grads", "check_inputs"]


@dataclass(frozen=True)
class OpFeature:
    """What the operators need to know of one engine feature.

    Attributes:
        name: the feature's name (for messages).
        table: its table's name.
        vocab: the table's ``vocabulary_size``; ``None`` for a dynamic table (any int64 key).
        combiner: the combiner the engine's conversion gives it (``"sum"`` for a sequence).
        dim: the activation width.
    """

    name: str
    table: str
    vocab: int | None
    combiner: str
    dim: int


def _fail(op: str, feature: OpFeature | None, text: str) -> ValueError:
    where = f"feature '{feature.name}': " if feature is not None else ""
    return ValueError(f"embcore::{op}: {where}{text}")


def _tensor(op: str, f: OpFeature, what: str, t: Any, dtype: torch.dtype, device) -> Tensor:
    if not isinstance(t, Tensor) or t.dtype != dtype or t.dim() != 1:
        got = f"{t.dtype} of shape {tuple(t.shape)}" if isinstance(t, Tensor) else type(t).__name__
        raise _fail(op, f, f"{what} must be a 1-D {dtype} tensor, got {got}")
    # (is_cpu: a tenth of the cost of t.device, which every feature would pay)
    if not (t.is_cpu if device.type == "cpu" else t.device.type == device.type):
        raise _fail(op, f, f"{what} is on {t.device}, the engine's tensors on {device}")
    return t


def check_inputs(
    op: str,
    features: Sequence[OpFeature],
    values: Sequence[Any],
    offsets: Sequence[Any],
    weights: Sequence[Any],
    combiners: Sequence[Any],
    stacked: bool,
    device: torch.device,
    known: bool = False,
) -> None:
    """Raise ``ValueError`` (naming the feature) unless the operator's batch is one the
    engine's conversion could have produced.

    Args:
        op: ``"lookup"`` or ``"update"``, for messages.
        features: the engine's features, in order.
        values: per feature, ``(N_f,) int64`` ids; with ``offsets`` empty, raw dense ids
            (``(S_f,)`` or ``(S_f, 1)``) that the engine's conversion validates itself.
        offsets: per feature ``(S_f+1,) int64``, or empty (raw dense ids).
        weights: per feature ``(N_f,) float32`` or ``None``.
        combiners: per feature an index into ``COMBINERS`` (empty with raw ids).
        stacked: one ``(S, F, dim)`` activation: every feature must have ``S`` samples and
            one dim.
        device: the engine's device.
        known: the features' tensors are known good (:mod:`._known_batches`): only the
            numbers of features and the stacked shape are checked.
    """
    count = len(features)
    if len(values) != count:
        raise _fail(op, None, f"{len(values)} features given, the engine has {count}")
    if not offsets:  # raw dense ids: the engine's conversion checks each
        if any(w is not None for w in weights) or combiners:
            raise _fail(op, None, "raw dense ids (offsets empty) take no weights and no combiners")
        samples = [v.numel() if isinstance(v, Tensor) else -1 for v in values]
    else:
        for what, given in (("offsets", offsets), ("weights", weights), ("combiners", combiners)):
            if len(given) != count:
                raise _fail(op, None, f"{len(given)} {what} given for {count} features")
        if not known:
            _features(op, features, values, offsets, weights, combiners, device)
        samples = [o.shape[0] - 1 for o in offsets]
    if stacked and count:
        first = features[0]
        for f, s in zip(features, samples, strict=True):
            if s != samples[0] or f.dim != first.dim:
                raise _fail(
                    op,
                    f,
                    f"stacked needs every feature to have {samples[0]} samples of dim "
                    f"{first.dim} (as feature '{first.name}'), got {s} of dim {f.dim}",
                )


def _features(
    op: str,
    features: Sequence[OpFeature],
    values: Sequence[Any],
    offsets: Sequence[Any],
    weights: Sequence[Any],
    combiners: Sequence[Any],
    device: torch.device,
) -> None:
    """Every feature's tensors and combiner code, in feature order: the ids' ranges of all
    features at once, after the rest (a bad id of an earlier feature is still the error)."""
    from embcore.ops._library import COMBINERS

    split: set[tuple[int, int]] = set()  # (offsets, ids) checked: one may serve many
    ranged: list[tuple[OpFeature, Tensor]] = []  # ids of fixed-size tables
    try:
        for f, v, o, w, c in zip(features, values, offsets, weights, combiners, strict=True):
            _feature(op, f, v, o, w, c, COMBINERS, device, split)
            if f.vocab is not None:
                ranged.append((f, v))
    except ValueError:
        _check_ranges(op, ranged, device.type == "cpu")
        raise
    _check_ranges(op, ranged, device.type == "cpu")


def _feature(
    op: str,
    f: OpFeature,
    values: Any,
    offsets: Any,
    weights: Any,
    code: Any,
    combiners: Sequence[str],
    device: torch.device,
    split: set[tuple[int, int]],
) -> None:
    """One feature's ids, offsets, weights and combiner, all but the ids' range (see
    :func:`check_inputs`); ``split``: the ``id()`` of offsets and their number of ids checked
    already in this call (the features of dense ids share one offsets tensor)."""
    values = _tensor(op, f, "values", values, torch.int64, device)
    n = values.shape[0]
    if (id(offsets), n) not in split:
        offsets = _tensor(op, f, "offsets", offsets, torch.int64, device)
        try:  # first 0, last n, never decreasing: the checks of the engine's conversion
            check_splits(f.name, "offsets", offsets.cpu(), n, hint=False)
        except ValueError as error:
            raise ValueError(f"embcore::{op}: {error}") from None
        split.add((id(offsets), n))
    if weights is not None:
        weights = _tensor(op, f, "weights", weights, torch.float32, device)
        if weights.shape[0] != n:
            raise _fail(op, f, f"{weights.shape[0]} weights for {n} ids")
        if not bool(torch.isfinite(weights).all()):
            i = int((~torch.isfinite(weights)).nonzero()[0])
            raise _fail(op, f, f"weights must be finite, got {weights[i].item()} at position {i}")
    if not isinstance(code, int) or not 0 <= code < len(combiners):
        raise _fail(op, f, f"combiner code {code!r} is not one of 0..{len(combiners) - 1}")
    if combiners[code] != f.combiner:
        raise _fail(
            op,
            f,
            f"combiner code {code} ({combiners[code]!r}) differs from the feature's "
            f"{f.combiner!r} (code {combiners.index(f.combiner)})",
        )


def _check_ranges(op: str, ranged: Sequence[tuple[OpFeature, Tensor]], on_cpu: bool) -> None:
    """Every feature's ids inside its table, ``[0, vocab)``: on the CPU for all features at
    once (:func:`_all_in_range`), feature by feature where that finds a bad id, for its error."""
    if on_cpu and len(ranged) > 1 and _all_in_range(ranged):
        return
    for f, values in ranged:
        try:
            check_range(f.name, f.table, f.vocab, values, hint=False)  # ids come pruned
        except ValueError as error:
            raise ValueError(f"embcore::{op}: {error}") from None


def _all_in_range(ranged: Sequence[tuple[OpFeature, Tensor]]) -> bool:
    """Whether every id lies inside its table, in one pass over the ids of all features (a few
    calls whatever their number): read in place where they are the rows of one block (dense
    ids prepared, one per sample: rows of one ``(F, B)`` copy), else from one copy of them."""
    ids = [v for _, v in ranged]
    lengths = [v.shape[0] for v in ids]
    if min(lengths) == 0:
        return False  # feature by feature
    block = _block(ids, lengths[0]) if len(set(lengths)) == 1 else None
    if block is not None:  # (F, n); NumPy's reductions of int64 rows: ten times torch's
        rows = block.numpy()
        low, high = rows.min(axis=1), rows.max(axis=1)
    else:
        flat = torch.cat(ids).numpy()
        starts = np.cumsum([0, *lengths[:-1]])
        low, high = np.minimum.reduceat(flat, starts), np.maximum.reduceat(flat, starts)
    vocab = np.array([f.vocab for f, _ in ranged])
    return low.min() >= 0 and bool((high < vocab).all())


def _block(ids: Sequence[Tensor], n: int) -> Tensor | None:
    """``(F, n)``: the ``F`` tensors of ``n`` ids as the rows of one tensor, without a copy,
    where each follows the one before in memory within one storage; else ``None``."""
    start = ids[0].data_ptr()
    for i, v in enumerate(ids):
        if (n > 1 and v.stride(0) != 1) or v.data_ptr() != start + i * n * v.element_size():
            return None
    try:  # the storage's bounds are checked: rows of other storages fail here
        return ids[0].as_strided((len(ids), n), (n, 1))
    except RuntimeError:
        return None


def check_grads(
    features: Sequence[OpFeature],
    offsets: Sequence[Tensor],
    values: Sequence[Any],
    grads: Sequence[Any],
    stacked: bool,
) -> None:
    """Raise ``ValueError`` unless ``grads`` has the structure of the lookup's outputs:
    ``stacked``, one ``(S, F, dim)`` tensor (or an empty one: unused); otherwise one per
    feature, each ``(S_f, dim_f)`` or empty. The engine checks their values itself."""
    count = len(features)
    if stacked:
        if len(grads) != 1:
            raise _fail("update", None, f"stacked takes one gradient, got {len(grads)}")
        g = grads[0]
        samples = offsets[0].shape[0] - 1 if offsets else (values[0].numel() if values else 0)
        want = (samples, count, features[0].dim if count else 0)
        if isinstance(g, Tensor) and g.numel() and tuple(g.shape) != want:
            raise _fail(
                "update", None, f"the stacked gradient must have shape {want}, got {tuple(g.shape)}"
            )
        return
    if len(grads) != count:
        raise _fail("update", None, f"{len(grads)} gradients given for {count} features")
