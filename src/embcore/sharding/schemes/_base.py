"""The interface of a sharding scheme: its plan-format rules, its cost, and its step protocol.

A scheme owns everything about one way of placing a table: which :class:`TableShard` fields it
takes and how they are checked, the placements the planner may try and the overrides it
parses, its memory and traffic estimate, which ranks serve a lookup, and, at run time, one
table's pieces on this rank and its part of each step (``input_dist -> lookup -> output_dist``
forward, ``grad_dist -> update`` backward). Design and the per-scheme tables:
``docs/sharding.md``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor

from embcore import ops
from embcore._comm import Comm, Exchange, Inbox, Reducer
from embcore.config import ResolvedTable
from embcore.inputs import FeatureBatch
from embcore.rows import RowEnv, RowStore, make_rows
from embcore.rows._piece import Piece
from embcore.sharding._wire import F32
from embcore.sharding.schemes._cost import Cost, PlannedTable

__all__ = ["Scheme", "Shard", "ShardDict", "ShardEnv", "UpdateJob", "is_dynamic", "served_by"]

#: A placement in the plan format's dict form (``TableShard.to_dict()``), as the planning
#: methods return it: the planner turns it into a ``TableShard``.
ShardDict = dict[str, Any]


class Shard(Protocol):
    """What a scheme reads of a placement: a :class:`~embcore.sharding.plan.TableShard`
    (declared here so that the schemes do not depend on the plan format built on them)."""

    @property
    def scheme(self) -> str: ...
    @property
    def ranks(self) -> tuple[int, ...]: ...
    @property
    def partition_strategy(self) -> str | None: ...
    @property
    def column_sizes(self) -> tuple[int, ...] | None: ...
    def column_bounds(self, dim: int) -> list[tuple[int, int]]: ...


@dataclass(frozen=True)
class ShardEnv:
    """Where the schemes run: the process group, the device, the seed and the backend."""

    comm: Comm
    device: torch.device
    seed: int
    backend: str
    storage_dtype: torch.dtype = F32  # of the weights; slots are float32
    stochastic_rounding: bool = False


@dataclass(frozen=True, eq=False)
class UpdateJob:
    """One table shard's share of the step's single ``ops.update`` call."""

    state: ops.TableState
    features: list[FeatureBatch]
    grads: list[Tensor]
    lr_table: int  # index of the table, whose learning rate applies


def is_dynamic(table: ResolvedTable) -> bool:
    """Whether ``table`` is a dynamic table (``vocabulary_size=None``: any int64 key)."""
    return table.config.vocabulary_size is None


def served_by(ranks: list[int], world_size: int) -> Callable[[np.ndarray], np.ndarray]:
    """A load function where each of ``ranks`` serves every id looked up."""
    owners = np.asarray(ranks, dtype=np.int64)

    def load(ids: np.ndarray) -> np.ndarray:
        out = np.zeros(world_size, dtype=np.int64)
        out[owners] = ids.size
        return out

    return load


class Scheme(ABC):
    """One way of placing a table; an instance is one table's pieces on this rank.

    Subclasses set :attr:`scheme` and :attr:`shard_fields`, define :meth:`piece` (who holds
    what), the step protocol, and the planning class methods :meth:`candidates`,
    :meth:`parse_override`, :meth:`cost` and :meth:`lookup_load`. ``ctx`` is the scheme's own
    record of one forward (from :meth:`input_dist`) or one backward (from :meth:`grad_dist`),
    handed to the later phases of the same pass.
    """

    #: The scheme's name in plans (``TableShard.scheme``).
    scheme: ClassVar[str]
    #: The optional :class:`TableShard` fields it takes (others must be ``None``).
    shard_fields: ClassVar[tuple[str, ...]] = ()
    #: Whether it places dynamic tables (``vocabulary_size=None``) instead of fixed ones.
    dynamic: ClassVar[bool] = False
    #: Whether a pipelined update must be applied before the next training lookup.
    flush_before_training_lookup: bool = False

    # ------------------------------------------------------------ the plan format
    @classmethod  # noqa: B027
    def check_shard(cls, owner: str, shard: Shard) -> None:
        """Raise ``ValueError`` (prefixed by ``owner``) unless ``shard``'s ranks and fields
        suit this scheme. ``ranks`` are already distinct ints."""

    @classmethod  # noqa: B027
    def check_in_plan(cls, table: str, shard: Shard, world_size: int) -> None:
        """Raise ``ValueError`` unless ``shard`` may place ``table`` in a plan for
        ``world_size`` ranks (its ranks are already inside the world)."""

    @classmethod  # noqa: B027
    def check_table(cls, shard: Shard, table: ResolvedTable) -> None:
        """Raise ``ValueError`` unless ``shard`` suits the table (dim, optimizer)."""

    @classmethod
    @abstractmethod
    def describe(cls, shard: Shard) -> str:
        """Short human form of a placement: ``row_wise(div) on 0,1``."""

    # ------------------------------------------------------------------ planning
    @classmethod
    @abstractmethod
    def candidates(cls, t: PlannedTable, world: int, min_column_width: int) -> list[ShardDict]:
        """The placements of this scheme the planner tries for ``t`` on ``world`` ranks."""

    @classmethod
    @abstractmethod
    def parse_override(cls, arg: str, t: PlannedTable, world: int) -> list[ShardDict] | None:
        """The placements an override ``"<scheme>:<arg>"`` allows (``arg`` may be empty), or
        ``None`` if this scheme does not take ``arg``."""

    @classmethod
    @abstractmethod
    def cost(cls, t: PlannedTable, shard: Shard, world: int) -> Cost:
        """Per-rank memory and per-step traffic of ``t`` placed by ``shard``, following the
        scheme's protocol."""

    @classmethod
    @abstractmethod
    def lookup_load(
        cls, shard: Shard, vocabulary_size: int, world_size: int, rank: int
    ) -> Callable[[np.ndarray], np.ndarray]:
        """The load function of one table on rank ``rank``: ``ids (N,) int64 -> (world_size,)
        int64`` id occurrences each rank serves when ``rank`` looks up ``ids`` (what the
        lookup statistics record as ``shard_load``)."""

    # ------------------------------------------------------------------- runtime
    def __init__(self, table: ResolvedTable, shard: Shard, env: ShardEnv) -> None:
        self.table = table
        self.shard = shard
        self.env = env
        self.comm = env.comm
        self.rank, self.world = env.comm.rank, env.comm.world
        self.features = list(table.features)
        mine = self.piece(self.rank)
        #: this rank's row storage of its piece (``None``: it holds nothing)
        self.rows: Any = None
        if mine is not None:
            row_env = RowEnv(
                env.seed, env.device, env.storage_dtype, env.stochastic_rounding, self.rank
            )
            self.rows = make_rows(table, row_env, piece=mine)

    @property
    def state(self) -> ops.TableState | None:
        """The kernels' view of this rank's piece (``None``: it holds nothing)."""
        rows: RowStore | None = self.rows
        return None if rows is None else rows.state()

    # ------------------------------------------------------------------- placement
    @abstractmethod
    def piece(self, rank: int) -> Piece | None:
        """What ``rank`` holds of the logical table (``None``: nothing)."""

    def logical_shape(self, name: str) -> tuple[int, ...]:
        v, d = self.table.vocabulary_size, self.table.dim
        if name == "weight" or self.table.optimizer is None:
            return (v, d)
        spec = {s.name: s for s in self.table.optimizer.slot_specs()}[name]
        return spec.shape(v, d)

    def local(self, name: str) -> Tensor | None:
        """This rank's piece of ``weight`` or a slot, as its row storage reads it (``None``
        if it holds nothing)."""
        return None if self.rows is None else self.rows.read(name)

    def _put_local(self, name: str, value: Tensor) -> None:
        """Write this rank's piece of ``weight`` or a slot (unless ``value`` is the live one)."""
        state = self.state
        assert state is not None
        if value is not (state.weight if name == "weight" else state.slots[name]):
            self.rows.write(name, value)

    # ------------------------------------------------------------------ the step
    def input_dist(self, batches: list[FeatureBatch], ex: Exchange, training: bool = False) -> Any:
        """Send this rank's ids to the owners; return the step's ``ctx``. ``training``: an
        update may follow (keyed rows count, admit and insert keys)."""
        return None

    def late(self, ctx: Any) -> bool:
        """Whether the owners reply a phase later (:meth:`lookup_late`, then
        :meth:`output_dist`)."""
        return False

    def lookup_late(self, inbox: Inbox, ex: Exchange, ctx: Any) -> None:  # noqa: B027
        """Owners, when :meth:`late`: the reply :meth:`lookup` left for a later phase."""

    @classmethod
    def end_steps(cls, schemes: list[Scheme], comm: Comm) -> None:
        """After the step's update, for every table of this scheme (a collective): each
        row storage's :meth:`~embcore.rows.RowStore.end_step`."""
        for s in schemes:
            if s.rows is not None:
                s.rows.end_step()

    def shape(self, name: str) -> tuple[int, ...]:
        """The logical shape of ``weight`` or a slot (may communicate: every rank asks)."""
        return self.logical_shape(name)

    def lookup(self, inbox: Inbox, ex: Exchange, ctx: Any) -> None:  # noqa: B027
        """Owners: look up what every rank asked for and send the results back."""

    @abstractmethod
    def output_dist(self, inbox: Inbox, ctx: Any) -> list[Tensor]:
        """One ``(S_f, dim)`` activation per feature of this table, for this rank's batch."""

    @abstractmethod
    def grad_dist(
        self, batches: list[FeatureBatch], grads: list[Tensor], ex: Exchange, reducer: Reducer
    ) -> Any:
        """Send this rank's gradients to the owners; return the backward's ``ctx``.

        The forward leaves nothing behind: the backward gets the batches again, so a lookup
        never has to be paired with an update (inference, pipelining, several forwards).
        """

    @abstractmethod
    def update(self, inbox: Inbox, reduced: list[Tensor], ctx: Any) -> UpdateJob | None:
        """Owners: the per-row sums of every rank's contributions, as one ``ops.update`` job.

        ``reduced`` holds the all-reduced tensors handed to the reducer in :meth:`grad_dist`.
        """

    def job(self, features: list[FeatureBatch], grads: list[Tensor]) -> UpdateJob:
        """This rank's share of the update: ``features`` hold piece-local rows, which its row
        storage maps to the slots the kernels update."""
        assert self.rows is not None
        mapped = self.rows.for_update(features)
        return UpdateJob(self.rows.state(), mapped, grads, self.table.index)

    # ------------------------------------------------------------- whole tensors
    def gather_send(self, name: str, ex: Exchange) -> None:
        """Gathering the full logical tensor (a collective): this rank's piece to every rank."""
        mine = self.local(name)
        if mine is not None:
            for dest in range(self.world):
                if dest != self.rank:
                    ex.send(dest, mine)

    def gather_take(self, name: str, inbox: Inbox) -> Tensor:
        """Gathering, second half: every rank's piece put in place, the full tensor."""
        mine = self.local(name)
        dtype = self.env.storage_dtype if name == "weight" else F32
        full = torch.empty(self.logical_shape(name), dtype=dtype, device=self.env.device)
        for src in range(self.world):
            piece = self.piece(src)
            if piece is None:
                continue
            lo, hi = piece.cols
            rows = piece.rows.to(full.device)
            if full.dim() == 1:
                part = mine if src == self.rank else inbox.take(src, dtype)
                full[rows] = part.reshape(-1)
            else:
                part = mine if src == self.rank else inbox.take(src, dtype, hi - lo)
                full[rows, lo:hi] = part
        return full

    def load_full(self, name: str, full: Tensor) -> None:
        """Copy this rank's piece out of a full logical tensor (no communication)."""
        mine, piece = self.local(name), self.piece(self.rank)
        if mine is None or piece is None:
            return
        rows = piece.rows.to(full.device)
        part = full[rows] if full.dim() == 1 else full[rows, piece.cols[0] : piece.cols[1]]
        self.rows.write(name, part)

    def save_chunks(self, name: str) -> list[tuple[tuple[int, ...], Tensor]]:
        """``(offsets, tensor)`` boxes of the logical tensor this rank writes to a checkpoint.

        Together, the ranks' chunks cover the tensor exactly once. May communicate.
        """
        if (boxes := self._boxes(name)) is not None:
            return self._placed(boxes.chunks())
        mine, piece = self.local(name), self.piece(self.rank)
        if mine is None or piece is None or mine.numel() == 0:
            return []
        assert piece.row_start is not None
        offsets = (piece.row_start,) if mine.dim() == 1 else (piece.row_start, piece.cols[0])
        return [(offsets, mine)]

    def load_chunks(self, name: str) -> list[tuple[tuple[int, ...], Tensor]]:
        """``(offsets, tensor)`` boxes a checkpoint load fills on this rank, then
        :meth:`finish_load` moves them into place (may communicate)."""
        if (boxes := self._boxes(name)) is not None:
            return self._placed(boxes.load_chunks())
        return self.save_chunks(name)

    def finish_load(self, name: str, chunks: list[tuple[tuple[int, ...], Tensor]]) -> None:
        """Loaded chunks go to the row storage (nothing to move when they were its live
        tensor); schemes with staging buffers override this."""
        if (boxes := self._boxes(name)) is not None:
            return boxes.finish_load(chunks)
        for _, tensor in chunks:
            self._put_local(name, tensor)

    def _boxes(self, name: str) -> Any:
        """The row storage's own stored tensor ``name`` when it hands a checkpoint boxes
        read or written on demand (``streams_boxes``: a tier that does not hold its piece in
        memory, such as a disk table), else ``None``."""
        if self.rows is None or not getattr(self.rows, "streams_boxes", False):
            return None
        key = f"{self.table.name}.{name}"
        return next(t for t in self.rows.tensors() if t.key == key)

    def _placed(self, chunks: list[tuple[tuple[int, ...], Tensor]]) -> Any:
        """Boxes at offsets in this rank's piece (contiguous rows), moved to the table's."""
        piece = self.piece(self.rank)
        assert piece is not None and piece.row_start is not None
        start, col = piece.row_start, piece.cols[0]
        return [((o[0] + start, *(c + col for c in o[1:])), box) for o, box in chunks]

    # -------------------------------------------------------------- reads by key
    # The collectives behind a store's reads of keyed rows (``table_keys``, ``table_rows``,
    # ``table_info``, ``dynamic_state``, ``load_dynamic_state``): a scheme that places keyed
    # row storage answers them (``key_hash``: :class:`._key_views.KeyViews`); every rank calls
    # the same ones, so the others raise on every rank before any exchange.
    def keys_send(self, ex: Exchange) -> None:
        """Gathering the table's keys (a collective): this rank's keys to every rank."""
        raise self._not_keyed("keys")

    def keys_take(self, inbox: Inbox) -> Tensor:
        """``(R,) int64``: the keys holding a row on any rank, ascending."""
        raise self._not_keyed("keys")

    def rows_send(self, keys: Tensor, ex: Exchange) -> Any:
        """Reading the rows of this rank's ``keys`` (a collective; never inserts): ask the
        owners; returns the read's ``ctx``."""
        raise self._not_keyed("rows by key")

    def rows_serve(self, inbox: Inbox, ex: Exchange, ctx: Any) -> None:
        """Owners: send back the rows every rank asked for."""
        raise self._not_keyed("rows by key")

    def rows_take(self, inbox: Inbox, ctx: Any) -> Tensor:
        """``(K, dim) float32``: the rows of the keys asked for, zeros for keys without one."""
        raise self._not_keyed("rows by key")

    def info(self) -> dict[str, int]:
        """The table's counters summed over the ranks (a collective), as
        ``EmbeddingEngine.table_info`` reports them: here those of a table in ``DiskStorage``,
        whose every piece counts its cache and file (a rank without a piece adds nothing)."""
        if self.table.storage is None:
            raise self._not_keyed("counters")
        held = self.rows.info() if self.rows is not None else {}
        everyone: list[Any] = [held]
        if self.comm.distributed and self.comm.world > 1:
            everyone = [None] * self.comm.world
            dist.all_gather_object(everyone, held, group=self.comm.group)
        return {k: sum(i.get(k, 0) for i in everyone) for info in everyone for k in info}

    def content(self) -> dict[str, np.ndarray]:
        """The whole table's content by key, as one process's row storage gives it (every
        rank's part, gathered onto every rank: a collective)."""
        raise self._not_keyed("content by key")

    def load_content(self, state: dict[str, Any]) -> None:
        """Keep this rank's part of a whole table's :meth:`content` (every rank gets the
        same; no communication)."""
        raise self._not_keyed("content by key")

    def _not_keyed(self, what: str) -> ValueError:
        return ValueError(
            f"table '{self.table.name}' ({self.scheme}) has no keyed rows: its {what} cannot "
            "be read by key; its tensors are read whole (gather)"
        )
