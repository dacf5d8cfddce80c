"""Dense rows: a table's (or a shard's piece's) rows in one tensor, ids are row numbers.

The kind of every fixed table (``vocabulary_size`` set, no ``storage``): ``weight`` is
``(rows, dim)`` in the storage dtype, each slot ``(rows, dim)`` or ``(rows,)`` float32, and an
id is its row (``map`` is the identity). A one-process engine holds the whole table; a
sharded one a :class:`~embcore.rows._piece.Piece` (its rows and columns of the logical
table, with exactly their initial values). Persisted as fixed-shape tensors.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import numpy as np
from torch import Tensor

from embcore.config import ResolvedTable
from embcore.initializers import initial_rows, initial_slots
from embcore.inputs import FeatureBatch
from embcore.rows._contract import Chunks, Records, RowEnv
from embcore.rows._module import RowModule
from embcore.rows._piece import Piece, initial_piece

__all__ = ["DenseRows", "DenseTensor"]


class DenseTensor:
    """A stored tensor of dense rows held whole: one chunk at offset 0, loaded in place."""

    def __init__(self, key: str, tensor: Tensor) -> None:
        self.key = key
        self.shape = tuple(tensor.shape)
        self.dtype = tensor.dtype
        self._tensor = tensor

    def chunks(self) -> Chunks:
        return [((0,) * len(self.shape), self._tensor)]

    def load_chunks(self) -> Chunks:
        return self.chunks()

    def finish_load(self, chunks: Chunks) -> None:
        """Nothing to move: the load wrote into the table itself."""


class DenseRows(RowModule):
    """A fixed table's rows, or a piece of them, in memory (see the module docstring).

    Args:
        table: the resolved table.
        env: seed, device, storage dtype, stochastic rounding.
        piece: the rows and columns held (``None``: the whole table, slots from the
            optimizer's ``slot_variable_creation_fn`` when it has one).
    """

    kind: ClassVar[str] = "dense"
    records: ClassVar[Records] = "tensors"
    flush_before_training_lookup: ClassVar[bool] = False

    def __init__(self, table: ResolvedTable, env: RowEnv, piece: Piece | None = None) -> None:
        super().__init__(table, env.stochastic_rounding)
        self.piece = piece
        cfg = table.config
        if piece is None:
            weight = initial_rows(
                table.name, cfg.vocabulary_size, cfg.dim, cfg.initializer, env.seed
            ).to(device=env.device, dtype=env.storage_dtype)
            slots = initial_slots(table, weight)
        else:
            weight, slots = initial_piece(table, env.seed, piece, env.device)
            weight = weight.to(env.storage_dtype)
        self.put("weight", weight)
        for name in self.slot_names:
            self.put(name, slots[name])

    @classmethod
    def planned_memory(cls, table: ResolvedTable, rows: int, cols: int) -> dict[str, int]:
        """:meth:`memory` of a piece of ``rows`` x ``cols`` before it is built: float32
        weights and slots (the GPU's memory for a CUDA engine, counted as ``"ram"``)."""
        specs = table.optimizer.slot_specs() if table.optimizer else ()
        element = sum(not s.rowwise for s in specs)
        return {"ram": rows * 4 * (cols * (1 + element) + sum(s.rowwise for s in specs))}

    # ------------------------------------------------------------------ the step
    def reserve(self, batches: Sequence[FeatureBatch]) -> None:
        """Nothing: every row exists."""

    def map(self, batches: Sequence[FeatureBatch], training: bool) -> list[FeatureBatch]:
        return list(batches)

    def for_update(self, batches: Sequence[FeatureBatch]) -> list[FeatureBatch]:
        return list(batches)

    def end_step(self) -> None:
        """Nothing happens between steps."""

    # ------------------------------------------------------------------ reading
    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.tensor(name).shape)

    def read(self, name: str) -> Tensor:
        return self.tensor(name)

    def write(self, name: str, value: Tensor) -> None:
        self.tensor(name).copy_(value)

    def keys(self) -> None:
        return None

    def rows(self, ids: Tensor) -> Tensor:
        weight = self.tensor("weight")
        return weight.index_select(0, ids.to(weight.device)).float()

    def info(self) -> dict[str, int]:
        return {"rows": self.tensor("weight").shape[0]}

    def rows_held(self) -> None:
        return None

    # ------------------------------------------------------------------ persisting
    def tensors(self) -> list[DenseTensor]:
        return [
            DenseTensor(f"{self.table.name}.{name}", self.tensor(name))
            for name in ("weight", *self.slot_names)
        ]

    def content(self) -> dict[str, np.ndarray | Tensor]:
        raise ValueError(
            f"table '{self.table.name}' has dense rows: they are persisted as tensors "
            "(tensors()), not as content by key"
        )

    def load_content(self, state: dict) -> None:
        self.content()
