"""The manifest of an ``embcore.checkpoint`` directory: what it records, and its comparison with
DCP's own index.

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

DCP's ``.metadata`` is a pickle, read by :mod:`embcore.checkpoint._digest` only after its
sha256 matched the manifest, with an unpickler that runs no code. See docs/reliability.md.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata

import embcore
from embcore import _atomic
from embcore.checkpoint._digest import check_name, read_small
from embcore.checkpoint._errors import CheckpointError

FORMAT = "embcore-checkpoint"
VERSION = 1
MANIFEST = "embcore_manifest.json"
DCP_METADATA = ".metadata"

_RANK_FILE = re.compile(r"^__(\d+)_")


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


# ----------------------------------------------------------------------- the manifest
def build(
    described: dict[str, Any],
    step: int,
    world_size: int,
    metadata: Metadata,
    digests: list[str],
    metadata_sha256: str,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The manifest of a checkpoint whose DCP ``metadata`` and chunk ``digests`` (in
    :func:`chunks_of` order) are known; ``described`` is the engine's configuration as JSON
    values (tables, features, sharding); ``extra`` adds the sections of dynamic tables
    (``"dynamic"``) and of a delta (``"base"``)."""
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
        "step": step,
        "world_size": world_size,
        **described,
        "checksums": "sha256 of each stored chunk's bytes, and of .metadata",
        "dcp_metadata_sha256": metadata_sha256,
        "tensors": tensors,
        **(extra or {}),
    }


def write(directory: str, manifest: dict[str, Any]) -> None:
    """Write the manifest into ``directory`` and flush it to disk."""
    text = json.dumps(manifest, indent=1, sort_keys=True) + "\n"
    _atomic.write_atomic(os.path.join(directory, MANIFEST), text.encode())


def read(directory: str) -> tuple[dict[str, Any], bytes]:
    """The manifest of the checkpoint ``directory`` and its raw bytes.

    Raises:
        FileNotFoundError: no checkpoint at ``directory`` (an interrupted save leaves only
            a ``directory.tmp-*``).
        CheckpointError: no manifest, or one of another format or a newer version.
    """
    if not os.path.isdir(directory):
        parent, name = os.path.split(os.path.abspath(directory))
        left = sorted(
            p
            for p in (os.listdir(parent) if os.path.isdir(parent) else [])
            if p == f"{name}.tmp" or p.startswith(f"{name}.tmp-")
        )
        hint = f"; {os.path.join(parent, left[0])} is a save that did not finish" if left else ""
        raise FileNotFoundError(f"no checkpoint at {directory}{hint}")
    path = os.path.join(directory, MANIFEST)
    if not os.path.lexists(path):
        raise CheckpointError(
            f"{directory} has no {MANIFEST}: it is not a complete embcore checkpoint (a save "
            "publishes the directory only after writing the manifest)"
        )
    raw = read_small(directory, MANIFEST)
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


def check_matches(directory: str, manifest: dict[str, Any], metadata: Metadata) -> list[Chunk]:
    """The chunks of ``metadata``, after checking they are the ones the manifest lists and
    that each names a plain file of ``directory``."""
    chunks = chunks_of(metadata)
    for c in chunks:
        check_name(directory, c.file)
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
