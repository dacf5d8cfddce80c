"""The row-storage contract: what one kind of row storage provides to the stores above it.

A *row storage* holds one table's rows and optimizer slots on this process (the whole table
for a one-process engine, this rank's piece or key shard for a sharded one) and decides how
they are held: dense in memory, keyed (a key index in front of growable rows), on disk behind
a RAM cache. The stores (``engine/_local.py``, ``sharding/_store.py``) compose row storages
and run the kernels (``embcore.ops``) on the :class:`~embcore.ops.TableState` each exposes;
checkpoints, the state dict and serving ask the row storage what it holds, never what kind
of table it is. See docs/architecture.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Protocol, runtime_checkable

import numpy as np
import torch
from torch import Tensor

from embcore import ops
from embcore.config import ResolvedTable
from embcore.inputs import FeatureBatch

__all__ = [
    "Chunks",
    "Records",
    "RowEnv",
    "RowStore",
    "StoredTensor",
    "TouchedRows",
    "stored_names",
    "whole_tensor_error",
]

#: ``(offsets, tensor)`` boxes of a logical tensor: ``tensor`` sits at ``offsets`` in it.
Chunks = list[tuple[tuple[int, ...], Tensor]]

#: How a row storage is persisted (checkpoints, state dicts):
#: ``"tensors"``: fixed-shape logical tensors (``weight``, slots), written as chunks and
#: resharded N -> M ranks (:meth:`RowStore.tensors`); ``"keyed"``: a content dict by
#: ascending key (:meth:`RowStore.content`), of which a delta checkpoint writes the rows
#: touched since its base.
Records = Literal["tensors", "keyed"]


def stored_names(table: ResolvedTable) -> list[str]:
    """``weight`` and the table's optimizer slots, in checkpoint order."""
    opt = table.optimizer
    return ["weight"] + ([s.name for s in opt.slot_specs()] if opt else [])


@dataclass(frozen=True)
class RowEnv:
    """What every row storage is built from, besides its table.

    Attributes:
        seed: the engine's seed (default initial values depend on it, the table's name and
            the row or key only).
        device: where the rows the kernels read live (a deeper tier may live elsewhere).
        storage_dtype: the dtype of ``weight`` rows (slots stay float32).
        stochastic_rounding: round half-precision rows stochastically when stored.
        rank: this process's rank in a sharded engine (0 alone): a kind that keeps files
            gives each rank its own.
    """

    seed: int
    device: torch.device
    storage_dtype: torch.dtype = torch.float32
    stochastic_rounding: bool = False
    rank: int = 0


class StoredTensor(Protocol):
    """One logical tensor as a checkpoint sees it (``"tensors"`` records).

    ``key`` is the state-dict key (``{table}.weight``, ``{table}.{slot}``), ``shape`` the
    logical shape (the whole table's), ``dtype`` how it is stored. A local tensor is one chunk
    at offset 0; a sharded one is the boxes this rank holds; a tier that does not hold the
    whole tensor in memory may hand out several boxes, read one at a time.
    """

    key: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    def chunks(self) -> Chunks:
        """The boxes this rank writes; together the ranks' boxes cover the tensor once (a
        whole tensor that every rank holds alike may be offered by each: it is written once).
        May communicate: every rank calls it, for every tensor, in the same order."""
        ...

    def load_chunks(self) -> Chunks:
        """The boxes a load fills on this rank (may communicate, like :meth:`chunks`)."""
        ...

    def finish_load(self, chunks: Chunks) -> None:
        """Move the boxes :meth:`load_chunks` returned, now filled, into place."""
        ...


class TouchedRows(Protocol):
    """What a :class:`StoredTensor` may also offer so that a delta checkpoint holds only
    the rows written since its base (a fixed table in ``DiskStorage`` does): without it, a
    delta writes the tensor whole."""

    def touched_since(self, checkpoint: str) -> np.ndarray | None:
        """``(K,) int64`` ascending: the rows written since the checkpoint whose manifest's
        sha256 is ``checkpoint``; ``None`` when the tensor is not known to have equalled it."""
        ...

    def read_rows(self, ids: np.ndarray) -> Tensor:
        """``(K, ...)``: the current values of rows ``ids``."""
        ...

    def checkpointed(self, checkpoint: str | None) -> None:
        """A save or load of the checkpoint ``checkpoint`` (its manifest's sha256) just
        finished: the tensor equals it (``None``: no checkpoint is known to equal it)."""
        ...


@runtime_checkable
class RowStore(Protocol):
    """One table's rows and optimizer slots on this process, and the work on them.

    *Ids* are what a store hands the row storage for the table: local row numbers
    ``[0, rows)`` of a dense table or piece (``rows``: the table's vocabulary size, or the
    piece's rows), or int64 keys of a keyed table. *Slots* are the row numbers of the tensors
    in :meth:`state`, which the kernels index. The step, in the order a store calls it::

        reserve(batches)      training lookups only: room for the batches' new ids, before
                              any table of the step changes (may raise, changing nothing)
        map(batches, train)   ids -> slots: counting, admitting, fetching into a cache,
                              refreshing, where the kind does; the kernels then read state()
        for_update(batches)   the slots the batches' training lookup gave them (a slot that
                              no longer holds its id: the kind's drop slot, gradient dropped)
        [ops.update on state()]
        end_step()            after the update: eviction, write-back, resetting a drop slot

    All methods are called under ``torch.no_grad()``; none communicates (a sharded store does
    the collectives). A kind is a ``torch.nn.Module`` whose tensors are buffers (so device
    moves and ``share_memory`` reach them through the local store) and saves nothing through
    ``state_dict`` itself (the engine writes its state dict from :meth:`tensors` /
    :meth:`content`).

    Attributes:
        kind: the registered name (``embcore.rows.ROWS``).
        records: how it is persisted (:data:`Records`).
        table: the resolved table.
        flush_before_training_lookup: a pipelined update must be applied before the next
            training lookup (its :meth:`end_step` may evict or reuse slots the lookup maps to).
    """

    kind: ClassVar[str]
    records: ClassVar[Records]
    table: ResolvedTable

    @property
    def flush_before_training_lookup(self) -> bool: ...

    # ------------------------------------------------------------------ the step
    def reserve(self, batches: Sequence[FeatureBatch]) -> None:
        """Make room for a training lookup of ``batches`` (the ids :meth:`map` will get):
        rows, slots and index space for the ids that may be new. Changes no visible state;
        raises ``MemoryError`` naming the table otherwise."""
        ...

    def map(self, batches: Sequence[FeatureBatch], training: bool) -> list[FeatureBatch]:
        """The table's batches for one step (every feature's, one call per lookup) with
        ``values: (N,) int64`` ids replaced by slots of :meth:`state`; offsets, weights and
        combiner unchanged. ``training``: an update may follow (the kind may count, admit,
        initialise and refresh); an evaluation lookup changes nothing."""
        ...

    def for_update(self, batches: Sequence[FeatureBatch]) -> list[FeatureBatch]:
        """The slots the update of ``batches`` (original ids, as looked up) writes."""
        ...

    def state(self) -> ops.TableState:
        """The tensors the fused kernels read and write, by slot: ``weight (slots, dim)``
        in the storage dtype, each optimizer slot ``(slots, dim)`` or ``(slots,)`` float32.
        The same object while the tensors are the same (backends cache work on it)."""
        ...

    def end_step(self) -> None:
        """After the step's update: eviction, write-back, whatever the kind does per step."""
        ...

    # ------------------------------------------------------------------ reading
    def shape(self, name: str) -> tuple[int, ...]:
        """The logical shape of ``weight`` or a slot (a keyed kind: ``(keys held, ...)``)."""
        ...

    def read(self, name: str) -> Tensor:
        """The whole logical ``weight`` or slot: the live tensor where the kind holds it so
        (writes to it write the table), else a copy (a keyed kind: rows by ascending key)."""
        ...

    def write(self, name: str, value: Tensor) -> None:
        """Copy a whole logical tensor in (``"tensors"`` records; a keyed kind raises
        ``ValueError`` naming the table: its rows load with their keys)."""
        ...

    def keys(self) -> Tensor | None:
        """``(R,) int64`` ascending: the keys holding a row; ``None`` for a kind without keys."""
        ...

    def rows(self, ids: Tensor) -> Tensor:
        """``(N, dim) float32`` rows of ``ids: (N,) int64``; zeros for a key without a row.
        Inserts, counts and refreshes nothing."""
        ...

    def info(self) -> dict[str, int]:
        """The kind's counters (a keyed kind: ``rows``, ``pending``, ``dropped_gradients``,
        ``step``), as ``EmbeddingEngine.table_info`` reports them."""
        ...

    def rows_held(self) -> int | None:
        """Rows held now, for statistics (``None``: the fixed vocabulary)."""
        ...

    def memory(self) -> dict[str, int]:
        """Bytes held per tier: ``{"ram": ...}``, ``{"gpu": ...}``, ``{"disk": ...}``."""
        ...

    # ------------------------------------------------------------------ persisting
    def tensors(self) -> list[StoredTensor]:
        """``"tensors"`` records: ``weight`` then each slot (keys ``{table}.{name}``), in
        checkpoint order; ``[]`` for a ``"keyed"`` kind."""
        ...

    def content(self) -> dict[str, np.ndarray | Tensor]:
        """``"keyed"`` records: ``step``, ``keys (R,) int64`` ascending, ``freq``,
        ``last_seen`` and ``pending/...`` arrays, ``weight`` and each slot ``(R, ...)`` in key
        order: the table's whole content (a checkpoint delta writes the rows that changed)."""
        ...

    def load_content(self, state: dict[str, Any]) -> None:
        """Replace the content with a :meth:`content` (checked first: a ``ValueError``
        naming the table and the part leaves everything unchanged)."""
        ...


def whole_tensor_error(table: str) -> ValueError:
    """The refusal of writing a keyed table's rows as one tensor (they load with their keys)."""
    return ValueError(
        f"table '{table}' is dynamic: its rows are loaded with their keys "
        "(load_dynamic_state), not as a whole tensor"
    )
