"""The offsets of one id per sample, ``arange(S + 1)``: one tensor shared by every batch of
``S`` samples (dense ids, a DLRM's categorical fields), as building it each step would cost."""

from __future__ import annotations

import functools

import torch
from torch import Tensor

__all__ = ["one_per_sample"]


def one_per_sample(samples: int) -> Tensor:
    """``(samples + 1,) int64`` ``arange``: the shared tensor, a normal one even under
    inference mode (the compiled operators save offsets for their backward). The engine never
    writes offsets in place; a user may, through a prepared batch: a tensor whose version
    moved is never handed out again."""
    if _arange(samples)._version:
        _arange.cache_clear()
    return _arange(samples)


@functools.lru_cache(maxsize=8)
def _arange(samples: int) -> Tensor:
    with torch.inference_mode(False):
        return torch.arange(samples + 1, dtype=torch.int64)
