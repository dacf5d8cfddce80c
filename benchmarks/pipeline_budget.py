"""Pipelined mode's thread budget: exact vs pipelined with the background update on every
core vs pipelined with the update on the cores PyTorch leaves free, on one engine.

One W1 engine (the ``embcore bench`` step: stacked lookup, projection loss, backward) runs
in three modes, interleaved within every repeat (the order alternates; the engine is flushed
untimed between modes):

* ``exact``: ``pipelined = False``;
* ``pipelined``: the background update's kernels use ``torch.get_num_threads()`` threads,
  next to PyTorch's own threads computing the next step;
* ``pipelined, own budget``: the background update runs inside
  ``embcore.ops.cpu.threads.budget(background_workers())``.

Prints min / median / max of the per-repeat medians and the speed-ups over exact within each
repeat::

    python benchmarks/pipeline_budget.py                 # W1, 5 repeats of 6 steps
    python benchmarks/pipeline_budget.py --workload W1-quick --repeats 3
    python benchmarks/pipeline_budget.py --threads 1    # PyTorch on one core, update on the other
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sidebyside.systems.embcore_engine import Run
from sidebyside.workloads import WORKLOADS, make_batches

from embcore.ops.cpu import threads
from embcore.ops.cpu.malloc import keep_freed_memory


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", default="W1", choices=sorted(WORKLOADS))
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--steps", type=int, default=6, help="timed steps per mode and repeat")
    p.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    keep_freed_memory()
    workload = WORKLOADS[args.workload]
    run = Run(workload, "adagrad", make_batches(workload, 4), pipeline=True)
    engine = run.engine
    plain_update = engine._apply_update

    def own_budget(*deferred: Any) -> None:
        with threads.budget(threads.background_workers()):
            plain_update(*deferred)

    modes = {
        "exact": (False, plain_update),
        "pipelined": (True, plain_update),
        "pipelined, own budget": (True, own_budget),
    }
    times: dict[str, list[float]] = {m: [] for m in modes}
    i = 0
    for r in range(args.repeats + 1):  # repeat 0 warms up
        order = list(modes) if r % 2 else list(reversed(modes))
        for mode in order:
            engine.flush()
            engine.pipelined, engine._apply_update = modes[mode]
            run.step(i % len(run.inputs))  # untimed: no update in flight yet
            i += 1
            steps = []
            for _ in range(args.steps):
                start = time.perf_counter()
                run.step(i % len(run.inputs))
                steps.append(time.perf_counter() - start)
                i += 1
            engine.flush()
            if r:
                times[mode].append(float(np.median(steps)))
    print(
        f"{workload.name} Adagrad, {torch.get_num_threads()} torch threads, background budget "
        f"{threads.background_workers()}; {args.repeats} repeats x {args.steps} steps"
    )
    print("| mode | min ms | median ms | max ms | speed-up over exact (median per repeat) |")
    print("|---|---:|---:|---:|---:|")
    exact = np.array(times["exact"])
    for mode, t in times.items():
        ms = 1e3 * np.array(t)
        print(
            f"| {mode} | {ms.min():.1f} | {np.median(ms):.1f} | {ms.max():.1f} | "
            f"{np.median(exact / np.array(t)):.2f}x |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
