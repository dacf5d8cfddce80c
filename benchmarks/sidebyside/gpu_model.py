"""A bandwidth MODEL of embcore's GPU step (not a measurement): bytes per kernel / HBM bandwidth.

For the GPU benchmark's workloads (``W1-gpu``, ``W2-gpu``: batch 65,536, Adagrad, one feature
per table) and one seeded batch of :func:`sidebyside.workloads.make_batches`, the bytes each
kernel of a training step must move to or from device memory, per step, summed over tables
(``N`` ids, ``U`` unique ids, ``B`` bags, ``D`` dim, ``r`` bytes of a stored row)::

    lookup   forward.pooled      N * (r + 8) + B * 8 + B * D * 4      rows, ids, offsets, acts
    check    finite.non_finite   B * D * 4                            the activation gradients
    update   backward.bag_gains  B * 8 + N * 12                       offsets; gain + bag per id
             sort (torch.sort)   N * 8 * (2 * 16) + N * 16            8 radix passes of 8 bits
                                                                      over int64 key + index,
                                                                      + index init, histogram
             searchsorted        N * 16                               run ends
             partials + rule     N * (D * 4 + 8 + 8 + 4 + 24)         each id's gradient row,
                                 + U * 2 * (r + D * 4)                order, bag, gain; locate;
                                 + 2 * (N / 64) * D * 4               row + slot read and write;
                                                                      split-run partial sums

The predicted floor is those bytes divided by the HBM bandwidth (H100 SXM 3.35 TB/s, H200
4.8 TB/s): what the step would take if every kernel streamed at peak bandwidth with nothing
else in the way. Real kernels reach a fraction of it. Not counted: launch overheads, the
dense part of the step, and L2 hits (a Zipf head row read many times per step may come from
the 50 MB L2, so the lookup can beat its line). ``embcore bench --device cuda`` measures the
real figures; the :mod:`.gpu` module reports its kernels' bytes with :func:`kernel_bytes`.
"""

from __future__ import annotations

from sidebyside.workloads import Batch, Workload, make_batches

__all__ = ["BANDWIDTH", "kernel_bytes", "markdown", "model"]

#: HBM bandwidth, bytes per second (vendor peak figures)
BANDWIDTH = {"H100": 3.35e12, "H200": 4.8e12}


def kernel_bytes(
    ids: float, unique: float, bags: int, dim: int, row: int, slot_row: int | None = None
) -> dict[str, float]:
    """Bytes each kernel of a step moves (module docstring), for totals over the tables.

    Args:
        ids, unique, bags: ids, unique ids and bags of the step, all tables together.
        dim: the tables' width.
        row: bytes of one stored row (``dim * 4`` float32, ``dim * 2`` half).
        slot_row: bytes of one row's optimizer slots (default ``dim * 4``: Adagrad's
            accumulator; ``4`` for RowwiseAdagrad's one float per row).
    """
    slot_row = dim * 4 if slot_row is None else slot_row
    return {
        "lookup: forward.pooled": ids * (row + 8) + bags * 8 + bags * dim * 4,
        "check: finite.non_finite": bags * dim * 4,
        "update: backward.bag_gains": bags * 8 + ids * 12,
        "update: sort (torch.sort)": ids * 8 * 32 + ids * 16,
        "update: searchsorted": ids * 16,
        "update: partials + rules.adagrad": (
            ids * (dim * 4 + 44) + unique * 2 * (row + slot_row) + 2 * (ids / 64) * dim * 4
        ),
    }


def _batch_figures(workload: Workload, batch: Batch) -> tuple[int, int, int]:
    return batch.ids, sum(batch.unique), workload.batch * workload.tables


def model(workloads: dict[str, Workload], dtypes: tuple[str, ...] = ("float32", "bfloat16")):
    """``{workload: {"ids", "unique", "bags", dtype: {kernel: bytes}}}`` for one seeded batch."""
    out = {}
    for name, w in workloads.items():
        ids, unique, bags = _batch_figures(w, make_batches(w, 1)[0])
        entry = {"ids": ids, "unique": unique, "bags": bags, "dim": w.dim}
        for dtype in dtypes:
            row = w.dim * (4 if dtype == "float32" else 2)
            entry[dtype] = kernel_bytes(ids, unique, bags, w.dim, row)
        out[name] = entry
    return out


def markdown(figures: dict) -> str:
    """The model's table: per workload, storage dtype and kernel, MB and predicted floors."""
    gpus = list(BANDWIDTH)
    lines = [
        "| workload | tables | kernel | MB per step | "
        + " | ".join(f"{g} floor ms (model)" for g in gpus)
        + " |",
        "|---|---|---|---:|" + "---:|" * len(gpus),
    ]
    for name, entry in figures.items():
        for dtype, kernels in entry.items():
            if not isinstance(kernels, dict):
                continue
            rows = [*kernels.items(), ("**step total**", sum(kernels.values()))]
            for kernel, size in rows:
                floors = " | ".join(f"{size / BANDWIDTH[g] * 1e3:.3f}" for g in gpus)
                lines.append(f"| {name} | {dtype} | {kernel} | {size / 1e6:,.1f} | {floors} |")
    facts = "; ".join(
        f"{name}: {e['ids']:,} ids, {e['unique']:,} unique, {e['bags']:,} bags, dim {e['dim']}"
        for name, e in figures.items()
    )
    return "\n".join(lines) + f"\n\nOne seeded batch per workload: {facts}.\n"
