"""Checks of one feature's raw input, each a single vectorised pass over a tensor.

Used by :mod:`embcore.inputs` at the conversion boundary, before any kernel reads the ids: a
kernel trusts ``values``, ``offsets`` and ``weights`` completely (it reads them through raw
pointers), so everything it relies on is checked here. Every error names the feature, the bad
value and what was expected (docs/reliability.md, "Wrong results").
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "INT_DTYPES",
    "check_coo",
    "check_ids",
    "check_range",
    "check_splits",
    "check_weights",
]

INT_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)

_INT64_MAX = 2**63 - 1


def check_ids(feature: str, values: Tensor, what: str) -> Tensor:
    """Check an id tensor is integral; return it as int64 (a copy only when the dtype differs)."""
    if values.dtype not in INT_DTYPES:
        raise TypeError(
            f"feature '{feature}': {what} must be integers (int8..int64, uint8), got dtype "
            f"{values.dtype}; cast with .long() if the values are whole numbers"
        )
    return values if values.dtype == torch.int64 else values.to(torch.int64)


def check_weights(feature: str, weights: Tensor, count: int) -> Tensor:
    """Check weights are finite and float32, or losslessly convertible to it."""
    w = weights
    if w.dtype == torch.bool or w.is_complex():
        raise TypeError(f"feature '{feature}': weights must be float32, got dtype {w.dtype}")
    w = w.reshape(-1)
    if w.numel() != count:
        raise ValueError(
            f"feature '{feature}': weights are not aligned with ids: {w.numel()} weights for "
            f"{count} ids"
        )
    if w.is_floating_point() and not bool(torch.isfinite(w).all()):
        i = int((~torch.isfinite(w)).nonzero()[0])
        raise ValueError(
            f"feature '{feature}': weights must be finite, got {w[i].item()} at position {i}"
        )
    if w.dtype != torch.float32:
        converted = w.to(torch.float32)
        if w.dtype not in (torch.float16, torch.bfloat16):
            lossy = converted.to(w.dtype) != w
            if bool(lossy.any()):
                i = int(lossy.nonzero()[0])
                raise TypeError(
                    f"feature '{feature}': weights of dtype {w.dtype} are not exactly "
                    f"representable in float32 (e.g. {w[i].item()!r} at position {i}); pass "
                    "float32 weights"
                )
        w = converted
    return w


def check_range(feature: str, table: str, vocab: int, values: Tensor, hint: bool = True) -> None:
    """Every id in ``[0, vocab)`` (after the safe lookup's pruning). ``hint``: suggest
    ``safe_lookup`` for a negative id (not where ids come already pruned)."""
    if values.numel() == 0:
        return
    lo, hi = torch.aminmax(values)
    if int(lo) < 0 or int(hi) >= vocab:
        bad_mask = (values < 0) | (values >= vocab)
        i = int(bad_mask.nonzero()[0])
        prune = hint and int(values[i]) < 0
        hint_text = "; set TableConfig(safe_lookup=True) to prune ids < 0" if prune else ""
        raise ValueError(
            f"feature '{feature}': id {int(values[i])} at position {i} is out of range for table "
            f"'{table}' with vocabulary_size {vocab}; ids must be in [0, {vocab}){hint_text}"
        )


def check_splits(feature: str, what: str, splits: Tensor, count: int, hint: bool = True) -> Tensor:
    """CSR row splits over ``count`` values: 1-D integers, starting at 0, ending at ``count``,
    never decreasing (so every row lies inside the values). Returns them as int64.

    ``splits`` must be on the CPU (the conversion works there).

    Args:
        splits: ``(B+1,)`` integers.
        count: ``N``, the number of values they split.
        hint: ask whether a ``RaggedIds``' splits were changed (where they come from one).
    """
    if splits.dim() != 1 or splits.numel() < 1 or splits.dtype not in INT_DTYPES:
        raise ValueError(
            f"feature '{feature}': {what} must be a 1-D integer tensor of length B+1, got shape "
            f"{tuple(splits.shape)} dtype {splits.dtype}"
        )
    s = splits if splits.dtype == torch.int64 else splits.to(torch.int64)
    a = s.numpy()  # CPU; NumPy's small element-wise passes cost a tenth of torch's here
    first, last = int(a[0]), int(a[-1])
    if first != 0 or last != count:
        raise ValueError(
            f"feature '{feature}': {what} must start at 0 and end at len(values)={count}, got "
            f"{first} ... {last}"
            + (" (were they changed after the RaggedIds was built?)" if hint else "")
        )
    if a.size > 2 and bool((a[1:] < a[:-1]).any()):
        i = int(np.flatnonzero(a[1:] < a[:-1])[0])
        raise ValueError(
            f"feature '{feature}': {what} must never decrease, got {what}[{i + 1}]="
            f"{int(a[i + 1])} < {what}[{i}]={int(a[i])}"
        )
    return s


def check_coo(
    feature: str, indices: Tensor, values: Tensor, shape: tuple[int, ...]
) -> tuple[Tensor, Tensor | None]:
    """Validate a sparse COO tensor's entries against its ``dense_shape``.

    torch does not check a ``sparse_coo_tensor``'s invariants unless asked, so an index may be
    negative, outside ``dense_shape``, repeated or out of order. Every index must lie inside
    the shape. Entries out of order are sorted row-major (stably: repeated indices keep their
    order); a repeated index is two ids of one sample, as in TensorFlow, where the last index
    is not used for combining (docs/semantics.md §2.2).

    Args:
        indices: ``(R, nnz) int64`` with ``R = len(shape)``, on the CPU.
        values: ``(nnz,)`` the ids.
        shape: the ``dense_shape``, rank ``R >= 2``.

    Returns:
        ``(nnz,) int64`` row-major linear index of each entry, sorted, and the permutation that
        sorts the entries, or ``None`` when they already are (the usual, coalesced case).
    """
    if values.dim() != 1:
        raise ValueError(
            f"feature '{feature}': a sparse id tensor must have one id per index (no dense "
            f"dimensions), got values of shape {tuple(values.shape)} for dense_shape "
            f"{list(shape)}"
        )
    if math.prod(shape) > _INT64_MAX:
        raise ValueError(
            f"feature '{feature}': sparse dense_shape {list(shape)} has more than 2**63 - 1 "
            "positions; use a smaller dense_shape"
        )
    nnz = indices.shape[1]
    if nnz == 0:
        return torch.zeros(0, dtype=torch.int64), None
    idx = indices.numpy()  # (R, nnz), CPU: NumPy's passes over a few thousand ids cost less
    sizes = np.asarray(shape, dtype=np.int64)
    if bool((idx.min(axis=1) < 0).any()) or bool((idx.max(axis=1) >= sizes).any()):
        j = int(np.flatnonzero(((idx < 0) | (idx >= sizes[:, None])).any(axis=0))[0])
        index = tuple(int(x) for x in idx[:, j])
        raise ValueError(
            f"feature '{feature}': sparse index {index} of entry {j} is outside dense_shape "
            f"{list(shape)}; every index must satisfy 0 <= index[d] < dense_shape[d]"
        )
    strides = np.asarray([math.prod(shape[d + 1 :]) for d in range(len(shape))], dtype=np.int64)
    linear = (idx * strides[:, None]).sum(axis=0)  # (nnz,) row-major position
    if not bool((linear[1:] < linear[:-1]).any()):
        return torch.from_numpy(linear), None
    order = np.argsort(linear, kind="stable")
    return torch.from_numpy(linear[order]), torch.from_numpy(order)
