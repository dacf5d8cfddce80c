"""Inputs: dense, sparse and ragged ids, converted once into a jagged batch per feature.

Every input format becomes a :class:`FeatureBatch`: the ids grouped by *sample* (one output
slot, docs/semantics.md §2.1), with CSR offsets and optional per-id weights::

    samples      0        1     2
    values    [ 3, 7 |       | 5 ]      (N,) int64 ids
    offsets   [0,    2,      2,  3]     (S+1,) int64; sample s = values[offsets[s]:offsets[s+1]]
    weights   [.5, 1 |       | 2 ]      (N,) float32, or None for all ones

How formats map to samples (docs/semantics.md §2.2, §2.4, §2.5):

* dense ``(B,)`` or ``(B, ..., 1)`` ints: one id per sample, output shape without the last 1;
* ``torch.sparse_coo_tensor`` of rank >= 2: entries sharing all but the last index form a
  sample; with ``max_sequence_length = L > 0`` and rank 2, sample ``(row, col)`` for ``col < L``
  and output ``(B, L)``;
* :class:`RaggedIds` ``(B, None)``: row ``b`` is a sample, or ``(row, position < L)`` as a
  sequence.

Every check raises before anything is looked up, naming the feature, the bad value and what was
expected (the checks live in ``_input_checks``): ids in range, weights finite, ragged row_splits
and sparse indices inside their bounds, re-checked at each conversion because a tensor can change
in place after a :class:`RaggedIds` was built. A :class:`FeatureBatch` owns its tensors, as
TensorFlow's enqueue copies its input: the caller may refill its buffers as soon as the
conversion returns (docs/reliability.md).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from embcore._input_checks import (
    INT_DTYPES,
    check_coo,
    check_ids,
    check_range,
    check_splits,
    check_weights,
)
from embcore._one_per_sample import one_per_sample
from embcore.config import ResolvedFeature, ResolvedTable

__all__ = ["FeatureBatch", "RaggedIds", "to_feature_batch"]

#: The most samples one feature may have in one step (a sparse dense_shape can ask for more).
_MAX_SAMPLES = 2**31 - 1


@dataclass(frozen=True, eq=False)
class RaggedIds:
    """A ragged ``(B, None)`` batch: row ``b`` is ``values[row_splits[b]:row_splits[b+1]]``.

    Args:
        values: ``(N,)`` ids (integers) or, when used as weights, floats.
        row_splits: ``(B+1,)`` integers, non-decreasing, from 0 to N.
    """

    values: Tensor
    row_splits: Tensor

    def __post_init__(self) -> None:
        values = torch.as_tensor(self.values)
        splits = torch.as_tensor(self.row_splits)
        if values.dim() != 1:
            raise ValueError(f"RaggedIds: values must be 1-D, got shape {tuple(values.shape)}")
        if splits.dim() != 1 or splits.numel() < 1 or splits.dtype not in INT_DTYPES:
            raise ValueError(
                "RaggedIds: row_splits must be a 1-D integer tensor of length B+1, got "
                f"shape {tuple(splits.shape)} dtype {splits.dtype}"
            )
        splits = splits.to(torch.int64)
        if int(splits[0]) != 0 or int(splits[-1]) != values.numel():
            raise ValueError(
                f"RaggedIds: row_splits must start at 0 and end at len(values)={values.numel()}, "
                f"got {int(splits[0])} ... {int(splits[-1])}"
            )
        if splits.numel() > 1 and bool((splits[1:] < splits[:-1]).any()):
            raise ValueError("RaggedIds: row_splits must be non-decreasing")
        object.__setattr__(self, "values", values)
        object.__setattr__(self, "row_splits", splits)

    @classmethod
    def from_lists(
        cls, rows: Sequence[Sequence[Any]], dtype: torch.dtype | None = None
    ) -> RaggedIds:
        """Build from a list of rows: ``RaggedIds.from_lists([[3, 7], [], [5]])``."""
        lengths = [len(r) for r in rows]
        flat = [x for r in rows for x in r]
        if dtype is None:
            dtype = torch.float32 if any(isinstance(x, float) for x in flat) else torch.int64
        splits = torch.zeros(len(rows) + 1, dtype=torch.int64)
        splits[1:] = torch.cumsum(torch.tensor(lengths, dtype=torch.int64), 0)
        return cls(torch.tensor(flat, dtype=dtype), splits)

    @property
    def nrows(self) -> int:
        return self.row_splits.numel() - 1

    def row_lengths(self) -> Tensor:
        return self.row_splits[1:] - self.row_splits[:-1]


@dataclass(frozen=True, eq=False)
class FeatureBatch:
    """One feature's ids for one step, ready for a lookup kernel, which trusts it: the offsets
    are in bounds, and no tensor is a view of the caller's input (see :func:`to_feature_batch`).

    Attributes:
        values: ``(N,) int64`` ids in ``[0, vocab)``, grouped by sample (any int64 keys for
            a dynamic table, which its store maps to rows).
        offsets: ``(S+1,) int64`` CSR offsets over the ``S = prod(output_shape)`` samples.
        weights: ``(N,) float32`` per-id weights, or ``None`` (all ones).
        combiner: ``"sum"``, ``"mean"`` or ``"sqrtn"``; sequence features use ``"sum"``
            (each position is its own sample).
        output_shape: the activation shape without ``dim``.
    """

    values: Tensor
    offsets: Tensor
    weights: Tensor | None
    combiner: str
    output_shape: tuple[int, ...]

    @property
    def num_samples(self) -> int:
        return self.offsets.numel() - 1

    def segments(self) -> Tensor:
        """``(N,) int64``: the sample of each id."""
        lengths = self.offsets[1:] - self.offsets[:-1]
        return torch.repeat_interleave(
            torch.arange(self.num_samples, device=self.offsets.device), lengths
        )

    def to(self, device: torch.device) -> FeatureBatch:
        def move(t: Tensor | None) -> Tensor | None:
            return None if t is None else t.to(device, non_blocking=True)

        return FeatureBatch(
            move(self.values),
            move(self.offsets),
            move(self.weights),
            self.combiner,
            self.output_shape,
        )


# ---------------------------------------------------------------------------------------------
# helpers


def _resolve_output_shape(feature: ResolvedFeature, samples: int) -> tuple[int, ...]:
    """The configured output shape with its unknown entry filled for ``samples`` samples."""
    shape = feature.config.output_shape
    assert shape is not None
    known = math.prod(d for d in shape if d is not None)
    if None in shape:
        if known == 0 or samples % known:
            raise ValueError(
                f"feature '{feature.name}': output_shape {list(shape)} cannot hold {samples} "
                "samples"
            )
        return tuple(samples // known if d is None else d for d in shape)
    if known != samples:
        raise ValueError(
            f"feature '{feature.name}': output_shape {list(shape)} holds {known} samples but the "
            f"input has {samples}"
        )
    return tuple(int(d) for d in shape)  # type: ignore[arg-type]


def _offsets(samples: Tensor, num_samples: int) -> Tensor:
    """``(S+1,) int64`` CSR offsets of ids whose ``samples`` are already in increasing order."""
    offsets = np.zeros(num_samples + 1, dtype=np.int64)
    np.cumsum(np.bincount(samples.numpy(), minlength=num_samples), out=offsets[1:])
    return torch.from_numpy(offsets)


def _storages(*inputs: Any) -> set[int]:
    """The memory the caller's tensors live in: what a batch must not keep a view of."""
    ptrs = set()
    for x in inputs:
        if isinstance(x, RaggedIds):
            tensors: tuple[Tensor, ...] = (x.values, x.row_splits)
        elif isinstance(x, Tensor) and x.layout == torch.sparse_coo:
            tensors = (x._indices(), x._values())
        elif isinstance(x, Tensor) and x.layout == torch.strided:
            tensors = (x,)
        else:
            continue
        ptrs.update(t.untyped_storage().data_ptr() for t in tensors)
    return ptrs


def _owned(t: Tensor, borrowed: set[int], device: torch.device) -> Tensor:
    """``t``, or a contiguous copy when it shares memory with the caller's input.

    A batch lives on after the call that made it (between ``enqueue`` and ``dequeue``, or a
    lookup and its backward); refilling an input buffer in place must not change it. Most
    conversions already produce fresh tensors; only the views are copied. Moving to another
    device copies too: from pageable memory the copy has read the source when ``.to``
    returns, but from pinned memory it may still be running, so pinned views are copied.
    """
    if t.untyped_storage().data_ptr() not in borrowed:
        return t
    if device.type != "cpu" and not t.is_pinned():
        return t
    return t.clone(memory_format=torch.contiguous_format)


def _prune(
    table: ResolvedTable,
    combiner: str,
    values: Tensor,
    offsets: Tensor,
    weights: Tensor | None,
) -> tuple[Tensor, Tensor, Tensor | None]:
    """``safe_embedding_lookup_sparse`` pruning (docs/semantics.md §2.8): drop ids < 0 and, unless
    the combiner is sum, ids whose weight is <= 0."""
    keep = values >= 0
    if weights is not None and combiner != "sum":
        keep &= weights > 0
    if bool(keep.all()):
        return values, offsets, weights
    kept = torch.zeros(values.numel() + 1, dtype=torch.int64)  # kept[i]: ids kept before i
    kept[1:] = torch.cumsum(keep.to(torch.int64), 0)
    return values[keep], kept[offsets], None if weights is None else weights[keep]


# ---------------------------------------------------------------------------------------------
# formats


def _from_dense(feature: ResolvedFeature, ids: Tensor, weights: Any) -> tuple:
    name, cfg = feature.name, feature.config
    if weights is not None:
        raise ValueError(
            f"feature '{name}': weights were given for dense input; dense ids have one id per "
            "sample and take no weights (use a sparse tensor or RaggedIds for weighted ids)"
        )
    if cfg.max_sequence_length > 0:
        raise ValueError(
            f"feature '{name}' is a sequence feature (max_sequence_length="
            f"{cfg.max_sequence_length}) but a dense tensor of shape {tuple(ids.shape)} was "
            "passed; feed a 2-D sparse tensor or RaggedIds"
        )
    if ids.dim() == 0:
        raise ValueError(f"feature '{name}': dense ids must have rank >= 1, got a scalar")
    if ids.dim() >= 2 and ids.shape[-1] != 1:
        raise ValueError(
            f"feature '{name}': dense ids of rank >= 2 must end in a dimension of 1 (one id per "
            f"sample), got shape {tuple(ids.shape)}; use a sparse tensor or RaggedIds for "
            "several ids per sample"
        )
    values = check_ids(name, ids.cpu(), "ids").reshape(-1)
    shape = tuple(ids.shape) if ids.dim() == 1 else tuple(ids.shape[:-1])
    return values, one_per_sample(values.numel()), None, shape, False


def _from_sparse(feature: ResolvedFeature, ids: Tensor, weights: Any) -> tuple:
    name, cfg = feature.name, feature.config
    if ids.dim() < 2:
        raise ValueError(f"feature '{name}': sparse ids must have rank >= 2, got {ids.dim()}")
    indices = ids._indices().cpu()
    values = check_ids(name, ids._values().cpu(), "sparse id values")
    dense_shape = tuple(ids.shape)
    linear, order = check_coo(name, indices, values, dense_shape)
    w = None
    if weights is not None:
        if not (isinstance(weights, Tensor) and weights.layout == torch.sparse_coo):
            raise ValueError(
                f"feature '{name}': ids are a sparse tensor, so weights must be a sparse tensor "
                f"with the same indices, got {type(weights).__name__}"
            )
        if weights.shape != ids.shape or not torch.equal(weights._indices().cpu(), indices):
            raise ValueError(
                f"feature '{name}': weights are not aligned with ids: the sparse weights must "
                "have the same dense_shape and indices as the ids"
            )
        w = check_weights(name, weights._values().cpu(), values.numel())
    if order is not None:  # entries out of row-major order: sort them
        indices, values = indices[:, order], values[order]
        w = None if w is None else w[order]
    length = cfg.max_sequence_length
    if length > 0 and ids.dim() > 2:
        warnings.warn(
            f"feature '{name}': max_sequence_length={length} is ignored for sparse ids of rank "
            f"{ids.dim()}; ids are combined over the last axis",
            UserWarning,
            stacklevel=4,
        )
    if length > 0 and ids.dim() == 2 and cfg.output_shape is None:
        rows, cols = indices[0], indices[1]
        keep = cols < length  # truncate by column index (docs/semantics.md §2.4)
        samples = rows[keep] * length + cols[keep]  # increasing: entries are row-major
        values = values[keep]
        w = None if w is None else w[keep]
        shape: tuple[int, ...] = (dense_shape[0], length)
        sequence = True
    else:
        shape = dense_shape[:-1]
        samples = torch.from_numpy(linear.numpy() // max(dense_shape[-1], 1))
        sequence = False
    if math.prod(shape) > _MAX_SAMPLES:  # the activation alone could not be allocated
        raise ValueError(
            f"feature '{name}': sparse dense_shape {list(dense_shape)} makes {math.prod(shape)} "
            f"samples of output shape {list(shape)}; at most {_MAX_SAMPLES} are supported"
        )
    return values, _offsets(samples, math.prod(shape)), w, shape, sequence


def _from_ragged(feature: ResolvedFeature, ids: RaggedIds, weights: Any) -> tuple:
    name, cfg = feature.name, feature.config
    values = check_ids(name, ids.values.cpu(), "ragged id values")
    if values.dim() != 1:
        raise ValueError(
            f"feature '{name}': ragged id values must be 1-D, got shape {tuple(values.shape)}"
        )
    # RaggedIds checked its row_splits when it was built, but the tensor may have been
    # changed in place since: the kernels index the values with them, so check again
    splits = check_splits(name, "row_splits", ids.row_splits.cpu(), values.numel())
    w = None
    if weights is not None:
        if not isinstance(weights, RaggedIds):
            raise ValueError(
                f"feature '{name}': ids are RaggedIds, so weights must be RaggedIds with the same "
                f"row_splits, got {type(weights).__name__}"
            )
        if weights.row_splits.shape != splits.shape or not torch.equal(
            weights.row_splits.cpu(), splits
        ):
            raise ValueError(
                f"feature '{name}': weights are not aligned with ids: ragged weights must have "
                "the same row_splits as the ids"
            )
        w = check_weights(name, weights.values.cpu(), values.numel())
    rows = splits.numel() - 1
    length = cfg.max_sequence_length
    if cfg.output_shape is not None:
        wanted = math.prod(d for d in cfg.output_shape if d is not None)
        if None not in cfg.output_shape and wanted != rows:
            if rows == 0 or wanted % rows:
                raise ValueError(
                    f"feature '{name}': output_shape {list(cfg.output_shape)} holds {wanted} "
                    f"samples, which should be the ragged batch size {rows} or a multiple of it"
                )
            # docs/semantics.md §2.5 / §6 pitfall 12: a multiple of the batch makes each row a
            # sequence.
            length = wanted // rows
            if w is not None:
                warnings.warn(
                    f"feature '{name}': output_shape {list(cfg.output_shape)} turns ragged ids "
                    "into sequences; their weights and the combiner are ignored",
                    UserWarning,
                    stacklevel=4,
                )
            w = None
        else:
            length = 0
    if length > 0:
        lengths = splits[1:] - splits[:-1]
        positions = torch.arange(values.numel()) - torch.repeat_interleave(splits[:-1], lengths)
        keep = positions < length
        row_of = torch.repeat_interleave(torch.arange(rows), lengths)
        # increasing: rows ascend, positions ascend within a row
        samples = row_of[keep] * length + positions[keep]
        w = None if w is None else w[keep]
        return values[keep], _offsets(samples, rows * length), w, (rows, length), True
    return values, splits, w, (rows,), False


def _as_tensor(feature: str, ids: Any) -> tuple[Any, bool]:
    """NumPy ids as a tensor (sharing memory when the array is writable), and whether that
    tensor is a private copy."""
    if not isinstance(ids, np.ndarray):
        return ids, False
    if ids.dtype.kind not in "iu":
        raise TypeError(
            f"feature '{feature}': ids must be integers (int8..int64, uint8), got a NumPy array "
            f"of dtype {ids.dtype}; cast with .astype(np.int64) if the values are whole numbers"
        )
    if ids.dtype not in (np.int8, np.int16, np.int32, np.int64, np.uint8):
        raise TypeError(
            f"feature '{feature}': ids of NumPy dtype {ids.dtype} may not fit int64 ids; cast "
            "with .astype(np.int64)"
        )
    if not ids.flags.writeable:  # torch tensors are writable: copy (torch would warn)
        return torch.tensor(ids), True
    return torch.from_numpy(ids), False


def to_feature_batch(
    feature: ResolvedFeature, table: ResolvedTable, ids: Any, weights: Any, device: torch.device
) -> FeatureBatch:
    """Validate one feature's input and convert it to a :class:`FeatureBatch` on ``device``.

    The batch owns its tensors: none is a view of ``ids`` or ``weights`` (as TensorFlow's
    enqueue copies its input), so the caller may refill its buffers as soon as this returns.
    Offsets are checked before anything reads the ids with them.

    Raises:
        TypeError: the input is of an unknown kind, ids are not integers, or weights are not
            (losslessly) float32.
        ValueError: any other bad input, naming the feature and the offending value.
    """
    name = feature.name
    ids, private = _as_tensor(name, ids)
    borrowed = _storages(weights) if private else _storages(ids, weights)
    if isinstance(ids, RaggedIds):
        parts = _from_ragged(feature, ids, weights)
    elif isinstance(ids, Tensor) and ids.layout == torch.sparse_coo:
        parts = _from_sparse(feature, ids, weights)
    elif isinstance(ids, Tensor) and ids.layout == torch.strided:
        parts = _from_dense(feature, ids, weights)
    else:
        layout = f" of layout {ids.layout}" if isinstance(ids, Tensor) else ""
        raise TypeError(
            f"feature '{name}': expected a dense integer tensor, a torch.sparse_coo_tensor or "
            f"embcore.RaggedIds, got {type(ids).__name__}{layout}"
        )
    values, offsets, w, shape, sequence = parts
    values, offsets = values.cpu(), offsets.cpu()
    w = None if w is None else w.cpu()
    combiner = "sum" if sequence else table.combiner
    if table.config.safe_lookup:
        values, offsets, w = _prune(table, combiner, values, offsets, w)
    if table.vocabulary_size is not None:  # a dynamic table's ids are any int64 keys
        check_range(name, table.name, table.vocabulary_size, values)
    if feature.config.output_shape is not None:
        shape = _resolve_output_shape(feature, offsets.numel() - 1)
    values, offsets = _owned(values, borrowed, device), _owned(offsets, borrowed, device)
    w = None if w is None else _owned(w, borrowed, device)
    return FeatureBatch(values, offsets, w, combiner, shape).to(device)
