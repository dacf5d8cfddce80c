"""Feature batches and gradient contributions as the schemes send them between ranks.

A requester ships a batch to an owner as ``(offsets, ids, gains)``; the owner pools it as a
``sum`` batch weighted by those gains, which is the requester's own combiner bit for bit. See
``docs/sharding.md`` ("Sharding schemes").
"""

from __future__ import annotations

import torch
from torch import Tensor

from embcore._comm import Exchange, Inbox
from embcore.inputs import FeatureBatch
from embcore.ops import gains

__all__ = [
    "F32",
    "I64",
    "concat_batches",
    "contributions",
    "occurrences",
    "send_batch",
    "take_batch",
]

F32 = torch.float32
I64 = torch.int64


def send_batch(ex: Exchange, dest: int, batch: FeatureBatch) -> None:
    """Ship one feature batch to an owner that pools it: offsets, ids and per-id gains."""
    ex.send(dest, batch.offsets)
    ex.send(dest, batch.values)
    ex.send(dest, gains(batch))


def take_batch(inbox: Inbox, src: int) -> FeatureBatch:
    """The counterpart of :func:`send_batch`: a ``sum`` batch weighted by the sender's gains.

    Pooling ``gain * row`` with the sender's gains is the sender's own combiner, bit for bit.
    """
    offsets = inbox.take(src, I64).reshape(-1)
    values = inbox.take(src, I64).reshape(-1)
    weights = inbox.take(src, F32).reshape(-1)
    samples = offsets.numel() - 1
    return FeatureBatch(values, offsets, weights, "sum", (samples,))


def concat_batches(batches: list[FeatureBatch]) -> FeatureBatch:
    """Batches of ``sum`` samples (as from :func:`take_batch`) one after the other."""
    if len(batches) == 1:
        return batches[0]
    offsets, base = [batches[0].offsets[:1]], 0
    for b in batches:
        offsets.append(b.offsets[1:] + base)
        base += b.values.numel()
    weights = [gains(b) for b in batches]  # the weights themselves: these are sum batches
    samples = sum(b.num_samples for b in batches)
    return FeatureBatch(
        torch.cat([b.values for b in batches]),
        torch.cat(offsets),
        torch.cat(weights),
        "sum",
        (samples,),
    )


def contributions(batch: FeatureBatch, grad: Tensor) -> Tensor:
    """``(N, dim)``: each id's share ``gain * dL/dactivation[sample]`` of its row's gradient.

    Args:
        batch: one feature's ``N`` ids in ``S`` samples.
        grad: ``(S, dim)`` float32, the gradient of the feature's activations.

    The same expression as the reference update, so the owner's sums match it bit for bit.
    """
    return grad[batch.segments()] * gains(batch)[:, None]


def occurrences(ids: Tensor) -> FeatureBatch:
    """A batch with one ``sum`` sample per id, to feed precomputed contributions to
    ``ops.update`` (each contribution then enters its row's sum unchanged).

    Args:
        ids: ``(N,) int64`` rows, one per contribution.
    """
    n = ids.numel()
    return FeatureBatch(ids, torch.arange(n + 1, device=ids.device), None, "sum", (n,))
