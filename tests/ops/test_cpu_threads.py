"""The CPU backend's thread budget: a thread can cap the workers of its kernel calls (a
pipelined update in the background), without touching other threads or the results."""

from __future__ import annotations

import threading

import pytest
import torch

from embcore._numba import threads


@pytest.fixture
def two_threads():  # type: ignore[no-untyped-def]
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_budget_caps_this_thread_only(two_threads: None) -> None:
    big = 10 * threads.MIN_WORK_PER_THREAD
    assert threads.num_workers(big) == 2
    seen = {}
    with threads.budget(1):
        assert threads.num_workers(big) == 1
        other = threading.Thread(target=lambda: seen.setdefault("other", threads.num_workers(big)))
        other.start()
        other.join()
        with threads.budget(4):  # nested budgets only tighten
            assert threads.num_workers(big) == 1
    assert seen["other"] == 2
    assert threads.num_workers(big) == 2
    assert threads.num_workers(1) == 1  # too little work: one thread, budget or not


def test_budget_rejects_fewer_than_one_worker() -> None:
    with pytest.raises(ValueError, match="at least 1, got 0"), threads.budget(0):
        pass


def test_background_workers_leave_pytorchs_threads_their_cores(two_threads: None) -> None:
    import os

    assert threads.background_workers() == max(1, (os.cpu_count() or 1) - 2)


def test_run_under_a_budget_calls_the_kernel_once_per_worker(two_threads: None) -> None:
    calls = []

    def kernel(tag: str, worker: int, workers: int) -> int:
        calls.append((tag, worker, workers))
        return worker

    with threads.budget(1):
        n = threads.num_workers(10 * threads.MIN_WORK_PER_THREAD)
        assert threads.run(kernel, "a", workers=n) == [0]
    assert calls == [("a", 0, 1)]


def _step(threads_: int, seed: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Lookup and one Adagrad update of 5 tables with ``threads_`` torch threads."""
    import embcore as ec
    from embcore.inputs import FeatureBatch
    from embcore.ops import cpu
    from embcore.ops.state import TableState

    torch.set_num_threads(threads_)
    gen = torch.Generator().manual_seed(seed)
    opt = ec.Adagrad(learning_rate=0.1, initial_accumulator_value=0.1)
    states, features, grads = [], [], []
    for t in range(5):
        vocab = 50 + 3000 * t  # small tables (many duplicates) and large ones
        weight = torch.randn(vocab, 8, generator=gen)
        slots = {"accumulators": torch.full((vocab, 8), 0.1)}
        states.append(TableState(f"t{t}", weight, slots, opt))
        values = torch.randint(0, vocab, (3000,), generator=gen)
        offsets = torch.arange(0, 3001, 1, dtype=torch.int64)
        features.append([FeatureBatch(values, offsets, None, "sum", (3000,))])
        grads.append([torch.randn(3000, 8, generator=gen)])
    acts = cpu.lookup(states, features)
    cpu.update(states, features, grads, [0.1] * 5, 1)
    return [a[0] for a in acts], [s.weight for s in states]


def test_more_workers_than_cores_give_bit_identical_results() -> None:
    """Workers claim chunks in whatever order the OS runs them; every chunk is computed once
    and the same way, so 1 and 4 threads (on any core count) agree to the bit."""
    before = torch.get_num_threads()
    try:
        one, four = _step(1, seed=3), _step(4, seed=3)
    finally:
        torch.set_num_threads(before)
    for a, b in zip(one[0] + one[1], four[0] + four[1], strict=True):
        assert torch.equal(a, b)
