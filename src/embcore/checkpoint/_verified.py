"""What ``ec.checkpoint.verify`` returns: a short summary that also reads as the manifest.

``repr`` says what was checked in one line::

    Verified('ckpt/step-1000': step 1000, 3 tables, 12 tensors in 40 chunks, 4.2 MiB, ok)

and the full manifest is ``result.manifest``. The result is also a read-only mapping over the
manifest (``result["step"]``, ``result == manifest``), as ``verify`` returned the manifest
itself before.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Verified"]


@dataclass(frozen=True, eq=False)
class Verified(Mapping[str, Any]):
    """A checkpoint that passed every check.

    Attributes:
        path: the checkpoint directory.
        manifest: its manifest (a delta's own manifest; ``bases`` counts what it stands on).
        bases: how many checkpoints the delta stands on (0: a full checkpoint).
    """

    path: str
    manifest: dict[str, Any]
    bases: int = 0

    @property
    def step(self) -> int:
        return int(self.manifest["step"])

    @property
    def tables(self) -> list[str]:
        return [t["name"] for t in self.manifest.get("tables", [])]

    @property
    def chunks(self) -> int:
        return sum(len(t["chunks"]) for t in self.manifest["tensors"].values())

    @property
    def nbytes(self) -> int:
        """Bytes of the chunks whose sha256 was checked (of this checkpoint, not its bases)."""
        return sum(c["length"] for t in self.manifest["tensors"].values() for c in t["chunks"])

    def __repr__(self) -> str:
        tensors = len(self.manifest["tensors"])
        chain = f", a delta over {self.bases} base(s)" if self.bases else ""
        return (
            f"Verified({self.path!r}: step {self.step}, {len(self.tables)} tables, {tensors} "
            f"tensors in {self.chunks} chunks, {self.nbytes / 2**20:.1f} MiB{chain}, ok)"
        )

    def __getitem__(self, key: str) -> Any:
        return self.manifest[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.manifest)

    def __len__(self) -> int:
        return len(self.manifest)
