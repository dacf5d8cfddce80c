"""Cases shared by the Triton backend tests (interpreter on CPU, and CUDA).

Every case runs the Triton backend and the reference backend (embcore.ops.reference, the
readable PyTorch yardstick) on copies of the same table and compares tables, slots and
activations. Half-precision tables are compared with the reference run in float32 on the
widened table and then rounded to the storage dtype, which is what the backend promises.
"""

from __future__ import annotations

import torch

# re-exported for the Triton test modules
from optimizer_cases import OPTIMIZERS  # noqa: F401

import embcore as ec
from embcore.inputs import FeatureBatch
from embcore.ops import reference
from embcore.ops.state import TableState

#: float32 tolerance: summation order within a bag or a row differs from the reference
RTOL, ATOL = 1e-5, 1e-6


def make_state(
    opt: ec.Optimizer | None,
    vocab: int,
    dim: int,
    seed: int,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> TableState:
    """A table with random rows and random (valid) slot values, so every term matters."""
    gen = torch.Generator().manual_seed(seed)
    weight = (torch.randn(vocab, dim, generator=gen) * 0.5).to(dtype)
    slots = {}
    for spec in opt.slot_specs() if opt is not None else ():
        value = torch.full(spec.shape(vocab, dim), spec.initial_value)
        value += torch.rand(value.shape, generator=gen) * 0.2  # accumulators stay >= 0
        slots[spec.name] = value.to(device)
    return TableState(f"table{seed}", weight.to(device), slots, opt)


def copy_state(state: TableState, dtype: torch.dtype | None = None) -> TableState:
    """A deep copy, the weight optionally converted (float32 for the reference of a half
    table)."""
    slots = {k: v.clone() for k, v in state.slots.items()}
    weight = state.weight.clone() if dtype is None else state.weight.to(dtype, copy=True)
    return TableState(state.name, weight, slots, state.optimizer)


def make_batch(
    gen: torch.Generator,
    vocab: int,
    samples: int,
    max_ids: int,
    combiner: str = "sum",
    weighted: bool = False,
    device: str = "cpu",
) -> FeatureBatch:
    """Random bags of 0..max_ids ids, with duplicates (small vocab) and empty bags."""
    lengths = torch.randint(0, max_ids + 1, (samples,), generator=gen)
    offsets = torch.zeros(samples + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(lengths, 0)
    values = torch.randint(0, vocab, (int(offsets[-1]),), generator=gen)
    weights = torch.rand(values.numel(), generator=gen) * 2 - 0.5 if weighted else None
    batch = FeatureBatch(values, offsets, weights, combiner, (samples,))
    return batch.to(torch.device(device))


def sequence_batch(
    gen: torch.Generator, vocab: int, batch: int, length: int, device: str = "cpu"
) -> FeatureBatch:
    """A sequence feature: every position is a bag of one id, or of none (padding)."""
    present = torch.rand(batch * length, generator=gen) < 0.7
    offsets = torch.zeros(batch * length + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(present.long(), 0)
    values = torch.randint(0, vocab, (int(offsets[-1]),), generator=gen)
    fb = FeatureBatch(values, offsets, None, "sum", (batch, length))
    return fb.to(torch.device(device))


def gradients(gen: torch.Generator, features: list[FeatureBatch], dim: int) -> list[torch.Tensor]:
    device = features[0].values.device
    return [torch.randn(f.num_samples, dim, generator=gen).to(device) for f in features]


def touched(features: list[FeatureBatch], vocab: int) -> torch.Tensor:
    mask = torch.zeros(vocab, dtype=torch.bool, device=features[0].values.device)
    for f in features:
        mask[f.values] = True
    return mask


def check_update(
    backend,
    state: TableState,
    features: list[FeatureBatch],
    grads: list[torch.Tensor],
    lr: float = 0.1,
    step: int = 3,
) -> None:
    """Update ``state`` with ``backend`` and a float32 copy with the reference; compare.

    Float32 tables agree within float32 rounding; half tables within one unit in the last
    place of the storage dtype (the float32 results may straddle a rounding boundary).
    Untouched rows of lazy optimizers must stay bit-identical."""
    before = state.weight.clone()
    expected = copy_state(state, torch.float32)
    backend.update([state], [features], [grads], [lr], step)
    reference.update([expected], [features], [grads], [lr], step)
    got = state.weight
    if got.dtype == torch.float32:
        torch.testing.assert_close(got, expected.weight, rtol=RTOL, atol=ATOL)
    else:
        torch.testing.assert_close(got, expected.weight.to(got.dtype))
    for name, slot in state.slots.items():
        torch.testing.assert_close(slot, expected.slots[name], rtol=RTOL, atol=ATOL)
    if state.optimizer.lazy:
        untouched = ~touched(features, state.weight.shape[0])
        assert torch.equal(got[untouched], before[untouched])
        for name, slot in state.slots.items():
            assert torch.equal(slot[untouched], expected.slots[name][untouched]), name
