"""Dynamic tables in a checkpoint: their state as keyed records, written whole or as a delta.

A dynamic table's state (a dict of arrays, see :mod:`embcore.dynamic.keyspace`) splits into
two record groups and a few *extras*::

    rows      keys (R,) + weight, optimizer slots, freq, last_seen   (R, ...) by key
    pending   pending/keys (P,) + pending/counts, pending/last_seen  (P,) by key
    extras    step, and the pending-count sketch once in use          stored whole

stored as the tensors ``{table}.{name}``, with ``{table}.{group}#digests`` (each record's
digest) and ``{table}.{group}#deleted`` (keys removed since the base; empty in a full save).
A delta stores the records whose digest differs from its base's, the keys its base held and
it does not, and the extras whose sha256 changed. The manifest's ``"dynamic"`` section gives,
per table and group, the column names, the number of records of the whole state and its set
digest, so a load checks that replaying the chain gave exactly what was saved. See
docs/dynamic_tables.md.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from embcore.checkpoint._errors import CheckpointError
from embcore.checkpoint._records import (
    Records,
    apply,
    changed,
    digests,
    set_digest,
    sorted_records,
)

__all__ = ["GROUPS", "Known", "restore", "save_tensors", "split", "state_of", "to_state"]

#: group -> the prefix of its arrays in a table's state
GROUPS = {"rows": "", "pending": "pending/"}
_NOT_COLUMNS = {"step", "keys", "rows", "pending/sketch"}
_DIGESTS, _DELETED = "#digests", "#deleted"

#: ``{table: {group: Records (keys and digests)}}``: what a delta is computed against
Known = dict[str, dict[str, Records]]


def _group_of(name: str) -> str:
    return "pending" if name.startswith("pending/") else "rows"


def split(table: str, state: dict[str, np.ndarray]) -> tuple[dict[str, Records], dict]:
    """A table's state as ``({group: Records}, {extra name: array})``.

    Columns of a group are its ``(K, ...)`` arrays (sorted by name: the digest's order);
    0-d arrays, ``rows`` (row numbers, never stored) and the sketch are not columns.
    """
    groups: dict[str, Records] = {}
    for group, prefix in GROUPS.items():
        if f"{prefix}keys" not in state:
            continue
        keys = np.ascontiguousarray(state[f"{prefix}keys"], np.int64)
        columns = {}
        for name in sorted(state):
            value = state[name]
            if name in _NOT_COLUMNS or _group_of(name) != group or np.ndim(value) == 0:
                continue
            if name == f"{prefix}keys":
                continue
            if value.shape[0] != keys.size:
                raise ValueError(
                    f"table '{table}': state '{name}' has {value.shape[0]} entries for "
                    f"{keys.size} keys"
                )
            columns[name] = np.ascontiguousarray(value)
        groups[group] = Records(keys, digests(keys, list(columns.values())), columns)
    extras = {
        n: np.array(v, order="C")
        for n, v in state.items()
        if n != "rows" and (np.ndim(v) == 0 or n == "pending/sketch")
    }
    return groups, extras


def _sha(value: np.ndarray) -> str:
    return hashlib.sha256(np.array(value, order="C").tobytes()).hexdigest()


def _tensor(array: np.ndarray) -> torch.Tensor:
    """``array`` for DCP, sharing its memory where it can (the state is the save's own copy);
    digests (uint64) as int64."""
    if array.dtype == np.uint64:
        array = array.view(np.int64)
    if array.ndim == 0 or not array.flags.writeable or not array.flags.c_contiguous:
        array = np.array(array, order="C")  # a copy (0-d stays 0-d)
    return torch.from_numpy(array)


def save_tensors(
    states: dict[str, dict[str, np.ndarray]],
    base: Known | None,
    base_section: dict[str, Any] | None,
) -> tuple[dict[str, torch.Tensor], dict[str, Any], Known]:
    """What a save writes for the dynamic tables ``{table: state}``: the tensors, the
    manifest's ``"dynamic"`` section, and the keys and digests saved (for a later delta).

    With ``base`` (and its manifest's section), only what changed since it is written.
    """
    tensors: dict[str, torch.Tensor] = {}
    section: dict[str, Any] = {}
    known: Known = {}
    for table, state in states.items():
        groups, extras = split(table, state)
        entry: dict[str, Any] = {"groups": {}, "extras": {}}
        known[table] = {}
        for group, records in groups.items():
            prefix = f"{table}.{GROUPS[group]}"
            if base is None:
                stored, deleted = records, np.zeros(0, np.int64)
            else:
                before = base.get(table, {}).get(group) or Records(
                    np.zeros(0, np.int64), np.zeros((0, 2), np.uint64)
                )
                upserts, deleted = changed(before, records)
                stored = records.take(upserts)
            tensors[f"{prefix}keys"] = _tensor(stored.keys)
            tensors[f"{prefix}{_DIGESTS}"] = _tensor(stored.digests)
            tensors[f"{prefix}{_DELETED}"] = _tensor(deleted)
            for name, column in stored.columns.items():
                tensors[f"{table}.{name}"] = _tensor(column)
            entry["groups"][group] = {
                "columns": list(records.columns),
                "count": len(records),
                "stored": len(stored),
                "deleted": int(deleted.size),
                "digest": set_digest(records.digests),
            }
            known[table][group] = Records(records.keys, records.digests)
        before_extras = ((base_section or {}).get(table) or {}).get("extras", {})
        for name, value in extras.items():
            sha = _sha(value)
            store = base is None or (before_extras.get(name) or {}).get("sha256") != sha
            if store:
                tensors[f"{table}.{name}"] = _tensor(value)
            entry["extras"][name] = {"sha256": sha, "stored": store}
        section[table] = entry
    return tensors, section, known


Reader = Callable[[Any, list[str]], dict[str, np.ndarray]]


def _replay_group(table: str, group: str, chain: list[Any], read: Reader, columns: bool) -> Records:
    """One group of one table through the chain (full checkpoint first)."""
    prefix = f"{table}.{GROUPS[group]}"
    records: Records | None = None
    for link in chain:
        entry = link.manifest["dynamic"][table]["groups"].get(group)
        if entry is None:
            raise CheckpointError(f"{link.path}: table '{table}' has no {group} records")
        names = [f"{table}.{n}" for n in entry["columns"]] if columns else []
        keys = [f"{prefix}keys", f"{prefix}{_DIGESTS}", f"{prefix}{_DELETED}", *names]
        arrays = read(link, keys)
        cols = {n: arrays[f"{table}.{n}"] for n in entry["columns"]} if columns else {}
        try:
            upserts = sorted_records(
                arrays[keys[0]], arrays[keys[1]].view(np.uint64).reshape(-1, 2), cols
            )
            deleted = np.unique(arrays[keys[2]])
            if records is None:
                if deleted.size:
                    raise ValueError("a full checkpoint deletes keys")
                records = upserts
            else:
                if columns and list(records.columns) != list(cols):
                    raise ValueError(
                        f"stores columns {list(cols)}, its base {list(records.columns)}"
                    )
                records = apply(records, upserts, deleted)
        except ValueError as error:
            raise CheckpointError(f"{link.path}: table '{table}', {group}: {error}") from error
        if len(records) != entry["count"] or set_digest(records.digests) != entry["digest"]:
            raise CheckpointError(
                f"{link.path}: table '{table}': replaying its chain gave {len(records)} "
                f"{group} records with digest {set_digest(records.digests)}, the manifest "
                f"records {entry['count']} with digest {entry['digest']}"
            )
    if records is None:
        raise CheckpointError(f"table '{table}': an empty chain of checkpoints")
    if columns:
        found = set_digest(digests(records.keys, list(records.columns.values())))
        if found != set_digest(records.digests):
            raise CheckpointError(
                f"{chain[-1].path}: table '{table}': the {group} records' values do not match "
                "their digests"
            )
    return records


def restore(
    table: str, chain: list[Any], read: Reader, columns: bool = True
) -> tuple[dict[str, Records], dict[str, np.ndarray]]:
    """A table's groups and extras as the last checkpoint of ``chain`` holds them, replayed
    from the full checkpoint; ``columns=False`` reads keys and digests only (for a delta's
    base).

    Raises:
        CheckpointError: the chain does not replay to the saved state, or a manifest's
            ``"dynamic"`` section is malformed (named per table).
    """
    try:
        return _restore(table, chain, read, columns)
    except (KeyError, TypeError, AttributeError, IndexError) as error:
        raise CheckpointError(
            f"{chain[-1].path}: table '{table}': the manifest's \"dynamic\" section (or a "
            f"base's) is malformed ({error!r})"
        ) from error


def _restore(
    table: str, chain: list[Any], read: Reader, columns: bool
) -> tuple[dict[str, Records], dict[str, np.ndarray]]:
    last = chain[-1].manifest["dynamic"][table]
    groups = {g: _replay_group(table, g, chain, read, columns) for g in last["groups"]}
    extras: dict[str, np.ndarray] = {}
    if not columns:
        return groups, extras
    for link in chain:
        entry = link.manifest["dynamic"][table]["extras"]
        stored = [n for n, e in entry.items() if e["stored"]]
        arrays = read(link, [f"{table}.{n}" for n in stored])
        extras = {n: extras[n] for n in entry if n in extras}
        extras |= {n: arrays[f"{table}.{n}"] for n in stored}
        for name, e in entry.items():
            if name not in extras or _sha(extras[name]) != e["sha256"]:
                raise CheckpointError(
                    f"{link.path}: table '{table}': '{name}' does not replay to what was saved"
                )
    return groups, extras


def to_state(groups: dict[str, Records], extras: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The table's state dict again (keys ascending, as :func:`split` took it)."""
    state = dict(extras)
    for group, records in groups.items():
        state[f"{GROUPS[group]}keys"] = records.keys
        state |= records.columns
    return state


def state_of(groups: dict[str, Records]) -> dict[str, Records]:
    """Keys and digests only (what a later delta is computed against)."""
    return {g: Records(r.keys, r.digests) for g, r in groups.items()}
