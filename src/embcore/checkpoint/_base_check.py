"""Before a delta is written: every rank was given the same base, and its whole chain loads.

A delta can only ever load with every checkpoint of its chain, so ``save(..., base=)``
checks, after planning and before anything is created::

    every rank    open the base's manifest       -> a fingerprint of (name, manifest sha256)
    all ranks     the fingerprints agree         (ranks given different bases all raise)
    every rank    resolve the chain on disk      (a deleted root or middle link raises)
    all ranks     share the sha256 of every chunk of the chain (a corrupt file raises)

Each step ends in an agreement, so a failure raises on every rank and nothing is written.
The engine's memory of the base (which spares reading the base's keys) is not trusted for
this: the files are. See docs/reliability.md.
"""

from __future__ import annotations

import os

from embcore._comm import Comm
from embcore._fingerprint import fingerprint64
from embcore.checkpoint._chain import Link, open_checkpoint, resolve
from embcore.checkpoint._errors import CheckpointError
from embcore.checkpoint._load import verify_shared

__all__ = ["check_base"]

_WHAT = "embcore.checkpoint.save"


def _refused(base: str, error: BaseException) -> BaseException:
    """``error`` (same type) saying that a delta on ``base`` could never load."""
    message = f"{_WHAT}: a delta on base {base} could never load, nothing was written: {error}"
    kind = FileNotFoundError if isinstance(error, FileNotFoundError) else CheckpointError
    return kind(message)


def check_base(comm: Comm, base: str | None, needs_chain: bool) -> None:
    """Raise on every rank unless every rank was given the same ``base`` (the same
    directory name and manifest) and, when the delta will name it (``needs_chain``), the
    base's whole chain is on disk and every chunk of it verifies. A collective."""
    error: BaseException | None = None
    link: Link | None = None
    identity = 0
    if base is not None:
        try:
            link = open_checkpoint(os.path.abspath(base))
            name = f"{os.path.basename(os.path.abspath(base))}\0{link.sha256}"
            identity = fingerprint64(name.encode())
        except (OSError, ValueError) as e:
            error = _refused(base, e)
    comm.agree(_WHAT, error)
    manifest = link.sha256[:16] if link is not None else "none"
    comm.check_same(
        _WHAT,
        identity,
        f"were given another base (this rank: base={base!r}, manifest sha256 {manifest}...) "
        "; every rank must name the same base, nothing was written",
    )
    if link is None or not needs_chain:
        return
    chain: list[Link] = []
    try:
        chain = resolve(link)
    except (OSError, ValueError) as e:
        error = _refused(base, e)  # type: ignore[arg-type]
    comm.agree(_WHAT, error)
    try:
        verify_shared(comm, chain, _WHAT, outcome="a delta on it could never load")
    except CheckpointError as e:
        raise CheckpointError(f"{_WHAT}: base {base}: {e}; nothing was written") from e
