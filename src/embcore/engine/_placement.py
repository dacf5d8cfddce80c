"""Where an engine runs: its device, its sharding plan, its rank among the processes and the
communication it has done (the store's, read through the engine)."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["Placement"]


class Placement:
    """The engine's properties that read its store's placement (``self.store``)."""

    store: Any

    @property
    def device(self) -> torch.device:
        return self.store.device

    @property
    def plan(self) -> Any:
        """The ``ShardingPlan`` of sharded tables (``None`` in one process)."""
        return self.store.plan

    @property
    def rank(self) -> int:
        return self.store.comm.rank

    @property
    def world_size(self) -> int:
        return self.store.comm.world

    @property
    def comm_stats(self) -> Any:
        """This rank's cumulative communication (bytes sent and received, collectives)."""
        return self.store.comm.stats
