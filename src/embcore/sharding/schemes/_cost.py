"""What the planner's cost model knows about a table, and what a scheme reports for it.

Each scheme estimates one table's per-rank memory and traffic under one placement
(:meth:`Scheme.cost <embcore.sharding.schemes.Scheme.cost>`); the planner sums them. See
``docs/sharding.md`` ("Plans").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

__all__ = ["F32_BYTES", "I64_BYTES", "Cost", "PlannedTable"]

F32_BYTES, I64_BYTES = 4, 8


@dataclass(frozen=True)
class PlannedTable:
    """One table as the cost model sees it: sizes and the expected ids of one rank's step.

    Attributes:
        name, vocab, dim: the table.
        col_bytes: bytes per row and column: the weight and each element-wise slot.
        row_bytes: bytes per row: the row-wise slots.
        samples: samples per rank and step, over the table's features.
        ids: ids looked up per rank and step.
        unique: distinct ids among them (at most ``vocab``).
        element_wise: whether the optimizer keeps no row-wise slot (column shards allowed).
        dynamic: a dynamic table: ``vocab`` is the rows it is expected to hold.
        placements: the placements its row storage can hold (``"table_wise"``,
            ``"row_wise:div"``...); ``None``: every one.
        memory_of: ``(rows, cols) -> bytes per tier`` of a piece, as its row storage reports
            it (:func:`embcore.rows.planned_memory`); ``None``: float32 rows and slots in RAM.
        index_bytes: RAM per row besides (a dynamic table's key index and row metadata).
    """

    name: str
    vocab: int
    dim: int
    col_bytes: int
    row_bytes: int
    samples: float
    ids: float
    unique: float
    element_wise: bool
    dynamic: bool = False
    placements: tuple[str, ...] | None = None
    memory_of: Callable[[int, int], dict[str, int]] | None = field(default=None, compare=False)
    index_bytes: int = 0

    def tiers(self, rows: int, cols: int) -> dict[str, int]:
        """Bytes per tier (``"ram"``, ``"disk"``) of ``rows`` rows and ``cols`` columns,
        weights plus optimizer slots (and a cache's bookkeeping, a key index)."""
        if self.memory_of is not None:
            out = self.memory_of(rows, cols)
        else:
            out = {"ram": rows * (cols * self.col_bytes + self.row_bytes)}
        if self.index_bytes:
            out = {**out, "ram": out.get("ram", 0) + self.index_bytes * rows}
        return out

    def bytes(self, rows: int, cols: int) -> int:
        """Memory of ``rows`` rows and ``cols`` columns: every tier but the disk."""
        return sum(v for tier, v in self.tiers(rows, cols).items() if tier != "disk")

    @property
    def batch_message(self) -> float:
        """Bytes of the table's batch of one rank and step: offsets, ids and gains."""
        return I64_BYTES * (self.samples + 1) + (I64_BYTES + F32_BYTES) * self.ids


class Cost(NamedTuple):
    """One table's estimate under one placement, one entry per rank (bytes; per step for
    the traffic)."""

    memory: list[float]
    sent: list[float]
    received: list[float]

    @classmethod
    def zeros(cls, world: int) -> Cost:
        return cls([0.0] * world, [0.0] * world, [0.0] * world)
