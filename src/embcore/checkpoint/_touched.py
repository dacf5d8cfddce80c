"""Fixed tables in a delta as the rows touched since its base, not whole.

A table whose stored tensors know which rows were written since a checkpoint (a fixed table
in ``DiskStorage``: ``touched_since``, ``read_rows``, ``checkpointed`` on its
:class:`~embcore.checkpoint._engine_view.StoredTensor`) is written into a delta on that
checkpoint as two tensors per stored tensor ``key``::

    {key}#rows     (K,) int64      the rows touched since the base, ascending
    {key}#touched  (K, ...)        their values, in boxes of BOX rows read when written

and the manifest's ``"touched"`` section gives ``key``'s logical shape, dtype and ``K``. A
load takes each tensor whole from the latest checkpoint of the chain that holds it whole and
writes the touched rows of every later delta over it (later deltas win), box by box as the
tensor streams in. Any other table, a table not known to equal the base (the engine neither
saved nor loaded it since its rows last changed), and a sharded engine's tables are written
whole, as before. See docs/disk_tables.md, "Checkpoints".
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from embcore._lazy_box import LazyBox
from embcore.checkpoint._chain import Link
from embcore.checkpoint._dcp import Chunked, Chunks, read_arrays
from embcore.checkpoint._engine_view import EngineView, StoredTensor
from embcore.checkpoint._errors import CheckpointError

__all__ = [
    "Patch",
    "checkpointed",
    "patch_chunks",
    "patches",
    "plan",
    "section",
    "stored",
    "tensors",
    "verify_chain",
]

ROWS, VALUES = "#rows", "#touched"
#: rows per box of a touched tensor (read from the table when the save writes the box)
BOX = 8192

#: ``(ids (K,) int64 ascending, values (K, ...))``: rows to write over a tensor
Patch = tuple[np.ndarray, np.ndarray]


def plan(view: EngineView, stored: list[StoredTensor], base: Link) -> dict[str, np.ndarray]:
    """``{key: touched rows}`` of the tensors (``stored``: ``view``'s) a delta on ``base``
    writes as touched rows (one-process engines only: a rank's rows of a sharded table are
    written whole)."""
    if view.world_size != 1:
        return {}
    touched = {}
    for t in stored:
        ids = None if t.touched_since is None else t.touched_since(base.sha256)
        if ids is not None:
            touched[t.key] = ids
    return touched


def section(stored: list[StoredTensor], touched: dict[str, np.ndarray]) -> dict[str, Any]:
    """The manifest's ``"touched"`` section: ``{key: {"shape", "dtype", "rows"}}``."""
    return {
        t.key: {"shape": list(t.shape), "dtype": t.dtype, "rows": int(touched[t.key].size)}
        for t in stored
        if t.key in touched
    }


def tensors(stored: list[StoredTensor], touched: dict[str, np.ndarray]) -> dict[str, Any]:
    """What DCP writes for the touched tensors: their rows, and their values as boxes of
    :data:`BOX` rows, each read from the table when DCP writes it."""
    out: dict[str, Any] = {}
    for t in stored:
        if t.key not in touched:
            continue
        ids, tail = touched[t.key], tuple(t.shape[1:])
        read = t.read_rows
        assert read is not None  # a tensor that tracks touched rows reads them
        out[t.key + ROWS] = torch.from_numpy(np.ascontiguousarray(ids, np.int64))
        boxes = [
            (
                (a, *(0,) * len(tail)),
                LazyBox(
                    (min(ids.size, a + BOX) - a, *tail),
                    torch.float32,
                    read=lambda a=a, read=read, ids=ids: read(ids[a : a + BOX]).float(),
                ),
            )
            for a in range(0, ids.size, BOX)
        ]
        shape = (ids.size, *tail)
        out[t.key + VALUES] = Chunked(shape, boxes) if boxes else torch.zeros(shape)
    return out


def stored(manifest: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``{key: {"shape", "dtype"}}`` of every tensor a checkpoint restores: those stored whole
    and those stored as touched rows."""
    out = {k: v for k, v in manifest["tensors"].items() if "#" not in k}
    for key, entry in (manifest.get("touched") or {}).items():
        out[key] = {"shape": [int(n) for n in entry["shape"]], "dtype": str(entry["dtype"])}
    return out


def _source(chain: list[Link], key: str) -> int:
    """The index of the latest checkpoint of ``chain`` that holds ``key`` whole."""
    for i in range(len(chain) - 1, -1, -1):
        if key in chain[i].manifest["tensors"]:
            return i
        if key not in (chain[i].manifest.get("touched") or {}):
            break
    raise CheckpointError(
        f"{chain[-1].path}: '{key}' is held as touched rows, but no checkpoint of its chain "
        f"holds it whole (the chain is malformed)"
    )


def _read(link: Link, key: str, shape: tuple[int, ...]) -> Patch:
    """One delta's touched rows of ``key``, checked: ascending, distinct, in range."""
    arrays = read_arrays(link.path, link.metadata, link.manifest, [key + ROWS, key + VALUES])
    ids, values = arrays[key + ROWS], arrays[key + VALUES]
    k = int(link.manifest["touched"][key]["rows"])
    good = ids.ndim == 1 and ids.size == k and values.shape == (k, *shape[1:])
    good = good and bool(np.all(ids[1:] > ids[:-1]))
    if not good or (k and (ids[0] < 0 or ids[-1] >= shape[0])):
        raise CheckpointError(
            f"{link.path}: the touched rows of '{key}' are malformed (expected {k} distinct "
            f"ascending rows in [0, {shape[0]}) with values of shape {(k, *shape[1:])})"
        )
    return ids.astype(np.int64), values


def patches(chain: list[Link], keys: list[str]) -> tuple[dict[str, int], dict[str, Patch]]:
    """For each of ``keys``: the index of the checkpoint of ``chain`` to read it whole from,
    and (where a later delta touched it) the rows to write over it, later deltas winning.
    Chunks must be verified already.

    Raises:
        CheckpointError: a delta's touched rows are malformed, or no checkpoint of the
            chain holds a tensor whole.
    """
    try:
        return _patches(chain, keys)
    except (KeyError, TypeError, AttributeError) as error:
        raise CheckpointError(
            f"{chain[-1].path}: the manifest's touched rows are malformed ({error!r})"
        ) from error


def verify_chain(chain: list[Link]) -> None:
    """Read and check every touched row the last checkpoint of ``chain`` restores."""
    patches(chain, list(chain[-1].manifest.get("touched") or {}))


def _patches(chain: list[Link], keys: list[str]) -> tuple[dict[str, int], dict[str, Patch]]:
    sources, out = {}, {}
    shapes = stored(chain[-1].manifest)
    for key in keys:
        sources[key] = source = _source(chain, key)
        shape = tuple(int(n) for n in shapes[key]["shape"])
        parts = [_read(link, key, shape) for link in chain[source + 1 :]]
        if parts:
            ids = np.concatenate([p[0] for p in parts])
            values = np.concatenate([p[1] for p in parts])
            order = np.argsort(ids, kind="stable")  # equal rows keep the chain's order
            ids, values = ids[order], values[order]
            last = np.r_[ids[1:] != ids[:-1], True]
            out[key] = (ids[last], values[last])
    return sources, out


def patch_chunks(chunks: Chunks, patch: Patch) -> list[Any]:
    """Write ``patch`` into the boxes ``chunks`` a load fills: a box written to its table
    when filled (:class:`LazyBox`) is patched just before; the returned callables patch the
    other boxes, once DCP has filled them."""
    ids, values = patch
    later = []
    for offsets, box in chunks:
        size = tuple(box.size())
        a, b = np.searchsorted(ids, [offsets[0], offsets[0] + size[0]])
        if a == b:
            continue
        rows = torch.from_numpy(ids[a:b] - offsets[0])
        part = torch.from_numpy(values[a:b])
        if len(size) > 1:  # a box of columns [c, c + width)
            part = part[:, offsets[1] : offsets[1] + size[1]]

        def write(tensor: torch.Tensor, rows: torch.Tensor = rows, part: Any = part) -> None:
            tensor.index_copy_(0, rows, part.to(tensor.dtype))

        if isinstance(box, LazyBox):
            box.amend(write)
        else:
            later.append(lambda box=box, write=write: write(box))
    return later


def checkpointed(tensors: list[StoredTensor], sha256: str | None) -> None:
    """The engine's tensors now equal the checkpoint whose manifest has ``sha256``."""
    for t in tensors:
        if t.checkpointed is not None:
            t.checkpointed(sha256)
