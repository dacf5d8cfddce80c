"""This machine's memory limits, measured in the same run as the systems.

* random-row gather: ``torch.index_select`` of ``rows`` random rows of a ``(table_rows, 64)``
  float32 table (256-byte rows), counted as bytes read plus written;
* sequential copy: ``dst.copy_(src)`` of a large buffer, read plus written.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import torch

__all__ = ["copy_bandwidth", "gather_bandwidth"]


def _median_seconds(fn, repeats: int, warmup: int = 2, clock=time.perf_counter) -> float:  # type: ignore[no-untyped-def]
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = clock()
        fn()
        times.append(clock() - start)
    return float(np.median(times))


def gather_bandwidth(
    table_rows: int,
    rows: int,
    repeats: int = 10,
    seed: int = 0,
    huge_pages: bool = False,
    clock: Callable[[], float] = time.perf_counter,
) -> dict:
    """GB/s of random 256-byte row gathers (read + write); ``huge_pages``: with the table on
    2 MiB pages, as embcore's CPU backend keeps its tables; ``clock``: e.g.
    ``time.process_time`` on a shared machine (then with one torch thread)."""
    table = torch.empty(table_rows, 64).uniform_(-1, 1)
    if huge_pages:
        from embcore.ops.cpu.hugepages import prefer_huge_pages

        prefer_huge_pages(table)
    gen = torch.Generator().manual_seed(seed)
    index = [torch.randint(0, table_rows, (rows,), generator=gen) for _ in range(repeats + 2)]
    out = torch.empty(rows, 64)
    it = iter(index * 2)
    seconds = _median_seconds(
        lambda: torch.index_select(table, 0, next(it), out=out), repeats, clock=clock
    )
    moved = 2 * rows * 64 * 4
    return {
        "table_rows": table_rows,
        "rows": rows,
        "seconds": seconds,
        "gb_s": moved / seconds / 1e9,
    }


def copy_bandwidth(megabytes: int, repeats: int = 10) -> dict:
    """GB/s of a large sequential copy (read + write)."""
    n = megabytes * (1 << 20) // 4
    src, dst = torch.ones(n), torch.empty(n)
    seconds = _median_seconds(lambda: dst.copy_(src), repeats)
    return {"megabytes": megabytes, "seconds": seconds, "gb_s": 2 * n * 4 / seconds / 1e9}
