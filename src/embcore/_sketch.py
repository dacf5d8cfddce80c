"""The Misra-Gries heavy-hitter sketch of the lookup statistics (:mod:`embcore.stats`):
bounded and mergeable."""

from __future__ import annotations

import numpy as np

__all__ = ["merged_sketch"]


def merged_sketch(
    sketch: dict[int, int], ids: np.ndarray, counts: np.ndarray, capacity: int
) -> dict[int, int]:
    """Add exact counts of distinct ``ids`` to a sketch, then the Misra-Gries reduction: if
    more than ``capacity`` ids remain, subtract the (capacity+1)-th largest count and keep the
    positives. Vectorized: this runs per table for every profiled batch."""
    if sketch:
        n = len(sketch)
        ids = np.concatenate([np.fromiter(sketch.keys(), dtype=np.int64, count=n), ids])
        counts = np.concatenate([np.fromiter(sketch.values(), dtype=np.int64, count=n), counts])
        ids, inverse = np.unique(ids, return_inverse=True)
        summed = np.zeros(ids.size, dtype=np.int64)
        np.add.at(summed, inverse, counts)
        counts = summed
    if ids.size > capacity:
        cut = np.partition(counts, ids.size - capacity - 1)[ids.size - capacity - 1]
        keep = counts > cut
        ids, counts = ids[keep], counts[keep] - cut
    return dict(zip(ids.tolist(), counts.tolist(), strict=True))
