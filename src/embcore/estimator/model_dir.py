"""Checkpoint and export directories: tensors in safetensors, everything else in JSON.

A checkpoint or an export is a directory::

    tensors.safetensors   "engine/<table>.weight", "engine/<table>.<slot>", "engine/step",
                          "dense_tables/<table>", "model/<key>", "params.<name>/<key>",
                          "optimizer/<param index>/<state name>" (checkpoints only)
    meta.json             {"format": ..., "version": 1, "kind": "checkpoint" | "export",
                           "global_step": ..., "columns": [...], "optimizer": ...}

Nothing is pickled: loading runs no code from the files. Checkpoints live in ``model_dir`` as
``ckpt-<global step>`` with ``checkpoint.json`` naming the newest; each is written to a temporary
directory first and renamed into place, so a crash never leaves a half-written checkpoint.
``meta.json`` records the sha256 of ``tensors.safetensors`` and of itself, checked on read (a
corrupt or mixed directory is refused, naming the file). ``checkpoint.json`` is trusted only for
names this module writes (``ckpt-<step>``), resolved inside ``model_dir``: nothing outside it
is ever read or deleted. See docs/reliability.md.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from embcore import _atomic
from embcore._files import read_regular
from embcore._fingerprint import IntegrityError, check_sealed, seal, sha256_file

__all__ = [
    "FORMAT",
    "latest_checkpoint",
    "load_optimizer_state",
    "optimizer_state",
    "read_directory",
    "write_checkpoint",
    "write_directory",
]

FORMAT = "embcore.estimator"
VERSION = 1
_POINTER = "checkpoint.json"
_TENSORS = "tensors.safetensors"
_CHECKPOINT_NAME = re.compile(r"^ckpt-\d{1,19}$")


def _safetensors() -> Any:
    try:
        import safetensors.torch
    except ImportError as e:  # pragma: no cover - safetensors ships with the test extras
        raise ImportError(
            "embcore.estimator checkpoints need the 'safetensors' package: pip install safetensors"
        ) from e
    return safetensors.torch


def write_directory(path: str | os.PathLike, tensors: dict[str, Tensor], meta: dict) -> Path:
    """Write ``tensors`` and ``meta`` into the directory ``path`` (replacing it) atomically.

    Raises:
        FileExistsError: ``path`` holds other files (nothing is deleted).
        DiskFullError (an OSError): the disk filled up; ``path`` is left as it was.
    """
    path = Path(path)
    _atomic.check_replaceable(path, "meta.json")  # before any work
    _atomic.remove_stale(path)
    with _atomic.temp_dir(path) as tmp:
        flat = {k: v.detach().to("cpu").contiguous().clone() for k, v in tensors.items()}
        _safetensors().save_file(flat, str(tmp.path / _TENSORS))
        document = {"format": FORMAT, "version": VERSION, **meta}
        document["files_sha256"] = {_TENSORS: sha256_file(tmp.path / _TENSORS)}
        text = json.dumps(seal(document), indent=1, sort_keys=True)
        _atomic.write_atomic(tmp.path / "meta.json", (text + "\n").encode())
        _atomic.replace_dir(tmp.path, path, "meta.json")
    return path


def read_directory(path: str | os.PathLike, kind: str) -> tuple[dict[str, Tensor], dict]:
    """``(tensors, meta)`` of a directory written by :func:`write_directory`.

    Raises:
        ValueError: not an embcore estimator directory of this ``kind``, or a newer version.
        IntegrityError (a ValueError): a file does not match its sha256 (corrupt, truncated,
            or the two files come from different saves); the message names the file.
    """
    path = Path(path)
    meta_file = path / "meta.json"
    if not meta_file.is_file():
        raise ValueError(f"{str(path)!r} is not an embcore {kind}: no meta.json")
    raw = read_regular(meta_file, 1 << 26)  # a link or a FIFO is refused, not followed
    try:
        document = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as error:
        raise IntegrityError(f"{meta_file} is not valid JSON (corrupt or truncated)") from error
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise ValueError(f"{str(path)!r} is not an embcore {kind} (format {_get(document)!r})")
    if document.get("version", 0) > VERSION:
        raise ValueError(
            f"{str(path)!r} has version {document['version']}; this embcore reads {VERSION}"
        )
    meta = check_sealed(document, str(meta_file))
    if meta.get("kind") != kind:
        raise ValueError(
            f"{str(path)!r} is not an embcore {kind} (format {meta.get('format')!r}, kind "
            f"{meta.get('kind')!r})"
        )
    tensors_file = path / _TENSORS
    expected = (meta.get("files_sha256") or {}).get(_TENSORS)
    if not tensors_file.is_file() or sha256_file(tensors_file) != expected:
        raise IntegrityError(
            f"{tensors_file} is missing or does not match the sha256 in meta.json (corrupt, "
            "truncated, or from another save)"
        )
    tensors = _safetensors().load_file(str(tensors_file))
    return tensors, meta


def _get(document: object) -> object:
    return document.get("format") if isinstance(document, dict) else type(document).__name__


def _checkpoint_name(model_dir: Path, name: object) -> Path:
    """``model_dir/name`` for a name this module writes (``ckpt-<step>``); refuses anything
    else (a path, ``..``, a link) so that the pointer file can never reach outside."""
    if not isinstance(name, str) or not _CHECKPOINT_NAME.match(name):
        raise ValueError(
            f"{model_dir / _POINTER}: refusing the checkpoint name {name!r}; the Estimator "
            "writes only names like 'ckpt-123' inside model_dir"
        )
    path = model_dir / name
    if path.is_symlink():
        raise ValueError(f"{path} is a symbolic link; the Estimator writes only directories")
    return path


def _read_pointer(model_dir: Path) -> tuple[str, list[str]] | None:
    """``(latest, all)`` names of ``checkpoint.json``, every one checked (None: no pointer)."""
    pointer = model_dir / _POINTER
    if not pointer.is_file():
        return None
    raw = read_regular(pointer, 1 << 20)  # a link or a FIFO is refused, not followed
    try:
        document = json.loads(raw)
        latest, names = document["latest"], document["all"]
    except (ValueError, UnicodeDecodeError, KeyError, TypeError) as error:
        raise ValueError(
            f"{pointer} is not a checkpoint pointer written by the Estimator ({error!r}); "
            "remove it to start afresh"
        ) from error
    if not isinstance(names, list):
        raise ValueError(f"{pointer}: 'all' must be a list of names, got {names!r}")
    for name in [latest, *names]:
        _checkpoint_name(model_dir, name)
    return latest, names


def latest_checkpoint(model_dir: str | os.PathLike) -> Path | None:
    """The newest checkpoint directory of ``model_dir``, or None.

    Raises:
        ValueError: ``checkpoint.json`` is malformed or names something the Estimator does not
            write (a path outside ``model_dir``).
    """
    found = _read_pointer(Path(model_dir))
    return None if found is None else _checkpoint_name(Path(model_dir), found[0])


def write_checkpoint(
    model_dir: str | os.PathLike, step: int, tensors: dict[str, Tensor], meta: dict, keep: int
) -> Path:
    """Write ``ckpt-<step>``, point ``checkpoint.json`` at it, keep the newest ``keep``."""
    model_dir = Path(model_dir)
    model_dir.mkdir(parents=True, exist_ok=True)
    found = _read_pointer(model_dir)  # checked before anything is written or deleted
    name = f"ckpt-{step}"
    path = write_directory(model_dir / name, tensors, {**meta, "kind": "checkpoint"})
    names = [n for n in (found[1] if found else []) if n != name] + [name]
    text = json.dumps({"latest": name, "all": names[-keep:]}) + "\n"
    _atomic.write_atomic(model_dir / _POINTER, text.encode())
    for old in names[:-keep]:  # after the pointer stopped naming them
        shutil.rmtree(_checkpoint_name(model_dir, old), ignore_errors=True)
    return path


# ----------------------------------------------------------------- torch optimizer state


def optimizer_state(optimizer: torch.optim.Optimizer) -> tuple[dict[str, Tensor], dict]:
    """A torch optimizer's ``state_dict`` as tensors plus JSON-safe metadata.

    Raises:
        TypeError: a hyperparameter that JSON cannot hold (e.g. a tensor learning rate).
    """
    state = optimizer.state_dict()
    tensors: dict[str, Tensor] = {}
    numbers: dict[str, Any] = {}
    for index, entries in state["state"].items():
        for name, value in entries.items():
            key = f"{index}/{name}"
            if isinstance(value, Tensor):
                tensors[key] = value
            else:
                numbers[key] = value
    groups = [
        {k: list(v) if isinstance(v, tuple) else v for k, v in group.items()}
        for group in state["param_groups"]
    ]
    meta = {"type": type(optimizer).__name__, "param_groups": groups, "numbers": numbers}
    try:
        json.dumps(meta)
    except TypeError as e:
        raise TypeError(
            f"cannot checkpoint the {type(optimizer).__name__} state: {e}; use plain numbers "
            "for its hyperparameters"
        ) from e
    return tensors, meta


def load_optimizer_state(
    optimizer: torch.optim.Optimizer, tensors: dict[str, Tensor], meta: dict
) -> None:
    """Load what :func:`optimizer_state` saved.

    Raises:
        ValueError: a different optimizer type or parameter layout.
    """
    if meta["type"] != type(optimizer).__name__:
        raise ValueError(
            f"the checkpoint holds a {meta['type']} state, but model_fn returned a "
            f"{type(optimizer).__name__}"
        )
    state: dict[int, dict[str, Any]] = {}
    for key, value in [*tensors.items(), *meta["numbers"].items()]:
        index, name = key.split("/", 1)
        state.setdefault(int(index), {})[name] = value
    groups = [
        {k: v if k == "params" or not isinstance(v, list) else tuple(v) for k, v in g.items()}
        for g in meta["param_groups"]
    ]
    if [len(g["params"]) for g in groups] != [len(g["params"]) for g in optimizer.param_groups]:
        raise ValueError(
            "the checkpoint's optimizer has parameter groups of sizes "
            f"{[len(g['params']) for g in groups]}, model_fn's has "
            f"{[len(g['params']) for g in optimizer.param_groups]}"
        )
    optimizer.load_state_dict({"state": state, "param_groups": groups})
