"""Digests of bytes: a 64-bit fingerprint for ranks to compare values cheaply, and sha256 for
the checksums files carry (checkpoints, run states, serving bundles, Estimator directories).

See docs/reliability.md for what each writer checks with them.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from embcore._files import open_regular

__all__ = [
    "IntegrityError",
    "TruncatedError",
    "check_sealed",
    "check_tensors",
    "fingerprint64",
    "seal",
    "sha256_file",
    "sha256_range",
    "sha256_tensor",
    "tensor_digests",
]

_BLOCK = 1 << 23


class IntegrityError(ValueError):
    """A file's content does not match the checksum written with it (a flipped bit, a
    truncation, files of two different saves mixed); the message names the file."""


class TruncatedError(IntegrityError):
    """A file holds fewer bytes than its checksum covers."""


def fingerprint64(data: bytes | str) -> int:
    """A non-negative int below ``2**62`` of ``data`` (blake2b): small enough for an int64
    tensor, so ranks can all-gather and compare it (not a security digest)."""
    if isinstance(data, str):
        data = data.encode()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little") >> 2


def sha256_range(path: str | os.PathLike[str], offset: int, length: int) -> str:
    """sha256 (hex) of ``length`` bytes at ``offset`` of the regular file ``path``.

    Raises:
        UnsafeFileError: ``path`` is a link or not a regular file.
        TruncatedError: the file ends before ``offset + length``.
    """
    digest = hashlib.sha256()
    fd, _ = open_regular(path)
    with os.fdopen(fd, "rb") as f:
        f.seek(offset)
        left = length
        while left:
            block = f.read(min(left, _BLOCK))
            if not block:
                raise TruncatedError(
                    f"{os.fspath(path)} ends {left} bytes early (expected {offset + length} "
                    "bytes): the file is truncated"
                )
            digest.update(block)
            left -= len(block)
    return digest.hexdigest()


def sha256_file(path: str | os.PathLike[str]) -> str:
    """sha256 (hex) of a whole regular file (a link or a FIFO is refused: see ``_files``)."""
    fd, size = open_regular(path)
    os.close(fd)
    return sha256_range(path, 0, size)


def sha256_tensor(tensor: Tensor) -> str:
    """sha256 (hex) of a CPU tensor's bytes in row-major order, plus its dtype and shape (so
    a reinterpreted or reshaped tensor does not match)."""
    t = tensor.detach().to("cpu").contiguous().reshape(-1)
    digest = hashlib.sha256(f"{t.dtype}{tuple(tensor.shape)}".encode())
    if t.numel():
        data: Any = t.view(torch.uint8).numpy()
        digest.update(memoryview(data))
    return digest.hexdigest()


def tensor_digests(tensors: Mapping[str, Tensor]) -> dict[str, str]:
    """``{name: sha256_tensor}`` of every tensor."""
    return {name: sha256_tensor(t) for name, t in sorted(tensors.items())}


def check_tensors(tensors: Mapping[str, Tensor], digests: Any, where: str) -> None:
    """Check tensors read back from ``where`` against their :func:`tensor_digests`.

    Raises:
        IntegrityError: a tensor differs, is missing or was added (named, with ``where``).
    """
    if not isinstance(digests, dict) or not all(isinstance(v, str) for v in digests.values()):
        raise IntegrityError(f"{where}: the checksums are missing or malformed")
    if sorted(digests) != sorted(tensors):
        raise IntegrityError(
            f"{where}: holds tensors {sorted(tensors)}, its checksums list {sorted(digests)}"
        )
    bad = [name for name in sorted(tensors) if sha256_tensor(tensors[name]) != digests[name]]
    if bad:
        raise IntegrityError(
            f"{where} is corrupt: tensor(s) {bad} do not match the sha256 written with them"
        )


def _canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def seal(document: dict[str, Any]) -> dict[str, Any]:
    """``document`` plus ``"sha256"``: the checksum of its other keys (canonical JSON)."""
    return {**document, "sha256": hashlib.sha256(_canonical(document)).hexdigest()}


def check_sealed(document: Any, where: str) -> dict[str, Any]:
    """``document`` without its ``"sha256"``, after checking it (see :func:`seal`).

    Raises:
        IntegrityError: not a JSON object, no checksum, or a checksum that does not match.
    """
    if not isinstance(document, dict) or not isinstance(document.get("sha256"), str):
        raise IntegrityError(f"{where}: no checksum (not written by this embcore, or damaged)")
    rest = {k: v for k, v in document.items() if k != "sha256"}
    if hashlib.sha256(_canonical(rest)).hexdigest() != document["sha256"]:
        raise IntegrityError(f"{where} is corrupt: its content does not match its sha256")
    return rest
