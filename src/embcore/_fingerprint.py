"""Digests of bytes: a 64-bit fingerprint for ranks to compare values cheaply, and sha256 for
the checksums files carry (checkpoints, run states, serving bundles, Estimator directories).

See docs/reliability.md for what each writer checks with them.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

import torch
from torch import Tensor

__all__ = ["TruncatedError", "fingerprint64", "sha256_file", "sha256_range", "sha256_tensor"]

_BLOCK = 1 << 23


class TruncatedError(ValueError):
    """A file holds fewer bytes than its checksum covers."""


def fingerprint64(data: bytes | str) -> int:
    """A non-negative int below ``2**62`` of ``data`` (blake2b): small enough for an int64
    tensor, so ranks can all-gather and compare it (not a security digest)."""
    if isinstance(data, str):
        data = data.encode()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little") >> 2


def sha256_range(path: str | os.PathLike[str], offset: int, length: int) -> str:
    """sha256 (hex) of ``length`` bytes at ``offset`` of ``path``.

    Raises:
        TruncatedError: the file ends before ``offset + length``.
    """
    digest = hashlib.sha256()
    with open(path, "rb") as f:
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
    """sha256 (hex) of a whole file."""
    return sha256_range(path, 0, os.path.getsize(path))


def sha256_tensor(tensor: Tensor) -> str:
    """sha256 (hex) of a CPU tensor's bytes in row-major order, plus its dtype and shape (so
    a reinterpreted or reshaped tensor does not match)."""
    t = tensor.detach().to("cpu").contiguous().reshape(-1)
    digest = hashlib.sha256(f"{t.dtype}{tuple(tensor.shape)}".encode())
    if t.numel():
        data: Any = t.view(torch.uint8).numpy()
        digest.update(memoryview(data))
    return digest.hexdigest()
