"""The end of a step of the key-hash (dynamic) tables: eviction decided over every shard.

Each shard evicts its expired keys (``steps_to_live``) itself; ``max_rows`` limits the whole
table, so the ranks choose its least used keys together, exactly as one process does:

1. every rank tells the others how many keys it keeps after ``steps_to_live`` (one
   all-gather for all tables), so each knows the table's excess ``E`` over ``max_rows``;
2. each shard sends the others its ``E`` least used survivors (freq, last-seen step, key; one
   exchange for all tables);
3. each shard evicts its own among the ``E`` least used of all: the order restricted to one
   shard is that shard's order, so the table's ``E`` least used are among those sent.

See ``docs/sharding.md`` ("Dynamic tables").
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from embcore._comm import Comm
from embcore.sharding._wire import I64

if TYPE_CHECKING:
    from embcore.sharding.schemes.key_hash import KeyHash

__all__ = ["end_steps", "least_used_global"]


def least_used_global(candidates: list[np.ndarray], count: int) -> np.ndarray:
    """The ``count`` least used keys over all shards: ``(count,) int64`` keys.

    Args:
        candidates: each shard's ``(k, 3) int64`` ``(freq, last_seen, key)`` of its ``k``
            least used survivors, ``k >= min(count, survivors)`` (the table's ``count`` least
            used are among them: the order restricted to a shard is the shard's order).
        count: how many keys the table loses.

    The order of one process: lowest frequency, then least recent, then smallest key.
    """
    allc = np.concatenate(candidates) if candidates else np.zeros((0, 3), np.int64)
    order = np.lexsort((allc[:, 2], allc[:, 1], allc[:, 0]))
    return allc[order[:count], 2]


def end_steps(tables: list[KeyHash], comm: Comm) -> None:
    """The end of a step for every key-hash table (a collective, after the update).

    Each shard evicts by ``steps_to_live``; then a table over ``max_rows`` loses its least
    used keys over all shards, exactly as one process chooses them: the ranks share their
    survivor counts (one all-gather), each shard sends the others its ``excess`` least used
    survivors (one exchange), and each evicts its own among the ``excess`` least used of all.
    """
    limited = [s for s in tables if s.max_rows is not None]
    evict = {id(s): 0 for s in tables}
    if limited:
        counts = comm.all_gather_ints(
            [len(s.rows.survivors()[0]) if s.rows is not None else 0 for s in limited]
        )
        excess = [sum(c[i] for c in counts) - s.max_rows for i, s in enumerate(limited)]
        ex, mine = comm.exchange(), {}
        for s, e in zip(limited, excess, strict=True):
            if e > 0 and s.rows is not None:
                mine[id(s)] = s.rows.candidates(e)
                for dest in s.owner:
                    if dest != s.rank:
                        ex.send(dest, torch.from_numpy(mine[id(s)]))
        inbox = ex.run() if comm.world > 1 else ex.run_local()
        for s, e in zip(limited, excess, strict=True):
            if e > 0 and s.rows is not None:
                own = mine[id(s)]
                got = [own if src == s.rank else inbox.take(src, I64, 3).numpy() for src in s.owner]
                chosen = least_used_global(got, e)
                evict[id(s)] = int(np.isin(own[:, 2], chosen).sum())
        inbox.check_empty()
    for s in tables:
        if s.rows is not None:
            s.rows.end_step(evict[id(s)])
        s.step += 1
