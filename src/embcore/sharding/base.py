"""The interface every sharding scheme implements, and what the schemes share.

A scheme owns one table's pieces on this rank and its part of each step's communication, in
the torchrec layering::

    forward   input_dist(batches)  ->  lookup(inbox)      ->  output_dist(inbox) -> activations
              requester sends ids      owner looks them up     requester assembles its rows
    backward  grad_dist(grads)     ->  update(inbox)
              requester sends per-row  owner sums them per row, then one optimizer step
              gradient contributions   (an ``ops.update`` job)

Every phase goes through one fused :class:`~embcore.sharding.comm.Exchange` for all tables,
so the methods only append messages and take replies, in table and feature order.

The single-process engine is the yardstick: a sharded step computes what
``EmbeddingEngine`` computes on the concatenation of all ranks' batches (rank order), with the
per-row gradient summed over every rank before one update (SPEC 3.1, 3.16).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from embcore import ops
from embcore.config import ResolvedTable
from embcore.initializers import BLOCK_ROWS, initial_rows, initial_slots
from embcore.inputs import FeatureBatch
from embcore.ops.reference import gains
from embcore.sharding.comm import Comm, Exchange, Inbox, Reducer
from embcore.sharding.spec import TableShard

__all__ = [
    "Piece",
    "ShardEnv",
    "ShardedTable",
    "UpdateJob",
    "concat_batches",
    "contributions",
    "occurrences",
    "send_batch",
    "take_batch",
]

F32 = torch.float32
I64 = torch.int64


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
class Piece:
    """The part of a table's logical ``(vocab, dim)`` tensor that one rank holds.

    Attributes:
        rows: ``(n,) int64`` global row ids, in local-row order.
        cols: ``[lo, hi)`` columns.
        row_start: the first row when ``rows`` is the contiguous range ``row_start + arange(n)``,
            else ``None``.
    """

    rows: Tensor
    cols: tuple[int, int]
    row_start: int | None

    @classmethod
    def range(cls, start: int, stop: int, cols: tuple[int, int]) -> Piece:
        return cls(torch.arange(start, stop, dtype=I64), cols, start)


@dataclass(frozen=True, eq=False)
class UpdateJob:
    """One table shard's share of the step's single ``ops.update`` call."""

    state: ops.TableState
    features: list[FeatureBatch]
    grads: list[Tensor]
    lr_table: int  # index of the table, whose learning rate applies


# ------------------------------------------------------------------------------- batches
def send_batch(ex: Exchange, dest: int, batch: FeatureBatch) -> None:
    """Ship one feature batch to an owner that pools it: offsets, ids and per-id gains."""
    ex.send(dest, batch.offsets)
    ex.send(dest, batch.values)
    ex.send(dest, gains(batch))


def take_batch(inbox: Inbox, src: int) -> FeatureBatch:
    """The counterpart of :func:`send_batch`: a ``sum`` batch weighted by the sender's gains.

    Pooling ``gain * row`` with the sender's gains is the sender's own combiner, bit for bit.
    """
    offsets = inbox.take(src, I64).reshape(-1)
    values = inbox.take(src, I64).reshape(-1)
    weights = inbox.take(src, F32).reshape(-1)
    samples = offsets.numel() - 1
    return FeatureBatch(values, offsets, weights, "sum", (samples,))


def concat_batches(batches: list[FeatureBatch]) -> FeatureBatch:
    """Batches of ``sum`` samples (as from :func:`take_batch`) one after the other."""
    if len(batches) == 1:
        return batches[0]
    offsets, base = [batches[0].offsets[:1]], 0
    for b in batches:
        offsets.append(b.offsets[1:] + base)
        base += b.values.numel()
    weights = [gains(b) for b in batches]  # the weights themselves: these are sum batches
    samples = sum(b.num_samples for b in batches)
    return FeatureBatch(
        torch.cat([b.values for b in batches]),
        torch.cat(offsets),
        torch.cat(weights),
        "sum",
        (samples,),
    )


def contributions(batch: FeatureBatch, grad: Tensor) -> Tensor:
    """``(N, dim)``: each id's share ``gain * dL/dactivation[sample]`` of its row's gradient.

    The same expression as the reference update, so the owner's sums match it bit for bit.
    """
    return grad[batch.segments()] * gains(batch)[:, None]


def occurrences(ids: Tensor) -> FeatureBatch:
    """A batch with one ``sum`` sample per id, to feed precomputed contributions to
    ``ops.update`` (each contribution then enters its row's sum unchanged)."""
    n = ids.numel()
    return FeatureBatch(ids, torch.arange(n + 1, device=ids.device), None, "sum", (n,))


# -------------------------------------------------------------------------- initial values
def _initial_weight(table: ResolvedTable, seed: int, piece: Piece) -> Tensor:
    cfg, lo, hi = table.config, piece.cols[0], piece.cols[1]
    if piece.row_start is not None:
        stop = piece.row_start + piece.rows.numel()
        rows = initial_rows(
            table.name, cfg.vocabulary_size, cfg.dim, cfg.initializer, seed, piece.row_start, stop
        )
        return rows[:, lo:hi]
    if cfg.initializer is not None:  # a user initializer makes the full table anyway
        full = initial_rows(table.name, cfg.vocabulary_size, cfg.dim, cfg.initializer, seed)
        return full[piece.rows, lo:hi]
    out = torch.empty(piece.rows.numel(), hi - lo, dtype=F32)
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
    initial value (SPEC pitfall 27), whatever the sharding."""
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
        n = piece.rows.numel()
        slots = {
            s.name: torch.full((n,) if s.rowwise else (n, hi - lo), s.initial_value, dtype=F32)
            for s in opt.slot_specs()
        }
    return weight, {k: v.to(device=device, dtype=F32).contiguous() for k, v in slots.items()}


# ----------------------------------------------------------------------------- the interface
class ShardedTable(ABC):
    """One table's pieces on this rank and its part of every step's communication.

    Subclasses define :meth:`piece` (who holds what) and the step protocol. ``ctx`` is the
    scheme's own record of one forward (from :meth:`input_dist`) or one backward (from
    :meth:`grad_dist`), handed to the later phases of the same pass.
    """

    scheme: ClassVar[str]

    def __init__(self, table: ResolvedTable, shard: TableShard, env: ShardEnv) -> None:
        self.table = table
        self.shard = shard
        self.env = env
        self.comm = env.comm
        self.rank, self.world = env.comm.rank, env.comm.world
        self.features = list(table.features)
        mine = self.piece(self.rank)
        self.state: ops.TableState | None = None
        if mine is not None:
            weight, slots = initial_piece(table, env.seed, mine, env.device)
            weight, sr = weight.to(env.storage_dtype), env.stochastic_rounding
            self.state = ops.TableState(table.name, weight, slots, table.optimizer, sr)

    # ------------------------------------------------------------------- placement
    @abstractmethod
    def piece(self, rank: int) -> Piece | None:
        """What ``rank`` holds of the logical table (``None``: nothing)."""

    def tensor_names(self) -> list[str]:
        """``weight`` and the optimizer's slots, in checkpoint order."""
        opt = self.table.optimizer
        return ["weight"] + ([s.name for s in opt.slot_specs()] if opt else [])

    def logical_shape(self, name: str) -> tuple[int, ...]:
        v, d = self.table.vocabulary_size, self.table.dim
        if name == "weight" or self.table.optimizer is None:
            return (v, d)
        spec = {s.name: s for s in self.table.optimizer.slot_specs()}[name]
        return spec.shape(v, d)

    def local(self, name: str) -> Tensor | None:
        """This rank's piece of ``weight`` or a slot (``None`` if it holds nothing)."""
        if self.state is None:
            return None
        return self.state.weight if name == "weight" else self.state.slots[name]

    # ------------------------------------------------------------------ the step
    def input_dist(self, batches: list[FeatureBatch], ex: Exchange) -> Any:
        """Send this rank's ids to the owners; return the step's ``ctx``."""
        return None

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
        assert self.state is not None
        return UpdateJob(self.state, features, grads, self.table.index)

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
        mine.copy_(part)

    def save_chunks(self, name: str) -> list[tuple[tuple[int, ...], Tensor]]:
        """``(offsets, tensor)`` boxes of the logical tensor this rank writes to a checkpoint.

        Together, the ranks' chunks cover the tensor exactly once. May communicate.
        """
        mine, piece = self.local(name), self.piece(self.rank)
        if mine is None or piece is None or mine.numel() == 0:
            return []
        assert piece.row_start is not None
        offsets = (piece.row_start,) if mine.dim() == 1 else (piece.row_start, piece.cols[0])
        return [(offsets, mine)]

    def load_chunks(self, name: str) -> list[tuple[tuple[int, ...], Tensor]]:
        """``(offsets, tensor)`` boxes a checkpoint load fills on this rank, then
        :meth:`finish_load` moves them into place (may communicate)."""
        return self.save_chunks(name)

    def finish_load(self, name: str, chunks: list[tuple[tuple[int, ...], Tensor]]) -> None:  # noqa: B027
        """Loaded chunks were written in place; schemes with staging buffers override this."""
