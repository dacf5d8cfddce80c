"""The CPU backend's cached descriptors: reused only while they still describe the tensors.

The batch part of the feature descriptors is kept for a step's lookup and update, and the
table descriptors while the states and their addresses are the same; a moved table
(``share_memory_()`` moves its storage in place) or other batches must be seen afresh.
"""

from __future__ import annotations

import pytest
import torch

import embcore as ec
from embcore.inputs import FeatureBatch
from embcore.ops import cpu, reference
from embcore.ops.state import TableState


def _state(seed: int) -> TableState:
    gen = torch.Generator().manual_seed(seed)
    return TableState(f"t{seed}", torch.randn(20, 4, generator=gen), {}, ec.SGD(0.5))


def _batch(ids: list[int]) -> FeatureBatch:
    return FeatureBatch(torch.tensor(ids), torch.arange(len(ids) + 1), None, "sum", (len(ids),))


def test_a_moved_table_and_other_batches_are_described_afresh():
    states = [_state(0), _state(1)]
    for ids in ([1, 2, 3], [4, 5, 19], [1, 2, 3]):
        features = [[_batch(ids)], [_batch(ids[::-1])]]
        got = cpu.lookup(states, features)
        want = reference.lookup(states, features)
        pairs = zip([a for t in got for a in t], [a for t in want for a in t], strict=True)
        assert all(torch.equal(g, w) for g, w in pairs)
    before = states[0].weight.data_ptr()
    states[0].weight.share_memory_()  # same tensor, new storage
    assert states[0].weight.data_ptr() != before
    features = [[_batch([7])], [_batch([8])]]
    grads = [[torch.ones(1, 4)], [torch.ones(1, 4)]]
    expected = states[0].weight[7] - 0.5
    cpu.update(states, features, grads, [0.5, 0.5], 1)
    assert torch.equal(states[0].weight[7], expected)
    assert torch.equal(cpu.lookup(states, features)[0][0][0], expected)


def test_an_output_with_strided_columns_is_refused_before_any_work():
    states = [_state(0)]
    out = torch.zeros(3, 8)[:, ::2]  # (3, 4), columns two floats apart
    with pytest.raises(NotImplementedError, match="outputs whose columns are contiguous"):
        cpu.lookup(states, [[_batch([1, 2, 3])]], out=[[out]])
    assert torch.equal(out, torch.zeros(3, 4))
