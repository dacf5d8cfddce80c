"""Adapters to ``torch.distributed.checkpoint`` (DCP): chunked logical tensors, planners that
keep them whole, a reader that uses metadata already verified, and DCP's errors as ours.

A stored tensor is a :class:`Chunked` value: its logical shape and the boxes this rank holds
(possibly none). DCP writes each box as one chunk and reads into the boxes a rank asks for.
See docs/reliability.md for the checkpoint protocol.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
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

from embcore._comm import Comm, CommError
from embcore._lazy_box import LazyBox
from embcore.checkpoint._errors import CheckpointError

__all__ = [
    "Chunked",
    "LoadPlanner",
    "SavePlanner",
    "VerifiedReader",
    "dcp_errors",
    "no_dist_ok",
    "read_arrays",
]

Chunks = list[tuple[tuple[int, ...], Tensor]]


class Chunked:
    """A logical tensor of which this rank holds some boxes ``(offsets, tensor)``, for DCP.
    A box may be a :class:`LazyBox` (a table on disk): read when DCP writes it, written to
    the table when DCP has filled it."""

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
                    properties=TensorProperties.create_from_tensor(
                        t.meta() if isinstance(t, LazyBox) else t
                    ),
                    size=self.shape,
                ),
            )
            for offsets, t in self.chunks.items()
        ]

    def __create_chunk_list__(self) -> list[ChunkStorageMetadata]:
        return [ChunkStorageMetadata(torch.Size(o), t.size()) for o, t in self.chunks.items()]

    def at(self, offset: Any) -> Tensor:
        box = self.chunks[tuple(offset)]
        return box.tensor() if isinstance(box, LazyBox) else box

    def filled(self, offset: Any, elements: int) -> None:
        """DCP copied ``elements`` values into the box at ``offset``."""
        box = self.chunks[tuple(offset)]
        if isinstance(box, LazyBox):
            box.filled(elements)


class SavePlanner(dcp.DefaultSavePlanner):
    def __init__(self) -> None:
        super().__init__(flatten_state_dict=False, flatten_sharded_tensors=False)

    def lookup_object(self, index: MetadataIndex) -> Any:
        obj = self.state_dict[index.fqn]
        return obj.at(index.offset) if isinstance(obj, Chunked) else super().lookup_object(index)


class LoadPlanner(dcp.DefaultLoadPlanner):
    def __init__(self) -> None:
        super().__init__(flatten_state_dict=False, flatten_sharded_tensors=False)

    def set_up_planner(
        self, state_dict: dict[str, Any], metadata: Any = None, is_coordinator: bool = False
    ) -> None:
        # As the default planner, without its meta-device pass, which would drop our
        # non-tensor Chunked values (our tensors are never on the meta device).
        self.original_state_dict = state_dict
        self.state_dict = state_dict
        self.mappings = {}
        self.metadata = metadata
        self.is_coordinator = is_coordinator

    def lookup_tensor(self, index: MetadataIndex) -> Tensor:
        obj = self.state_dict[index.fqn]
        return obj.at(index.offset) if isinstance(obj, Chunked) else super().lookup_tensor(index)

    def commit_tensor(self, read_item: Any, tensor: Tensor) -> None:
        obj = self.state_dict[read_item.dest_index.fqn]
        if isinstance(obj, Chunked):
            obj.filled(read_item.dest_index.offset, tensor.numel())

    def load_bytes(self, read_item: Any, value: Any) -> None:
        # DCP unpickles byte items with weights_only=False; an embcore checkpoint has none.
        raise CheckpointError(f"'{read_item.dest_index.fqn}' is stored as bytes, not a tensor")


class VerifiedReader(dcp.FileSystemReader):
    """Reads chunks as DCP does, with metadata that was already verified (DCP's own
    ``read_metadata`` would unpickle the file without restriction)."""

    def __init__(self, path: str, metadata: Metadata) -> None:
        super().__init__(path)
        self._verified = metadata

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        if kwargs.get("rank") is not None:  # DCP's per-rank fallback: not used by embcore
            raise FileNotFoundError("embcore checkpoints have one global metadata file")
        return self._verified


def dcp_args(comm: Comm) -> dict[str, Any]:
    """The process group DCP runs its collectives over (none: one process)."""
    if comm.distributed:
        return {"process_group": comm.group, "no_dist": False}
    return {"no_dist": True}


@contextmanager
def no_dist_ok(args: dict[str, Any]) -> Iterator[None]:
    """DCP warns that it assumes one process when there is no process group: that is the
    intent there."""
    with warnings.catch_warnings():
        if args["no_dist"]:
            warnings.filterwarnings("ignore", message=r"torch\.distributed is .*single process")
        yield


@contextmanager
def dcp_errors(comm: Comm, what: str, path: str) -> Iterator[None]:
    """DCP's failures as embcore errors: a rank's failure that DCP reports everywhere
    (``CheckpointException``, a ``BaseException``) becomes a ``RuntimeError`` (an ``OSError``
    stays one, so a full disk is still recognised); a collective that fails because a rank
    died or timed out becomes a :class:`CommError`."""
    try:
        yield
    except CheckpointException as error:
        rank, (cause, _) = next(iter(sorted(error.failures.items(), key=lambda kv: kv[0])))
        text = (
            f"embcore.checkpoint.{what} of {path} failed on rank(s) {sorted(error.failures)}; "
            f"on rank {rank}: {type(cause).__name__}: {cause}"
        )
        if isinstance(cause, OSError) and cause.errno is not None:
            raise OSError(cause.errno, text) from error
        raise RuntimeError(text) from error
    except RuntimeError as error:
        if isinstance(error, CommError) or not comm.distributed:
            raise
        raise comm.failed(f"embcore.checkpoint.{what} of {path}", error) from error


def read_arrays(
    path: str, metadata: Metadata, manifest: dict[str, Any], keys: list[str]
) -> dict[str, Any]:
    """The stored tensors ``keys`` of a checkpoint as NumPy arrays, read whole in this process
    (their shapes and dtypes from the manifest, which was checked against ``metadata``)."""
    state: dict[str, Tensor] = {}
    for key in keys:
        entry = manifest["tensors"].get(key)
        dtype = getattr(torch, str((entry or {}).get("dtype")), None)
        if entry is None or not isinstance(dtype, torch.dtype):
            raise CheckpointError(f"{path}: the tensor '{key}' is missing from the manifest")
        state[key] = torch.empty([int(n) for n in entry["shape"]], dtype=dtype)
    if state:
        args = {"no_dist": True}
        with torch.no_grad(), no_dist_ok(args):
            dcp.load(
                state,
                storage_reader=VerifiedReader(path, metadata),
                planner=LoadPlanner(),
                **args,
            )
    return {k: v.numpy() for k, v in state.items()}
