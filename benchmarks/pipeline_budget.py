"""Pipelined mode's thread budget: exact vs pipelined with the background update on every
core vs pipelined with the update on the cores PyTorch leaves free (or one core each), on one
engine.

One W1 engine (the ``embcore bench`` step: stacked lookup, projection loss, backward) runs
in three modes, interleaved within every repeat (the order alternates; the engine is flushed
untimed between modes):

* ``exact``: ``pipelined = False``;
* ``pipelined``: the background update's kernels use ``torch.get_num_threads()`` threads,
  next to PyTorch's own threads computing the next step;
* ``pipelined, own budget``: the background update runs inside
  ``embcore._numba.threads.budget(background_workers())``;
* ``exact, 1 thread`` and ``pipelined, 1 + 1 cores``: the whole step on one torch thread, so
  pipelined, the foreground and the background update (capped by the torch thread count)
  each have one core of two; exact on one thread is its baseline.

Prints, per mode, min / median / max of the per-repeat medians, the speed-up over exact (the
median of per-repeat ratios) and the cores the process kept busy (its CPU time over wall time,
summed over its threads). Then the step's phases, timed apart on the same engine: the inputs'
checks and conversion ``P`` (``prepare``), the lookup ``L``, the loss and backward with the
update deferred ``B``, and the deferred update alone ``U`` (``flush()``), and the most
pipelining can give with cores to spare, ``(P + L + B + U) / (L + max(P + B, U))``: the
update overlaps only the loss and backward of the next step and the preparation of the one
after (the next lookup must read the tables before it, the one after waits for it). The
load average is printed before and after: the machine is shared::

    python benchmarks/pipeline_budget.py                 # W1, 5 repeats of 6 steps
    python benchmarks/pipeline_budget.py --workload W1 W2 --repeats 3
    python benchmarks/pipeline_budget.py --workload W1-quick --repeats 3
    python benchmarks/pipeline_budget.py --threads 1    # PyTorch on one core, update on the other
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sidebyside.systems.embcore_engine import Run
from sidebyside.workloads import WORKLOADS, make_batches

from embcore._numba import threads
from embcore.ops.cpu.malloc import keep_freed_memory


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", nargs="+", default=["W1"], choices=sorted(WORKLOADS))
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--steps", type=int, default=6, help="timed steps per mode and repeat")
    p.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    keep_freed_memory()
    print(
        f"load average before: {os.getloadavg()}, {os.cpu_count()} cores, torch {torch.__version__}"
    )
    for name in args.workload:
        bench(WORKLOADS[name], args.repeats, args.steps)
        print(f"load average after {name}: {os.getloadavg()}")
    return 0


def bench(workload: Any, repeats: int, per_repeat: int) -> None:
    """Time the three modes on one engine of ``workload``, interleaved, then its phases."""
    batches = make_batches(workload, 4)
    run = Run(workload, "adagrad", batches, pipeline=True)
    engine = run.engine
    plain_update = engine._apply_update

    def own_budget(*deferred: Any) -> None:
        with threads.budget(threads.background_workers()):
            plain_update(*deferred)

    every = torch.get_num_threads()
    modes = {  # pipelined?, the update, torch threads for the whole step
        "exact": (False, plain_update, every),
        "pipelined": (True, plain_update, every),
        "pipelined, own budget": (True, own_budget, every),
        "exact, 1 thread": (False, plain_update, 1),
        "pipelined, 1 + 1 cores": (True, plain_update, 1),
    }
    times: dict[str, list[float]] = {m: [] for m in modes}
    busy: dict[str, list[float]] = {m: [] for m in modes}
    i = 0
    for r in range(repeats + 1):  # repeat 0 warms up
        order = list(modes) if r % 2 else list(reversed(modes))
        for mode in order:
            engine.flush()
            engine.pipelined, engine._apply_update, n = modes[mode]
            torch.set_num_threads(n)
            run.step(i % len(run.inputs))  # untimed: no update in flight yet
            i += 1
            steps = []
            cpu0, wall0 = time.process_time(), time.perf_counter()
            for _ in range(per_repeat):
                start = time.perf_counter()
                run.step(i % len(run.inputs))
                steps.append(time.perf_counter() - start)
                i += 1
            engine.flush()  # the last update's work counts in the CPU time and the wall time
            cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
            torch.set_num_threads(every)
            if r:
                times[mode].append(float(np.median(steps)))
                busy[mode].append(cpu / wall)
    engine.pipelined, engine._apply_update = True, plain_update
    phases = {}
    for n in sorted({every, 1}, reverse=True):
        torch.set_num_threads(n)
        phases[n] = phase_times(run, repeats * per_repeat, i)
    torch.set_num_threads(every)
    print(
        f"\n{workload.name} Adagrad, {torch.get_num_threads()} torch threads, background budget "
        f"{threads.background_workers()}; {repeats} repeats x {per_repeat} steps"
    )
    print(
        "| mode | min ms | median ms | max ms | speed-up over exact | over exact on as many "
        "threads | cores busy |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    exact = np.array(times["exact"])
    for mode, t in times.items():
        ms = 1e3 * np.array(t)
        same = np.array(times["exact" if modes[mode][2] == every else "exact, 1 thread"])
        print(
            f"| {mode} | {ms.min():.1f} | {np.median(ms):.1f} | {ms.max():.1f} | "
            f"{np.median(exact / np.array(t)):.2f}x | {np.median(same / np.array(t)):.2f}x | "
            f"{np.median(busy[mode]):.2f} |"
        )
    for n, measured in phases.items():
        prep, lookup, backward, update = (1e3 * measured[k][0] for k in "PLBU")
        # the update overlaps the loss and backward of the next step and the preparation of
        # the one after (which then waits for it before its lookup)
        ceiling = (prep + lookup + backward + update) / (lookup + max(prep + backward, update))
        cores = ", ".join(f"{k} {measured[k][1]:.2f}" for k in "PLBU")
        print(
            f"phases on {n} thread(s) (median ms): prepare P {prep:.1f}, lookup L {lookup:.1f}, "
            f"loss + backward B {backward:.1f}, update U {update:.1f}; cores busy {cores}; "
            f"pipelining's ceiling with a core to spare (P + L + B + U) / (L + max(P + B, U)) "
            f"= {ceiling:.2f}x"
        )
    print(traffic(workload, batches))


def phase_times(run: Run, steps: int, i: int) -> dict[str, tuple[float, float]]:
    """Median seconds and cores busy (CPU time over wall time) of the inputs' preparation
    (checks and conversion), the lookup, the loss and backward (the update deferred) and the
    deferred update applied alone, on the main thread with every worker."""
    engine = run.engine
    out: dict[str, list[tuple[float, float]]] = {"P": [], "L": [], "B": [], "U": []}
    for _ in range(steps):
        engine.flush()
        batch = run.inputs[i % len(run.inputs)]
        i += 1
        marks = [(time.perf_counter(), time.process_time())]
        prepared = engine.prepare(batch)  # the inputs checked and converted
        marks.append((time.perf_counter(), time.process_time()))
        acts = engine.stacked(prepared)  # nothing in flight: the lookup alone
        marks.append((time.perf_counter(), time.process_time()))
        ((acts @ run.projection) ** 2).sum().backward()
        marks.append((time.perf_counter(), time.process_time()))
        engine.flush()
        marks.append((time.perf_counter(), time.process_time()))
        for key, (w0, c0), (w1, c1) in zip("PLBU", marks[:-1], marks[1:], strict=True):
            out[key].append((w1 - w0, (c1 - c0) / max(w1 - w0, 1e-9)))
    return {
        k: (float(np.median([w for w, _ in v])), float(np.median([c for _, c in v])))
        for k, v in out.items()
    }


def traffic(workload: Any, batches: list[Any]) -> str:
    """Ids and unique rows per step, and the bytes of rows the lookup and the update move."""
    ids = np.mean([sum(len(v) for v in b.values) for b in batches])
    rows = np.mean([sum(len(np.unique(v)) for v in b.values) for b in batches])
    row = 4 * workload.dim
    # lookup: read every id's row; update: read and write each unique row and accumulator,
    # plus the summed gradient (written, then read)
    return (
        f"{ids:,.0f} ids, {rows:,.0f} unique rows per step: lookup reads {ids * row / 2**20:.0f} "
        f"MiB, the update moves {rows * row * 6 / 2**20:.0f} MiB (weight and accumulator read "
        "and written, gradient written and read)"
    )


if __name__ == "__main__":
    raise SystemExit(main())
