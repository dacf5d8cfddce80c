"""Optimizers that update rows outside the batch, on every kernel backend, over steps whose
ids change.

Non-lazy Adam moves every row every step, the untouched ones with ``g = 0``. A kernel that
finds a row's gradient through an index kept from earlier steps (the CPU backend's sparse-set
dedup index) must not take a stale entry for a row of this step: the steps below are built so
that rows touched before, at positions the next step reuses, are left out of the next step.
Each backend runs the same steps as the reference backend; tables and slots must agree after
every step.
"""

from __future__ import annotations

import pytest
import torch
from engine_cases import BACKENDS
from optimizer_cases import OPTIMIZERS

from embcore import ops
from embcore.inputs import FeatureBatch
from embcore.ops import reference
from embcore.ops.state import TableState

RTOL, ATOL = 1e-5, 1e-6
VOCAB, DIM = 12, 5

#: every optimizer of the conformance list that touches rows outside the batch
NON_LAZY = sorted(name for name, opt in OPTIMIZERS.items() if not opt.lazy)

#: the ids of each step, as bags of one feature: step 2 reads 6 rows (positions 0-5 of its
#: index) and leaves out rows 2-7 of step 1, whose old positions 2-5 it reuses; step 3 again
#: leaves out most rows of step 2, and reads a row (3) last seen two steps before.
STEPS = [
    [[0, 1, 2], [3, 3], [], [4, 5, 6, 7]],
    [[8, 9], [10, 0], [11], [1, 8]],
    [[3], [], [9, 5], [5]],
]

#: (backend, device): every kernel backend that runs here, and Triton compiled on CUDA
CASES = [pytest.param(b, "cpu", id=b) for b in BACKENDS if b != "reference"] + [
    pytest.param("triton", "cuda", id="triton-cuda", marks=pytest.mark.gpu)
]


def _batch(bags: list[list[int]], device: str) -> FeatureBatch:
    lengths = torch.tensor([len(b) for b in bags])
    offsets = torch.zeros(len(bags) + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(lengths, 0)
    values = torch.tensor([i for b in bags for i in b], dtype=torch.int64)
    return FeatureBatch(values, offsets, None, "sum", (len(bags),)).to(torch.device(device))


def _state(name: str, device: str) -> TableState:
    """Random rows and slot values (accumulators stay >= 0), so every term matters."""
    opt = OPTIMIZERS[name]
    gen = torch.Generator().manual_seed(5)
    weight = torch.randn(VOCAB, DIM, generator=gen) * 0.5
    slots = {
        s.name: torch.full(s.shape(VOCAB, DIM), s.initial_value)
        + torch.rand(s.shape(VOCAB, DIM), generator=gen) * 0.2
        for s in opt.slot_specs()
    }
    return TableState("t", weight.to(device), {k: v.to(device) for k, v in slots.items()}, opt)


def test_the_steps_leave_out_rows_whose_old_positions_are_reused() -> None:
    first, second = ({i for bag in step for i in bag} for step in STEPS[:2])
    # rows of step 1 that step 2 leaves out, with their step-1 index position (first seen)
    order = list(dict.fromkeys(i for bag in STEPS[0] for i in bag))
    stale = {r: order.index(r) for r in first - second}
    assert any(u < len(second) for u in stale.values())


@pytest.mark.parametrize("name", NON_LAZY)
@pytest.mark.parametrize(("backend", "device"), CASES)
def test_rows_left_out_by_a_step_are_updated_with_zero_gradient(
    backend: str, device: str, name: str
) -> None:
    kernels = ops.get_backend(backend)
    state = _state(name, device)
    want = _state(name, "cpu")
    gen = torch.Generator().manual_seed(7)
    for step, bags in enumerate(STEPS, start=1):
        grads = torch.randn(len(bags), DIM, generator=gen)
        kernels.update([state], [[_batch(bags, device)]], [[grads.to(device)]], [0.1], step)
        reference.update([want], [[_batch(bags, "cpu")]], [[grads]], [0.1], step)
        for what, got, expected in [
            ("weight", state.weight, want.weight),
            *((f"slot {k}", state.slots[k], want.slots[k]) for k in want.slots),
        ]:
            torch.testing.assert_close(
                got.cpu(),
                expected,
                rtol=RTOL,
                atol=ATOL,
                msg=lambda m, what=what, step=step: f"{name}, {what}, step {step}: {m}",
            )
