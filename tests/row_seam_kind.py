"""A row-storage kind written outside embcore, for the tests of the row-storage seam.

:class:`ReversedRows` holds a table's rows (or a shard's piece) upside down: id ``i`` lives in
slot ``n - 1 - i``. So nothing works unless every layer goes through the ``RowStore``
contract: the stores must map ids to slots before the kernels, checkpoints and state dicts
must read and write whole tensors through it, serving must read its snapshot. It counts the
calls it gets. :func:`use` registers it and picks it for the tables named (the one
registration, and the one place a kind is chosen).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from embcore import ops, rows
from embcore.config import ResolvedTable
from embcore.initializers import initial_rows, initial_slots
from embcore.inputs import FeatureBatch
from embcore.rows import _registry
from embcore.rows._piece import Piece, initial_piece

KIND = "reversed"


class _Stored:
    """A logical tensor of :class:`ReversedRows`: saved from a copy, loaded through staging."""

    def __init__(self, rows: ReversedRows, name: str) -> None:
        self.key, self._rows, self._name = f"{rows.table.name}.{name}", rows, name
        self.shape = rows.shape(name)
        self.dtype = rows.read(name).dtype

    def chunks(self) -> list[tuple[tuple[int, ...], Tensor]]:
        return [((0,) * len(self.shape), self._rows.read(self._name))]

    def load_chunks(self) -> list[tuple[tuple[int, ...], Tensor]]:
        return [((0,) * len(self.shape), torch.empty(self.shape, dtype=self.dtype))]

    def finish_load(self, chunks: list[tuple[tuple[int, ...], Tensor]]) -> None:
        self._rows.write(self._name, chunks[0][1])


class ReversedRows(nn.Module):
    """Dense rows stored upside down (see the module docstring)."""

    kind: ClassVar[str] = KIND
    records: ClassVar[rows.Records] = "tensors"
    flush_before_training_lookup: ClassVar[bool] = False
    calls: ClassVar[dict[str, int]] = {"map": 0, "for_update": 0, "end_step": 0}

    def __init__(self, table: ResolvedTable, env: rows.RowEnv, piece: Piece | None = None):
        super().__init__()
        self.table = table
        if piece is None:
            cfg = table.config
            w = initial_rows(table.name, cfg.vocabulary_size, cfg.dim, cfg.initializer, env.seed)
            slots = initial_slots(table, w)
        else:
            w, slots = initial_piece(table, env.seed, piece, env.device)
        self.names = ["weight", *slots]
        self.data = {n: v.flip(0).contiguous() for n, v in [("weight", w), *slots.items()]}
        self._state = ops.TableState(
            table.name, self.data["weight"], {n: self.data[n] for n in self.names[1:]},
            table.optimizer,
        )  # fmt: skip

    def _flip(self, batches: Sequence[FeatureBatch]) -> list[FeatureBatch]:
        n = self.data["weight"].shape[0]
        return [dataclasses.replace(b, values=n - 1 - b.values) for b in batches]

    def reserve(self, batches: Sequence[FeatureBatch]) -> None:
        pass

    def map(self, batches: Sequence[FeatureBatch], training: bool) -> list[FeatureBatch]:
        ReversedRows.calls["map"] += 1
        return self._flip(batches)

    def for_update(self, batches: Sequence[FeatureBatch]) -> list[FeatureBatch]:
        ReversedRows.calls["for_update"] += 1
        return self._flip(batches)

    def state(self) -> ops.TableState:
        return self._state

    def end_step(self) -> None:
        ReversedRows.calls["end_step"] += 1

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.data[name].shape)

    def read(self, name: str) -> Tensor:
        return self.data[name].flip(0)

    def write(self, name: str, value: Tensor) -> None:
        self.data[name].copy_(value.flip(0))

    def keys(self) -> None:
        return None

    def rows(self, ids: Tensor) -> Tensor:
        weight = self.data["weight"]
        return weight[weight.shape[0] - 1 - ids].float()

    def info(self) -> dict[str, int]:
        return {"rows": self.data["weight"].shape[0]}

    def rows_held(self) -> None:
        return None

    def memory(self) -> dict[str, int]:
        return {"ram": sum(t.numel() * t.element_size() for t in self.data.values())}

    def tensors(self) -> list[_Stored]:
        return [_Stored(self, n) for n in self.names]

    def content(self) -> dict[str, Any]:
        raise ValueError("ReversedRows are persisted as tensors")

    def load_content(self, state: dict[str, Any]) -> None:
        raise ValueError("ReversedRows are persisted as tensors")


def use(tables: Sequence[str]) -> Any:
    """Register :class:`ReversedRows` and choose it for ``tables``; returns the previous
    ``kind_of``, which :func:`restore` puts back."""
    rows.register(KIND, ReversedRows)
    before = _registry.kind_of

    def kind_of(table: ResolvedTable) -> str:
        return KIND if table.name in tables else before(table)

    _registry.kind_of = kind_of
    return before


def restore(before: Any) -> None:
    _registry.kind_of = before
    rows.ROWS.pop(KIND, None)
