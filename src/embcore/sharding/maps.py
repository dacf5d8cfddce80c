"""The ``div`` and ``mod`` row -> shard maps (``docs/semantics.md`` §4.1), as pure functions.

With ``N`` rows over ``P`` shards, ``q = N // P`` and ``x = N % P``, both strategies give the first
``x`` shards ``q + 1`` rows and the rest ``q`` (``q = 0``: shards ``N..P-1`` are empty)::

    13 ids over 5 shards
    div   [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10], [11, 12]]   contiguous: shard p starts at
                                                                    p*q + min(p, x)
    mod   [[0, 5, 10], [1, 6, 11], [2, 7, 12], [3, 8], [4, 9]]   shard(i) = i % P, local = i // P
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

__all__ = [
    "STRATEGIES",
    "div_starts",
    "global_ids",
    "local_of",
    "shard_of",
    "shard_sizes",
]

Strategy = Literal["div", "mod"]
STRATEGIES: tuple[str, ...] = ("div", "mod")


def _check(num_rows: int, num_shards: int, strategy: str) -> None:
    if num_shards < 1:
        raise ValueError(f"row map: num_shards must be >= 1, got {num_shards}")
    if num_rows < 0:
        raise ValueError(f"row map: num_rows must be >= 0, got {num_rows}")
    if strategy not in STRATEGIES:
        raise ValueError(
            f"row map: partition_strategy must be one of {list(STRATEGIES)}, got {strategy!r}"
        )


def shard_sizes(num_rows: int, num_shards: int) -> list[int]:
    """Rows of each shard, the same for ``div`` and ``mod``: ``ceil((N - p) / P)`` for shard p."""
    _check(num_rows, num_shards, "div")
    q, x = divmod(num_rows, num_shards)
    return [q + 1 if p < x else q for p in range(num_shards)]


def div_starts(num_rows: int, num_shards: int) -> list[int]:
    """``P + 1`` boundaries: ``div`` shard p holds rows ``[starts[p], starts[p+1])``."""
    q, x = divmod(num_rows, num_shards)
    return [p * q + min(p, x) for p in range(num_shards + 1)]


def shard_of(ids: Tensor, num_rows: int, num_shards: int, strategy: str) -> Tensor:
    """``(N,) int64``: the shard of each global id."""
    _check(num_rows, num_shards, strategy)
    if strategy == "mod":
        return torch.remainder(ids, num_shards)
    q, x = divmod(num_rows, num_shards)
    big = x * (q + 1)  # ids below this live in the x shards of q+1 rows
    # q = 0 means N < P: every id is below `big`, so the guarded second branch is never taken.
    return torch.where(ids < big, ids // (q + 1), x + (ids - big) // max(q, 1))


def local_of(ids: Tensor, num_rows: int, num_shards: int, strategy: str) -> Tensor:
    """``(N,) int64``: the row of each global id inside its shard."""
    _check(num_rows, num_shards, strategy)
    if strategy == "mod":
        return torch.div(ids, num_shards, rounding_mode="floor")
    starts = torch.tensor(div_starts(num_rows, num_shards), dtype=ids.dtype, device=ids.device)
    return ids - starts[shard_of(ids, num_rows, num_shards, "div")]


def global_ids(
    shard: int, num_rows: int, num_shards: int, strategy: str, device: torch.device | None = None
) -> Tensor:
    """``(rows,) int64``: the global ids shard ``shard`` holds, in local-row order."""
    _check(num_rows, num_shards, strategy)
    if not 0 <= shard < num_shards:
        raise ValueError(f"row map: shard must be in [0, {num_shards}), got {shard}")
    if strategy == "mod":
        stop = max(shard, num_rows)  # an empty shard when the vocabulary is smaller
        return torch.arange(shard, stop, num_shards, dtype=torch.int64, device=device)
    starts = div_starts(num_rows, num_shards)
    return torch.arange(starts[shard], starts[shard + 1], dtype=torch.int64, device=device)
