"""What ``save`` and ``load`` do for dynamic tables and deltas, between the engine and the files.

``save(engine, path, base=earlier)``: the base is opened and checked against the engine, the
keys and record digests it holds are taken from memory (when this process saved or loaded
that very checkpoint, recognised by its manifest's sha256) or read from its chain (keys and
digests only, their chunks' sha256 checked), and the dynamic tables write what changed.
``load``: the chain is resolved and every dynamic table replayed from the full checkpoint
through each delta, checked against the set digests the manifests record, before the engine
changes. See docs/dynamic_tables.md.
"""

from __future__ import annotations

import hashlib
import weakref
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from embcore.checkpoint import _dynamic, _manifest, _touched
from embcore.checkpoint._chain import Link, compatible, link_to, resolve
from embcore.checkpoint._dcp import read_arrays
from embcore.checkpoint._digest import sha256_chunk
from embcore.checkpoint._dynamic import Known
from embcore.checkpoint._engine_view import EngineView
from embcore.checkpoint._errors import CheckpointError

__all__ = [
    "SavePlan",
    "fit_problems",
    "load_states",
    "manifest_sha256",
    "plan_save",
    "read",
    "remember",
    "verify_chain",
]

#: per engine, the keys and digests of the checkpoints it last saved or loaded, by the sha256
#: of their manifests (at most two: the last full checkpoint and the last delta, typically)
_KNOWN: weakref.WeakKeyDictionary[Any, dict[str, Known]] = weakref.WeakKeyDictionary()
_REMEMBERED = 2


def manifest_sha256(path: str) -> str | None:
    """The sha256 of the manifest of the checkpoint at ``path`` (``None``: unreadable)."""
    try:
        return hashlib.sha256(_manifest.read(path)[1]).hexdigest()
    except (OSError, CheckpointError):
        return None


def remember(engine: Any, path: str, known: Known) -> None:
    """Keep ``known`` as the state of the checkpoint at ``path`` (just saved or loaded);
    if its manifest cannot be read back, nothing is kept (a later delta reads the disk)."""
    sha = manifest_sha256(path)
    if sha is None:
        return
    entries = _KNOWN.setdefault(engine, {})
    entries.pop(sha, None)
    entries[sha] = known
    while len(entries) > _REMEMBERED:
        entries.pop(next(iter(entries)))


def _read_checked(link: Link, keys: list[str]) -> dict[str, np.ndarray]:
    """``read_arrays`` after checking the sha256 of every chunk of ``keys``."""
    for c in link.chunks:
        if c.key in keys:
            found = sha256_chunk(link.path, c.file, c.offset, c.length)
            if found != _manifest.expected_digest(link.manifest, c):
                raise CheckpointError(
                    f"embcore.checkpoint: {link.path} is corrupt: {c.describe()}: sha256 "
                    f"expected {_manifest.expected_digest(link.manifest, c)}, found {found}"
                )
    return read_arrays(link.path, link.metadata, link.manifest, keys)


def read(link: Link, keys: list[str]) -> dict[str, np.ndarray]:
    """``read_arrays`` of a link whose chunks were all verified already."""
    return read_arrays(link.path, link.metadata, link.manifest, keys)


@dataclass
class SavePlan:
    """What a save adds for dynamic tables and a base: tensors to write, manifest sections,
    the keys and digests saved (remembered once the checkpoint is published), and the fixed
    tensors written as their rows touched since the base (``{key: rows}``, not whole)."""

    tensors: dict[str, Any]
    sections: dict[str, Any]
    known: Known
    touched: dict[str, np.ndarray] = field(default_factory=dict)


def _optimizers(view: EngineView, manifest: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """``{dynamic table: (the checkpoint's optimizer type, the engine's)}`` where they differ
    and the engine has one (a lookup-only engine loads any optimizer's rows)."""
    mine = {t["name"]: (t["optimizer"] or {}).get("type") for t in view.describe()["tables"]}
    written = {t["name"]: (t.get("optimizer") or {}).get("type") for t in manifest["tables"]}
    return {
        name: (written[name], mine[name])
        for name in view.dynamic_tables()
        if name in written and mine[name] is not None and written[name] != mine[name]
    }


def fit_problems(
    view: EngineView, manifest: dict[str, Any], allow_optimizer_change: bool = False
) -> list[str]:
    """Why a checkpoint's dynamic tables do not fit this engine's (empty: they do): each
    dynamic table of the engine must be dynamic there with the same dim and optimizer type
    (unless ``allow_optimizer_change``), and no table fixed here may be dynamic there."""
    mine = {t["name"]: t for t in view.describe()["tables"]}
    theirs = set(manifest.get("dynamic") or {})
    written = {t["name"]: t for t in manifest["tables"]}
    problems = []
    for name in view.dynamic_tables():
        if name not in written:
            problems.append(f"table '{name}' is not in the checkpoint (it has {sorted(written)})")
        elif name not in theirs:
            problems.append(f"table '{name}' is dynamic in the engine, fixed in the checkpoint")
        elif written[name].get("dim") != mine[name]["dim"]:
            problems.append(
                f"table '{name}': dim {written[name].get('dim')} in the checkpoint, "
                f"{mine[name]['dim']} in the engine"
            )
    if not allow_optimizer_change:
        problems += [
            f"table '{name}': optimizer {a} in the checkpoint, {b} in the engine (pass "
            "allow_optimizer_change=True to load its rows with fresh optimizer slots)"
            for name, (a, b) in _optimizers(view, manifest).items()
            if name in theirs
        ]
    problems += [
        f"table '{t}' is dynamic in the checkpoint, fixed in the engine"
        for t in sorted(theirs)
        if t in mine and t not in view.dynamic_tables()
    ]
    return problems


def plan_save(view: EngineView, path: str, base: str | None) -> SavePlan:
    """Everything a save of ``view`` to ``path`` (a delta when ``base`` is given) computes
    before writing: nothing is created, so an error here leaves no trace."""
    what = "embcore.checkpoint.save"
    sections: dict[str, Any] = {}
    base_known: Known | None = None
    base_section = None
    touched: dict[str, np.ndarray] = {}
    if base is not None:
        link, sections["base"] = link_to(path, base)
        try:
            problems = compatible(view.describe(), link) + fit_problems(view, link.manifest)
        except (KeyError, TypeError, AttributeError) as error:
            raise CheckpointError(f"{what}: base {base}: its manifest is malformed") from error
        if problems:
            raise CheckpointError(
                f"{what}: base {base} was saved by an engine that does not fit this one: "
                + "; ".join(problems)
            )
        base_section = link.manifest.get("dynamic") or {}
        base_known = _KNOWN.get(view.engine, {}).get(link.sha256)
        if base_known is None and base_section:
            chain = resolve(link)
            base_known = {
                t: _dynamic.restore(t, chain, _read_checked, columns=False)[0] for t in base_section
            }
        stored = view.tensors()
        touched = _touched.plan(view, stored, link)
    if not view.dynamic_tables() and not touched:  # all whole: it loads without its base
        sections.pop("base", None)
    states = {name: view.dynamic_state(name) for name in view.dynamic_tables()}
    tensors, section, known = _dynamic.save_tensors(states, base_known, base_section)
    if section:
        sections["dynamic"] = section
    if touched:
        sections["touched"] = _touched.section(stored, touched)
        tensors |= _touched.tensors(stored, touched)
    return SavePlan(tensors, sections, known, touched)


def load_states(
    view: EngineView, chain: list[Link]
) -> tuple[dict[str, dict[str, np.ndarray]], Known]:
    """Each dynamic table's state as the last checkpoint of ``chain`` holds it (chunks
    already verified), and its keys and digests; the engine is not changed. A table whose
    optimizer differs from the checkpoint's (allowed by the caller) gets fresh slots; a
    lookup-only table gets none."""
    states, known = {}, {}
    lookup_only = {t["name"] for t in view.describe()["tables"] if t["optimizer"] is None}
    changed = _optimizers(view, chain[-1].manifest)
    for table in view.dynamic_tables():
        groups, extras = _dynamic.restore(table, chain, read)
        states[table] = _dynamic.to_state(groups, extras)
        known[table] = _dynamic.state_of(groups)
        if table in lookup_only or table in changed:  # the rows without their slots
            rows = groups["rows"].columns
            for name in set(rows) - {"weight", "freq", "last_seen"}:
                del states[table][name]
        if table in changed:
            states[table] |= view.initial_slots(table, len(groups["rows"]))
    return states, known


def verify_chain(chain: list[Link]) -> None:
    """Replay every dynamic table of the chain (chunks already verified) and check each
    against the set digests the manifests record."""
    for table in chain[-1].manifest.get("dynamic") or {}:
        _dynamic.restore(table, chain, read)
