"""``embcore kernels``: compile every Triton kernel ahead of time and report its resources.

No GPU is needed. Every kernel specialisation the Triton backend launches for its table
configurations (every optimizer, float32/float16/bfloat16 storage, stochastic rounding, pooled,
sequence, weighted and mixed inputs; ``embcore.ops.triton.aot``) is compiled for each
architecture, one row each: registers per thread, spilled bytes, shared memory, warps and the
widest global load/store in the PTX. Exits 1 on any compile failure or spill::

    embcore kernels --arch sm_80 sm_90
    embcore kernels --arch sm_90 --quick      # one storage mode per optimizer

Needs Triton (``pip install embcore[gpu]``). Under ``TRITON_INTERPRET=1`` the command re-runs
itself without it (the interpreter replaces the kernels, so nothing could be compiled).
See docs/gpu_backend.md.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "kernels",
        help="compile every Triton kernel for GPU architectures (no GPU needed); resources",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--arch", nargs="+", default=["sm_80", "sm_90"], help="e.g. sm_80 sm_90")
    p.add_argument("--quick", action="store_true", help="one storage mode per optimizer")
    p.add_argument(
        "--jobs", type=int, default=min(4, os.cpu_count() or 1), help="parallel compiles"
    )
    p.set_defaults(func=run)


def _archs(names: list[str]) -> list[int] | str:
    """``["sm_80", "sm_90"]`` -> ``[80, 90]``, or an error message."""
    out = []
    for name in names:
        digits = name.lower().removeprefix("sm_").removeprefix("sm")
        if not digits.isdigit() or not 50 <= int(digits) <= 120:
            return f"--arch {name!r}: expected sm_<compute capability>, e.g. sm_80 or sm_90"
        out.append(int(digits))
    return out


def _interpreted() -> bool:
    flag = os.environ.get("TRITON_INTERPRET", "").strip().lower()
    return flag not in ("", "0", "false", "off", "no")


def _rerun_without_interpreter(argv: list[str]) -> int:
    """Run ``embcore kernels`` again in a process without ``TRITON_INTERPRET``."""
    import embcore

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    src = str(Path(embcore.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([src, *filter(None, [env.get("PYTHONPATH")])])
    cmd = [sys.executable, "-m", "embcore.cli.main", "kernels", *argv]
    with subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True) as proc:  # fmt: skip
        assert proc.stdout is not None
        for line in proc.stdout:
            print(line, end="", flush=True)
    return proc.returncode


def run(args: argparse.Namespace) -> int:
    archs = _archs(args.arch)
    if isinstance(archs, str):
        print(f"embcore kernels: {archs}", file=sys.stderr)
        return 2
    if args.jobs < 1:
        print(f"embcore kernels: --jobs must be >= 1, got {args.jobs}", file=sys.stderr)
        return 2
    if _interpreted():
        argv = ["--arch", *args.arch, "--jobs", str(args.jobs)] + ["--quick"] * args.quick
        return _rerun_without_interpreter(argv)
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "0")  # every launch sets it anyway
    try:
        from embcore.ops.triton import aot
    except ImportError as exc:
        print(f"embcore kernels: needs Triton (pip install embcore[gpu]): {exc}", file=sys.stderr)
        return 2
    specs = aot.specs(quick=args.quick)
    head = f"{'arch':<6} {'kernel':<26} {'specialisation':<40} regs spill smem  warps ld/st"
    print(head)
    print("-" * len(head))
    ok = failed = spilling = 0
    for spec, c in aot.compile_all(specs, archs, args.jobs):
        where = f"sm_{c.arch:<3} {spec.name:<26} {spec.label:<40}"
        if c.error:
            failed += 1
            print(f"{where} FAILED: {c.error}", flush=True)
            continue
        ok += 1
        spilling += c.spill_bytes > 0
        vec = f"{c.load_vector}/{c.store_vector}"
        print(f"{where} {c.regs:>4} {c.spill_bytes:>5} {c.shared_bytes:>5} {c.warps:>5} {vec}",
              flush=True)  # fmt: skip
    names = ", ".join(f"sm_{a}" for a in archs)
    print(f"{ok} kernels compiled for {names}: {failed} failed, {spilling} spilling")
    return 1 if failed or spilling else 0
