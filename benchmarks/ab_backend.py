"""A/B of the CPU backend's kernels: this checkout against a git revision, in one process.

The base revision's ``embcore/ops/cpu`` sources are read with ``git show`` into a temporary
package (its imports of ``embcore.ops.cpu`` renamed), so both versions run side by side on
the same tables, batches and gradients. Each repeat times, for A then B then A ... (the order
alternates), the forward lookup into a stacked ``(B, T, dim)`` output, the finiteness check
and the update with the stacked gradient's slices (and within it the dedup kernel and
the optimizer kernel, or the fused kernel doing both table by table; a backend whose update
checks the gradients itself, ``UPDATE_CHECKS_FINITE``, is timed that way, without the separate
check); printed are the medians
per phase and
the B/A ratios taken within each repeat. Times are process CPU time (the kernels run on the
process's own threads), which holds better than wall time when other jobs share the cores::

    python benchmarks/ab_backend.py --base HEAD           # W1, Adagrad, 15 repeats
    python benchmarks/ab_backend.py --base HEAD~2 --workload W2 --threads 1
"""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from sidebyside.systems.embcore_engine import Run  # noqa: E402
from sidebyside.workloads import WORKLOADS, make_batches  # noqa: E402

from embcore.ops.cpu.malloc import keep_freed_memory  # noqa: E402

PACKAGE = "src/embcore/ops/cpu"


def base_backend(revision: str, into: Path) -> ModuleType:
    """The CPU backend as it was at ``revision``, imported as ``embcore_base_cpu``."""
    files = subprocess.run(
        ["git", "-C", str(ROOT), "ls-tree", "-r", "--name-only", revision, PACKAGE],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    for name in files:
        text = subprocess.run(
            ["git", "-C", str(ROOT), "show", f"{revision}:{name}"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        target = into / "embcore_base_cpu" / Path(name).relative_to(PACKAGE)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text.replace("embcore.ops.cpu", "embcore_base_cpu"))
    sys.path.insert(0, str(into))
    return importlib.import_module("embcore_base_cpu")


def _clock() -> float:
    """Process CPU time: unlike wall time it leaves out the time the process waits for a core
    on a shared machine (the kernels run on this process's threads)."""
    return time.process_time()


def _timed_run(run: Callable[..., Any], spent: dict[str, float]) -> Callable[..., Any]:
    def wrapper(kernel: Callable[..., Any], *args: Any, workers: int) -> Any:
        start = _clock()
        try:
            return run(kernel, *args, workers=workers)
        finally:
            name = kernel.__name__
            spent[name] = spent.get(name, 0.0) + _clock() - start

    return wrapper


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base", default="HEAD", help="git revision of the A side")
    p.add_argument("--workload", default="W1", choices=sorted(WORKLOADS))
    p.add_argument("--optimizer", default="adagrad", choices=["adagrad", "rowwise_adagrad"])
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--threads", type=int)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    keep_freed_memory()
    import embcore.ops.cpu as current

    with tempfile.TemporaryDirectory() as tmp:
        sides = {"A": base_backend(args.base, Path(tmp)), "B": current}
        workload = WORKLOADS[args.workload]
        batches = make_batches(workload, 4)
        run = Run(workload, args.optimizer, batches)
        engine = run.engine
        states = [r.state() for r in engine.store.rows]
        prepared = [engine._by_table(engine._prepare(x, None)) for x in run.inputs]
        count = len(engine.feature_names)
        shape = (workload.batch, count, workload.dim)
        gen = torch.Generator().manual_seed(0)
        grads = [torch.randn(shape, generator=gen) * 1e-3 for _ in prepared]
        out = torch.empty(shape)
        slices = engine._by_table([out[:, f, :] for f in range(count)])
        lrs = [0.01] * len(states)
        phases = ("lookup", "non_finite", "update", "unique_gradients", "rule", "fused")
        times = {s: {ph: [] for ph in phases} for s in sides}
        kernel_time: dict[str, float] = {}
        for backend in sides.values():  # time the dedup kernel and the rule kernel apart
            backend.threads.run = _timed_run(backend.threads.run, kernel_time)

        def step(backend: ModuleType, i: int) -> dict[str, float]:
            feats, grad = prepared[i % len(prepared)], grads[i % len(grads)]
            kernel_time.clear()
            t0 = _clock()
            backend.lookup(states, feats, out=slices)
            t1 = _clock()
            folded = getattr(backend, "UPDATE_CHECKS_FINITE", False)  # checked in the dedup
            if not folded:
                backend.non_finite([grad])
            t2 = _clock()
            parts = engine._by_table([grad[:, f, :] for f in range(count)])
            backend.update(
                states, feats, parts, lrs, i + 1, **({"check_finite": True} if folded else {})
            )
            t3 = _clock()
            dedup = sum(
                v for k, v in kernel_time.items() if k in ("unique_gradients", "unique_occurrences")
            )
            rule = sum(
                v for k, v in kernel_time.items() if k in ("update", "update_all", "update_listed")
            )
            fused = kernel_time.get("fused", 0.0)  # dedup and rule, table by table
            return {
                "lookup": t1 - t0,
                "non_finite": t2 - t1,
                "update": t3 - t2,
                "unique_gradients": dedup,
                "rule": rule,
                "fused": fused,
            }

        for i in range(2):  # warm-up (compiles the kernels, faults the pages in)
            for backend in sides.values():
                step(backend, i)
        for r in range(args.repeats):
            order = list(sides) if r % 2 == 0 else list(reversed(sides))
            for s in order:
                for ph, t in step(sides[s], r).items():
                    times[s][ph].append(t)
        print(
            f"{workload.name} {args.optimizer}, {torch.get_num_threads()} threads, "
            f"{args.repeats} repeats; A = {args.base}, B = this checkout"
        )
        print("| phase | A median ms | B median ms | B/A (median of per-repeat ratios) |")
        print("|---|---:|---:|---:|")
        for ph in (*phases, "total"):

            def series(s: str, ph: str = ph) -> np.ndarray:
                if ph == "total":
                    return np.sum([times[s][q] for q in phases[:3]], axis=0)
                return np.array(times[s][ph])

            a, b = series("A"), series("B")
            ratio = f"{np.median(b / a):.3f}" if a.all() and b.all() else "-"
            print(f"| {ph} | {1e3 * np.median(a):.2f} | {1e3 * np.median(b):.2f} | {ratio} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
