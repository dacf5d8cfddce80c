"""Raw feature values, whatever their container, as one ragged batch of NumPy values.

Feature columns accept a feature as any of::

    torch.tensor([3, 7, 5])                      dense (B,): one value per example
    torch.tensor([[3, 7], [5, -1]])              dense (B, k): -1 (or "") marks padding
    torch.sparse_coo_tensor(indices, values)     sparse (B, k)
    embcore.RaggedIds / [[3, 7], [], [5]]        ragged rows
    np.array(["a", "b"]) / np.array([["a", ""]])  NumPy ints, floats or strings, as above
    pa.array([["a"], [], ["b", "c"]])            pyarrow (chunked) arrays, list or flat

and turns it into :class:`RaggedValues`: ``(N,)`` values grouped into ``B`` rows by ``(B+1,)``
row splits. Values are ``int64``, ``float64`` or Python ``str`` (in an object array).

Dense (rectangular) inputs drop their padding entries, ``-1`` for integers and ``""`` for
strings, as TensorFlow's feature columns do; nothing else is ever dropped (in particular id 0
is an id, docs/semantics.md §6 pitfall 24). Ragged and sparse inputs keep every entry they list.
pyarrow nulls are missing values: a null row is an empty row, a null inside a list is an error.

Each value also has a *position* in its row, which sequence columns embed at (TensorFlow's
``indices[:, 1]``)::

    sparse  indices (0,0) (0,2) (1,1)   positions [0, 2 | 1]      lengths [3, 2]
    dense   [[3, -1, 5], [-1, 7, -1]]   positions [0, 2 | 1]      lengths [3, 2]
    ragged  [[3, 5], [7]]               positions [0, 1 | 0]      lengths [2, 1]

A sparse input's positions are its column indices; a dense input keeps the columns of the
values left after its padding is dropped; ragged rows and lists count from 0. A row's sequence
length is its last position + 1 (0 for an empty row), as TensorFlow's
``sequence_length_from_sparse_tensor``: a gap is a position without an id (a zero vector).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from embcore.inputs import RaggedIds

__all__ = ["RaggedValues", "to_ragged"]

_SEQUENCES = (list, tuple, np.ndarray)


@dataclass(frozen=True, eq=False)
class RaggedValues:
    """One feature's raw values for a batch.

    Attributes:
        values: ``(N,)`` int64, float64, or object array of ``str``.
        row_splits: ``(B+1,) int64``; row ``b`` is ``values[row_splits[b]:row_splits[b+1]]``.
        dense: True when the input was rectangular, so that padding may be dropped.
        columns: ``(N,) int64`` positions (column indices) of the values in their rows when
            they are not ``0, 1, ...``: a sparse input's ``indices[:, 1]`` (also used to check
            that sparse weights sit at the ids' indices), or the columns a dense input's
            values had before its padding was dropped; ``None``: value ``j`` of a row is at
            position ``j``.
    """

    values: np.ndarray
    row_splits: np.ndarray
    dense: bool = False
    columns: np.ndarray | None = None

    @property
    def nrows(self) -> int:
        return len(self.row_splits) - 1

    @property
    def kind(self) -> str:
        """``"int"``, ``"float"`` or ``"string"``."""
        if self.values.dtype == object:
            return "string"
        return "float" if self.values.dtype.kind == "f" else "int"

    def row_lengths(self) -> np.ndarray:
        return np.diff(self.row_splits)

    def row_ids(self) -> np.ndarray:
        """``(N,) int64``: the row of each value."""
        return np.repeat(np.arange(self.nrows, dtype=np.int64), self.row_lengths())

    def positions(self) -> np.ndarray:
        """``(N,) int64``: each value's position in its row (see the module docstring)."""
        if self.columns is not None:
            return self.columns
        return np.arange(len(self.values), dtype=np.int64) - np.repeat(
            self.row_splits[:-1], self.row_lengths()
        )

    def mask(self, keep: np.ndarray) -> RaggedValues:
        """Keep the values where ``keep`` is True; every row stays (possibly empty), and the
        kept values keep their positions."""
        counts = np.bincount(self.row_ids()[keep], minlength=self.nrows)
        splits = np.zeros_like(self.row_splits)
        splits[1:] = np.cumsum(counts)
        return RaggedValues(self.values[keep], splits, columns=self.positions()[keep])

    def drop_padding(self) -> tuple[RaggedValues, np.ndarray | None]:
        """Drop ``-1`` / ``""`` entries of a dense input; returns the kept mask (None: all)."""
        if not self.dense or self.kind == "float":
            return self, None
        pad = "" if self.kind == "string" else -1
        keep = self.values != pad
        if bool(keep.all()):
            return RaggedValues(self.values, self.row_splits), None
        return self.mask(keep), keep


def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _normalize_values(key: str, values: np.ndarray) -> np.ndarray:
    """1-D int64, float64 or object-of-str values."""
    kind = values.dtype.kind
    if kind in "iu":
        return values.astype(np.int64, copy=False)
    if kind == "f":
        return values.astype(np.float64, copy=False)
    if kind not in "USO":
        raise TypeError(
            f"feature '{key}': values must be ints, floats or strings, got dtype {values.dtype}"
        )
    items = values.tolist()
    if items and all(_is_int(v) for v in items):
        return np.asarray(items, dtype=np.int64)
    if items and all(isinstance(v, (float, np.floating)) or _is_int(v) for v in items):
        return np.asarray(items, dtype=np.float64)
    out = np.empty(len(items), dtype=object)
    for i, v in enumerate(items):
        if isinstance(v, bytes):
            try:
                v = v.decode("utf-8")
            except UnicodeDecodeError as e:
                raise ValueError(f"feature '{key}': bytes value {v!r} is not UTF-8") from e
        if not isinstance(v, str):
            raise TypeError(
                f"feature '{key}': values must be all ints, all floats or all strings, got "
                f"{type(v).__name__} ({v!r}) at position {i}"
            )
        out[i] = v
    return out


def _from_rectangular(key: str, array: np.ndarray) -> RaggedValues:
    if array.ndim == 0:
        raise ValueError(
            f"feature '{key}': expected a batch (rank 1 or 2), got a scalar; wrap it in a list"
        )
    if array.ndim > 2:
        raise ValueError(
            f"feature '{key}': dense inputs must have rank 1 (B,) or 2 (B, k), got shape "
            f"{tuple(array.shape)}"
        )
    if array.dtype == object and array.ndim == 1 and any(isinstance(v, _SEQUENCES) for v in array):
        return _from_rows(key, list(array))
    width = 1 if array.ndim == 1 else array.shape[1]
    splits = np.arange(0, array.shape[0] * width + 1, max(width, 1), dtype=np.int64)
    if width == 0:
        splits = np.zeros(array.shape[0] + 1, dtype=np.int64)
    return RaggedValues(_normalize_values(key, array.reshape(-1)), splits, dense=True)


def _from_rows(key: str, rows: Sequence[Any]) -> RaggedValues:
    lengths, flat = [], []
    for i, row in enumerate(rows):
        if not isinstance(row, _SEQUENCES):
            raise ValueError(
                f"feature '{key}': row {i} is {type(row).__name__} ({row!r}) while other rows "
                "are lists; give every row as a list, or every example as one value"
            )
        row = list(row.tolist() if isinstance(row, np.ndarray) else row)
        if any(isinstance(v, _SEQUENCES) for v in row):
            raise ValueError(f"feature '{key}': row {i} is nested deeper than a list of values")
        lengths.append(len(row))
        flat.extend(row)
    splits = np.zeros(len(rows) + 1, dtype=np.int64)
    splits[1:] = np.cumsum(lengths)
    if not flat:
        return RaggedValues(np.zeros(0, dtype=np.int64), splits)
    if any(isinstance(v, (bool, np.bool_)) for v in flat):
        raise TypeError(f"feature '{key}': bool values are not feature values")
    values = np.empty(len(flat), dtype=object)
    values[:] = flat
    return RaggedValues(_normalize_values(key, values), splits)


def _from_pyarrow(key: str, array: Any) -> RaggedValues:
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    if pa.types.is_dictionary(array.type):
        array = array.dictionary_decode()
    if pa.types.is_list(array.type) or pa.types.is_large_list(array.type):
        lengths = pc.list_value_length(array).fill_null(0).to_numpy(zero_copy_only=False)
        values = array.flatten()
        if values.null_count:
            raise ValueError(
                f"feature '{key}': a list holds a null value; nulls are only "
                "allowed as whole rows (empty rows)"
            )
    else:
        lengths = array.is_valid().to_numpy(zero_copy_only=False).astype(np.int64)
        values = array.drop_null()
    if pa.types.is_dictionary(values.type):
        values = values.dictionary_decode()
    splits = np.zeros(len(lengths) + 1, dtype=np.int64)
    splits[1:] = np.cumsum(lengths)
    t = values.type
    if (
        pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_binary(t)
        or (pa.types.is_large_binary(t))
    ):
        flat = np.empty(len(values), dtype=object)
        flat[:] = values.to_pylist()
    else:
        flat = values.to_numpy(zero_copy_only=False)
    return RaggedValues(_normalize_values(key, flat), splits)


def to_ragged(key: str, value: Any) -> RaggedValues:
    """Convert one raw feature (see the module docstring) to :class:`RaggedValues`.

    Raises:
        TypeError: an unsupported container or value type (bools, nested objects).
        ValueError: a scalar, a rank above 2, or rows that mix lists and single values.
    """
    if isinstance(value, RaggedIds):
        values = value.values.detach().cpu().numpy()
        splits = value.row_splits.detach().cpu().numpy().astype(np.int64)
        return RaggedValues(_normalize_values(key, values), splits)
    if isinstance(value, torch.Tensor):
        if value.dtype == torch.bool:
            raise TypeError(f"feature '{key}': bool tensors are not feature values")
        if value.layout == torch.sparse_coo:
            if value.dim() != 2:
                raise ValueError(
                    f"feature '{key}': sparse inputs must have rank 2 (B, k), got {value.dim()}"
                )
            indices = value._indices().cpu().numpy()
            flat = indices[0] * value.shape[1] + indices[1]  # row-major position
            order = np.argsort(flat, kind="stable")
            if len(flat) and (np.diff(flat[order]) == 0).any():
                i = order[np.flatnonzero(np.diff(flat[order]) == 0)[0]]
                raise ValueError(
                    f"feature '{key}': the sparse input repeats index {indices[:, i].tolist()}; "
                    "each (row, column) may hold one value"
                )
            rows = indices[0][order]
            splits = np.zeros(value.shape[0] + 1, dtype=np.int64)
            splits[1:] = np.cumsum(np.bincount(rows, minlength=value.shape[0]))
            values = value._values().detach().cpu().numpy()[order]
            return RaggedValues(_normalize_values(key, values), splits, columns=indices[1][order])
        return _from_rectangular(key, value.detach().cpu().numpy())
    if isinstance(value, np.ndarray):
        if value.dtype == np.bool_:
            raise TypeError(f"feature '{key}': bool arrays are not feature values")
        return _from_rectangular(key, value)
    if type(value).__module__.startswith("pyarrow"):
        return _from_pyarrow(key, value)
    if isinstance(value, (list, tuple)):
        if any(isinstance(v, _SEQUENCES) for v in value):
            return _from_rows(key, value)
        if any(isinstance(v, (bool, np.bool_)) for v in value):
            raise TypeError(f"feature '{key}': bool values are not feature values")
        array = np.empty(len(value), dtype=object)
        array[:] = list(value)
        ragged = _from_rectangular(key, array) if len(value) else _from_rows(key, [])
        return RaggedValues(ragged.values, ragged.row_splits)  # a list is not padded
    raise TypeError(
        f"feature '{key}': expected a tensor, a NumPy or pyarrow array, RaggedIds or a list of "
        f"values or of lists, got {type(value).__name__}"
    )
