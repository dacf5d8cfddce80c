"""A piece: the part of a table's logical tensor that one rank holds, and its initial value.

A piece's initial weight and slots are exactly its rows and columns of the full table's
initial value, whatever the sharding (see ``docs/sharding.md``, "Details that matter").
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch
from torch import Tensor

from embcore.config import ResolvedTable
from embcore.initializers import BLOCK_ROWS, initial_rows, initial_slots, slot_values

__all__ = ["Piece", "initial_piece"]

F32 = torch.float32
I64 = torch.int64


@dataclass(frozen=True, eq=False)
class Piece:
    """The part of a table's logical ``(vocab, dim)`` tensor that one rank holds.

    Attributes:
        listed: ``(n,) int64`` global row ids, in local-row order; ``None`` for the
            contiguous range ``row_start + arange(n)`` (made only when :attr:`rows` is read:
            a piece of a table on disk may have billions of rows).
        cols: ``[lo, hi)`` columns.
        row_start: the first row when the rows are the contiguous range ``row_start +
            arange(n)``, else ``None``.
        size: ``n``, the rows held.
    """

    listed: Tensor | None
    cols: tuple[int, int]
    row_start: int | None
    size: int = -1

    def __post_init__(self) -> None:
        if self.size < 0:
            assert self.listed is not None
            object.__setattr__(self, "size", int(self.listed.numel()))

    @classmethod
    def range(cls, start: int, stop: int, cols: tuple[int, int]) -> Piece:
        return cls(None, cols, start, stop - start)

    @cached_property
    def rows(self) -> Tensor:
        """``(n,) int64`` global row ids, in local-row order."""
        if self.listed is not None:
            return self.listed
        assert self.row_start is not None
        return torch.arange(self.row_start, self.row_start + self.size, dtype=I64)


def _initial_weight(table: ResolvedTable, seed: int, piece: Piece) -> Tensor:
    cfg, lo, hi = table.config, piece.cols[0], piece.cols[1]
    if piece.row_start is not None:
        stop = piece.row_start + piece.size
        rows = initial_rows(
            table.name, cfg.vocabulary_size, cfg.dim, cfg.initializer, seed, piece.row_start, stop
        )
        return rows[:, lo:hi]
    if cfg.initializer is not None:  # a user initializer makes the full table anyway
        full = initial_rows(table.name, cfg.vocabulary_size, cfg.dim, cfg.initializer, seed)
        return full[piece.rows, lo:hi]
    out = torch.empty(piece.size, hi - lo, dtype=F32)
    blocks = torch.div(piece.rows, BLOCK_ROWS, rounding_mode="floor")
    for block in torch.unique(blocks).tolist():  # draw only the blocks holding our rows
        start = block * BLOCK_ROWS
        stop = min(start + BLOCK_ROWS, cfg.vocabulary_size)
        drawn = initial_rows(table.name, cfg.vocabulary_size, cfg.dim, None, seed, start, stop)
        mask = blocks == block
        out[mask] = drawn[piece.rows[mask] - start, lo:hi]
    return out


def initial_piece(
    table: ResolvedTable, seed: int, piece: Piece, device: torch.device
) -> tuple[Tensor, dict[str, Tensor]]:
    """A piece's initial weight and slots: exactly its rows and columns of the full table's
    initial value (``docs/semantics.md`` §6, pitfall 27), whatever the sharding."""
    weight = _initial_weight(table, seed, piece).to(device=device, dtype=F32).contiguous()
    opt = table.optimizer
    if opt is None:
        return weight, {}
    lo, hi = piece.cols
    if opt.slot_variable_creation_fn is not None:
        cfg = table.config
        full = initial_rows(table.name, cfg.vocabulary_size, cfg.dim, cfg.initializer, seed)
        made = initial_slots(table, full)
        slots = {
            name: (value[piece.rows] if value.dim() == 1 else value[piece.rows, lo:hi])
            for name, value in made.items()
        }
    else:
        slots = slot_values(opt, piece.size, hi - lo)
    return weight, {k: v.to(device=device, dtype=F32).contiguous() for k, v in slots.items()}
