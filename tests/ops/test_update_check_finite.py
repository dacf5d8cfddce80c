"""``ops.update(..., check_finite=True)``: a NaN or an Inf in any gradient writes no table and
returns ``False``; finite gradients give exactly the update without the check.

The CPU backend checks inside its dedup (every gradient row it reads, and the rows of empty
bags, which it reads for the check alone); the reference backend is checked by the dispatch
before its update. Both are compared with NumPy's ``isfinite`` over every gradient.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import embcore as ec
from embcore import ops
from embcore.inputs import FeatureBatch
from embcore.ops.state import TableState

OPTIMIZERS = {
    "adagrad": ec.Adagrad(learning_rate=0.1),  # fused with the dedup when not checking
    "rowwise": ec.RowwiseAdagrad(learning_rate=0.1),
    "sgd": ec.SGD(learning_rate=0.1),
    "adam-non-lazy": ec.Adam(learning_rate=0.1, lazy_adam=False, use_gradient_accumulation=True),
}
VOCAB, DIM = 50, 5


def _state(opt: ec.Optimizer, seed: int) -> TableState:
    gen = torch.Generator().manual_seed(seed)
    weight = torch.randn(VOCAB, DIM, generator=gen)
    slots = {s.name: torch.full(s.shape(VOCAB, DIM), s.initial_value) for s in opt.slot_specs()}
    return TableState(f"t{seed}", weight, slots, opt)


def _copy(state: TableState) -> TableState:
    slots = {k: v.clone() for k, v in state.slots.items()}
    return TableState(state.name, state.weight.clone(), slots, state.optimizer)


def _batch(gen: torch.Generator, samples: int, combiner: str) -> FeatureBatch:
    """Bags of 0-3 ids: at least one empty bag, whose gradient row the update never sums."""
    lengths = torch.randint(0, 4, (samples,), generator=gen)
    lengths[samples // 2] = 0
    offsets = torch.zeros(samples + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(lengths, 0)
    values = torch.randint(0, VOCAB, (int(offsets[-1]),), generator=gen)
    return FeatureBatch(values, offsets, None, combiner, (samples,))


def _case(kind: str, seed: int) -> tuple[list, list, list]:
    """Two tables (the first read by two features); the gradients of the second table's
    feature are rows of a wider tensor (strided, as slices of a stacked gradient)."""
    gen = torch.Generator().manual_seed(seed)
    opt = OPTIMIZERS[kind]
    states = [_state(opt, 0), _state(opt, 1)]
    features = [
        [_batch(gen, 7, "sum"), _batch(gen, 9, "mean")],
        [_batch(gen, 6, "sqrtn")],
    ]
    wide = torch.randn(6, 2 * DIM, generator=gen)
    grads = [
        [torch.randn(7, DIM, generator=gen), torch.randn(9, DIM, generator=gen)],
        [wide[:, :DIM]],
    ]
    return states, features, grads


def _tensors(states: list[TableState]) -> list[torch.Tensor]:
    return [t for s in states for t in (s.weight, *s.slots.values())]


def _places(features: list, grads: list) -> list[tuple[int, int, int, int]]:
    """(table, feature, sample, column) positions to spoil: a sample with ids and an empty
    bag in every feature, first and last columns."""
    out = []
    for t, (batches, per_table) in enumerate(zip(features, grads, strict=True)):
        for f, (b, g) in enumerate(zip(batches, per_table, strict=True)):
            sizes = (b.offsets[1:] - b.offsets[:-1]).tolist()
            with_ids = sizes.index(next(n for n in sizes if n > 0))
            empty = sizes.index(0)
            out += [(t, f, with_ids, 0), (t, f, empty, g.shape[1] - 1)]
    return out


@pytest.mark.parametrize("backend", ["cpu", "reference"])
@pytest.mark.parametrize("kind", sorted(OPTIMIZERS))
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_a_non_finite_gradient_anywhere_writes_no_table(backend, kind, bad):
    states, features, grads = _case(kind, seed=1)
    for t, f, s, d in _places(features, grads):
        spoiled = [[g.clone() for g in per_table] for per_table in grads]
        spoiled[t][f][s, d] = bad
        want = any(not np.isfinite(g.numpy()).all() for gs in spoiled for g in gs)
        assert want
        before = [x.clone() for x in _tensors(states)]
        applied = ops.update(backend, states, features, spoiled, [0.1, 0.2], 1, check_finite=True)
        assert applied is False, (t, f, s, d)
        for x, y in zip(before, _tensors(states), strict=True):
            assert torch.equal(x, y), (t, f, s, d)


@pytest.mark.parametrize("backend", ["cpu", "reference"])
@pytest.mark.parametrize("kind", sorted(OPTIMIZERS))
def test_finite_gradients_update_exactly_as_without_the_check(backend, kind):
    states, features, grads = _case(kind, seed=2)
    plain = [_copy(s) for s in states]
    for step in (1, 2):
        assert ops.update(backend, states, features, grads, [0.1, 0.2], step, check_finite=True)
        assert ops.update(backend, plain, features, grads, [0.1, 0.2], step)
    for x, y in zip(_tensors(states), _tensors(plain), strict=True):
        assert torch.equal(x, y)
    assert not torch.equal(states[0].weight, _state(OPTIMIZERS[kind], 0).weight)
