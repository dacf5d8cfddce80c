"""Run every system on every workload in this process, one after another, on the same batches.

Each system is built (tables, optimizer, its own input format: untimed), warmed up, timed step
by step, then freed before the next one, so only one system's tables are resident at a time.
The machine's limits (random-row gather and sequential copy bandwidth) are measured in the
same run, before the workloads.
"""

from __future__ import annotations

import gc
import importlib.metadata
import os
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from embcore.ops.cpu.malloc import keep_freed_memory
from sidebyside import limits, memory
from sidebyside.systems import SYSTEMS, supports
from sidebyside.workloads import WORKLOADS, bytes_touched, make_batches

__all__ = ["Options", "run"]

SLOT_FLOATS = {"adagrad": None, "rowwise_adagrad": 1}  # None: one slot float per element


@dataclass
class Options:
    """What to run; the defaults are the figures of BENCHMARKS.md."""

    workloads: list[str] = field(default_factory=lambda: ["W1", "W2", "W3", "W3-evict"])
    optimizers: list[str] = field(default_factory=lambda: ["adagrad", "rowwise_adagrad"])
    systems: list[str] | None = None  # module names; None: all
    repeats: int = 1
    warmup: int = 2
    steps: int = 8
    threads: int | None = None
    gather_table_rows: int = 5_500_000
    gather_rows: int = 106_496
    copy_megabytes: int = 512
    index_keys: int = 4_000_000  # the dynamic tables' key index alone; 0: not measured


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def hardware() -> dict:
    """The machine and software the figures come from."""
    model = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            model = next(line.split(":", 1)[1].strip() for line in f if "model name" in line)
    except (OSError, StopIteration):
        pass
    memory_gib = None
    try:
        with open("/proc/meminfo") as f:
            memory_gib = round(int(f.readline().split()[1]) / 2**20, 1)
    except (OSError, ValueError, IndexError):
        pass
    packages = ["torch", "numpy", "numba", "embcore", "fbgemm-gpu-cpu", "fbgemm-gpu", "torchrec"]
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "memory_gib": memory_gib,
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "versions": {p: v for p in packages if (v := _version(p)) is not None},
    }


def _time_system(system, workload, optimizer, batches, options: Options) -> dict:  # type: ignore[no-untyped-def]
    gc.collect()
    memory.reset_peak()
    before = memory.current_rss()
    start = time.perf_counter()
    run = system.build(workload, optimizer, batches)
    build_seconds = time.perf_counter() - start
    times, cpu = [], []
    for i in range(options.warmup + options.steps):
        start, start_cpu = time.perf_counter(), time.process_time()
        run.step(i)
        times.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    peak = memory.peak_rss()
    state_bytes = run.state_bytes
    rows_held = getattr(run, "rows_held", None)  # dynamic tables: rows after the last step
    del run
    gc.collect()
    timed = times[options.warmup :]
    median = float(np.median(timed))
    slot_floats = SLOT_FLOATS[optimizer]
    slot_floats = workload.dim if slot_floats is None else slot_floats
    moved = float(
        np.mean([bytes_touched(workload, b, slot_floats) for b in batches[options.warmup :]])
    )
    return {
        "workload": workload.name,
        "system": system.NAME,
        "optimizer": optimizer,
        "label": system.OPTIMIZERS[optimizer],
        "step_ms": [1e3 * t for t in times],
        "median_ms": 1e3 * median,
        # CPU seconds of the whole process (all its threads) per step: steadier than the wall
        # clock on a shared machine, and equal to it with one thread and a core to itself
        "median_cpu_ms": 1e3 * float(np.median(cpu[options.warmup :])),
        "samples_per_s": workload.batch / median,
        "bytes_per_step": moved,
        "gb_s": moved / median / 1e9,
        "state_bytes": state_bytes,
        "rss_before": before,
        "peak_rss": peak,
        "build_s": build_seconds,
        "rows_held": rows_held,
    }


def run(options: Options, log: Callable[[str], None] = print) -> dict:
    """Every repeat: the limits, then each workload x optimizer x system. Returns the JSON."""
    if options.threads:
        torch.set_num_threads(options.threads)
    # for every system alike: freed batch-sized blocks are reused, not mapped afresh each step
    kept = keep_freed_memory()
    systems = [
        s
        for s in SYSTEMS
        if options.systems is None or s.__name__.rsplit(".", 1)[-1] in options.systems
    ]
    skipped = {}
    for s in systems:
        if (reason := s.unavailable()) is not None:
            skipped[s.NAME] = reason
            log(f"skipping {s.NAME}: {reason}")
    results: dict = {"hardware": hardware(), "options": asdict(options), "skipped": skipped}
    results["hardware"]["malloc_keeps_freed_memory"] = kept
    results["workloads"] = {name: asdict(WORKLOADS[name]) for name in options.workloads}
    results["limits"], results["runs"] = [], []
    for repeat in range(options.repeats):
        gather = limits.gather_bandwidth(options.gather_table_rows, options.gather_rows)
        huge = limits.gather_bandwidth(
            options.gather_table_rows, options.gather_rows, huge_pages=True
        )
        copy = limits.copy_bandwidth(options.copy_megabytes)
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
        results["limits"].append(
            {
                "repeat": repeat,
                "gather": gather,
                "gather_huge_pages": huge,
                "copy": copy,
                "load_average": load,
            }
        )
        log(
            f"[run {repeat + 1}] random-row gather {gather['gb_s']:.2f} GB/s "
            f"({huge['gb_s']:.2f} on 2 MiB pages), "
            f"sequential copy {copy['gb_s']:.2f} GB/s"
        )
        for name in options.workloads:
            workload = WORKLOADS[name]
            batches = make_batches(workload, options.warmup + options.steps)
            for optimizer in options.optimizers:
                for system in systems:
                    if (
                        system.NAME in skipped
                        or optimizer not in system.OPTIMIZERS
                        or not supports(system, workload)
                    ):
                        continue
                    record = _time_system(system, workload, optimizer, batches, options)
                    record["repeat"] = repeat
                    record["gather_fraction"] = record["gb_s"] / gather["gb_s"]
                    results["runs"].append(record)
                    log(
                        f"[run {repeat + 1}] {name} {system.NAME} {record['label']}: "
                        f"{record['median_ms']:.1f} ms/step, {record['gb_s']:.2f} GB/s"
                    )
            del batches
    if options.index_keys and any(WORKLOADS[n].raw_keys for n in options.workloads):
        results["dynamic_index"] = _index(options)
        r = results["dynamic_index"]
        log(
            f"key index: inserts {r['inserts_per_s'] / 1e6:.1f} M/s, lookups "
            f"{r['lookups_per_s_zipf'] / 1e6:.1f} M/s Zipf, "
            f"{r['lookups_per_s_uniform'] / 1e6:.1f} M/s uniform, "
            f"{r['bytes_per_key']:.1f} bytes/key"
        )
    return results


def _index(options: Options) -> dict:
    """The key index alone (``benchmarks/dynamic_index.py``), ``options.index_keys`` keys."""
    import dynamic_index

    gc.collect()
    lookups = max(options.index_keys, 26 * 4096)
    return dynamic_index.measure(keys=options.index_keys, lookups=lookups, threads=options.threads)
