"""A streaming reader for Criteo-layout Parquet files (needs the ``parquet`` extra: pyarrow).

Expected columns (others are ignored): ``label`` (0/1), ``I1`` ... ``I13`` (integers or floats)
and ``C1`` ... ``C26``, either hex-hash strings as in the TSV files or non-negative integers
(already hashed). Nulls mean missing, exactly as empty TSV fields.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from embcore.data.bad_rows import BadRows
from embcore.data.batch import (
    DENSE_NAMES,
    NUM_SPARSE,
    SPARSE_NAMES,
    Batch,
    dense_transform,
    rebatch,
)
from embcore.data.criteo_tsv import sparse_ids
from embcore.errors import UserError, reading

__all__ = ["COLUMNS", "read_criteo_parquet"]

COLUMNS: tuple[str, ...] = ("label", *DENSE_NAMES, *SPARSE_NAMES)


def _pyarrow() -> tuple[Any, Any, Any]:
    try:
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.parquet as pq
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(
            "reading Parquet needs pyarrow: pip install 'embcore[parquet]' (or pip install pyarrow)"
        ) from e
    return pa, pc, pq


def _categorical(column: Any, name: str, pa: Any) -> tuple[np.ndarray, np.ndarray, str]:
    """``(B,) int64`` raw hashes (-1 where null), ``(B,) bool`` malformed rows, and what a
    malformed value should have been."""
    if pa.types.is_integer(column.type):
        values = column.cast(pa.int64()).fill_null(-1).to_numpy(zero_copy_only=False)
        return values, values < -1, "integer ids must be >= 0 or null"
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        out = np.empty(len(column), dtype=np.int64)
        bad = np.zeros(len(column), dtype=bool)
        for i, text in enumerate(column.to_pylist()):
            try:
                out[i] = int(text, 16) if text else -1
                bad[i] = out[i] < -1 or (bool(text) and out[i] < 0)
            except (ValueError, OverflowError):
                out[i], bad[i] = -1, True
        return out, bad, "expected hex hashes up to 7fffffffffffffff or null"
    raise UserError(f"column {name}: expected strings (hex hashes) or integers, got {column.type}")


def _record(record: Any, path: str, first_row: int, bad_rows: BadRows, pa: Any, pc: Any) -> Any:
    """A record batch as ``(labels, dense, raw)`` arrays without its malformed rows."""
    labels = record.column("label").cast(pa.float32()).to_numpy(zero_copy_only=False)
    bad = np.isnan(labels) | ~np.isin(labels, (0.0, 1.0))
    why = ["column label must be 0 or 1 with no nulls" if b else "" for b in bad]
    dense = np.stack(
        [
            pc.fill_null(record.column(n).cast(pa.float64()), np.nan).to_numpy(zero_copy_only=False)
            for n in DENSE_NAMES
        ],
        1,
    )
    columns = []
    for n in SPARSE_NAMES:
        values, malformed, expected = _categorical(record.column(n), n, pa)
        for i in np.flatnonzero(malformed & ~bad):
            why[i] = f"column {n}: {expected}"
        bad |= malformed
        columns.append(values)
    raw = np.stack(columns, 1)
    for i in np.flatnonzero(bad):
        row = first_row + int(i)
        bad_rows.found(row, f"{path}: row {row}: {why[i]}")
    keep = ~bad
    return labels[keep], dense[keep], raw[keep]


def read_criteo_parquet(
    path: str | os.PathLike,
    *,
    batch_size: int,
    vocab_sizes: Sequence[int] | None,
    skip_rows: int = 0,
    drop_last: bool = False,
    bad_rows: BadRows | None = None,
) -> Iterator[Batch]:
    """Stream a Parquet file as preprocessed batches (same contract as ``read_criteo_tsv``).

    Raises:
        ImportError: pyarrow is not installed.
        UserError: the file cannot be read or is no Parquet file, a column is missing or of
            an unusable type, or a row is malformed (naming the file, row and column).
    """
    pa, pc, pq = _pyarrow()
    if vocab_sizes is not None and len(vocab_sizes) != NUM_SPARSE:
        raise ValueError(
            f"read_criteo_parquet: vocab_sizes must have {NUM_SPARSE} entries, got "
            f"{len(vocab_sizes)}"
        )
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"read_criteo_parquet: batch_size must be an int >= 1, got {batch_size!r}")
    bad = bad_rows if bad_rows is not None else BadRows()
    name = os.fspath(path)

    def batches() -> Iterator[Batch]:
        with reading(name, "a Parquet file"):
            file = pq.ParquetFile(path)
            missing = [c for c in COLUMNS if c not in file.schema_arrow.names]
            if missing:
                raise UserError(
                    f"{name}: missing columns {missing}; expected label, I1..I13, C1..C26"
                )
            to_skip, first_row = skip_rows, 0
            records = file.iter_batches(batch_size=max(batch_size, 1024), columns=list(COLUMNS))
            for record in records:
                if not bad.skip and to_skip >= record.num_rows:  # fast: no need to parse
                    to_skip -= record.num_rows
                    first_row += record.num_rows
                    continue
                labels, dense, raw = _record(record, name, first_row, bad, pa, pc)
                first_row += record.num_rows
                skip_here = min(to_skip, len(labels))  # well-formed rows left to skip
                to_skip -= skip_here
                if skip_here == len(labels):
                    continue
                yield Batch.from_numpy(
                    dense_transform(dense[skip_here:]),
                    sparse_ids(raw[skip_here:], vocab_sizes),
                    labels[skip_here:],
                )

    yield from rebatch(batches(), batch_size, drop_last=drop_last)
