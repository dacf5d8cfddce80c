"""A stand-in for TorchRec's ``KeyedJaggedTensor`` (torchrec is an optional dependency):
only the methods embcore reads, for tests of KJT inputs."""

from __future__ import annotations

import torch


class StandInKJT:
    """The parts of torchrec.sparse.jagged_tensor.KeyedJaggedTensor that embcore reads."""

    def __init__(self, keys, values, lengths, weights=None):
        self._keys, self._values, self._lengths, self._weights = keys, values, lengths, weights

    def keys(self):
        return self._keys

    def values(self):
        return self._values

    def lengths(self):
        return self._lengths

    def offsets(self):
        return torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(self._lengths, 0)])

    def weights_or_none(self):
        return self._weights
