"""Workers for tests/sharding/test_delta_base_ranks.py: delta saves of dynamic tables on 2 gloo
ranks (the key-hash scenario of ``dynamic_sharding_harness.py``) given different bases, or
a base whose chain was damaged on disk. Run with ``sharding_harness.launch``."""

from __future__ import annotations

import os
from typing import Any

import embcore as ec


def _outcome(save: Any) -> str:
    """``"saved"``, or the type and message of what the save raised."""
    try:
        save()
    except Exception as error:  # every rank reports what it raised
        return f"{type(error).__name__}: {error}"
    return "saved"


def worker_setup(rank: int, world: int, tmp: str) -> None:
    """Save ``c3`` (full) and ``c6`` (a delta on ``c3``)."""
    import dynamic_sharding_harness as d

    e = d.engine(world)
    d.train(e, [rank], range(3))
    ec.checkpoint.save(e, f"{tmp}/c3")
    d.train(e, [rank], range(3, 6))
    ec.checkpoint.save(e, f"{tmp}/c6", base=f"{tmp}/c3")


def worker_bases(rank: int, world: int, tmp: str, bases: list[str | None]) -> dict[str, Any]:
    """Train as far as ``c6`` again, then save ``c9`` with base ``bases[rank]``; report the
    outcome and what is left in ``tmp``."""
    import dynamic_sharding_harness as d

    e = d.engine(world)
    d.train(e, [rank], range(6))
    base = bases[rank]
    outcome = _outcome(lambda: ec.checkpoint.save(e, f"{tmp}/c9", base=base and f"{tmp}/{base}"))
    return {"outcome": outcome, "left": sorted(os.listdir(tmp))}
