"""Checkpoints of embedding engines on ``torch.distributed.checkpoint`` (DCP): atomic, verified.

A checkpoint stores every table and slot as its full logical tensor, under the engine's
state-dict keys (``{table}.weight``, ``{table}.{slot}``, ``step``), whatever the sharding
(SPEC 5.1, pitfall 22: never a ``mod``-interleaved layout). So a checkpoint written by N ranks
under one plan loads into M ranks under another, into one process, or into a CPU serving
engine (``optimizer=None``: slots in the checkpoint are ignored), with identical values::

    ec.checkpoint.save(engine, "ckpt/step-1000")      # every rank calls it
    ec.checkpoint.load(engine, "ckpt/step-1000")

Each rank writes only its own pieces, as boxes of the logical tensor: contiguous row ranges
(table-wise, row-wise ``div``), column ranges (column-wise), one copy of replicated tables.
Row-wise ``mod`` shards are first re-laid as the ``div`` ranges they cover (one all-to-all),
so the stored tensor is a plain ``(vocab, dim)`` table. Loading reads the boxes each rank's
plan needs. Without a process group the same calls run in one process (DCP's no-dist mode).

Atomic: every rank writes into ``path.tmp``; DCP flushes and fsyncs each file; rank 0 then
writes ``embcore_manifest.json`` (configs, plan, a sha256 of every stored chunk: see
:mod:`embcore._manifest`), fsyncs it and renames ``path.tmp`` to ``path``. A process killed at
any moment leaves either no ``path`` or a complete one; a later save to the same path clears
the leftover ``path.tmp``. Verified: :func:`load` checks the manifest, DCP's metadata and every
chunk's checksum (each rank a share) before it changes anything, and never unpickles objects
outside DCP's metadata classes. Every step that can fail on one rank ends in a small
all-gather of each rank's outcome, so a failure on one rank raises on all of them.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import Tensor
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorProperties,
)
from torch.distributed.checkpoint.planner import TensorWriteData, WriteItem, WriteItemType

from embcore import _manifest
from embcore._manifest import CheckpointError, table_of
from embcore.engine import EmbeddingEngine
from embcore.sharding.comm import Comm, CommError

__all__ = ["CheckpointError", "load", "read_manifest", "save", "verify"]

Chunks = list[tuple[tuple[int, ...], Tensor]]


class _Chunked:
    """A logical tensor of which this rank holds some boxes (possibly none), for DCP."""

    def __init__(self, shape: tuple[int, ...], chunks: Chunks) -> None:
        self.shape = torch.Size(shape)
        self.chunks = {tuple(offsets): tensor for offsets, tensor in chunks}

    def size(self) -> torch.Size:
        return self.shape

    def __create_write_items__(self, fqn: str, obj: Any) -> list[WriteItem]:
        return [
            WriteItem(
                index=MetadataIndex(fqn, torch.Size(offsets)),
                type=WriteItemType.SHARD,
                tensor_data=TensorWriteData(
                    chunk=ChunkStorageMetadata(torch.Size(offsets), t.size()),
                    properties=TensorProperties.create_from_tensor(t),
                    size=self.shape,
                ),
            )
            for offsets, t in self.chunks.items()
        ]

    def __create_chunk_list__(self) -> list[ChunkStorageMetadata]:
        return [ChunkStorageMetadata(torch.Size(o), t.size()) for o, t in self.chunks.items()]

    def at(self, offset: Any) -> Tensor:
        return self.chunks[tuple(offset)]


class _SavePlanner(dcp.DefaultSavePlanner):
    def __init__(self) -> None:
        super().__init__(flatten_state_dict=False, flatten_sharded_tensors=False)

    def lookup_object(self, index: MetadataIndex) -> Any:
        obj = self.state_dict[index.fqn]
        return obj.at(index.offset) if isinstance(obj, _Chunked) else super().lookup_object(index)


class _LoadPlanner(dcp.DefaultLoadPlanner):
    def __init__(self) -> None:
        super().__init__(flatten_state_dict=False, flatten_sharded_tensors=False)

    def set_up_planner(
        self, state_dict: dict[str, Any], metadata: Any = None, is_coordinator: bool = False
    ) -> None:
        # As the default planner, without its meta-device pass, which would drop our
        # non-tensor _Chunked values (our tensors are never on the meta device).
        self.original_state_dict = state_dict
        self.state_dict = state_dict
        self.mappings = {}
        self.metadata = metadata
        self.is_coordinator = is_coordinator

    def lookup_tensor(self, index: MetadataIndex) -> Tensor:
        obj = self.state_dict[index.fqn]
        return obj.at(index.offset) if isinstance(obj, _Chunked) else super().lookup_tensor(index)

    def load_bytes(self, read_item: Any, value: Any) -> None:
        # DCP unpickles byte items with weights_only=False; an embcore checkpoint has none.
        raise CheckpointError(f"'{read_item.dest_index.fqn}' is stored as bytes, not a tensor")


class _VerifiedReader(dcp.FileSystemReader):
    """Reads chunks as DCP does, with the metadata that :func:`load` already verified (DCP's
    own ``read_metadata`` would unpickle the file without restriction)."""

    def __init__(self, path: str, metadata: Metadata) -> None:
        super().__init__(path)
        self._verified = metadata

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        if kwargs.get("rank") is not None:  # DCP's per-rank fallback: not used by embcore
            raise FileNotFoundError("embcore checkpoints have one global metadata file")
        return self._verified


def _sharded(engine: EmbeddingEngine) -> bool:
    from embcore.sharding.engine import ShardedEmbeddingEngine

    return isinstance(engine, ShardedEmbeddingEngine)


def _dcp_args(engine: EmbeddingEngine) -> dict[str, Any]:
    if _sharded(engine):
        comm = engine._comm  # type: ignore[attr-defined]
        if comm.distributed:
            return {"process_group": comm.group, "no_dist": False}
        return {"no_dist": True}
    return {"no_dist": not (dist.is_available() and dist.is_initialized())}


def _comm(engine: EmbeddingEngine) -> Comm:
    """The group the checkpoint's ranks agree over (DCP's: the default one for a plain engine)."""
    if _sharded(engine):
        return engine._comm  # type: ignore[attr-defined]
    return Comm(None, engine.device)


@contextmanager
def _single_process_ok(no_dist: bool) -> Iterator[None]:
    # DCP warns that it assumes one process when there is no process group; that is the intent.
    with warnings.catch_warnings():
        if no_dist:
            warnings.filterwarnings("ignore", message=r"torch\.distributed is .*single process")
        yield


@contextmanager
def _dcp_errors(comm: Comm, what: str, path: str) -> Iterator[None]:
    """DCP's failures as embcore errors: a rank's failure that DCP reports everywhere
    (``CheckpointException``, a ``BaseException``) becomes a ``RuntimeError``; a collective
    that fails because a rank died or timed out becomes a :class:`CommError`."""
    try:
        yield
    except CheckpointException as error:
        rank, (cause, _) = next(iter(sorted(error.failures.items(), key=lambda kv: kv[0])))
        raise RuntimeError(
            f"embcore.checkpoint.{what} of {path} failed on rank(s) {sorted(error.failures)}; "
            f"on rank {rank}: {type(cause).__name__}: {cause}"
        ) from error
    except RuntimeError as error:
        if isinstance(error, CommError) or not comm.distributed:
            raise
        raise comm.failed(f"embcore.checkpoint.{what} of {path}", error) from error


def _check_engine(engine: Any, what: str) -> None:
    if not isinstance(engine, EmbeddingEngine):
        raise TypeError(
            f"embcore.checkpoint.{what}: expected an EmbeddingEngine, got {type(engine).__name__}"
        )


def _fingerprint(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little") >> 2


def _agree(
    comm: Comm, what: str, error: BaseException | None, values: list[int]
) -> list[list[int]]:
    """A barrier that carries each rank's outcome and ``values`` (the same length on every
    rank): a failure on any rank raises on every rank instead of leaving the others waiting.

    Returns every rank's ``values``, in rank order.
    """
    gathered = comm.all_gather_ints([int(error is not None), *values])
    if error is not None:
        raise error
    failed = [r for r, g in enumerate(gathered) if g[0]]
    if failed:
        raise RuntimeError(
            f"embcore.checkpoint.{what}: failed on rank(s) {failed} (see the error there); "
            "no rank went on"
        )
    return [g[1:] for g in gathered]


def _same_everywhere(what: str, gathered: list[list[int]], about: str) -> None:
    differ = [r for r, g in enumerate(gathered) if g != gathered[0]]
    if differ:
        raise ValueError(f"embcore.checkpoint.{what}: rank(s) {differ} {about} than rank 0")


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _clear(path: str, tmp: str) -> None:
    """Refuse to replace a checkpoint; remove what an interrupted save left."""
    if os.path.lexists(path) and not (os.path.isdir(path) and not os.listdir(path)):
        raise FileExistsError(
            f"embcore.checkpoint.save: {path} already exists; a checkpoint is never overwritten "
            "(save to a new path, or delete it first)"
        )
    if os.path.lexists(tmp):
        shutil.rmtree(tmp)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)


def _publish(tmp: str, path: str) -> None:
    """The commit point: one rename makes the complete checkpoint visible."""
    _fsync_dir(tmp)
    os.rename(tmp, path)  # replaces an empty directory, never a checkpoint (see _clear)
    _fsync_dir(os.path.dirname(os.path.abspath(path)))


def save(engine: EmbeddingEngine, path: str | os.PathLike[str]) -> None:
    """Write an engine's tables, slots and step to the directory ``path``, atomically.

    A collective: under a process group every rank calls it with the same path (on a file
    system they share). A pipelined update still pending is applied first.

    Raises:
        FileExistsError: ``path`` holds something already (checkpoints are not overwritten).
        RuntimeError: writing failed on another rank; ``path`` was not created.
    """
    _check_engine(engine, "save")
    path = os.path.normpath(os.fspath(path))
    tmp = f"{path}.tmp"
    engine.flush()
    comm = _comm(engine)
    error: BaseException | None = None
    if comm.rank == 0:
        try:
            _clear(path, tmp)
        except OSError as e:
            error = e
    paths = _agree(comm, "save", error, [_fingerprint(path.encode())])
    _same_everywhere("save", paths, f"were given another path than {path!r}")

    if _sharded(engine):
        state: dict[str, Any] = {"step": engine._step.detach()}
        for key, table, name in engine._checkpoint_items():  # type: ignore[attr-defined]
            state[key] = _Chunked(table.logical_shape(name), table.save_chunks(name))
    else:
        state = dict(engine.state_dict())
    args = _dcp_args(engine)
    with _single_process_ok(args["no_dist"]), _dcp_errors(comm, "save", path):
        metadata = dcp.save(
            state, storage_writer=dcp.FileSystemWriter(tmp), planner=_SavePlanner(), **args
        )

    # Each rank hashes what it wrote (still in its page cache); rank 0 collects the digests.
    chunks = _manifest.chunks_of(metadata)
    mine: list[int] = []
    error = None
    try:
        for c in chunks:
            if c.writer == comm.rank:
                digest = _manifest.sha256_range(os.path.join(tmp, c.file), c.offset, c.length)
                mine += _manifest.digest_to_ints(digest)
            else:
                mine += [0, 0, 0, 0]
    except OSError as e:
        error, mine = e, [0] * (4 * len(chunks))
    everyone = _agree(comm, "save", error, mine)

    error = None
    if comm.rank == 0:
        try:
            digests = [
                _manifest.digest_from_ints(everyone[c.writer][4 * i : 4 * i + 4])
                for i, c in enumerate(chunks)
            ]
            meta_sha = _manifest.sha256_file(os.path.join(tmp, _manifest.DCP_METADATA))
            _manifest.write(tmp, _manifest.build(engine, metadata, digests, meta_sha))
            _publish(tmp, path)
        except OSError as e:
            error = e
    _agree(comm, "save", error, [])  # no rank returns before the checkpoint is visible


def read_manifest(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The manifest of the checkpoint at ``path`` (JSON values; nothing verified but its
    format): format version, step, tables, features, optimizer hyperparameters, sharding
    plan and the checksum of every stored chunk."""
    manifest, _ = _manifest.read(os.path.normpath(os.fspath(path)))
    return manifest


def _verify_chunks(
    path: str, manifest: dict[str, Any], chunks: list[_manifest.Chunk], rank: int, world: int
) -> dict[int, str]:
    """``{chunk index: what was found}`` for the chunks of this rank's share (every
    ``world``-th) whose bytes do not match the manifest's sha256."""
    bad = {}
    for i in range(rank, len(chunks), world):
        c = chunks[i]
        try:
            found = _manifest.sha256_range(os.path.join(path, c.file), c.offset, c.length)
        except (OSError, CheckpointError) as error:
            bad[i] = f"unreadable ({error})"
            continue
        if found != _manifest.expected_digest(manifest, c):
            bad[i] = found
    return bad


def _corrupt(
    path: str,
    manifest: dict[str, Any],
    chunks: list[_manifest.Chunk],
    bad: list[int],
    found: dict[int, str],
) -> CheckpointError:
    lines = [
        f"table '{table_of(chunks[i].key)}': {chunks[i].describe()}: sha256 expected "
        f"{_manifest.expected_digest(manifest, chunks[i])}, found "
        f"{found.get(i, 'a mismatch on another rank')}"
        for i in bad
    ]
    return CheckpointError(
        f"embcore.checkpoint: {path} is corrupt, nothing was loaded: " + "; ".join(lines)
    )


def _open(path: str) -> tuple[dict[str, Any], bytes, Metadata, list[_manifest.Chunk]]:
    """Manifest, its bytes, verified DCP metadata and the chunk list of a checkpoint."""
    manifest, raw = _manifest.read(path)
    try:
        metadata = _manifest.read_dcp_metadata(path, manifest["dcp_metadata_sha256"])
        chunks = _manifest.check_matches(manifest, metadata)
    except (KeyError, TypeError) as error:
        raise CheckpointError(f"{path}: the manifest is malformed ({error!r})") from error
    return manifest, raw, metadata, chunks


def verify(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Check a checkpoint completely in this process (manifest, DCP metadata, the sha256 of
    every chunk) and return its manifest.

    Raises:
        FileNotFoundError: nothing at ``path``.
        CheckpointError: incomplete or corrupt; the message names each table concerned.
    """
    path = os.path.normpath(os.fspath(path))
    manifest, _, _, chunks = _open(path)
    found = _verify_chunks(path, manifest, chunks, 0, 1)
    if found:
        raise _corrupt(path, manifest, chunks, sorted(found), found)
    return manifest


def _expected(engine: EmbeddingEngine, sharded: bool) -> dict[str, tuple[tuple[int, ...], str]]:
    """``{key: (shape, dtype)}`` of every tensor the engine loads."""
    if sharded:
        items = engine._checkpoint_items()  # type: ignore[attr-defined]
        weight = str(engine.storage_dtype).removeprefix("torch.")  # slots are float32
        out = {k: (t.logical_shape(n), weight if n == "weight" else "float32") for k, t, n in items}
    else:
        out = {
            k: (tuple(v.shape), str(v.dtype).removeprefix("torch."))
            for k, v in engine.state_dict().items()
        }
    out["step"] = ((), "int64")
    return out


def _fit_problems(engine: EmbeddingEngine, manifest: dict[str, Any], sharded: bool) -> list[str]:
    """Why the checkpoint cannot fill this engine, one entry per table (empty: it can)."""
    stored = manifest["tensors"]
    written = {t["name"]: t for t in manifest["tables"]}
    engine_optimizer = {t.name: type(t.optimizer).__name__ for t in engine.tables if t.optimizer}
    missing: dict[str, list[str]] = {}
    problems: list[str] = []
    for key, (shape, dtype) in _expected(engine, sharded).items():
        table = table_of(key)
        if key not in stored:
            missing.setdefault(table, []).append(key)
        elif tuple(stored[key]["shape"]) != shape:
            problems.append(
                f"table '{table}': '{key}' has shape {tuple(stored[key]['shape'])}, the engine "
                f"expects {shape}"
            )
        elif stored[key]["dtype"] != dtype:
            problems.append(
                f"table '{table}': '{key}' is {stored[key]['dtype']}, the engine expects {dtype}"
            )
    for table, keys in missing.items():
        if table not in written:
            problems.append(f"table '{table}' is not in the checkpoint (it has {sorted(written)})")
            continue
        opt = written[table].get("optimizer") or {"type": "no optimizer"}
        problems.append(
            f"table '{table}': {', '.join(repr(k) for k in keys)} missing (the checkpoint's "
            f"optimizer is {opt['type']}, the engine's {engine_optimizer.get(table)})"
        )
    return problems


def load(engine: EmbeddingEngine, path: str | os.PathLike[str]) -> None:
    """Restore an engine from a checkpoint written by :func:`save`, whatever the number of
    ranks and the sharding plan it was written with. A collective, like :func:`save`.

    Before anything changes, every rank checks the manifest and DCP's metadata, and the ranks
    share the verification of every chunk's sha256. Tensors the engine does not have (slots,
    when it has no optimizer) are ignored.

    Raises:
        FileNotFoundError: nothing at ``path`` (an interrupted save leaves ``path.tmp`` only).
        CheckpointError (a ValueError): the checkpoint is incomplete or corrupt, or lacks one of
            the engine's tensors or holds it with another shape (a different vocabulary size,
            dim or optimizer); the message names the table, expected and found. Nothing is
            loaded.
    """
    _check_engine(engine, "load")
    path = os.path.normpath(os.fspath(path))
    sharded = _sharded(engine)
    if sharded:
        engine.flush()
    comm = _comm(engine)
    error: BaseException | None = None
    fingerprint = 0
    try:
        manifest, raw, metadata, chunks = _open(path)
        fingerprint = _fingerprint(raw)
        problems = _fit_problems(engine, manifest, sharded)
        if problems:
            raise CheckpointError(
                f"embcore.checkpoint.load: {path} does not fit this engine: {'; '.join(problems)}"
            )
    except (OSError, ValueError) as e:
        error = e
    manifests = _agree(comm, "load", error, [fingerprint])
    _same_everywhere("load", manifests, f"read another manifest at {path!r}")

    found = _verify_chunks(path, manifest, chunks, comm.rank, comm.world)
    flags = _agree(comm, "load", None, [int(i in found) for i in range(len(chunks))])
    bad = [i for i in range(len(chunks)) if any(f[i] for f in flags)]
    if bad:
        raise _corrupt(path, manifest, chunks, bad, found)

    reader = _VerifiedReader(path, metadata)
    args = _dcp_args(engine)
    if sharded:
        staged = []
        state: dict[str, Any] = {"step": engine._step}
        for key, table, name in engine._checkpoint_items():  # type: ignore[attr-defined]
            table_chunks = table.load_chunks(name)
            state[key] = _Chunked(table.logical_shape(name), table_chunks)
            staged.append((table, name, table_chunks))
        with torch.no_grad(), _single_process_ok(args["no_dist"]), _dcp_errors(comm, "load", path):
            dcp.load(state, storage_reader=reader, planner=_LoadPlanner(), **args)
            for table, name, table_chunks in staged:
                table.finish_load(name, table_chunks)
        engine._deferred = None  # an update computed before the load no longer applies
        engine._pending = None
    else:
        state = dict(engine.state_dict())  # shares storage with the engine's buffers
        with torch.no_grad(), _single_process_ok(args["no_dist"]), _dcp_errors(comm, "load", path):
            dcp.load(state, storage_reader=reader, planner=_LoadPlanner(), **args)
        engine.load_state_dict(state)  # resets what a load resets (pending batches)
