"""What a raw batch costs over a prepared one: an engine stepping on the user's raw batches, one
stepping on batches made by ``engine.prepare`` before the clock, and FBGEMM TBE (its indices and
offsets built ahead) in one process, stepping in turn (the order rotated every step), timed
in process CPU time (a shared machine)::

    python benchmarks/raw_prepared.py --optimizer rowwise_adagrad --steps 40
    python benchmarks/raw_prepared.py --workload W1-quick --steps 10 --no-peer

Prints the median step of each and the medians of the per-step ratios (FBGEMM / raw,
FBGEMM / prepared, raw / prepared). The two embcore engines are the ``embcore`` and
``embcore, inputs prepared ahead`` systems of ``embcore bench``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sidebyside.systems import embcore_engine, fbgemm_tbe
from sidebyside.workloads import WORKLOADS, make_batches

from embcore.ops.cpu.malloc import keep_freed_memory


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", default="W1", choices=sorted(WORKLOADS))
    p.add_argument("--optimizer", default="rowwise_adagrad", choices=["adagrad", "rowwise_adagrad"])
    p.add_argument("--warmup", type=int, default=8)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--no-peer", action="store_true", help="leave FBGEMM TBE out")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    keep_freed_memory()
    workload = WORKLOADS[args.workload]
    batches = make_batches(workload, 4)
    systems = {
        "raw": embcore_engine.Run(workload, args.optimizer, batches),
        "prepared": embcore_engine.Run(workload, args.optimizer, batches, prepared=True),
    }
    if not args.no_peer:
        if (missing := fbgemm_tbe.unavailable()) is not None:
            raise SystemExit(f"FBGEMM TBE: {missing} (use --no-peer)")
        systems["fbgemm"] = fbgemm_tbe.build(workload, args.optimizer, batches)
    names = list(systems)
    cpu: dict[str, list[float]] = {n: [] for n in names}
    for i in range(args.warmup + args.steps):
        k = i % len(names)
        for name in names[k:] + names[:k]:
            start = time.process_time()
            systems[name].step(i % len(batches))
            if i >= args.warmup:
                cpu[name].append(time.process_time() - start)
    t = {n: np.array(c) for n, c in cpu.items()}
    steps = ", ".join(f"{n} {1e3 * np.median(c):.2f}" for n, c in t.items())
    print(
        f"{workload.name} {args.optimizer}, {args.threads} thread(s): median ms per step: {steps}"
    )
    pairs = [("raw", "prepared")]
    if "fbgemm" in t:
        pairs = [("fbgemm", "raw"), ("fbgemm", "prepared"), *pairs]
    ratios = ", ".join(f"{a} / {b} {np.median(t[a] / t[b]):.3f}" for a, b in pairs)
    print(f"medians of per-step CPU-time ratios: {ratios}")
    print(f"1-minute load average at the end: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
