"""``embcore.checkpoint.save``: every rank writes its boxes into one temporary directory, rank 0
adds the manifest and publishes the directory with one rename.

Protocol (each step ends in an agreement, so a failure on one rank raises on every rank)::

    rank 0: remove what killed saves of this path left; create path.tmp-<random>; share its name
    every rank: DCP writes its boxes (files flushed and fsynced)
    every rank: sha256 of the chunks it wrote  -> rank 0
    rank 0: write the manifest; rename path.tmp-<random> -> path (fails if path exists)

A failed save removes its temporary directory; a killed one leaves it, and the next save to
the same path removes it (a directory still locked by a live saver is left alone). Two saves
to one path never mix: each writes its own directory and exactly one rename wins. See
docs/reliability.md.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed.checkpoint as dcp

from embcore import _atomic
from embcore._comm import Comm
from embcore._fingerprint import fingerprint64
from embcore.checkpoint import _delta, _manifest, _touched
from embcore.checkpoint._base_check import check_base
from embcore.checkpoint._dcp import Chunked, SavePlanner, dcp_args, dcp_errors, no_dist_ok
from embcore.checkpoint._digest import digest_from_ints, digest_to_ints, sha256_chunk
from embcore.checkpoint._engine_view import EngineView, StoredTensor

if TYPE_CHECKING:  # annotations only: engines are seen through _engine_view
    from embcore.engine import EmbeddingEngine

__all__ = ["save"]

_NAME_INTS = 40  # a temporary directory's name, shared as up to 320 bytes


def _encode(name: str) -> list[int]:
    raw = name.encode()
    if len(raw) > 8 * _NAME_INTS:
        raise OSError(f"the checkpoint's file name is too long: {name!r}")
    raw = raw.ljust(8 * _NAME_INTS, b"\0")
    return [int.from_bytes(raw[i : i + 8], "little", signed=True) for i in range(0, len(raw), 8)]


def _decode(values: list[int]) -> str:
    return b"".join(v.to_bytes(8, "little", signed=True) for v in values).rstrip(b"\0").decode()


def _value(t: StoredTensor) -> Any:
    """What DCP is given: a whole tensor stored as one chunk stays a plain tensor."""
    chunks = t.save_chunks()
    if len(chunks) == 1:
        offsets, tensor = chunks[0]
        if isinstance(tensor, torch.Tensor) and not any(offsets) and tuple(tensor.shape) == t.shape:
            return tensor.detach()
    return Chunked(t.shape, chunks)


def _start(comm: Comm, path: str) -> tuple[_atomic.TempDir | None, str]:
    """Rank 0 creates the temporary directory; every rank learns its name."""
    what = "embcore.checkpoint.save"
    error: BaseException | None = None
    tmp = None
    if comm.rank == 0:
        try:
            if os.path.lexists(path) and not (os.path.isdir(path) and not os.listdir(path)):
                raise FileExistsError(
                    f"{what}: {path} already exists; a checkpoint is never overwritten (save to "
                    "a new path, or delete it first)"
                )
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            with _atomic.writing(path):
                _atomic.remove_stale(path)
                tmp = _atomic.TempDir(Path(os.path.abspath(path)))
            encoded = _encode(tmp.path.name)
        except OSError as e:
            if tmp is not None:
                tmp.remove()
                tmp = None
            error, encoded = e, [0] * _NAME_INTS
    else:
        encoded = [0] * _NAME_INTS
    everyone = comm.agree(what, error, [fingerprint64(path), *encoded])
    differ = [r for r, v in enumerate(everyone) if v[0] != everyone[0][0]]
    if differ:  # every rank sees it: rank 0 removes its directory
        if tmp is not None:
            tmp.remove()
        raise ValueError(
            f"{what}: rank(s) {differ} were given another path than rank 0 (this rank: {path!r})"
        )
    return tmp, os.path.join(os.path.dirname(os.path.abspath(path)), _decode(everyone[0][1:]))


def save(
    engine: EmbeddingEngine,
    path: str | os.PathLike[str],
    *,
    base: str | os.PathLike[str] | None = None,
) -> None:
    """Write an engine's tables, slots and step to the directory ``path``, atomically.

    A collective: under a process group every rank calls it with the same path (on a file
    system they share). A pipelined update still pending is applied first, so weights, slots
    and the dynamic tables' counts are all taken at the same step.

    Args:
        engine: the engine to save.
        path: the new checkpoint directory.
        base: an earlier checkpoint in the same directory as ``path``: write a *delta*, whose
            dynamic tables hold only the rows inserted or changed since ``base`` and the keys
            removed since, and whose fixed tables in ``DiskStorage`` hold only the rows
            written since ``base`` when this engine saved or loaded ``base`` itself (other
            fixed tables, those of a sharded engine, and the step are written whole). Loading
            the delta reads ``base`` (and its own base, if it is a delta too), so before
            writing the ranks check that they were given the same base and that its whole
            chain is on disk and verifies (every chunk's sha256, shared among the ranks).

    Raises:
        FileExistsError: ``path`` holds something already (checkpoints are not overwritten),
            or another save to the same path published first.
        FileNotFoundError: ``base`` does not exist, or a checkpoint of its chain is missing.
        ValueError: ``base`` is not another checkpoint of the directory of ``path``.
        CheckpointError (a ValueError): ``base`` is unreadable, or was saved by an engine with
            other tables (names, vocabulary sizes, dims, optimizers, dynamic or not) or
            features, or a chunk of its chain fails its sha256 (a delta on it could never
            load), or the ranks were given different bases. Nothing is written.
        DiskFullError (an OSError): the disk filled up; the message names the path.
        RuntimeError: writing failed on another rank; ``path`` was not created.
    """
    view = EngineView(engine, "save")
    path = os.path.normpath(os.fspath(path))
    base = None if base is None else os.path.normpath(os.fspath(base))
    view.flush()
    comm = view.comm
    error: BaseException | None = None
    plan = _delta.SavePlan({}, {}, {})
    try:
        plan = _delta.plan_save(view, path, base)
    except (OSError, ValueError) as e:
        error = e
    comm.agree("embcore.checkpoint.save", error)
    check_base(comm, base, needs_chain="base" in plan.sections)
    tmp, tmp_path = _start(comm, path)
    try:
        _write(view, comm, path, tmp_path, plan)
    except BaseException:
        if tmp is not None:
            tmp.remove()
        raise
    if tmp is not None:
        tmp.release()
    if plan.known:
        _delta.remember(engine, path, plan.known)
    _touched.checkpointed(view.tensors(), _delta.manifest_sha256(path))


def _write(view: EngineView, comm: Comm, path: str, tmp_path: str, plan: _delta.SavePlan) -> None:
    what = "embcore.checkpoint.save"
    state = {t.key: _value(t) for t in view.tensors() if t.key not in plan.touched}
    state |= plan.tensors
    args = dcp_args(comm)
    with _atomic.writing(path), no_dist_ok(args), dcp_errors(comm, "save", path):
        metadata = dcp.save(
            state, storage_writer=dcp.FileSystemWriter(tmp_path), planner=SavePlanner(), **args
        )

    # Each rank hashes what it wrote (still in its page cache); rank 0 collects the digests.
    chunks = _manifest.chunks_of(metadata)
    mine: list[int] = []
    error: BaseException | None = None
    try:
        for c in chunks:
            if c.writer == comm.rank:
                mine += digest_to_ints(sha256_chunk(tmp_path, c.file, c.offset, c.length))
            else:
                mine += [0, 0, 0, 0]
    except (OSError, ValueError) as e:
        error, mine = e, [0] * (4 * len(chunks))
    everyone = comm.agree(what, error, mine)

    error = None
    if comm.rank == 0:
        try:
            digests = [
                digest_from_ints(everyone[c.writer][4 * i : 4 * i + 4])
                for i, c in enumerate(chunks)
            ]
            meta_sha = sha256_chunk(
                tmp_path,
                _manifest.DCP_METADATA,
                0,
                os.path.getsize(os.path.join(tmp_path, _manifest.DCP_METADATA)),
            )
            described = view.describe()
            manifest = _manifest.build(
                described, view.step, view.world_size, metadata, digests, meta_sha, plan.sections
            )
            with _atomic.writing(path):
                _manifest.write(tmp_path, manifest)
                publish(tmp_path, path)
        except (OSError, ValueError) as e:
            error = e
    comm.agree(what, error)  # no rank returns before the checkpoint is visible


def publish(tmp: str, path: str) -> None:
    """The commit point: one rename makes the complete checkpoint visible."""
    try:
        _atomic.publish_dir(tmp, path)
    except FileExistsError as error:
        raise FileExistsError(
            f"embcore.checkpoint.save: {path} was published by another save while this one "
            "was writing; this save was discarded (a checkpoint is never overwritten)"
        ) from error
