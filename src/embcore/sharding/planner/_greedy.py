"""Greedy placement: tables one at a time, each where the whole placement is best balanced.

A placement is scored by ``sum_r (traffic_r / C)^2 + sum_r (memory_r / M)^2``: small, even
traffic first, and memory balance as it nears a rank's capacity. See ``docs/sharding.md``
("Plans").
"""

from __future__ import annotations

import math

from embcore.sharding.plan import TableShard
from embcore.sharding.planner._cost import cost
from embcore.sharding.schemes import PlannedTable

__all__ = ["ASSUMED_MEMORY_PER_RANK", "GreedyPlacement"]

#: The memory a rank is assumed to have for tables when ``memory_per_rank`` is not given.
ASSUMED_MEMORY_PER_RANK = 16 << 30


class GreedyPlacement:
    """The tables placed so far, and the per-rank memory and traffic they add up to.

    Args:
        world: number of ranks.
        memory_per_rank: bytes a rank may hold (``None``: no limit); also ``M`` in the score,
            else :data:`ASSUMED_MEMORY_PER_RANK`.
        traffic_scale: ``C`` in the score: bytes per rank and step.
    """

    def __init__(self, world: int, memory_per_rank: int | None, traffic_scale: float) -> None:
        self.world = world
        self.memory_per_rank = memory_per_rank
        self.norm_m = float(memory_per_rank or ASSUMED_MEMORY_PER_RANK)
        self.norm_c = traffic_scale
        self.memory = [0.0] * world
        self.traffic = [0.0] * world
        self.chosen: dict[str, TableShard] = {}

    def peak_memory(self, t: PlannedTable, shard: TableShard) -> float:
        """The fullest rank's memory with ``t`` placed by ``shard`` on top."""
        added = cost(t, shard, self.world).memory
        return max(a + b for a, b in zip(self.memory, added, strict=True))

    def fits(self, t: PlannedTable, shard: TableShard) -> bool:
        return self.memory_per_rank is None or self.peak_memory(t, shard) <= self.memory_per_rank

    def _score(self, t: PlannedTable, shard: TableShard) -> float:
        m, s, r = cost(t, shard, self.world)
        new_mem = [a + b for a, b in zip(self.memory, m, strict=True)]
        if self.memory_per_rank is not None and max(new_mem) > self.memory_per_rank:
            return math.inf
        new_traffic = [a + b + c for a, b, c in zip(self.traffic, s, r, strict=True)]
        return sum((x / self.norm_m) ** 2 for x in new_mem) + sum(
            (x / self.norm_c) ** 2 for x in new_traffic
        )

    def place(self, t: PlannedTable, options: list[TableShard]) -> None:
        """Place ``t`` by the best-scoring of ``options`` (the first of equal ones).

        Raises:
            ValueError: no option fits within ``memory_per_rank``.
        """
        best, best_score = None, math.inf
        for shard in options:
            score = self._score(t, shard)
            if score < best_score * (1 - 1e-9):
                best, best_score = shard, score
        if best is None:
            fullest, shard = min(
                ((self.peak_memory(t, o), o) for o in options), key=lambda pair: pair[0]
            )
            raise ValueError(
                f"plan: table '{t.name}' ({t.vocab}x{t.dim}) does not fit in "
                f"memory_per_rank={self.memory_per_rank} bytes on {self.world} ranks: placed "
                f"{shard.describe()}, a rank would hold {fullest:.0f} bytes with the "
                "tables placed before it; add ranks, raise memory_per_rank or use a lighter "
                "optimizer"
            )
        m, s, r = cost(t, best, self.world)
        for i in range(self.world):
            self.memory[i] += m[i]
            self.traffic[i] += s[i] + r[i]
        self.chosen[t.name] = best
