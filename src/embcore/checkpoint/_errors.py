"""The one error type of :mod:`embcore.checkpoint` (see docs/reliability.md)."""

from __future__ import annotations

__all__ = ["CheckpointError"]


class CheckpointError(ValueError):
    """A checkpoint that is incomplete, corrupt, unsafe to read, or does not fit the engine."""
