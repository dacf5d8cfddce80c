"""``ops.non_finite``: which activation gradients hold a NaN or an Inf, against NumPy."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from embcore import ops


def _case(rng: np.random.Generator) -> list[torch.Tensor]:
    tensors = []
    for size in (0, 1, 7, 64, 4096 * 8, 100_003):
        x = rng.standard_normal(size).astype(np.float32)
        if size and rng.random() < 0.6:
            x[rng.integers(size)] = rng.choice([np.nan, np.inf, -np.inf])
        tensors.append(torch.from_numpy(x))
    return tensors


@pytest.mark.parametrize("backend", ["cpu", "reference"])
def test_flags_match_numpy(backend):
    rng = np.random.default_rng(0)
    for _ in range(5):
        tensors = _case(rng)
        # non-contiguous, 2-D, float64 and a huge finite value also count
        tensors.append(torch.full((64, 8), np.float32(3e38))[:, ::2])
        tensors.append(torch.tensor([[1.0, float("nan")]], dtype=torch.float64))
        stacked = torch.zeros(50, 3, 4)  # the slices of a stacked (S, F, dim) output
        stacked[rng.integers(50), 1, rng.integers(4)] = np.inf
        tensors += [stacked[:, f, :] for f in range(3)]
        want = [not np.isfinite(t.numpy()).all() for t in tensors]
        assert ops.non_finite(backend, tensors) == want
    assert any(want) and not all(want)


def test_every_position_of_a_long_tensor_is_checked():
    x = torch.ones(1000)
    for i in (0, 1, 511, 998, 999):
        for bad in (float("nan"), float("inf"), float("-inf")):
            y = x.clone()
            y[i] = bad
            assert ops.non_finite("cpu", [x, y, x]) == [False, True, False]
