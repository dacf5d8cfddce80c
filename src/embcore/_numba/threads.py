"""Run a Numba kernel on several threads: the calling thread plus a small persistent pool.

Kernels are plain ``nogil`` functions taking ``(..., worker, workers)`` as their last two
arguments; the workers of a call claim chunks of work from a shared counter
(:func:`.address.claim`) until none is left, so a thread the OS holds back does not keep the
others waiting for its fixed share. This keeps
compile time low (no parfor machinery, whose compilation costs seconds per kernel) and lets
the pool's threads sleep between steps instead of spinning next to PyTorch's OpenMP threads.
The thread count follows ``torch.get_num_threads()``, capped by the calling thread's
:func:`budget`: work that runs in the background while PyTorch computes on its own threads
can take a smaller one. The engine's pipelined update does not: measured on 2 cores, a
budget was never faster than the same worker count (docs/pipelining_and_stats.md).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import torch

__all__ = ["background_workers", "budget", "num_workers", "run"]

#: below this many rows (or ids) a kernel runs on the calling thread alone
MIN_WORK_PER_THREAD = 2048

_local = threading.local()  # .budget: this thread's cap on workers (None: no cap)
_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_pool_size = 0


def num_workers(work: int | None = None) -> int:
    """How many threads a kernel call uses: PyTorch's intra-op thread count capped by this
    thread's :func:`budget`, or 1 when ``work`` (rows or ids) is too small to repay a
    hand-off to another thread."""
    if work is not None and work < MIN_WORK_PER_THREAD:
        return 1
    cap = getattr(_local, "budget", None)
    n = torch.get_num_threads()
    return max(1, n if cap is None else min(n, cap))


def background_workers() -> int:
    """The budget for work that overlaps PyTorch's own (a pipelined update): the cores
    PyTorch's intra-op threads leave free, at least one."""
    return max(1, (os.cpu_count() or 1) - torch.get_num_threads())


@contextmanager
def budget(workers: int) -> Iterator[None]:
    """Kernel calls made by this thread inside the block use at most ``workers`` threads
    (the calling thread included); other threads are unaffected."""
    if workers < 1:
        raise ValueError(f"threads.budget: workers must be at least 1, got {workers}")
    previous = getattr(_local, "budget", None)
    _local.budget = workers if previous is None else min(previous, workers)
    try:
        yield
    finally:
        _local.budget = previous


def _executor(extra: int) -> ThreadPoolExecutor:
    global _pool, _pool_size
    with _lock:
        if _pool is None or _pool_size < extra:
            if _pool is not None:
                _pool.shutdown(wait=False)
            _pool = ThreadPoolExecutor(extra, thread_name_prefix="embcore-cpu")
            _pool_size = extra
        return _pool


def run(kernel: Callable[..., Any], *args: Any, workers: int) -> list[Any]:
    """``[kernel(*args, w, workers) for w in range(workers)]``, run concurrently."""
    n = workers
    if n == 1:
        return [kernel(*args, 0, 1)]
    pool = _executor(n - 1)
    futures = [pool.submit(kernel, *args, w, n) for w in range(1, n)]
    try:
        first = kernel(*args, 0, n)
    finally:
        rest = [f.result() for f in futures]  # wait even on error: they use our buffers
    return [first, *rest]
