"""A stand-in for TorchRec's ``KeyedJaggedTensor`` (torchrec is an optional dependency):
only the methods embcore reads, for tests of KJT inputs."""

from __future__ import annotations

import importlib.util
import warnings

import pytest
import torch

#: Why the tests of TorchRec's own class are skipped where it is not installed.
NO_TORCHREC = (
    "torchrec is not installed (CI does not install it; pip install torchrec==1.8.0 "
    "fbgemm-gpu-cpu==1.8.0 to run these tests against TorchRec's own KeyedJaggedTensor)"
)


def torchrec_kjt() -> type:
    """TorchRec's ``KeyedJaggedTensor`` class, or skip the test saying why.

    Importing torchrec 1.8.0 on CPU warns (FBGEMM's SSD and Adam-SSD kernels are missing from
    fbgemm-gpu-cpu); those import-time warnings are not about embcore."""
    if importlib.util.find_spec("torchrec") is None:
        pytest.skip(NO_TORCHREC)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torchrec.sparse.jagged_tensor import KeyedJaggedTensor
    return KeyedJaggedTensor


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
