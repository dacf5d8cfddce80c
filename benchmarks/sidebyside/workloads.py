"""The workloads of BENCHMARKS.md, and their batches, generated once before any timing.

A batch is, per table, CSR ids: ``values (N,) int64`` and ``offsets (B+1,) int64`` (one
feature per table). Every system converts the same batches to its own input format before
the clock starts. Workloads with ``raw_keys`` (W3) hold the same Zipf ranks as their fixed
twin, each mixed through a 64-bit hash (:func:`mixed_keys`): raw ids for dynamic tables, with
the same unique ids per step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

__all__ = [
    "CRITEO_CARDINALITIES",
    "WORKLOADS",
    "Batch",
    "Workload",
    "bytes_touched",
    "make_batches",
    "mixed_keys",
    "projection",
]

CRITEO_CARDINALITIES = (
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194, 27,
    14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572,
)  # fmt: skip


@dataclass(frozen=True)
class Workload:
    """One benchmark workload.

    Attributes:
        name: ``W1``, ``W2`` or a ``quick`` variant.
        vocab: rows of each table.
        dim: width of every table.
        batch: samples per step.
        min_ids, max_ids: each bag holds a uniform number of ids in ``[min_ids, max_ids]``.
        zipf: exponent of the per-table Zipf id distribution, ids ``(zipf - 1) % vocab``.
        description: one line for the report.
        raw_keys: the ids are mixed into raw 64-bit keys (dynamic tables only); ``vocab``
            then bounds the distinct keys of each table.
        steps_to_live, max_rows: the dynamic tables' eviction (``None``: none).
    """

    name: str
    vocab: tuple[int, ...]
    dim: int
    batch: int
    min_ids: int
    max_ids: int
    zipf: float = 1.05
    description: str = ""
    raw_keys: bool = False
    steps_to_live: int | None = None
    max_rows: int | None = None

    @property
    def tables(self) -> int:
        return len(self.vocab)

    def state_bytes(self, slot_floats_per_row: int) -> int:
        """Bytes of the tables plus ``slot_floats_per_row`` optimizer floats per row."""
        return sum(v * (self.dim + slot_floats_per_row) * 4 for v in self.vocab)


@dataclass(frozen=True)
class Batch:
    """One step's ids: ``values[t]``, ``offsets[t]`` for table ``t``."""

    values: list[np.ndarray]
    offsets: list[np.ndarray]
    unique: list[int] = field(default_factory=list)

    @property
    def ids(self) -> int:
        return sum(v.size for v in self.values)


def _capped(cap: int) -> tuple[int, ...]:
    return tuple(min(c, cap) for c in CRITEO_CARDINALITIES)


WORKLOADS: dict[str, Workload] = {
    "W1": Workload(
        "W1", _capped(1_000_000), 64, 4096, 1, 1,
        description="criteo-like one-hot: 26 tables (Criteo cardinalities capped at 1M), "
        "dim 64, batch 4096, 1 id per bag",
    ),
    "W2": Workload(
        "W2", (1_000_000,) * 8, 128, 2048, 1, 39,
        description="multi-hot: 8 x 1M tables, dim 128, batch 2048, 1-39 ids per bag",
    ),
    "W3": Workload(
        "W3", _capped(1_000_000), 64, 4096, 1, 1, raw_keys=True,
        description="W1 with raw 64-bit keys (each of W1's Zipf ids mixed through a 64-bit "
        "hash) in dynamic tables, empty at the start, admitted on first sight, never evicted",
    ),
    "W3-evict": Workload(
        "W3-evict", _capped(1_000_000), 64, 4096, 1, 1, raw_keys=True, steps_to_live=2,
        max_rows=1500,
        description="W3 with eviction on: steps_to_live=2, max_rows=1,500 per table",
    ),
    "W1-quick": Workload(
        "W1-quick", _capped(20_000), 64, 512, 1, 1, description="W1 shrunk for CI"
    ),
    "W2-quick": Workload(
        "W2-quick", (20_000,) * 8, 128, 128, 1, 39, description="W2 shrunk for CI"
    ),
    "W3-quick": Workload(
        "W3-quick", _capped(20_000), 64, 512, 1, 1, raw_keys=True,
        description="W3 shrunk for CI",
    ),
}  # fmt: skip

#: each raw-key workload's fixed-table twin: same shape, same Zipf ranks
FIXED_TWIN = {"W3": "W1", "W3-evict": "W1", "W3-quick": "W1-quick"}


def mixed_keys(ids: np.ndarray, table: int) -> np.ndarray:
    """``(N,) int64`` ids -> raw-looking ``(N,) int64`` keys (negatives included): SplitMix64's
    finalizer of ``id + table * 2**40``, a bijection, so distinct ids stay distinct."""
    z = ids.astype(np.uint64) + np.uint64(table << 40) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return (z ^ (z >> np.uint64(31))).view(np.int64)


def make_batches(workload: Workload, count: int, seed: int = 0) -> list[Batch]:
    """``count`` batches from a seeded NumPy generator (Zipf ids per table). A raw-key
    workload draws exactly what its fixed twin of the same shape draws, then mixes each id
    (:func:`mixed_keys`)."""
    rng = np.random.default_rng(seed)
    batches = []
    for _ in range(count):
        values, offsets, unique = [], [], []
        for t, vocab in enumerate(workload.vocab):
            lengths = rng.integers(workload.min_ids, workload.max_ids + 1, workload.batch)
            offs = np.zeros(workload.batch + 1, dtype=np.int64)
            np.cumsum(lengths, out=offs[1:])
            ids = (rng.zipf(workload.zipf, int(offs[-1])) - 1) % vocab
            ids = ids.astype(np.int64)
            values.append(mixed_keys(ids, t) if workload.raw_keys else ids)
            offsets.append(offs)
            unique.append(int(np.unique(ids).size))
        batches.append(Batch(values, offsets, unique))
    return batches


def bytes_touched(workload: Workload, batch: Batch, slot_floats_per_row: int) -> int:
    """Forward reads of every looked-up row, plus read and write of each unique row and its
    optimizer slots in the update."""
    row = workload.dim * 4
    forward = batch.ids * row
    update = sum(batch.unique) * (row + slot_floats_per_row * 4) * 2
    return forward + update


def projection(dim: int, seed: int = 0) -> torch.Tensor:
    """The loss's fixed random ``(dim,)`` projection: ``loss = sum((act @ p) ** 2)``. Cheaper
    than ``sum(act ** 2)`` (no activation-sized temporary in the forward) while the
    activation gradient ``2 (act @ p) p^T`` still differs per sample."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(dim, generator=gen) / dim**0.5
