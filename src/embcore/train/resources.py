"""Refusing a main-job config whose sizes cannot be allocated on this machine (docs/main_job.md).

A config can pass every type check and still ask for more memory than the machine has (a
``vocab_cap`` or ``batch_size`` typed with a few zeros too many, or a crafted bundle's
``config.json``); :func:`check_resources` says so before anything is allocated.
"""

from __future__ import annotations

import os

from embcore.errors import UserError
from embcore.train.config import Config

__all__ = ["check_resources"]


def _physical_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
        return None


def check_resources(config: Config, memory: int | None = None) -> None:
    """Refuse sizes that pass the type checks but cannot be allocated on this machine.

    Estimates (from below) the bytes of the tables with their optimizer slots, of one training
    step's activations and of the held-out rows, and raises naming the keys responsible when
    one alone exceeds ``memory`` (default: this machine's physical memory).
    """
    from embcore.data.batch import NUM_DENSE, NUM_SPARSE, capped_vocab_sizes

    memory = _physical_memory() if memory is None else memory
    if not memory:
        return
    m, d = config.model, config.data
    slots = {"adagrad": 1.0, "rowwise_adagrad": 1.0 / m.embedding_dim, "sgd": 0.0}
    rows = sum(capped_vocab_sizes(d.vocab_cap))  # a dynamic table holds at most its ids
    if m.tables == "dynamic" and m.max_rows:
        rows = sum(min(v, m.max_rows) for v in capped_vocab_sizes(d.vocab_cap))
    opt, in_memory = config.optim.embedding_optimizer, m.storage == "memory"
    width = (NUM_SPARSE + 1) * m.embedding_dim
    dense_params = width * width * (m.dcn_rank == 0) * m.dcn_layers + width * (
        sum(m.bottom_mlp) + sum(m.top_mlp)
    )
    needs = {
        "the tables ([model] embedding_dim, [data] vocab_cap)": 4.0
        * rows
        * m.embedding_dim
        * (1 + slots[config.optim.embedding_optimizer]),
        "the dense layers ([model] embedding_dim, bottom_mlp, top_mlp, dcn_rank)": 16.0
        * dense_params,
        "one step's activations ([data] batch_size)": 4.0
        * d.batch_size
        * (3 * width + NUM_DENSE + 2 * NUM_SPARSE + sum(m.bottom_mlp) + sum(m.top_mlp)),
        # each key's own 8 bytes in the index, and its row and slots when they are in memory
        "one dynamic table's reserved keys ([model] initial_capacity, embedding_dim)": (
            m.initial_capacity * (8.0 + 4.0 * m.embedding_dim * (1 + slots[opt]) * in_memory)
        ),
        "the held-out rows ([data] eval_rows)": 4.0
        * d.eval_rows
        * (NUM_DENSE + 2 * NUM_SPARSE + 1),
    }
    for what, need in needs.items():
        if need > memory:
            raise UserError(
                f"config: {what} need at least {need / 2**30:,.1f} GiB, more than this "
                f"machine's {memory / 2**30:,.1f} GiB of memory; make them smaller"
            )
