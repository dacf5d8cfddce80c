"""The manifest of an ``embcore.checkpoint`` directory, its checksums, and a safe metadata reader.

A checkpoint directory holds what ``torch.distributed.checkpoint`` (DCP) writes, plus
``embcore_manifest.json``::

    ckpt/step-1000/
      __0_0.distcp  __1_0.distcp ...   each rank's boxes (chunks) of the logical tensors
      .metadata                        DCP's index: tensor -> chunks -> (file, offset, length)
      embcore_manifest.json            written last, by rank 0: this module

The manifest (JSON) records the format version, the engine's configuration (tables, features,
optimizer hyperparameters; callables such as a learning-rate schedule or an initializer by
name only), the sharding plan (or ``"single process"``), the sha256 of ``.metadata`` and, for
every stored chunk of every tensor, its box and the sha256 of its stored bytes. Chunks are
what the writer stored, so the digests do not depend on how many ranks read the checkpoint or
under which plan: every reader verifies the same list (N-to-M resharding keeps working).

DCP's ``.metadata`` is a pickle. It is only unpickled after its sha256 matched the manifest,
and then by :class:`_MetadataUnpickler`, which resolves no global outside an allowlist of
DCP's metadata dataclasses, ``torch.Size``, dtypes and layouts: a crafted file can run no
other code. The chunks themselves are read by DCP with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import re
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata

import embcore

FORMAT = "embcore-checkpoint"
VERSION = 1
MANIFEST = "embcore_manifest.json"
DCP_METADATA = ".metadata"

_BLOCK = 1 << 23
_RANK_FILE = re.compile(r"^__(\d+)_")


class CheckpointError(ValueError):
    """A checkpoint that is incomplete, corrupt, or does not fit the engine."""


@dataclass(frozen=True)
class Chunk:
    """One stored box of a logical tensor: ``tensor[offsets : offsets + sizes]``, kept as
    ``length`` bytes at ``offset`` in ``file`` (relative to the checkpoint directory)."""

    key: str
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    file: str
    offset: int
    length: int

    def describe(self) -> str:
        box = ", ".join(f"{o}:{o + s}" for o, s in zip(self.offsets, self.sizes, strict=True))
        return f"'{self.key}'[{box}] (bytes {self.offset}+{self.length} of {self.file})"

    @property
    def writer(self) -> int:
        """The rank that wrote this chunk (DCP names files ``__{rank}_{n}.distcp``)."""
        m = _RANK_FILE.match(self.file)
        return int(m.group(1)) if m else 0


def table_of(key: str) -> str:
    """``'a.weight'`` -> ``'a'`` (``step`` has no table)."""
    return key.rsplit(".", 1)[0] if "." in key else key


# ---------------------------------------------------------------------------- checksums
def sha256_range(path: str, offset: int, length: int) -> str:
    """sha256 of ``length`` bytes at ``offset`` of ``path``; a short file is an error."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        f.seek(offset)
        left = length
        while left:
            block = f.read(min(left, _BLOCK))
            if not block:
                raise CheckpointError(
                    f"{path} ends {left} bytes early (expected {offset + length} bytes): the "
                    "file is truncated"
                )
            digest.update(block)
            left -= len(block)
    return digest.hexdigest()


def sha256_file(path: str) -> str:
    return sha256_range(path, 0, os.path.getsize(path))


def digest_to_ints(hexdigest: str) -> list[int]:
    """A sha256 as 4 int64 (to all-gather it as a tensor); ``digest_from_ints`` inverts it."""
    raw = bytes.fromhex(hexdigest)
    return [int.from_bytes(raw[i : i + 8], "little", signed=True) for i in range(0, 32, 8)]


def digest_from_ints(values: list[int]) -> str:
    return b"".join(v.to_bytes(8, "little", signed=True) for v in values).hex()


# ------------------------------------------------------------------- the DCP metadata
def chunks_of(metadata: Metadata) -> list[Chunk]:
    """Every stored chunk, in a deterministic order (tensor key, then offsets)."""
    where = {(idx.fqn, tuple(idx.offset)): info for idx, info in metadata.storage_data.items()}
    out = []
    for key, md in metadata.state_dict_metadata.items():
        if not isinstance(md, TensorStorageMetadata):
            raise CheckpointError(f"'{key}' is stored as {type(md).__name__}, not as a tensor")
        for c in md.chunks:
            info = where.get((key, tuple(c.offsets)))
            if info is None:
                raise CheckpointError(f"'{key}' chunk at {tuple(c.offsets)} has no storage entry")
            out.append(
                Chunk(
                    key,
                    tuple(c.offsets),
                    tuple(c.sizes),
                    str(info.relative_path),
                    int(info.offset),
                    int(info.length),
                )
            )
    return sorted(out, key=lambda c: (c.key, c.offsets))


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


def read_dcp_metadata(directory: str, expected_sha256: str) -> Metadata:
    """DCP's ``.metadata``, after checking its sha256 against the manifest, unpickled safely."""
    path = os.path.join(directory, DCP_METADATA)
    if not os.path.isfile(path):
        raise CheckpointError(f"{path} is missing")
    with open(path, "rb") as f:
        data = f.read()
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


# ----------------------------------------------------------------------- the manifest
def _named(value: Any) -> Any:
    """A JSON value for a config field: callables by name, tuples as lists."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (tuple, list)):
        return [_named(v) for v in value]
    if callable(value):
        name = getattr(value, "__qualname__", None) or type(value).__qualname__
        return f"<callable {getattr(value, '__module__', '?')}.{name}>"
    return repr(value)


def describe_engine(engine: Any) -> dict[str, Any]:
    """The engine's configuration as JSON values: tables, features, sharding."""
    tables = []
    for t in engine._tables:
        opt = t.optimizer
        tables.append(
            {
                "name": t.name,
                "vocabulary_size": t.vocabulary_size,
                "dim": t.dim,
                "combiner": t.combiner,
                "initializer": "default"
                if t.config.initializer is None
                else _named(t.config.initializer),
                "optimizer": None
                if opt is None
                else {
                    "type": type(opt).__name__,
                    "hyperparameters": {k: _named(v) for k, v in opt.hyperparameters().items()},
                },
                "features": [engine._features[i].name for i in t.features],
            }
        )
    features = [
        {
            "name": f.name,
            "table": engine._tables[f.table].name,
            "max_sequence_length": f.config.max_sequence_length,
            "output_shape": _named(f.config.output_shape),
        }
        for f in engine._features
    ]
    plan = getattr(engine, "plan", None)
    return {
        "engine": {"class": type(engine).__name__, "seed": engine.seed},
        "tables": tables,
        "features": features,
        "sharding": "single process" if plan is None else json.loads(plan.to_json()),
    }


def build(
    engine: Any, metadata: Metadata, digests: list[str], metadata_sha256: str
) -> dict[str, Any]:
    """The manifest of a checkpoint whose DCP ``metadata`` and chunk ``digests`` (in
    :func:`chunks_of` order) are known."""
    tensors: dict[str, Any] = {}
    for chunk, digest in zip(chunks_of(metadata), digests, strict=True):
        md = metadata.state_dict_metadata[chunk.key]
        entry = tensors.setdefault(
            chunk.key,
            {
                "shape": list(md.size),
                "dtype": str(md.properties.dtype).removeprefix("torch."),
                "chunks": [],
            },
        )
        entry["chunks"].append(
            {
                "offsets": list(chunk.offsets),
                "sizes": list(chunk.sizes),
                "file": chunk.file,
                "offset": chunk.offset,
                "length": chunk.length,
                "sha256": digest,
            }
        )
    return {
        "format": FORMAT,
        "format_version": VERSION,
        "embcore_version": embcore.__version__,
        "torch_version": torch.__version__,
        "step": engine.step,
        "world_size": getattr(engine, "world_size", 1),
        **describe_engine(engine),
        "checksums": "sha256 of each stored chunk's bytes, and of .metadata",
        "dcp_metadata_sha256": metadata_sha256,
        "tensors": tensors,
    }


def write(directory: str, manifest: dict[str, Any]) -> None:
    """Write the manifest into ``directory`` and flush it to disk."""
    with open(os.path.join(directory, MANIFEST), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())


def read(directory: str) -> tuple[dict[str, Any], bytes]:
    """The manifest of the checkpoint ``directory`` and its raw bytes.

    Raises:
        FileNotFoundError: no checkpoint at ``directory`` (an interrupted save leaves only
            ``directory.tmp``).
        CheckpointError: no manifest, or one of another format or a newer version.
    """
    if not os.path.isdir(directory):
        tmp = f"{directory}.tmp"
        hint = f"; {tmp} is a save that did not finish" if os.path.isdir(tmp) else ""
        raise FileNotFoundError(f"no checkpoint at {directory}{hint}")
    path = os.path.join(directory, MANIFEST)
    if not os.path.isfile(path):
        raise CheckpointError(
            f"{directory} has no {MANIFEST}: it is not a complete embcore checkpoint (a save "
            "publishes the directory only after writing the manifest)"
        )
    with open(path, "rb") as f:
        raw = f.read()
    try:
        manifest = json.loads(raw)
    except ValueError as error:
        raise CheckpointError(f"{path} is not valid JSON: {error}") from error
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not an embcore checkpoint manifest")
    version = manifest.get("format_version")
    if version != VERSION:
        raise CheckpointError(
            f"{path} has format_version {version!r}; this embcore ({embcore.__version__}) reads "
            f"format_version {VERSION}"
        )
    return manifest, raw


def check_matches(manifest: dict[str, Any], metadata: Metadata) -> list[Chunk]:
    """The chunks of ``metadata``, after checking they are the ones the manifest lists."""
    chunks = chunks_of(metadata)
    listed = []
    for key, entry in manifest["tensors"].items():
        for c in entry["chunks"]:
            box = (tuple(c["offsets"]), tuple(c["sizes"]), c["file"], c["offset"], c["length"])
            listed.append((key, *box))
    stored = sorted((c.key, c.offsets, c.sizes, c.file, c.offset, c.length) for c in chunks)
    if stored != sorted(listed):
        differ = sorted({table_of(k[0]) for k in set(stored) ^ set(listed)})
        raise CheckpointError(
            f"DCP metadata and the manifest list different chunks for tables {differ}"
        )
    for key, md in metadata.state_dict_metadata.items():
        entry = manifest["tensors"][key]
        dtype = str(md.properties.dtype).removeprefix("torch.")  # type: ignore[union-attr]
        if list(md.size) != entry["shape"] or dtype != entry["dtype"]:  # type: ignore[union-attr]
            raise CheckpointError(
                f"table '{table_of(key)}': '{key}' is {entry['dtype']} {entry['shape']} in the "
                f"manifest but {dtype} {list(md.size)} in DCP metadata"  # type: ignore[union-attr]
            )
    return chunks


def expected_digest(manifest: dict[str, Any], chunk: Chunk) -> str:
    for c in manifest["tensors"][chunk.key]["chunks"]:
        if tuple(c["offsets"]) == chunk.offsets:
            return str(c["sha256"])
    raise CheckpointError(f"the manifest has no checksum for {chunk.describe()}")
