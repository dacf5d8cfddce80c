"""The CPU backend's thread budget: a thread can cap the workers of its kernel calls (a
pipelined update in the background), without touching other threads or the results."""

from __future__ import annotations

import threading

import pytest
import torch

from embcore.ops.cpu import threads


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
