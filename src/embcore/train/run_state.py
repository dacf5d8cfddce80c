"""Training-run checkpoints: one safetensors file per checkpoint, written atomically.

A checkpoint holds everything a resumed run needs to continue exactly as if it had never
stopped: the model (dense weights and the engine's tables, slots and step), the torch
optimizer's state, the RNG state, and, as JSON in the file's metadata, the config, the step,
the metric history and the running loss sums. No pickles: tensors are safetensors, the rest is
JSON, and a file is read with ``safe_open`` only.

Writing goes to a temporary file beside the final name, is flushed and fsynced, then renamed
over it, so a run killed at any moment leaves either the previous checkpoints or a complete new
one, never a torn file; ``latest_checkpoint`` ignores leftovers. Every tensor and the JSON carry
a sha256 (in the file's metadata), checked on load: a flipped bit or a truncated file is
refused, naming the file. See docs/reliability.md.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save
from torch import Tensor

from embcore import _atomic
from embcore._fingerprint import IntegrityError, check_sealed, check_tensors, seal, tensor_digests

__all__ = [
    "checkpoint_path",
    "latest_checkpoint",
    "list_checkpoints",
    "load_checkpoint",
    "optimizer_from_tensors",
    "optimizer_to_tensors",
    "prune_checkpoints",
    "save_checkpoint",
]

_FORMAT = "embcore-train-checkpoint"
_VERSION = 1
_NAME = re.compile(r"^step_(\d{8,})\.safetensors$")
_CHECKS = "embcore_sha256"


def checkpoint_path(directory: str | os.PathLike, step: int) -> Path:
    """``directory/step_00001234.safetensors``."""
    return Path(directory) / f"step_{step:08d}.safetensors"


def list_checkpoints(directory: str | os.PathLike) -> list[tuple[int, Path]]:
    """Complete checkpoints in ``directory`` as ``(step, path)``, oldest first."""
    d = Path(directory)
    if not d.is_dir():
        return []
    found = [(int(m.group(1)), d / m.group(0)) for p in d.iterdir() if (m := _NAME.match(p.name))]
    return sorted(found)


def latest_checkpoint(directory: str | os.PathLike) -> Path | None:
    """The checkpoint with the highest step, or ``None``."""
    found = list_checkpoints(directory)
    return found[-1][1] if found else None


def prune_checkpoints(directory: str | os.PathLike, keep: int) -> None:
    """Delete all but the ``keep`` most recent checkpoints."""
    for _, path in list_checkpoints(directory)[:-keep] if keep > 0 else []:
        path.unlink(missing_ok=True)


def save_checkpoint(path: str | os.PathLike, tensors: dict[str, Tensor], meta: dict) -> Path:
    """Write ``tensors`` and the JSON-able ``meta`` to ``path`` atomically.

    Args:
        path: the final file name (see :func:`checkpoint_path`).
        tensors: name -> tensor; copied to contiguous CPU tensors as needed.
        meta: plain JSON values (floats round-trip exactly).
    """
    path = Path(path)
    header = json.dumps({"format": _FORMAT, "version": _VERSION, **meta})
    data = {k: v.detach().cpu().contiguous() for k, v in tensors.items()}
    checks = seal(
        {"header": hashlib.sha256(header.encode()).hexdigest(), "tensors": tensor_digests(data)}
    )
    metadata = {"embcore": header, _CHECKS: json.dumps(checks)}
    return _atomic.write_atomic(path, save(data, metadata=metadata))


def load_checkpoint(path: str | os.PathLike) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """The tensors and the metadata of a checkpoint written by :func:`save_checkpoint`.

    Raises:
        ValueError: the file is not an embcore training checkpoint.
        IntegrityError (a ValueError): the file is truncated or corrupt (a tensor or the JSON
            does not match its sha256); the message names the file.
    """
    where = os.fspath(path)
    try:
        with safe_open(where, framework="pt") as f:
            header = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open is no dict)
    except SafetensorError as error:
        raise IntegrityError(
            f"{where}: not a readable safetensors file (truncated or corrupt: {error})"
        ) from error
    raw, sealed = header.get("embcore"), _json(header.get(_CHECKS))
    if sealed is not None:  # check the JSON before trusting a byte of it
        checks = check_sealed(sealed, where)
        if checks.get("header") != hashlib.sha256((raw or "").encode()).hexdigest():
            raise IntegrityError(f"{where} is corrupt: its JSON metadata does not match its sha256")
    meta = _json(raw)
    if not isinstance(meta, dict) or meta.get("format") != _FORMAT:
        raise ValueError(f"{where}: not an embcore training checkpoint")
    if meta.get("version") != _VERSION:
        raise ValueError(
            f"{where}: checkpoint version {meta.get('version')}, this embcore reads "
            f"version {_VERSION}"
        )
    if sealed is None:
        raise IntegrityError(f"{where}: no checksums (not written by this embcore, or damaged)")
    check_tensors(tensors, checks.get("tensors"), where)
    return tensors, meta


def _json(text: str | None) -> Any:
    try:
        return json.loads(text) if text else None
    except ValueError:
        return None


def optimizer_to_tensors(
    optimizer: torch.optim.Optimizer, prefix: str
) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """A torch optimizer's state dict as tensors (``prefix/<param>/<name>``) plus JSON."""
    state = optimizer.state_dict()
    tensors: dict[str, Tensor] = {}
    plain: dict[str, dict[str, Any]] = {}
    for param, values in state["state"].items():
        for name, value in values.items():
            if isinstance(value, Tensor):
                tensors[f"{prefix}/{param}/{name}"] = value
            else:
                plain.setdefault(str(param), {})[name] = value
    return tensors, {"param_groups": state["param_groups"], "plain_state": plain}


def optimizer_from_tensors(
    optimizer: torch.optim.Optimizer, tensors: dict[str, Tensor], meta: dict[str, Any], prefix: str
) -> None:
    """Load what :func:`optimizer_to_tensors` wrote into ``optimizer``."""
    state: dict[int, dict[str, Any]] = {}
    for key, value in tensors.items():
        head, _, rest = key.partition("/")
        if head != prefix:
            continue
        param, _, name = rest.partition("/")
        state.setdefault(int(param), {})[name] = value
    for param, values in meta["plain_state"].items():
        state.setdefault(int(param), {}).update(values)
    optimizer.load_state_dict({"state": state, "param_groups": meta["param_groups"]})
