"""The table-store contract: what an engine's store is built from and what it provides.

The engine (``embcore.engine``) talks to its tables only through :class:`TableStore`; the
stores (``engine/_local.py``, ``sharding/_store.py``) implement it over per-table row storage
(``embcore.rows``). It sits below the engine and every store, so that neither imports the
other. See docs/architecture.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import torch
from torch import Tensor

from embcore._comm import Comm
from embcore.config import ResolvedTable
from embcore.inputs import FeatureBatch
from embcore.ops import Backend
from embcore.optimizers.base import Optimizer
from embcore.rows import Chunks, Records, StoredTensor

if TYPE_CHECKING:
    from embcore.stats import StatsCollector, StatsTable

__all__ = ["CounterTensor", "StoreConfig", "TableStore"]


@dataclass(frozen=True, eq=False)
class StoreConfig:
    """What every store is built from (the engine resolves and validates it first).

    Attributes:
        tables: the resolved tables, in engine order (``table.index`` is the position).
        seed: seeds the default initializer.
        device: where this process keeps its tables and computes.
        backend: the kernel backend, resolved once.
        storage_dtype: the dtype of table rows (slots stay float32).
        stochastic_rounding: round half-precision rows stochastically when they are stored.
        feature_config, optimizer: as given to the engine (the sharding planner reads them).
    """

    tables: tuple[ResolvedTable, ...]
    seed: int
    device: torch.device
    backend: Backend
    storage_dtype: torch.dtype
    feature_config: Any
    optimizer: Optimizer | None
    stochastic_rounding: bool = False


class CounterTensor:
    """A 0-d counter every rank holds alike (the engine's step), as a stored tensor: each rank
    offers the whole value (a checkpoint writes one copy) and every rank reads it."""

    def __init__(self, key: str, tensor: Tensor) -> None:
        self.key, self.shape, self.dtype = key, (), tensor.dtype
        self._tensor = tensor

    def chunks(self) -> Chunks:
        return [((), self._tensor)]

    def load_chunks(self) -> Chunks:
        return [((), self._tensor)]

    def finish_load(self, chunks: Chunks) -> None:
        """Nothing to move: the load wrote into the counter itself."""


class TableStore(Protocol):
    """The tables of one engine and the work on them.

    Every method that touches the tables is called by the engine under ``torch.no_grad()``;
    for a store over several ranks each is a collective that every rank calls in the same
    order. Table ``t`` is ``tables[t]`` of the :class:`StoreConfig`; ``features[t]`` and
    ``grads[t]`` hold its features' batches and ``(S_f, dim) float32`` gradients.
    """

    #: registered name (:data:`STORES`)
    name: ClassVar[str]
    #: what checkpoints and logs call an engine over this store
    engine_name: ClassVar[str]

    @property
    def device(self) -> torch.device: ...

    @property
    def comm(self) -> Comm:
        """The ranks this store's collectives (and checkpoints) agree over."""
        ...

    @property
    def plan(self) -> Any:
        """The sharding plan (``None`` for one process)."""
        ...

    @property
    def background_updates(self) -> bool:
        """Whether a pipelined update may run on the engine's update thread."""
        ...

    def lookup(
        self,
        features: Sequence[Sequence[FeatureBatch]],
        out: Sequence[Sequence[Tensor]] | None,
        training: bool = False,
    ) -> list[list[Tensor]]:
        """For each table, one ``(S_f, dim) float32`` activation per feature (written into
        ``out``'s tensors and returned, when given). ``training``: an update of these batches
        may follow (dynamic tables count, admit and refresh their keys; an evaluation lookup
        changes nothing)."""
        ...

    def update(
        self,
        features: Sequence[Sequence[FeatureBatch]],
        grads: Sequence[Sequence[Tensor]],
        rates: Sequence[float],
        step: int,
    ) -> bool | None:
        """One optimizer step of every table (``rates[t]``: table ``t``'s learning rate;
        ``step``: 1-based count of updates, this one included). A store whose
        ``folds_finite_check`` is true (an optional attribute; absent means false) also
        takes ``check_finite=True``: then a NaN or an Inf in any gradient changes nothing,
        and it returns whether it applied the step. The engine asks for that only where no
        other rank has to agree first and the update is not deferred, instead of checking
        the gradients in a pass of its own."""
        ...

    def agree(self, error: Exception | None, non_finite: bool) -> Sequence[int]:
        """Settle a step's gradient checks on every rank before any update.

        Raises ``error`` (this rank's invalid gradient), or ``RuntimeError`` when another
        rank's was invalid; otherwise returns the ranks whose gradients hold a NaN or an Inf.
        """
        ...

    def gather(self, items: Sequence[tuple[int, str]]) -> list[Tensor]:
        """Full logical tensors of ``(table index, "weight" or slot name)``: the live tensors
        for a local store, gathered copies for a sharded one."""
        ...

    def load_full(self, items: Sequence[tuple[int, str, Tensor]]) -> None:
        """Copy full logical tensors (``(table index, name, tensor)``) into the store."""
        ...

    def shape(self, table: int, name: str) -> tuple[int, ...]:
        """The logical shape of a table's ``weight`` or slot."""
        ...

    def records(self, table: int) -> Records:
        """How table ``table`` is persisted, as its row storage says (``"tensors"``: by
        :meth:`tensors` and :meth:`gather` / :meth:`load_full`; ``"keyed"``: by
        :meth:`dynamic_state` / :meth:`load_dynamic_state`)."""
        ...

    def flush_before_training_lookup(self) -> bool:
        """Whether a pipelined update must be applied before the next training lookup (a
        row storage's step end may evict rows the lookup would map to)."""
        ...

    def tensors(self) -> list[StoredTensor]:
        """Every ``"tensors"``-records table's stored tensors, in checkpoint order (no
        communication)."""
        ...

    def table_keys(self, table: int) -> Tensor:
        """``(R,) int64`` ascending: the keys holding a row in keyed table ``table`` (on any
        rank: a collective for a sharded store)."""
        ...

    def table_rows(self, table: int, keys: Tensor) -> Tensor:
        """``(N, dim) float32`` rows of ``keys: (N,) int64`` in keyed table ``table``, zeros
        without a row; inserts, counts and refreshes nothing."""
        ...

    def table_info(self, table: int) -> dict[str, int]:
        """Keyed table ``table``'s counters (``EmbeddingEngine.table_info``)."""
        ...

    def dynamic_state(self, table: int) -> dict[str, Any]:
        """Keyed table ``table``'s whole content (:meth:`embcore.rows.RowStore.content`),
        every rank's keys for a sharded store."""
        ...

    def load_dynamic_state(self, table: int, state: dict[str, Any]) -> None:
        """Replace keyed table ``table``'s content with a :meth:`dynamic_state`."""
        ...

    def stats_tables(self) -> list[StatsTable]:
        """The tables as lookup statistics record them (with this rank's load)."""
        ...

    def write_statistics(self, stats: StatsCollector) -> list[Path]:
        """Write the statistics collected (every rank's, for a sharded store)."""
        ...

    def describe(self, tables: str) -> str:
        """The engine's ``repr`` details around the description of its ``tables``."""
        ...

    def close(self) -> None:
        """Release the files and locks the row storages hold (``EmbeddingEngine.close``;
        no communication)."""
        ...
