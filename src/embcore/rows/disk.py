"""Rows on local disk behind a bounded RAM cache of rows: the ``"disk"`` row storage.

A table with ``storage=ec.DiskStorage(directory, cache_bytes)`` gets this kind. Each call
maps the table's ids to slots of its cache (:class:`~embcore.disk.table.DiskTable` reads the
rows not cached and writes back the changed rows it evicts), and the ordinary fused kernels
run on the cache's tensors, so the numbers are those of the in-memory table, bit for bit,
whatever the cache size. A checkpoint reads and writes the table as boxes of rows, one at a
time (:class:`DiskTensor`). See docs/disk_tables.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor, nn

from embcore import ops
from embcore._lazy_box import LazyBox
from embcore.config import ResolvedTable
from embcore.disk.placement import PLACEMENTS, piece_fits, planned_memory, rank_storage
from embcore.disk.table import DiskTable, row_shapes
from embcore.inputs import FeatureBatch
from embcore.rows._contract import Chunks, Records, RowEnv, stored_names
from embcore.rows._mapped import split_mapped
from embcore.rows._piece import Piece

__all__ = ["DiskRows", "DiskTensor"]


class DiskRows(nn.Module):
    """A fixed table's rows in its ``DiskStorage`` directory, a bounded cache of them in RAM.

    The cache's tensors are not buffers: device moves and dtype casts leave them (disk
    tables live on the CPU, in float32), and nothing goes through ``state_dict``.
    """

    kind: ClassVar[str] = "disk"
    records: ClassVar[Records] = "tensors"
    #: a sharded store hands checkpoints this kind's boxes, read or written one at a time
    streams_boxes: ClassVar[bool] = True

    #: the placements of a sharding plan whose pieces it holds (``embcore.sharding``)
    placements: ClassVar[tuple[str, ...]] = PLACEMENTS

    def __init__(
        self, table: ResolvedTable, env: RowEnv, piece: Piece | None = None, **part: Any
    ) -> None:
        super().__init__()
        if part or (piece is not None and not piece_fits(piece, table)):
            raise ValueError(
                f"table '{table.name}': a table in DiskStorage holds whole rows of a contiguous "
                f"range on each rank; a sharding plan may place it only {list(PLACEMENTS)}"
            )
        if env.device.type != "cpu" or env.storage_dtype != torch.float32:
            raise ValueError(
                f"table '{table.name}': DiskStorage needs a CPU engine with float32 rows, got "
                f"device={env.device}, storage_dtype={env.storage_dtype}"
            )
        self.table = table
        storage = rank_storage(table.storage, env.rank, sharded=piece is not None)
        rows = None if piece is None else piece.size
        first = 0 if piece is None else int(piece.row_start or 0)
        self.disk = DiskTable(table, storage, env.seed, storage.cache_bytes, rows, first)
        self._state: ops.TableState | None = None
        self.closed = False
        self.steps = 0  #: training steps ended (the lookup statistics' denominator)

    @classmethod
    def planned_memory(cls, table: ResolvedTable, rows: int, cols: int) -> dict[str, int]:
        """:meth:`memory` of a piece of ``rows`` rows before it is built, once all its rows
        were written (``cols`` is the table's dim: pieces hold whole rows)."""
        return planned_memory(table, rows)

    @property
    def flush_before_training_lookup(self) -> bool:
        return False  # an update finds its rows again, wherever the lookups between put them

    # ------------------------------------------------------------------ the step
    def reserve(self, occurrences: int) -> None:
        """Nothing to reserve: a call with more rows than the cache holds grows it for the
        step (``overflow_rows``)."""

    def map(self, batches: Sequence[FeatureBatch], training: bool) -> list[FeatureBatch]:
        return self._map(batches, changed=False)

    def for_update(self, batches: Sequence[FeatureBatch]) -> list[FeatureBatch]:
        """The batches' cache slots, read again if a lookup since evicted them (pipelined
        training); those rows are marked changed."""
        return self._map(batches, changed=True)

    def _map(self, batches: Sequence[FeatureBatch], changed: bool) -> list[FeatureBatch]:
        self._check_open()
        if not batches or sum(b.values.numel() for b in batches) == 0:
            return list(batches)
        flat = np.concatenate([b.values.cpu().numpy() for b in batches])
        unique, inverse = np.unique(flat, return_inverse=True)
        return split_mapped(batches, self.disk.slots(unique, changed)[inverse.reshape(-1)])

    def state(self) -> ops.TableState:
        self._state = cache_state(self.table, self.disk, self._state)
        return self._state

    def end_step(self) -> None:
        self.disk.end_step()
        self.steps += 1

    def prefetch(self, batches: Sequence[FeatureBatch]) -> None:
        """Start reading the rows of a batch prepared ahead (``EmbeddingEngine.prepare``)."""
        if batches:
            self.disk.prefetch(np.concatenate([b.values.cpu().numpy() for b in batches]))

    # ------------------------------------------------------------------ reading
    def shape(self, name: str) -> tuple[int, ...]:
        return self.disk.shape(name)

    def read(self, name: str) -> Tensor:
        """A copy of the whole ``weight`` or slot (the table in memory, once)."""
        return torch.cat([self.disk.read_range(a, b)[name] for a, b in self.disk.ranges()])

    def write(self, name: str, value: Tensor) -> None:
        self.disk.load_part(name, value)

    def keys(self) -> Tensor | None:
        return None

    def rows(self, ids: Tensor) -> Tensor:
        return self.disk.peek(ids.cpu().numpy())["weight"]

    def info(self) -> dict[str, int]:
        return self.disk.info()

    def cache_counters(self) -> dict[str, int]:
        """Counts since the engine was made, for the lookup statistics (:func:`disk_counters`)."""
        return disk_counters(self.disk, self.steps)

    def rows_held(self) -> int | None:
        return None

    def memory(self) -> dict[str, int]:
        return {"ram": self.disk.cache.nbytes, "disk": self.disk.file.disk_bytes}

    # ------------------------------------------------------------------ closing
    def close(self) -> None:
        """Release the working file and its lock now (``EmbeddingEngine.close``): another
        engine may then use the directory. The rows are gone: save a checkpoint first."""
        if not self.closed:
            self.closed = True
            self.disk.close()

    def _check_open(self) -> None:
        if self.closed:
            raise closed_error(self.table.name, self.disk)

    # ------------------------------------------------------------------ persisting
    def tensors(self) -> list[DiskTensor]:
        return [DiskTensor(self.disk, name) for name in stored_names(self.table)]

    def content(self) -> dict[str, Any]:
        raise ValueError(f"table '{self.table.name}' is persisted as tensors, not by key")

    def load_content(self, state: dict[str, Any]) -> None:
        raise ValueError(f"table '{self.table.name}' is persisted as tensors, not by key")

    def _save_to_state_dict(self, destination: dict, prefix: str, keep_vars: bool) -> None:
        """Nothing: the engine writes the tables under its own keys."""

    def _load_from_state_dict(self, *args: Any, **kwargs: Any) -> None:
        """Nothing: the engine loads the tables from its own keys."""


class DiskTensor:
    """``weight`` or one slot of a disk table as a checkpoint sees it: boxes of rows, each
    read from the table when the checkpoint writes it and written to the table as soon as a
    load has filled it (:class:`~embcore._lazy_box.LazyBox`), one at a time."""

    def __init__(self, disk: DiskTable, name: str) -> None:
        self.key = f"{disk.table.name}.{name}"
        self.shape, self.dtype = disk.shape(name), torch.float32
        self._disk, self._name = disk, name

    def _boxes(self, load: bool) -> Chunks:
        disk, name, tail = self._disk, self._name, (0,) * (len(self.shape) - 1)
        boxes = []
        for a, b in disk.ranges():
            shape = (b - a, *row_shapes(disk.table)[name])
            if load:
                box = LazyBox(shape, self.dtype, write=lambda v, a=a: disk.load_part(name, v, a))
            else:
                box = LazyBox(shape, self.dtype, read=lambda a=a, b=b: disk.read_range(a, b)[name])
            boxes.append(((a, *tail), box))
        return boxes  # type: ignore[return-value]

    def chunks(self) -> Chunks:
        return self._boxes(load=False)

    def load_chunks(self) -> Chunks:
        self._disk.wait_prefetch()  # rows read ahead of the load are stale after it
        return self._boxes(load=True)

    def finish_load(self, chunks: Chunks) -> None:
        """Nothing to move: each box was written to the table when it was filled."""

    # the rows a delta checkpoint holds (:class:`embcore.rows.TouchedRows`)
    def touched_since(self, checkpoint: str) -> np.ndarray | None:
        touched = self._disk.touched
        return touched.ids() if touched is not None and touched.since == checkpoint else None

    def read_rows(self, ids: np.ndarray) -> Tensor:
        return self._disk.peek(ids)[self._name]

    def checkpointed(self, checkpoint: str | None) -> None:
        if self._disk.touched is not None:
            self._disk.touched.reset(checkpoint)


def disk_counters(disk: DiskTable, steps: int) -> dict[str, int]:
    """A disk table's counts for the lookup statistics: ``steps`` ended, cache ``hits`` and
    ``misses`` (distinct ids of lookups), and ``rows_read``, ``bytes_read``, ``rows_written``,
    ``bytes_written`` of its working file."""
    size, io = disk.file.record_bytes, disk.io
    return {
        "steps": steps,
        "hits": disk.cache.stats["hits"],
        "misses": disk.cache.stats["misses"],
        "rows_read": io["rows_read"],
        "bytes_read": io["rows_read"] * size,
        "rows_written": io["rows_written"],
        "bytes_written": io["rows_written"] * size,
    }


def closed_error(table: str, disk: DiskTable) -> RuntimeError:
    """The error of a step on a table whose engine was closed (``EmbeddingEngine.close``)."""
    return RuntimeError(
        f"table '{table}': its engine was closed (the working file in "
        f"{disk.file.directory} is released); make a new engine and load a checkpoint into it"
    )


def cache_state(
    table: ResolvedTable, disk: DiskTable, state: ops.TableState | None
) -> ops.TableState:
    """The kernels' view of a disk table's cache: ``state`` while the cache keeps its tensors,
    a new one after it replaced them (it grew for an oversized step)."""
    t = disk.cache.tensors
    if state is None or state.weight is not t["weight"]:
        slots = {n: v for n, v in t.items() if n != "weight"}
        state = ops.TableState(table.name, t["weight"], slots, table.optimizer)
    return state
