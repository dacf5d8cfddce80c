"""Reading a checkpoint's files safely: names confined to the checkpoint directory, byte ranges
bounded by file sizes, chunk checksums, and an unpickler for DCP's metadata that runs no code.

A checkpoint directory may come from anyone, so every file name it holds (in DCP's
``.metadata`` and in the manifest) is accepted only as the plain name of a regular file inside
the directory: no ``/``, no ``..``, no absolute path, no symlink, no device or FIFO. Ranges are
checked against the file's size before a byte is read, so a checksum in an error message is
always of bytes inside the checkpoint. See docs/reliability.md (security).
"""

from __future__ import annotations

import hashlib
import io
import os
import pickle
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import Metadata

from embcore._files import UnsafeFileError, open_regular, read_regular
from embcore.checkpoint._errors import CheckpointError

__all__ = [
    "check_name",
    "digest_from_ints",
    "digest_to_ints",
    "read_dcp_metadata",
    "read_small",
    "sha256_chunk",
]

_BLOCK = 1 << 23
_SMALL = 1 << 30  # no manifest or .metadata is anywhere near 1 GiB


def check_name(directory: str, name: Any) -> str:
    """``directory/name`` if ``name`` is a plain file name (not a path); else CheckpointError."""
    if (
        not isinstance(name, str)
        or name in ("", ".", "..")
        or "/" in name
        or "\\" in name
        or "\0" in name
        or os.path.isabs(name)
    ):
        raise CheckpointError(
            f"{directory}: refusing the file name {name!r}: a checkpoint names only plain files "
            "inside its own directory"
        )
    return os.path.join(directory, name)


def _open(directory: str, name: Any) -> tuple[int, int]:
    """``(fd, size)`` of the regular file ``name`` inside ``directory`` (no symlink followed)."""
    try:
        return open_regular(check_name(directory, name))
    except UnsafeFileError as error:
        raise CheckpointError(f"{error}; a checkpoint holds only regular files") from error


def read_small(directory: str, name: str) -> bytes:
    """The whole of a small file of the checkpoint (the manifest, ``.metadata``)."""
    try:
        return read_regular(check_name(directory, name), _SMALL)
    except UnsafeFileError as error:
        raise CheckpointError(f"{error}; a checkpoint holds only regular files") from error


def sha256_chunk(directory: str, name: str, offset: int, length: int) -> str:
    """sha256 of ``length`` bytes at ``offset`` of the checkpoint file ``name``.

    Raises:
        CheckpointError: a bad name, not a regular file, or a range past the end of the file
            (checked before reading).
    """
    if not (isinstance(offset, int) and isinstance(length, int) and offset >= 0 and length >= 0):
        raise CheckpointError(f"{directory}: bad byte range {offset!r}+{length!r} of {name!r}")
    fd, size = _open(directory, name)
    with os.fdopen(fd, "rb") as f:
        if offset + length > size:
            raise CheckpointError(
                f"{os.path.join(directory, name)} has {size} bytes, {offset + length} expected: "
                "the file is truncated"
            )
        f.seek(offset)
        digest, left = hashlib.sha256(), length
        while left:
            block = f.read(min(left, _BLOCK))
            if not block:  # shrank while we read it
                raise CheckpointError(f"{os.path.join(directory, name)} is truncated")
            digest.update(block)
            left -= len(block)
    return digest.hexdigest()


def digest_to_ints(hexdigest: str) -> list[int]:
    """A sha256 as 4 int64 (to all-gather it as a tensor); ``digest_from_ints`` inverts it."""
    raw = bytes.fromhex(hexdigest)
    return [int.from_bytes(raw[i : i + 8], "little", signed=True) for i in range(0, 32, 8)]


def digest_from_ints(values: list[int]) -> str:
    return b"".join(v.to_bytes(8, "little", signed=True) for v in values).hex()


_SAFE_GLOBALS = {
    ("torch.distributed.checkpoint.metadata", name)
    for name in (
        "Metadata",
        "TensorStorageMetadata",
        "BytesStorageMetadata",
        "ChunkStorageMetadata",
        "TensorProperties",
        "MetadataIndex",
        "StorageMeta",
        "_MEM_FORMAT_ENCODING",
    )
} | {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
    ("pathlib._local", "PosixPath"),
    ("pathlib._local", "PurePosixPath"),
    ("collections", "OrderedDict"),
}


class _MetadataUnpickler(pickle.Unpickler):
    """Unpickles DCP metadata and nothing else: every global outside the allowlist is refused
    (the "restricting globals" recipe of the ``pickle`` documentation)."""

    def find_class(self, module: str, name: str) -> Any:
        dtype = module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)
        if (module, name) in _SAFE_GLOBALS or dtype:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(
            f"{module}.{name} is not part of DCP checkpoint metadata; refusing to load it"
        )


def read_dcp_metadata(directory: str, name: str, expected_sha256: str) -> Metadata:
    """DCP's ``.metadata``, after checking its sha256 against the manifest, unpickled safely."""
    path = os.path.join(directory, name)
    if not os.path.lexists(path):
        raise CheckpointError(f"{path} is missing")
    data = read_small(directory, name)
    found = hashlib.sha256(data).hexdigest()
    if found != expected_sha256:
        raise CheckpointError(
            f"{path} does not match the manifest: sha256 expected {expected_sha256}, found {found}"
        )
    try:
        metadata = _MetadataUnpickler(io.BytesIO(data)).load()
    except (pickle.UnpicklingError, EOFError, AttributeError, TypeError) as error:
        raise CheckpointError(f"{path} is not DCP metadata: {error}") from error
    if not isinstance(metadata, Metadata):
        raise CheckpointError(f"{path} holds a {type(metadata).__name__}, not DCP metadata")
    return metadata
