"""W4's dynamic set: W3's raw 64-bit keys in dynamic tables on disk (``embcore bench --disk``).

The fixed set's 26 tables, ids and cache budget, with each id mixed into a raw 64-bit key
(W3's :func:`~sidebyside.workloads.mixed_keys`, a bijection, so hit rates and Belady's cache
are those of the same stream), the tables dynamic (W3's admission: on first sight; never
evicted) in ``DiskStorage``, each with the cache that the fixed set's engine-wide budget gives
the table of the same size. Before timing, every key of each table is admitted once and its
row written (the files at full size, as the fixed set's). The key index stays in RAM besides
the cache: the training process's cgroup limit is the fixed set's plus
:data:`INDEX_BYTES_PER_KEY` per key, and the run reports the bytes the indexes took.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from sidebyside.workloads import Workload, mixed_keys

__all__ = ["INDEX_BYTES_PER_KEY", "engine", "prefill", "raw", "shares"]

#: RAM allowed per key for a dynamic table's key index and row metadata, beside the cache
INDEX_BYTES_PER_KEY = 64


def raw(w: Workload) -> Workload:
    """The workload with its ids mixed into raw 64-bit keys (W3's)."""
    return dataclasses.replace(w, raw_keys=True)


def shares(sizes: list[int], budget: int) -> list[int]:
    """``budget`` split as the engine-wide ``DiskStorage`` splits it between tables of
    ``sizes`` bytes (``embcore.config.split_cache``): evenly, a smaller table taking its size."""
    out = [0] * len(sizes)
    order = sorted(range(len(sizes)), key=lambda i: sizes[i])
    for n, i in enumerate(order):
        out[i] = min(sizes[i], budget // (len(sizes) - n))
        budget -= out[i]
    return out


def engine(w: Workload, cfg: dict[str, Any]) -> Any:
    """The dynamic set's engine: table ``t{i}`` dynamic, in ``DiskStorage`` under
    ``cfg["dir"]`` with its share of ``cfg["cache_bytes"]``."""
    import embcore as ec
    from embcore.storage import cached_row_bytes

    row = cached_row_bytes(w.dim, 1)  # RowwiseAdagrad: one accumulator a row
    caches = shares([v * row for v in w.vocab], cfg["cache_bytes"])
    features = {}
    for i, cache in enumerate(caches):
        storage = ec.DiskStorage(cfg["dir"], max(1, cache), io_threads=cfg["depth"])
        table = ec.TableConfig(None, w.dim, name=f"t{i}", storage=storage)
        features[f"f{i}"] = ec.FeatureConfig(table)
    return ec.EmbeddingEngine(features, ec.RowwiseAdagrad(learning_rate=0.01))


def prefill(emb: Any, w: Workload, chunk: int = 65536) -> None:
    """Admit every key of each table once and write its row (NumPy's fast generator for the
    values, as the fixed set's prefill), through the key space and the disk tier directly."""
    import torch

    rng = np.random.default_rng(0)
    for rows in emb.store.rows:
        t = int(rows.table.name[1:])
        for start in range(0, w.vocab[t], chunk):
            keys = mixed_keys(np.arange(start, min(w.vocab[t], start + chunk)), t)
            rows.space.reserve(keys.size)
            new = rows.space.train(keys).new_rows + 1  # fresh rows: consecutive, by key
            rows.disk.grow(rows.space.num_rows + 1)
            values = {
                "weight": torch.from_numpy(rng.standard_normal((new.size, w.dim), np.float32))
            }
            values["weight"] *= 0.1
            values["accumulators"] = torch.full((new.size,), 0.1)
            assert np.array_equal(new, np.arange(new[0], new[0] + new.size))
            rows.disk.write_rows(int(new[0]), values)
