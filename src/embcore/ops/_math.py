"""Math every backend and the sharded schemes share: the per-id multiplier of a pooled lookup.

See docs/semantics.md §2.3 for the combiners.
"""

from __future__ import annotations

import torch
from torch import Tensor

from embcore.inputs import FeatureBatch

__all__ = ["gains"]


def gains(batch: FeatureBatch) -> Tensor:
    """``(N,) float32``: the multiplier of each id, weight times its sample's combiner scale.

    ``scale`` is 1 for sum, ``1/sum(w)`` for mean and ``1/sqrt(sum(w^2))`` for sqrtn over the
    sample's ids (0 when the denominator is 0).
    """
    seg = batch.segments()
    w = batch.weights
    if w is None:
        w = torch.ones(batch.values.numel(), dtype=torch.float32, device=batch.values.device)
    if batch.combiner == "sum":
        return w
    per_sample = w if batch.combiner == "mean" else w * w
    denom = torch.zeros(batch.num_samples, dtype=torch.float32, device=w.device)
    denom.index_add_(0, seg, per_sample)
    if batch.combiner == "sqrtn":
        denom = torch.sqrt(denom)
    scale = torch.where(denom == 0, torch.zeros_like(denom), 1.0 / denom)
    return w * scale[seg]
