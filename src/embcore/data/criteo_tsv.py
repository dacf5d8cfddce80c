"""A streaming reader for the Criteo click logs' TSV format (plain or gzip).

Each line is 40 tab-separated columns (Criteo Kaggle ``train.txt``; Criteo 1TB day files)::

    label  I1 ... I13  C1 ... C26
    0/1    integers    8-hex-digit hashes        any column but the label may be empty (missing)

or, for unlabeled rows to score (Kaggle ``test.txt``), the same without the label (39 columns).

Rows are preprocessed into :class:`~embcore.data.batch.Batch` as they are read: dense values by
:func:`~embcore.data.batch.dense_transform`, hashes folded into the tables by
:func:`~embcore.data.batch.categorical_ids`, or kept as raw 64-bit keys
(:func:`~embcore.data.batch.categorical_keys`, for dynamic tables). Nothing is loaded whole.
"""

from __future__ import annotations

import gzip
import io
import math
import os
from collections.abc import Iterator, Sequence
from typing import IO

import numpy as np

from embcore.data.bad_rows import BadRows
from embcore.data.batch import (
    NUM_DENSE,
    NUM_SPARSE,
    Batch,
    categorical_ids,
    categorical_keys,
    dense_transform,
    rebatch,
)
from embcore.errors import UserError, reading

__all__ = ["open_text", "read_criteo_tsv", "sparse_ids"]

_COLUMNS = 1 + NUM_DENSE + NUM_SPARSE


def open_text(path: str | os.PathLike) -> IO[str]:
    """Open a text file for reading, decompressing gzip (recognized by its magic bytes)."""
    with open(path, "rb") as f:
        magic = f.read(2)
    if magic == b"\x1f\x8b":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", newline="\n")
    return open(path, encoding="utf-8", newline="\n")


def _parse_row(line: str, where: str, labeled: bool) -> tuple[float, list[float], list[int]]:
    """One line as ``(label, 13 dense values, 26 raw hashes)``; a UserError names what is wrong."""
    first = 1 if labeled else 0  # the column of I1
    columns = _COLUMNS if labeled else _COLUMNS - 1
    cols = line.rstrip("\r\n").split("\t")
    if len(cols) != columns:
        what = "label, " if labeled else "no label, "
        raise UserError(
            f"{where}: expected {columns} tab-separated columns ({what}{NUM_DENSE} integer, "
            f"{NUM_SPARSE} categorical), got {len(cols)}"
        )
    label = math.nan
    if labeled:
        if cols[0] not in ("0", "1"):
            raise UserError(f"{where}: the label must be 0 or 1, got {cols[0]!r}")
        label = 1.0 if cols[0] == "1" else 0.0
    ints, cats = cols[first : first + NUM_DENSE], cols[first + NUM_DENSE :]
    try:
        dense = [float(int(x)) if x else math.nan for x in ints]
    except (ValueError, OverflowError):
        bad = next(x for x in ints if x and not _is_int(x))
        raise UserError(
            f"{where}: integer columns must be integers of at most 300 digits or empty, "
            f"got {bad[:40]!r}"
        ) from None
    raw = [int(x, 16) if _is_hex(x) else -1 for x in cats]
    bad = next((x for x, h in zip(cats, raw, strict=True) if x and h < 0), None)
    if bad is not None:
        raise UserError(
            f"{where}: categorical columns must be hex hashes up to 7fffffffffffffff or empty, "
            f"got {bad[:40]!r}"
        )
    return label, dense, raw


def _parse(
    lines: list[str], numbers: list[int], path: str, labeled: bool, bad: BadRows
) -> tuple[np.ndarray, ...]:
    """The rows of ``lines`` that parse, as ``(labels, dense, raw)`` arrays."""
    labels, dense, raw = [], [], []
    for line, number in zip(lines, numbers, strict=True):
        try:
            label, d, r = _parse_row(line, f"{path}:{number}", labeled)
        except UserError as error:
            bad.found(number, str(error))
            continue
        labels.append(label)
        dense.append(d)
        raw.append(r)
    return (
        np.array(labels, dtype=np.float32),
        np.array(dense, dtype=np.float64).reshape(-1, NUM_DENSE),
        np.array(raw, dtype=np.int64).reshape(-1, NUM_SPARSE),
    )


def _is_int(text: str) -> bool:
    try:
        float(int(text))
    except (ValueError, OverflowError):
        return False
    return True


def _is_hex(text: str) -> bool:
    try:
        return 0 <= int(text, 16) < 2**63 and "_" not in text
    except ValueError:
        return False


def read_criteo_tsv(
    path: str | os.PathLike,
    *,
    batch_size: int,
    vocab_sizes: Sequence[int] | None,
    skip_rows: int = 0,
    drop_last: bool = False,
    labeled: bool | None = True,
    bad_rows: BadRows | None = None,
) -> Iterator[Batch]:
    """Stream a Criteo TSV file as preprocessed batches.

    Args:
        path: a ``.tsv``/``.txt`` file, or the same gzip-compressed (any name).
        batch_size: rows per batch; the last batch may be smaller unless ``drop_last``.
        vocab_sizes: the 26 table sizes the hashes are folded into; None: no folding, the
            hashes are the ids (raw 64-bit keys, missing -> ``MISSING_KEY``).
        skip_rows: rows to skip first (where a resumed run left off); blank lines are not rows.
        drop_last: drop a final batch smaller than ``batch_size``.
        labeled: rows start with a label (40 columns); False: no label (39 columns, labels
            NaN); None: decided by the first row.
        bad_rows: what a malformed line does (default: raise); when it skips, ``skip_rows``
            counts well-formed rows only.

    Raises:
        UserError: the file cannot be read (missing, a directory, binary, truncated gzip) or
            has a malformed line, naming the file, the line number and the bad value.
    """
    if vocab_sizes is not None and len(vocab_sizes) != NUM_SPARSE:
        raise ValueError(
            f"read_criteo_tsv: vocab_sizes must have {NUM_SPARSE} entries, got {len(vocab_sizes)}"
        )
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"read_criteo_tsv: batch_size must be an int >= 1, got {batch_size!r}")
    bad = bad_rows if bad_rows is not None else BadRows()
    lines = _stream(path, batch_size, vocab_sizes, skip_rows, labeled, bad)
    if bad.skip:  # skipped rows leave batches short: cut them to size again
        yield from rebatch(lines, batch_size, drop_last=drop_last)
        return
    for batch in lines:
        if drop_last and batch.size < batch_size:
            return
        yield batch


def _stream(
    path: str | os.PathLike,
    batch_size: int,
    vocab_sizes: Sequence[int] | None,
    skip_rows: int,
    labeled: bool | None,
    bad: BadRows,
) -> Iterator[Batch]:
    name = os.fspath(path)
    with reading(name, "a Criteo TSV file, plain or gzip"), open_text(path) as f:
        lines: list[str] = []
        numbers: list[int] = []  # line numbers, for error messages
        rows = 0
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue  # a trailing newline or blank line is not a row
            if not line.endswith("\n"):
                # The last line of a cut file: even with 40 columns its last field may be cut.
                bad.found(
                    number,
                    f"{name}:{number}: the last line has no line end, so the file looks "
                    "truncated (if it is complete, end it with a newline)",
                )
                continue
            if labeled is None:
                labeled = line.count("\t") + 1 == _COLUMNS
            if rows < skip_rows:
                # Only a skipping policy must parse a row to know whether it counts.
                rows += not bad.skip or _well_formed(line, f"{name}:{number}", labeled, bad)
                continue
            rows += 1
            lines.append(line)
            numbers.append(number)
            if len(lines) == batch_size:
                batch = _to_batch(_parse(lines, numbers, name, labeled, bad), vocab_sizes)
                if batch.size:
                    yield batch
                lines, numbers = [], []
        if lines:
            batch = _to_batch(_parse(lines, numbers, name, bool(labeled), bad), vocab_sizes)
            if batch.size:
                yield batch


def _well_formed(line: str, where: str, labeled: bool, bad: BadRows) -> bool:
    try:
        _parse_row(line, where, labeled)
    except UserError as error:
        bad.found(int(where.rpartition(":")[2]), str(error))
        return False
    return True


def _to_batch(parsed: tuple[np.ndarray, ...], vocab_sizes: Sequence[int] | None) -> Batch:
    labels, dense, raw = parsed
    return Batch.from_numpy(dense_transform(dense), sparse_ids(raw, vocab_sizes), labels)


def sparse_ids(raw: np.ndarray, vocab_sizes: Sequence[int] | None) -> np.ndarray:
    """Raw hashes as table rows (folded into ``vocab_sizes``) or, for None, as raw keys."""
    return categorical_keys(raw) if vocab_sizes is None else categorical_ids(raw, vocab_sizes)
