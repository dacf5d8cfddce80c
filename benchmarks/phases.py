"""Where a W1 training step spends its time, phase by phase, for ``stacked()`` and the
per-feature dict output (``acts = emb(batch)``), on one engine, interleaved.

Phases are timed by wrapping the engine's and the CPU backend's entry points (the kernels
themselves are untouched): input preparation (``EmbeddingEngine._prepare``), the forward
gather kernel, the backward's dedup + gradient-sum kernel, the optimizer kernel, the
finiteness check, the Python around the kernels in ``lookup``/``update`` (descriptors,
workspace, thread hand-off) and everything else (the loss, autograd, the engine's gradient
checks). Next to each phase, the bytes it must move for the step's batch. Prints a markdown
table (docs/cpu_backend.md quotes one)::

    python benchmarks/phases.py                  # W1, 3 warm-up + 12 timed steps per path
    python benchmarks/phases.py --workload W1-quick --steps 4
    python benchmarks/phases.py --mainjob        # the main job's step (embcore train defaults)
    python benchmarks/phases.py --optimizer rowwise_adagrad --peer   # FBGEMM TBE in turn
    python benchmarks/phases.py --threads 1 --cpu-time    # phases in process CPU time
    python benchmarks/phases.py --peer --prepared         # embcore's inputs prepared ahead

Under the table, the random-row gather limit measured in the same run (``torch.index_select``
of as many random 256-byte rows as the step has ids, from a 5.5M-row table on 2 MiB pages, as
``embcore bench`` measures it) and each kernel's GB/s as a share of it.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sidebyside import limits
from sidebyside.mainjob import embcore_step
from sidebyside.systems.embcore_engine import Run
from sidebyside.workloads import WORKLOADS, make_batches

import embcore.ops.cpu as cpu
from embcore._numba import threads
from embcore.engine import EmbeddingEngine
from embcore.ops.cpu.malloc import keep_freed_memory

#: kernel name -> phase
KERNELS = {
    "pooled_lookup": "forward gather (kernel)",
    "unique_gradients": "backward: dedup + gradient sums (kernel)",
    "unique_occurrences": "backward: dedup + gradient sums (kernel)",  # occurrence lists
    "non_finite_flags": "finiteness check (kernel)",
    "out_of_range": "update: id range check (kernel)",
    "fused": "dedup + rule, table by table (fused kernel)",
}
PHASES = [
    "input preparation",
    "forward gather (kernel)",
    "lookup: Python around the kernel",
    "finiteness check (kernel)",
    "finiteness check: Python",
    "backward: dedup + gradient sums (kernel)",
    "update: optimizer rule (kernel)",
    "update: id range check (kernel)",
    "dedup + rule, table by table (fused kernel)",
    "update: Python around the kernels",
    "loss, autograd, engine glue",
    "whole step",
]

_spent: dict[str, float] = defaultdict(float)
#: what phases and steps are timed with (``--cpu-time``: process CPU time)
_clock: list[Callable[[], float]] = [time.perf_counter]


def _timed(name: str | Callable[..., str], fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = _clock[0]()
        try:
            return fn(*args, **kwargs)
        finally:
            key = name(*args) if callable(name) else name
            _spent[key] += _clock[0]() - start

    return wrapper


def _instrument() -> None:
    """Wrap the entry points whose time makes up the phases (once per process)."""
    run = threads.run
    threads.run = _timed(  # type: ignore[assignment]
        lambda kernel, *a: KERNELS.get(kernel.__name__, "update: optimizer rule (kernel)"), run
    )
    for name in ("lookup", "update", "non_finite"):
        setattr(cpu, name, _timed(f"total {name}", getattr(cpu, name)))
    EmbeddingEngine._prepare = _timed("input preparation", EmbeddingEngine._prepare)  # type: ignore[method-assign]


def _phases(spent: dict[str, float], step: float) -> dict[str, float]:
    kernels = {p: spent.get(p, 0.0) for p in PHASES[:-1]}
    kernels["lookup: Python around the kernel"] = (
        spent["total lookup"] - kernels["forward gather (kernel)"]
    )
    kernels["finiteness check: Python"] = (
        spent["total non_finite"] - kernels["finiteness check (kernel)"]
    )
    kernels["update: Python around the kernels"] = (
        spent["total update"]
        - kernels["backward: dedup + gradient sums (kernel)"]
        - kernels["update: optimizer rule (kernel)"]
        - kernels["update: id range check (kernel)"]
        - kernels["dedup + rule, table by table (fused kernel)"]
    )
    accounted = sum(v for k, v in kernels.items() if k != "loss, autograd, engine glue")
    kernels["loss, autograd, engine glue"] = step - accounted
    kernels["whole step"] = step
    return kernels


def bytes_moved(workload: Any, batches: list[Any], optimizer: str) -> dict[str, float]:
    """Bytes each phase must move for an average batch (float32 rows of ``dim``; Adagrad: one
    slot float per element, RowwiseAdagrad: one per row)."""
    row = 4 * workload.dim
    slot = row if optimizer == "adagrad" else 4
    ids = np.mean([b.ids for b in batches])
    unique = np.mean([sum(b.unique) for b in batches])
    act = workload.batch * workload.tables * row  # one activation row per sample per feature
    return {
        "input preparation": ids * 8,
        "forward gather (kernel)": ids * row + act,  # rows read, activations written
        "finiteness check (kernel)": act,
        # gradients read, the index entry of each id (a cache line), the summed block written
        "backward: dedup + gradient sums (kernel)": act + ids * 64 + unique * row,
        # summed block read; each unique row's weights and slot read and written
        "update: optimizer rule (kernel)": unique * row + 2 * unique * (row + slot),
        "update: id range check (kernel)": ids * 8,
        # the two above, less the summed block's round trip through memory (kept in cache)
        "dedup + rule, table by table (fused kernel)": act + ids * 64 + 2 * unique * (row + slot),
    }


def _fbgemm(workload: Any, optimizer: str, batches: list[Any]) -> Any:
    from sidebyside.systems import fbgemm_tbe

    missing = fbgemm_tbe.unavailable()
    if missing:
        raise SystemExit(f"--peer: {missing}")
    return fbgemm_tbe.build(workload, optimizer, batches)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--workload",
        default="W1",
        choices=sorted(w for w in WORKLOADS if not w.startswith("W3")),
        help="a fixed-table workload (W3's raw keys need dynamic tables: `embcore bench`)",
    )
    p.add_argument(
        "--warmup",
        type=int,
        default=8,
        help="untimed steps per path (until the allocator has the step's blocks: no page faults)",
    )
    p.add_argument("--steps", type=int, default=12, help="timed steps per path")
    p.add_argument("--threads", type=int)
    p.add_argument("--mainjob", action="store_true", help="the main job's step instead of W1")
    p.add_argument("--optimizer", default="adagrad", choices=["adagrad", "rowwise_adagrad"])
    p.add_argument(
        "--peer",
        action="store_true",
        help="also step FBGEMM TBE (same optimizer, batches) in turn: whole-step times only",
    )
    p.add_argument(
        "--cpu-time",
        action="store_true",
        help="time phases and steps in process CPU time (a shared machine; use --threads 1)",
    )
    p.add_argument(
        "--prepared",
        action="store_true",
        help="embcore's batches prepared before the clock (engine.prepare), as FBGEMM's are",
    )
    p.add_argument(
        "--no-limit", action="store_true", help="skip the random-row gather limit (1.4 GB table)"
    )
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.cpu_time:
        _clock[0] = time.process_time
    keep_freed_memory()
    _instrument()  # before any engine is built: an engine reads the backend's entry points once
    if args.mainjob:
        return _mainjob(args)
    workload = WORKLOADS[args.workload]
    batches = make_batches(workload, 4)
    run = Run(workload, args.optimizer, batches, prepared=args.prepared)
    peer = _fbgemm(workload, args.optimizer, batches) if args.peer else None
    paths = {"stacked": True, "dict": False}
    per_path: dict[str, list[dict[str, float]]] = {name: [] for name in paths}
    peer_times: list[tuple[float, float]] = []
    for i in range(args.warmup + args.steps):
        if peer is not None:
            start, cpu = time.perf_counter(), time.process_time()
            peer.step(i % len(batches))
            if i >= args.warmup:
                peer_times.append((time.perf_counter() - start, time.process_time() - cpu))
        for name, stacked in paths.items():  # interleaved: stacked, dict, stacked, dict, ...
            run.stacked = stacked
            _spent.clear()
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            start, cpu = _clock[0](), time.process_time()
            run.step(i % len(batches))
            step, cpu = _clock[0]() - start, time.process_time() - cpu
            if i >= args.warmup:
                per_path[name].append(_phases(_spent, step))
                per_path[name][-1]["whole step, CPU time"] = cpu
                per_path[name][-1]["page faults"] = (
                    resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
                )
    moved = bytes_moved(workload, batches, args.optimizer)
    clock = "process CPU time" if args.cpu_time else "wall time"
    print(
        f"{workload.name}, {args.optimizer}, {torch.get_num_threads()} threads: median ms per step "
        f"({clock}) over {args.steps} steps per path (interleaved), bytes each phase must move"
    )
    print()
    print("| phase | stacked() ms | dict ms | MB moved | GB/s (stacked) |")
    print("|---|---:|---:|---:|---:|")
    for phase in PHASES:
        ms = {n: 1e3 * float(np.median([r[phase] for r in rows])) for n, rows in per_path.items()}
        if phase == "whole step":
            faults = {
                n: np.median([r["page faults"] for r in rows]) for n, rows in per_path.items()
            }
            print(f"| page faults per step | {faults['stacked']:.0f} | {faults['dict']:.0f} | | |")
        mb = moved.get(phase)
        rate = "" if mb is None or ms["stacked"] <= 0 else f"{mb / ms['stacked'] / 1e6:.1f}"
        mb_text = "" if mb is None else f"{mb / 1e6:.1f}"
        print(f"| {phase} | {ms['stacked']:.2f} | {ms['dict']:.2f} | {mb_text} | {rate} |")
    cpu = {n: [r["whole step, CPU time"] for r in rows] for n, rows in per_path.items()}
    ms = {n: 1e3 * float(np.median(c)) for n, c in cpu.items()}
    print(f"| whole step, process CPU time | {ms['stacked']:.2f} | {ms['dict']:.2f} | | |")
    ratio = np.median([d / s for d, s in zip(cpu["dict"], cpu["stacked"], strict=True)])
    if peer_times:
        wall, peer_cpu = (1e3 * float(np.median(x)) for x in zip(*peer_times, strict=True))
        over = np.median([p[1] / s for p, s in zip(peer_times, cpu["stacked"], strict=True)])
        print(f"| FBGEMM TBE whole step (wall / CPU time) | {wall:.2f} / {peer_cpu:.2f} | | | |")
        print()
        print(f"FBGEMM / embcore stacked(), median of per-step CPU-time ratios: {over:.3f}")
    if not args.no_limit:
        _limit(int(np.mean([b.ids for b in batches])), per_path["stacked"], moved)
    print()
    print(
        f"dict / stacked, median of per-step CPU-time ratios: {ratio:.3f}; 1-minute load "
        f"average {os.getloadavg()[0]:.1f} at the end (CPU time does not count the time a "
        "descheduled thread waits, so it holds better than wall time on a shared machine)"
    )
    return 0


def _limit(ids: int, rows: list[dict[str, float]], moved: dict[str, float]) -> None:
    """The random-row gather limit now, in this process, and each kernel's share of it."""
    limit = limits.gather_bandwidth(5_500_000, ids, huge_pages=True, clock=_clock[0])["gb_s"]
    print()
    shares = []
    for phase in (*KERNELS.values(), "update: optimizer rule (kernel)"):
        ms = 1e3 * float(np.median([r[phase] for r in rows]))
        if ms > 0 and phase in moved:
            rate = moved[phase] / ms / 1e6
            shares.append(f"{phase} {rate:.1f} GB/s ({rate / limit:.0%})")
    print(
        f"random-row gather {limit:.2f} GB/s (index_select of {ids} random 256-byte rows, "
        f"2 MiB pages, same clock); stacked(): {'; '.join(shares)}"
    )


def _mainjob(args: argparse.Namespace) -> int:
    step, cfg = embcore_step([f"train.threads={args.threads or 1}"], args.warmup + args.steps)
    rows = []
    for i in range(args.warmup + args.steps):
        _spent.clear()
        seconds = step(i)
        if i >= args.warmup:
            rows.append(_phases(_spent, seconds))
    print(
        f"main job (batch {cfg.data.batch_size}, dim {cfg.model.embedding_dim}, "
        f"{torch.get_num_threads()} thread(s)): median ms per step over {args.steps} steps"
    )
    print()
    print("| phase | ms |")
    print("|---|---:|")
    for phase in PHASES:
        name = "dense model, loss, autograd, engine glue" if phase.startswith("loss") else phase
        print(f"| {name} | {1e3 * float(np.median([r[phase] for r in rows])):.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
