"""A call's batches with their ids replaced by the rows (or cache slots) a row storage mapped
them to: one helper for every kind that maps ids (keyed, disk, disk_keyed)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import torch

from embcore.inputs import FeatureBatch

__all__ = ["split_mapped"]


def split_mapped(batches: Sequence[FeatureBatch], mapped: np.ndarray) -> list[FeatureBatch]:
    """The batches with ``values`` replaced by ``mapped: (N,) int64``, every batch's ids in
    order (batch ``i`` takes the next ``batches[i].values.numel()``), on each batch's device."""
    out, start = [], 0
    for b in batches:
        n = b.values.numel()
        values = torch.from_numpy(mapped[start : start + n]).to(b.values.device)
        out.append(dataclasses.replace(b, values=values))
        start += n
    return out
