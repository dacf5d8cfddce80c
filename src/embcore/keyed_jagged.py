"""TorchRec's ``KeyedJaggedTensor`` as an engine batch, by duck typing (torchrec stays optional).

A KJT holds every feature of a batch in one jagged tensor, key-major::

    keys     ["user", "item"]
    lengths  [2, 0, 1,   1, 1, 3]     (K * B,) ids per (key, sample): B = 3 samples per key
    values   [u0 u1 u2   i0 i1 i2 i3 i4]
    weights  optional, aligned with values

Key ``k`` becomes the feature named ``k``: a :class:`~embcore.inputs.RaggedIds` whose rows are
that key's ``B`` samples (and, with weights, a ``RaggedIds`` of weights). See
docs/semantics.md §2.1 for how ragged inputs are combined.
"""

from __future__ import annotations

from typing import Any

import torch

from embcore.inputs import RaggedIds

__all__ = ["from_keyed_jagged", "is_keyed_jagged", "unpack_keyed_jagged"]

_METHODS = ("keys", "values", "lengths", "offsets")


def is_keyed_jagged(batch: Any) -> bool:
    """Whether ``batch`` looks like a TorchRec ``KeyedJaggedTensor`` (has ``keys()``,
    ``values()``, ``lengths()`` and ``offsets()``) rather than a mapping of features."""
    return all(callable(getattr(batch, name, None)) for name in _METHODS) and not isinstance(
        batch, dict
    )


def from_keyed_jagged(kjt: Any) -> tuple[dict[str, RaggedIds], dict[str, RaggedIds] | None]:
    """Split a ``KeyedJaggedTensor`` into one ragged batch (and weights) per key.

    Args:
        kjt: a TorchRec ``KeyedJaggedTensor`` or any object with the same methods: ``keys()``
            (K names), ``values()`` ``(N,)`` ids, ``lengths()`` ``(K * B,)`` ids per key and
            sample (key-major), ``offsets()`` ``(K * B + 1,)``, and optionally
            ``weights_or_none()`` ``(N,)`` floats.

    Returns:
        ``(features, weights)``: ``{key: RaggedIds}`` with ``B`` rows each, and the weights
        the same way, or ``None`` when the KJT has none.

    Raises:
        ValueError: the keys repeat, the lengths do not split evenly into K keys of B samples
            (a variable batch size per key is not supported), or lengths, offsets and values
            disagree.
    """
    keys = list(kjt.keys())
    if len(set(keys)) != len(keys):
        raise ValueError(f"KeyedJaggedTensor: keys must be unique feature names, got {keys}")
    variable = getattr(kjt, "variable_stride_per_key", None)
    if callable(variable) and variable():
        raise ValueError(
            "KeyedJaggedTensor: a variable batch size per key is not supported; give every key "
            "the same number of samples"
        )
    values = torch.as_tensor(kjt.values())
    offsets = torch.as_tensor(kjt.offsets()).to(torch.int64)
    if offsets.dim() != 1 or offsets.numel() < 1:
        raise ValueError(
            f"KeyedJaggedTensor: offsets must be 1-D with K*B+1 entries, got shape "
            f"{tuple(offsets.shape)}"
        )
    rows = offsets.numel() - 1
    if (keys and rows % len(keys)) or (not keys and rows):
        raise ValueError(
            f"KeyedJaggedTensor: {rows} (key, sample) lengths do not split into {len(keys)} "
            "keys of equal batch size"
        )
    if int(offsets[0]) != 0 or int(offsets[-1]) != values.numel():
        raise ValueError(
            f"KeyedJaggedTensor: offsets must run from 0 to len(values)={values.numel()}, got "
            f"{int(offsets[0])} ... {int(offsets[-1])}"
        )
    weights = kjt.weights_or_none() if callable(getattr(kjt, "weights_or_none", None)) else None
    batch = rows // len(keys) if keys else 0
    features: dict[str, RaggedIds] = {}
    weighted: dict[str, RaggedIds] = {}
    for k, key in enumerate(keys):
        splits = offsets[k * batch : (k + 1) * batch + 1]
        lo, hi = int(splits[0]), int(splits[-1])
        features[key] = RaggedIds(values[lo:hi], splits - lo)
        if weights is not None:
            weighted[key] = RaggedIds(torch.as_tensor(weights)[lo:hi], splits - lo)
    return features, (weighted if weights is not None else None)


def unpack_keyed_jagged(features: Any, weights: Any) -> tuple[Any, Any]:
    """The engine's batch as given, or a KJT split into features and weights by key.

    Raises:
        ValueError: ``weights`` were passed beside a KJT (it carries its own weights).
    """
    if not is_keyed_jagged(features):
        return features, weights
    if weights is not None:
        raise ValueError(
            "EmbeddingEngine: a KeyedJaggedTensor carries its own weights (weights_or_none()); "
            "pass weights=None with it"
        )
    return from_keyed_jagged(features)
