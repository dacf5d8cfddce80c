"""Delta checkpoints name their base: the link, and the chain a load reads.

A delta's manifest holds ``"base": {"name", "manifest_sha256", "step"}``: the directory name
of the checkpoint it was saved against (a sibling: ``ckpt/step-2000`` names ``step-1000`` for
``ckpt/step-1000``), and the sha256 of that checkpoint's manifest. A load follows the links
back to a full checkpoint and refuses a missing base, one that is not a plain directory
beside the delta, or one whose manifest is not the one the delta was saved against (replaced
or edited since). See docs/dynamic_tables.md.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import Any

from torch.distributed.checkpoint.metadata import Metadata

from embcore.checkpoint import _manifest
from embcore.checkpoint._digest import check_name, read_dcp_metadata
from embcore.checkpoint._errors import CheckpointError
from embcore.checkpoint._manifest import Chunk

__all__ = ["MAX_CHAIN", "Link", "compatible", "link_to", "open_checkpoint", "resolve"]

#: the longest chain of deltas a load follows (a full checkpoint, then deltas)
MAX_CHAIN = 10_000


@dataclass(frozen=True)
class Link:
    """One checkpoint of a chain: its directory, manifest (and the manifest's bytes), DCP
    metadata (verified against the manifest) and chunk list."""

    path: str
    manifest: dict[str, Any]
    raw: bytes
    metadata: Metadata
    chunks: list[Chunk]

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.raw).hexdigest()

    @property
    def base(self) -> dict[str, Any] | None:
        return self.manifest.get("base")


def open_checkpoint(path: str) -> Link:
    """Manifest, verified DCP metadata and chunks of the checkpoint at ``path`` (no chunk
    checksum is checked here)."""
    manifest, raw = _manifest.read(path)
    try:
        metadata = read_dcp_metadata(path, _manifest.DCP_METADATA, manifest["dcp_metadata_sha256"])
        chunks = _manifest.check_matches(path, manifest, metadata)
        base = manifest.get("base")
        if base is not None and not (
            isinstance(base, dict)
            and isinstance(base.get("name"), str)
            and isinstance(base.get("manifest_sha256"), str)
        ):
            raise TypeError(f"'base' is {base!r}")
    except (KeyError, TypeError, AttributeError) as error:
        raise CheckpointError(f"{path}: the manifest is malformed ({error!r})") from error
    return Link(path, manifest, raw, metadata, chunks)


def _base_path(link: Link) -> str:
    name = link.base["name"]  # type: ignore[index]
    parent = os.path.dirname(os.path.abspath(link.path))
    try:
        full = check_name(parent, name)
    except CheckpointError as error:
        raise CheckpointError(
            f"{link.path} names its base {name!r}: a delta's base is a checkpoint directory "
            "beside it, named without a path"
        ) from error
    if os.path.islink(full):
        raise CheckpointError(
            f"{full}, the base of {link.path}, is a symbolic link; a base must be a checkpoint "
            "directory"
        )
    return full


def resolve(last: Link) -> list[Link]:
    """The chain ending at ``last``: a full checkpoint first, then each delta on the one
    before it.

    Raises:
        FileNotFoundError: a base is missing (the message names it and the delta naming it).
        CheckpointError: a base was replaced or edited since the delta was saved, is not a
            sibling directory, or the chain loops or is longer than :data:`MAX_CHAIN`.
    """
    chain = [last]
    seen = {os.path.realpath(last.path)}
    while chain[-1].base is not None:
        link = chain[-1]
        path = _base_path(link)
        if not os.path.isdir(path):
            raise FileNotFoundError(
                f"the base {path} of the delta checkpoint {link.path} is missing; a delta "
                "loads only with every checkpoint of its chain (restore the base, or load a "
                "full checkpoint)"
            )
        if os.path.realpath(path) in seen or len(chain) >= MAX_CHAIN:
            raise CheckpointError(
                f"{link.path}: its chain of bases loops or is longer than {MAX_CHAIN}"
            )
        seen.add(os.path.realpath(path))
        try:
            base = open_checkpoint(path)
        except CheckpointError as error:
            raise CheckpointError(f"the base of {link.path} is unusable: {error}") from error
        want = link.base["manifest_sha256"]  # type: ignore[index]
        if base.sha256 != want:
            raise CheckpointError(
                f"{path} is not the base {link.path} was saved against: its manifest's sha256 "
                f"is {base.sha256}, the delta expects {want} (the base was replaced or edited)"
            )
        chain.append(base)
    return chain[::-1]


def link_to(path: str, base: str) -> tuple[Link, dict[str, Any]]:
    """The base checkpoint a delta at ``path`` will name, and the manifest entry naming it.

    Raises:
        ValueError: ``base`` is ``path`` itself or not in the same directory.
        FileNotFoundError, CheckpointError: as :func:`open_checkpoint`.
    """
    here, there = os.path.abspath(path), os.path.abspath(base)
    if here == there or os.path.dirname(here) != os.path.dirname(there):
        raise ValueError(
            f"embcore.checkpoint.save: base={base!r} must be another checkpoint in the "
            f"directory of path={path!r} (a delta names its base by its directory name)"
        )
    if os.path.islink(there):
        raise CheckpointError(f"embcore.checkpoint.save: base {base} is a symbolic link")
    link = open_checkpoint(there)
    entry = {
        "name": os.path.basename(there),
        "manifest_sha256": link.sha256,
        "step": link.manifest.get("step"),
    }
    return link, entry


#: engine classes whose checkpoints hold the same records: a sharded engine writes whole
#: tables and keyed records that do not depend on the number of ranks, so a delta of either
#: may stand on a base the other saved (as full checkpoints load between any numbers)
_SAME_RECORDS = {"ShardedEmbeddingEngine": "EmbeddingEngine"}


def _shape(described: dict[str, Any]) -> dict[str, Any]:
    """What must agree between a delta and its base: the engine class (one process or
    sharded: the same), the tables (name, vocabulary size, dim, optimizer type) and the
    features with their tables."""
    engine = (described.get("engine") or {}).get("class")
    return {
        "engine": _SAME_RECORDS.get(engine, engine),
        "tables": [
            (
                t.get("name"),
                t.get("vocabulary_size"),
                t.get("dim"),
                (t.get("optimizer") or {}).get("type"),
            )
            for t in described.get("tables", [])
        ],
        "features": [(f.get("name"), f.get("table")) for f in described.get("features", [])],
    }


def compatible(described: dict[str, Any], base: Link) -> list[str]:
    """Why ``base`` cannot be the base of a delta of the engine ``described`` (empty: it can)."""
    mine, theirs = _shape(described), _shape(base.manifest)
    problems = []
    if mine["engine"] != theirs["engine"]:
        problems.append(f"engine {theirs['engine']} in the base, {mine['engine']} here")
    by_name = {t[0]: t for t in theirs["tables"]}
    for t in mine["tables"]:
        other = by_name.get(t[0])
        if other is None:
            problems.append(f"table '{t[0]}' is not in the base (it has {sorted(by_name)})")
            continue
        for field, a, b in zip(
            ("vocabulary_size", "dim", "optimizer"), other[1:], t[1:], strict=True
        ):
            if a != b:
                problems.append(f"table '{t[0]}': {field} {a} in the base, {b} here")
    extra = sorted(set(by_name) - {t[0] for t in mine["tables"]})
    if extra:
        problems.append(f"the base has tables {extra} that this engine lacks")
    if sorted(mine["features"]) != sorted(theirs["features"]):
        problems.append(
            f"features {sorted(theirs['features'])} in the base, {sorted(mine['features'])} here"
        )
    return problems
