"""The collectives of the stores and checkpoints: one fused all-to-all per phase, a sum all-reduce.

Every scheme speaks through an :class:`Exchange`: during a phase each table appends the tensors
it sends to each rank, in table order; :meth:`Exchange.run` ships everything in one
``all_to_all_single`` of bytes (after one small all-to-all of sizes, which also carries the
step's tag: its kind, number and phase, so that ranks out of step fail at once with
:class:`OutOfStepError` instead of exchanging another step's data), and each table then takes
what it receives from each rank in the same order. Messages to oneself never leave the process.
So a step costs a fixed number of collectives whatever the number of tables.

Wire format from one rank to another::

    [n piece sizes, int64][piece 0 bytes, padded to 8][piece 1 bytes, padded] ...

Piece dtypes and trailing shapes are implied by the protocol, which both sides run in lockstep.
Without an initialized process group (world size 1) nothing is communicated.

Faults: a collective that fails (a peer process died or closed the group, or the group's
timeout passed while a peer stayed away) raises :class:`CommError` on this rank, naming the
collective, instead of the backend's bare message. How soon depends on the backend: gloo
notices a dead peer's closed connection at once; a peer that is alive but never arrives is
noticed after the process group's ``timeout`` (``init_process_group(timeout=...)``: gloo's
default is 30 minutes; pick minutes for training jobs). See docs/reliability.md.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor

__all__ = [
    "STEP_KINDS",
    "Comm",
    "CommError",
    "CommStats",
    "Exchange",
    "Inbox",
    "OutOfStepError",
    "Reducer",
]

_ALIGN = 8


def _bytes(t: Tensor) -> Tensor:
    """A tensor's data as a flat uint8 view (a copy only if it is not contiguous)."""
    t = t.contiguous()
    return t.reshape(-1).view(torch.uint8) if t.numel() else t.new_empty(0, dtype=torch.uint8)


def _padded(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


class OutOfStepError(RuntimeError):
    """The ranks reached different collectives: one of them left a step half-way (it caught
    an error and went on) and now pairs its exchanges with another step's. Raised on every
    rank at the first such exchange; the process group stays usable, the tables may hold
    a half-applied step: resume every rank from the last checkpoint."""


#: the kinds of step an exchange belongs to (its tag's first field)
STEP_KINDS = ("untagged", "lookup", "update", "gather")


class CommError(RuntimeError):
    """A collective failed on this rank because another rank died, left the process group or
    did not arrive within the group's timeout. The group is unusable afterwards: end the
    process and restart the job from its last checkpoint."""


@dataclass
class CommStats:
    """Cumulative traffic of this rank (payload and size headers; all-reduce as a ring)."""

    bytes_sent: int = 0
    bytes_received: int = 0
    collectives: int = 0

    def snapshot(self) -> CommStats:
        return CommStats(self.bytes_sent, self.bytes_received, self.collectives)


class Comm:
    """The process group as the sharded engine uses it.

    Args:
        group: a torch.distributed process group, or ``None`` for the default group (or for
            one process when torch.distributed is not initialized).
        device: where communication buffers live (CPU for gloo, the rank's GPU for NCCL).
    """

    def __init__(self, group: dist.ProcessGroup | None, device: torch.device) -> None:
        self.group = group
        self.device = device
        self.distributed = dist.is_available() and dist.is_initialized()
        if group is not None and not self.distributed:
            raise ValueError(
                "embcore.sharding: process_group given, but torch.distributed is not initialized"
            )
        self.rank = dist.get_rank(group) if self.distributed else 0
        self.world = dist.get_world_size(group) if self.distributed else 1
        self.stats = CommStats()

    def exchange(self, tag: tuple[int, int, int] = (0, 0, 0)) -> Exchange:
        """A new exchange; ``tag`` ``(kind, number, phase)`` (:data:`STEP_KINDS`) travels
        with it and must be every rank's (see :meth:`Exchange.run`)."""
        return Exchange(self, tag)

    def reducer(self) -> Reducer:
        return Reducer(self)

    # ------------------------------------------------------------------ primitives
    def failed(self, what: str, error: BaseException) -> CommError:
        """The error to raise when a collective of ``what`` raised ``error`` on this rank."""
        text = str(error).strip()
        cause = text.splitlines()[0][:300] if text else repr(error)
        return CommError(
            f"{what} failed on rank {self.rank} of {self.world}: another rank died, left the "
            "process group, or did not arrive within the group's timeout "
            "(init_process_group(timeout=...)). End this process and resume from the last "
            f"checkpoint. Backend error: {cause}"
        )

    def _failed(self, op: str, error: BaseException) -> CommError:
        return self.failed(
            f"embcore.sharding: {op} (collective #{self.stats.collectives + 1})", error
        )

    def all_to_all(self, send: Tensor, send_splits: list[int], recv_splits: list[int]) -> Tensor:
        recv = send.new_empty(sum(recv_splits))
        try:
            dist.all_to_all_single(recv, send, recv_splits, send_splits, group=self.group)
        except RuntimeError as error:  # DistBackendError and the backends' errors
            raise self._failed("all_to_all", error) from error
        self.stats.collectives += 1
        return recv

    def all_reduce_sum(self, t: Tensor) -> None:
        if self.world == 1:
            return
        try:
            dist.all_reduce(t, op=dist.ReduceOp.SUM, group=self.group)
        except RuntimeError as error:
            raise self._failed("all_reduce", error) from error
        ring = 2 * (self.world - 1) * t.numel() * t.element_size() // self.world
        self.stats.bytes_sent += ring
        self.stats.bytes_received += ring
        self.stats.collectives += 1

    def all_gather_ints(self, values: list[int]) -> list[list[int]]:
        """Every rank's list of ints (same length on every rank), in rank order."""
        mine = torch.tensor(values, dtype=torch.int64, device=self.device)
        if self.world == 1:
            return [values]
        out = [torch.empty_like(mine) for _ in range(self.world)]
        try:
            dist.all_gather(out, mine, group=self.group)
        except RuntimeError as error:
            raise self._failed("all_gather", error) from error
        self.stats.collectives += 1
        return [o.tolist() for o in out]

    def agree(
        self, what: str, error: BaseException | None, values: list[int] | None = None
    ) -> list[list[int]]:
        """A barrier that carries each rank's outcome and ``values`` (the same length on every
        rank): a failure on any rank raises on every rank, instead of leaving the others
        waiting in the next collective.

        Args:
            what: the operation, for the message (``"embcore.checkpoint.save"``).
            error: this rank's failure, or ``None``; it is re-raised here after the barrier.
            values: ints to share (for instance fingerprints to compare).

        Returns:
            Every rank's ``values``, in rank order.

        Raises:
            RuntimeError: another rank failed (this rank's own ``error`` is raised as is).
        """
        gathered = self.all_gather_ints([int(error is not None), *(values or [])])
        if error is not None:
            raise error
        failed = [r for r, g in enumerate(gathered) if g[0]]
        if failed:
            raise RuntimeError(
                f"{what}: failed on rank(s) {failed} (see the error there); no rank went on"
            )
        return [g[1:] for g in gathered]

    def differing(self, what: str, fingerprint: int) -> list[int]:
        """The ranks whose ``fingerprint`` differs from rank 0's (the same list on every
        rank)."""
        everyone = [v[0] for v in self.agree(what, None, [fingerprint])]
        return [r for r, v in enumerate(everyone) if v != everyone[0]]

    def check_same(self, what: str, fingerprint: int, about: str) -> None:
        """Raise on every rank unless every rank holds the same ``fingerprint``
        (``about`` completes "rank(s) [..] ..." in the message)."""
        differ = self.differing(what, fingerprint)
        if differ:
            raise ValueError(f"{what}: rank(s) {differ} {about} than rank 0")


class Exchange:
    """Tensors for each rank, collected during one phase and sent in one fused all-to-all."""

    def __init__(self, comm: Comm, tag: tuple[int, int, int] = (0, 0, 0)) -> None:
        self._comm = comm
        self._tag = tag
        self._out: list[list[Tensor]] = [[] for _ in range(comm.world)]

    def send(self, dest: int, tensor: Tensor) -> None:
        self._out[dest].append(tensor)

    def run_local(self) -> Inbox:
        """Deliver messages to oneself only (a phase in which no table talks to other ranks)."""
        if any(out for dest, out in enumerate(self._out) if dest != self._comm.rank):
            raise RuntimeError("embcore.sharding: protocol error, messages to other ranks unsent")
        inbox = Inbox(self._comm.world)
        inbox.queues[self._comm.rank] = deque(self._out[self._comm.rank])
        return inbox

    def run(self) -> Inbox:
        comm = self._comm
        me, world = comm.rank, comm.world
        inbox = Inbox(world)
        inbox.queues[me] = deque(self._out[me])  # to oneself: the tensors themselves
        if world == 1:
            return inbox
        device = comm.device
        # per destination: piece count, bytes, and the step's tag (kind, number, phase)
        buffers, meta = [], torch.zeros(world, 5, dtype=torch.int64)
        meta[:, 2:] = torch.tensor(self._tag, dtype=torch.int64)
        for dest in range(world):
            pieces = [] if dest == me else self._out[dest]
            sizes = [p.numel() * p.element_size() for p in pieces]
            total = _padded(8 * len(sizes)) + sum(_padded(s) for s in sizes)
            buf = torch.zeros(total, dtype=torch.uint8, device=device)
            if pieces:
                buf[: 8 * len(sizes)] = _bytes(torch.tensor(sizes, dtype=torch.int64)).to(device)
                at = _padded(8 * len(sizes))
                for p, s in zip(pieces, sizes, strict=True):
                    buf[at : at + s] = _bytes(p)
                    at += _padded(s)
            buffers.append(buf)
            meta[dest, 0], meta[dest, 1] = len(sizes), total
        got = comm.all_to_all(meta.to(device).reshape(-1), [5] * world, [5] * world)
        got = got.reshape(world, 5).tolist()
        _check_in_step(comm, self._tag, [tuple(g[2:]) for g in got])
        send_splits = [b.numel() for b in buffers]
        recv_splits = [total for _, total, *_ in got]
        recv = comm.all_to_all(torch.cat(buffers), send_splits, recv_splits)
        comm.stats.bytes_sent += sum(send_splits) + 40 * (world - 1)
        comm.stats.bytes_received += sum(recv_splits) + 40 * (world - 1)
        at = 0
        for src, (count, total, *_) in enumerate(got):
            if src == me:
                at += total
                continue
            block = recv[at : at + total]
            at += total
            sizes = block[: 8 * count].view(torch.int64).tolist() if count else []
            offset = _padded(8 * count)
            queue: deque[Tensor] = deque()
            for s in sizes:
                queue.append(block[offset : offset + s])
                offset += _padded(s)
            inbox.queues[src] = queue
            inbox.remote[src] = True
        return inbox


def _check_in_step(comm: Comm, mine: tuple[int, ...], tags: list[tuple[int, ...]]) -> None:
    """Raise :class:`OutOfStepError` unless every rank's exchange carries this rank's tag.
    Every rank receives every rank's tag, so all of them raise together."""
    tags[comm.rank] = mine
    if all(t == mine for t in tags):
        return

    def said(tag: tuple[int, ...]) -> str:
        kind, number, phase = tag
        name = STEP_KINDS[kind] if 0 <= kind < len(STEP_KINDS) else f"kind {kind}"
        return f"{name} #{number} (exchange {phase + 1})" if kind else "an untagged exchange"

    where = "; ".join(f"rank {r} in {said(t)}" for r, t in enumerate(tags))
    raise OutOfStepError(
        f"embcore.sharding: the ranks are out of step: {where}. A rank left a step half-way "
        "(it caught an error and went on) and its collectives now pair with another step's; "
        "every rank must make the same engine calls. End every rank and resume from the last "
        "checkpoint."
    )


class Inbox:
    """What each rank sent in one phase, taken in the order it was sent."""

    def __init__(self, world: int) -> None:
        self.queues: list[deque[Tensor]] = [deque() for _ in range(world)]
        self.remote = [False] * world

    def take(self, src: int, dtype: torch.dtype, *tail: int) -> Tensor:
        """The next tensor from ``src``, as ``(-1, *tail)`` of ``dtype``."""
        if not self.queues[src]:
            raise RuntimeError(f"embcore.sharding: protocol error, nothing more from rank {src}")
        piece = self.queues[src].popleft()
        if self.remote[src]:
            piece = piece.view(dtype) if piece.numel() else piece.new_empty(0, dtype=dtype)
        elif piece.dtype != dtype:
            raise RuntimeError(
                f"embcore.sharding: protocol error, expected {dtype} from rank {src}, got "
                f"{piece.dtype}"
            )
        return piece.reshape(-1, *tail)

    def check_empty(self) -> None:
        left = {src: len(q) for src, q in enumerate(self.queues) if q}
        if left:
            raise RuntimeError(f"embcore.sharding: protocol error, unread messages {left}")


class Reducer:
    """Tensors summed over every rank by one all-reduce (the data-parallel gradients)."""

    def __init__(self, comm: Comm) -> None:
        self._comm = comm
        self._tensors: list[Tensor] = []

    def add(self, tensor: Tensor) -> int:
        self._tensors.append(tensor)
        return len(self._tensors) - 1

    def run(self) -> list[Tensor]:
        if not self._tensors or self._comm.world == 1:
            return self._tensors
        flat = torch.cat([t.reshape(-1) for t in self._tensors])
        self._comm.all_reduce_sum(flat)
        out, at = [], 0
        for t in self._tensors:
            out.append(flat[at : at + t.numel()].view(t.shape))
            at += t.numel()
        return out
