"""``embcore.checkpoint.load`` and ``verify``: check everything, then change the engine.

Before a tensor is read into the engine, every rank checks the manifest, DCP's metadata (its
sha256, then its chunk list against the manifest's, every file name confined to the
checkpoint directory) and whether the checkpoint fits the engine; then the ranks share the
sha256 verification of every stored chunk. Only then does DCP read. See docs/reliability.md.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed.checkpoint as dcp

from embcore._comm import Comm
from embcore._fingerprint import fingerprint64
from embcore.checkpoint import _delta, _manifest, _touched
from embcore.checkpoint._chain import Link, open_checkpoint, resolve
from embcore.checkpoint._dcp import (
    Chunked,
    LoadPlanner,
    VerifiedReader,
    dcp_args,
    dcp_errors,
    no_dist_ok,
)
from embcore.checkpoint._digest import sha256_chunk
from embcore.checkpoint._engine_view import EngineView, StoredTensor, table_of
from embcore.checkpoint._errors import CheckpointError
from embcore.checkpoint._manifest import Chunk
from embcore.checkpoint._verified import Verified

if TYPE_CHECKING:  # annotations only: engines are seen through _engine_view
    from embcore.engine import EmbeddingEngine

__all__ = ["load", "read_manifest", "verify"]


def read_manifest(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The manifest of the checkpoint at ``path`` (JSON values; nothing verified but its
    format): format version, step, tables, features, optimizer hyperparameters, sharding
    plan and the checksum of every stored chunk."""
    manifest, _ = _manifest.read(os.path.normpath(os.fspath(path)))
    return manifest


def _verify_chunks(
    path: str, manifest: dict[str, Any], chunks: list[Chunk], rank: int, world: int
) -> dict[int, str]:
    """``{chunk index: what was found}`` for the chunks of this rank's share (every
    ``world``-th) whose bytes do not match the manifest's sha256."""
    bad = {}
    for i in range(rank, len(chunks), world):
        c = chunks[i]
        try:
            found = sha256_chunk(path, c.file, c.offset, c.length)
        except (OSError, ValueError) as error:
            bad[i] = f"unreadable ({error})"
            continue
        if found != _manifest.expected_digest(manifest, c):
            bad[i] = found
    return bad


def _corrupt(
    path: str,
    manifest: dict[str, Any],
    chunks: list[Chunk],
    bad: list[int],
    found: dict[int, str],
    outcome: str = "nothing was loaded",
) -> CheckpointError:
    lines = [
        f"table '{table_of(chunks[i].key)}': {chunks[i].describe()}: sha256 expected "
        f"{_manifest.expected_digest(manifest, chunks[i])}, found "
        f"{found.get(i, 'a mismatch on another rank')}"
        for i in bad
    ]
    return CheckpointError(f"embcore.checkpoint: {path} is corrupt, {outcome}: " + "; ".join(lines))


def _bad_chunks(chain: list[Link], rank: int, world: int) -> dict[tuple[int, int], str]:
    """``{(link, chunk): found}`` for the bad chunks of this rank's share of a chain's chunks
    (every ``world``-th, counted over the whole chain)."""
    every = [(i, j) for i, link in enumerate(chain) for j in range(len(link.chunks))]
    bad = {}
    for i, j in every[rank::world]:
        link = chain[i]
        found = _verify_chunks(link.path, link.manifest, link.chunks[j : j + 1], 0, 1)
        if found:
            bad[(i, j)] = found[0]
    return bad


def _corrupt_chain(
    chain: list[Link],
    bad: list[tuple[int, int]],
    found: dict[tuple[int, int], str],
    outcome: str = "nothing was loaded",
) -> CheckpointError:
    """The error naming every bad chunk, the first link's path first."""
    i = bad[0][0]
    link = chain[i]
    mine = [j for (k, j) in bad if k == i]
    error = _corrupt(
        link.path,
        link.manifest,
        link.chunks,
        mine,
        {j: found[(i, j)] for j in mine if (i, j) in found},
        outcome,
    )
    if i < len(chain) - 1:
        return CheckpointError(f"{error} (it is a base of the delta {chain[-1].path})")
    return error


def verify_shared(
    comm: Comm, chain: list[Link], what: str, outcome: str = "nothing was loaded"
) -> None:
    """Every rank verifies its share of the sha256 of every chunk of ``chain`` (every
    ``world``-th); one bad chunk raises :class:`CheckpointError` on every rank, naming it
    (and ``outcome``)."""
    found = _bad_chunks(chain, comm.rank, comm.world)
    every = [(i, j) for i, link in enumerate(chain) for j in range(len(link.chunks))]
    flags = comm.agree(what, None, [int(k in found) for k in every])
    bad = [k for n, k in enumerate(every) if any(f[n] for f in flags)]
    if bad:
        raise _corrupt_chain(chain, bad, found, outcome)


def verify(path: str | os.PathLike[str]) -> Verified:
    """Check a checkpoint completely in this process (manifest, DCP metadata, the sha256 of
    every chunk). For a delta the whole chain is checked (every base, and that replaying it
    gives exactly the dynamic tables that were saved).

    Returns:
        A :class:`~embcore.checkpoint._verified.Verified`: a one-line ``repr`` of what was
        checked, the manifest as ``.manifest`` (it also reads as the manifest mapping).

    Raises:
        FileNotFoundError: nothing at ``path``, or a base of the delta is missing.
        CheckpointError: incomplete, corrupt or unsafe (or one of its bases is); the message
            names the file and each table concerned.
    """
    path = os.path.normpath(os.fspath(path))
    chain = resolve(open_checkpoint(path))
    found = _bad_chunks(chain, 0, 1)
    if found:
        raise _corrupt_chain(chain, sorted(found), found)
    _delta.verify_chain(chain)
    _touched.verify_chain(chain)
    return Verified(path, chain[-1].manifest, bases=len(chain) - 1)


def _changed_optimizers(
    view: EngineView, tensors: list[StoredTensor], manifest: dict[str, Any]
) -> dict[str, tuple[str, str]]:
    """``{table: (checkpoint's optimizer, engine's)}`` where slots would be restored from a
    checkpoint of another optimizer type."""
    written = {t["name"]: (t.get("optimizer") or {}).get("type") for t in manifest["tables"]}
    mine = view.optimizer_types()
    slotted = {t.table for t in tensors if t.is_slot}
    return {
        table: (str(written[table] or "no optimizer"), str(mine[table]))
        for table in sorted(slotted)
        if table in written and written[table] != mine[table]
    }


def _fit_problems(
    tensors: list[StoredTensor],
    manifest: dict[str, Any],
    changed: dict[str, tuple[str, str]],
) -> list[str]:
    """Why the checkpoint cannot fill these tensors, one entry per table (empty: it can)."""
    stored = _touched.stored(manifest)
    written = {t["name"] for t in manifest["tables"]}
    missing: dict[str, list[str]] = {}
    problems: list[str] = []
    for t in tensors:
        if t.key not in stored:
            missing.setdefault(t.table, []).append(t.key)
        elif tuple(stored[t.key]["shape"]) != t.shape:
            problems.append(
                f"table '{t.table}': '{t.key}' has shape {tuple(stored[t.key]['shape'])}, the "
                f"engine expects {t.shape}"
            )
        elif stored[t.key]["dtype"] != t.dtype:
            problems.append(
                f"table '{t.table}': '{t.key}' is {stored[t.key]['dtype']}, the engine expects "
                f"{t.dtype}"
            )
    for table, keys in missing.items():
        if table not in written:
            problems.append(f"table '{table}' is not in the checkpoint (it has {sorted(written)})")
            continue
        theirs, mine = changed.get(table, (None, None))
        why = f" (the checkpoint's optimizer is {theirs}, the engine's {mine})" if theirs else ""
        problems.append(f"table '{table}': {', '.join(repr(k) for k in keys)} missing{why}")
    for table, (theirs, mine) in changed.items():
        if table not in missing:
            problems.append(
                f"table '{table}': the checkpoint's optimizer is {theirs}, the engine's {mine}; "
                "its slots would be restored into another optimizer's (pass "
                "allow_optimizer_change=True to load the weights only and keep the engine's "
                "slots)"
            )
    return problems


def _value(shape: tuple[int, ...], chunks: list[Any]) -> Any:
    """What DCP fills: a whole tensor held as one chunk stays a plain tensor (filled in
    place)."""
    if len(chunks) == 1:
        offsets, tensor = chunks[0]
        if isinstance(tensor, torch.Tensor) and not any(offsets) and tuple(tensor.shape) == shape:
            return tensor
    return Chunked(shape, chunks)


def load(
    engine: EmbeddingEngine, path: str | os.PathLike[str], *, allow_optimizer_change: bool = False
) -> None:
    """Restore an engine from a checkpoint written by ``save``, whatever the number of ranks
    and the sharding plan it was written with. A collective, like ``save``.

    Before anything changes, every rank checks the manifest and DCP's metadata, and the ranks
    share the verification of every chunk's sha256. Tensors the engine does not have (slots,
    when it has no optimizer) are ignored. A delta (saved with ``base=``) is read with its
    chain of bases, every one verified, and restores exactly what a full save would have;
    dynamic tables are stored by key, so any number of ranks loads them.

    Args:
        engine: the engine to fill.
        path: the checkpoint directory.
        allow_optimizer_change: load a checkpoint written with another optimizer type for a
            table: that table's weights (and the step) are restored, its slots are left as the
            engine has them (freshly initialised, for a new engine); a dynamic table's
            loaded rows get the optimizer's initial slot values, as newly admitted keys do.
            Without it such a load is refused, since one optimizer's slots are meaningless to
            another.

    Raises:
        FileNotFoundError: nothing at ``path`` (an interrupted save leaves ``path.tmp-*``).
        CheckpointError (a ValueError): the checkpoint is incomplete, corrupt or unsafe, or
            lacks one of the engine's tensors or holds it with another shape (a different
            vocabulary size, dim or optimizer), or was written with another optimizer type
            for a table; the message names the table, expected and found. Nothing is loaded.
    """
    view = EngineView(engine, "load")
    path = os.path.normpath(os.fspath(path))
    view.flush()
    comm = view.comm
    what = "embcore.checkpoint.load"
    error: BaseException | None = None
    fingerprint = 0
    tensors = view.tensors()
    try:
        chain = resolve(open_checkpoint(path))
        manifest = chain[-1].manifest
        fingerprint = fingerprint64(chain[-1].raw)
        changed = _changed_optimizers(view, tensors, manifest)
        if allow_optimizer_change:
            tensors = [t for t in tensors if not (t.is_slot and t.table in changed)]
            changed = {}
        problems = _fit_problems(tensors, manifest, changed) + _delta.fit_problems(
            view, manifest, allow_optimizer_change
        )
        if problems:
            raise CheckpointError(f"{what}: {path} does not fit this engine: {'; '.join(problems)}")
    except (OSError, ValueError, KeyError, TypeError) as e:
        if isinstance(e, (KeyError, TypeError)):
            e = CheckpointError(f"{path}: the manifest is malformed ({e!r})")
        error = e
    comm.agree(what, error)
    comm.check_same(what, fingerprint, f"read another manifest at {path!r}")

    verify_shared(comm, chain, what)

    # The dynamic tables, and the rows deltas touched in fixed tables, are read (and the
    # dynamic tables replayed) into fresh memory before anything changes.
    error, states, known, sources, patches = None, {}, {}, {}, {}
    try:
        states, known = _delta.load_states(view, chain)
        bad = [p for table, state in states.items() for p in view.dynamic_problems(table, state)]
        if bad:
            raise CheckpointError(
                f"{what}: {path} holds a dynamic table no engine could have saved, nothing "
                f"was loaded: {'; '.join(bad)}"
            )
        sources, patches = _touched.patches(chain, [t.key for t in tensors])
    except (OSError, ValueError) as e:
        error = e
    comm.agree(what, error)

    args = dcp_args(comm)
    staged = [(t, t.load_chunks()) for t in tensors]
    later = [
        f
        for t, chunks in staged
        if t.key in patches
        for f in _touched.patch_chunks(chunks, patches[t.key])
    ]
    with torch.no_grad(), no_dist_ok(args), dcp_errors(comm, "load", path):
        for i in sorted(set(sources.values())):  # each tensor from the latest holding it whole
            link = chain[i]
            state = {t.key: _value(t.shape, c) for t, c in staged if sources[t.key] == i}
            reader = VerifiedReader(link.path, link.metadata)
            dcp.load(state, storage_reader=reader, planner=LoadPlanner(), **args)
        for patch in later:
            patch()
        for t, chunks in staged:
            t.finish_load(chunks)
        for table, table_state in states.items():
            view.load_dynamic_state(table, table_state)
    view.finish_load([t.key for t in tensors])
    partial = {t.table for t in view.tensors()} - {t.table for t in tensors}  # slots left
    _touched.checkpointed([t for t in tensors if t.table not in partial], chain[-1].sha256)
    if known:
        _delta.remember(engine, path, known)
