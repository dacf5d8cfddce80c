"""A box of a stored tensor that is read or written only when a checkpoint reaches it.

A table held outside memory (``DiskStorage``) hands a checkpoint its tensors as boxes of
rows; each box is read from the table when the checkpoint writes it, and written to the table
as soon as a load has filled it, so a save or a load holds one box at a time, never the
table (docs/disk_tables.md).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

__all__ = ["LazyBox"]


class LazyBox:
    """A ``shape`` box of ``dtype``: ``read()`` gives its values (saving); ``write(tensor)``
    takes them once a load has filled it (loading). One of the two is given."""

    def __init__(
        self,
        shape: tuple[int, ...],
        dtype: torch.dtype,
        read: Callable[[], Tensor] | None = None,
        write: Callable[[Tensor], None] | None = None,
    ) -> None:
        if (read is None) == (write is None):
            raise ValueError("LazyBox: give read= (a box to save) or write= (a box to load)")
        self.shape, self.dtype = tuple(shape), dtype
        self._read, self._write = read, write
        self._buffer: Tensor | None = None
        self._filled = 0

    def amend(self, change: Callable[[Tensor], None]) -> None:
        """Loading: ``change(values)`` runs on the filled box just before it is written (a
        delta's rows written over a base's box)."""
        write = self._write
        if write is None:
            raise ValueError("LazyBox.amend: only a box to load can be amended")

        def amended(values: Tensor) -> None:
            change(values)
            write(values)

        self._write = amended

    def size(self) -> torch.Size:
        return torch.Size(self.shape)

    def meta(self) -> Tensor:
        """An empty tensor of the box's shape and dtype (its properties, no memory)."""
        return torch.empty(self.shape, dtype=self.dtype, device="meta")

    def tensor(self) -> Tensor:
        """Saving: the values, read now. Loading: the buffer a load fills (kept until full)."""
        if self._read is not None:
            return self._read()
        if self._buffer is None:
            self._buffer, self._filled = torch.empty(self.shape, dtype=self.dtype), 0
        return self._buffer

    def filled(self, elements: int) -> None:
        """A load wrote ``elements`` more values into :meth:`tensor`; once all are there, the
        box is written to the table and its buffer dropped."""
        self._filled += elements
        full = self._filled >= math.prod(self.shape)
        if self._write is not None and self._buffer is not None and full:
            buffer, self._buffer = self._buffer, None
            self._write(buffer)
