"""A step-by-step Python model of a dynamic table's key space (docs/dynamic_tables.md):
admission by count, eviction by age and by count, keys admitted again. Plain dicts, one key
at a time; nothing here imports embcore."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import numpy as np


class Model:
    """One dynamic table's keys, one key at a time: ``held[key] = [value, freq, last seen]``
    (a dim-1 value trained by SGD(1) with gradient 1 per occurrence; ``start(key)`` is its
    initial value), ``pending[key] = (count, last seen)``. :meth:`lookup` is a training
    lookup (counts, admits after ``k`` occurrences), :meth:`update` the update and the step
    boundary (eviction by ``ttl`` steps unseen, then beyond ``cap`` rows, least used first).
    """

    def __init__(
        self,
        k: int,
        ttl: int | None,
        cap: int | None,
        start: Callable[[int], np.float32] = lambda key: np.float32(0.0),
    ) -> None:
        self.k, self.ttl, self.cap, self.start = k, ttl, cap, start
        self.step = 0
        self.pending: dict[int, tuple[int, int]] = {}  # key -> (count, last seen)
        self.held: dict[int, list] = {}  # key -> [value, freq, last seen]

    def lookup(self, keys: list[int]) -> dict[int, int]:
        """A training lookup: counts, admits; returns the occurrences of held keys."""
        for key, m in sorted(Counter(keys).items()):
            if key in self.held:
                self.held[key][1] += m
                self.held[key][2] = self.step
                continue
            total = self.pending.pop(key, (0, 0))[0] + m
            if total >= self.k:
                self.held[key] = [self.start(key), total, self.step]
            else:
                self.pending[key] = (total, self.step)
        return {key: m for key, m in Counter(keys).items() if key in self.held}

    def value(self, key: int) -> np.float32:
        return self.held[key][0] if key in self.held else np.float32(0.0)

    def update(self, touched: dict[int, int]) -> None:
        for key, m in touched.items():
            self.held[key][0] = np.float32(self.held[key][0] - np.float32(m))
        if self.ttl is not None:
            cut = self.step - self.ttl
            self.held = {k: v for k, v in self.held.items() if v[2] > cut}
            self.pending = {k: v for k, v in self.pending.items() if v[1] > cut}
        if self.cap is not None and len(self.held) > self.cap:
            order = sorted(self.held, key=lambda k: (self.held[k][1], self.held[k][2], k))
            for key in order[: len(self.held) - self.cap]:
                del self.held[key]
        self.step += 1
