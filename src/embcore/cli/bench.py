"""``embcore bench``: embcore and its peers side by side (BENCHMARKS.md).

Runs the workloads W1 and W2 (``--quick``: tiny versions for CI, seconds) for embcore, plain
PyTorch and, when ``fbgemm_gpu`` imports, FBGEMM TBE on CPU, and W3 (W1 with raw 64-bit keys)
for embcore's dynamic tables, plain PyTorch with a dict and, when ``torchrec`` imports,
TorchRec's managed collisions, in one process and one run, on the same pre-generated batches,
then the dynamic tables' key index alone; writes ``results.json`` and ``results.md`` to
``--out`` and, with ``--write-benchmarks``, regenerates the checkout's ``BENCHMARKS.md``::

    embcore bench                       # W1, W2, W3, W3-evict; results in --out
    embcore bench --repeats 3 --write-benchmarks
                                        # the suite 3 times, systems interleaved in each;
                                        # min / median / max per system, ratios per run;
                                        # regenerates BENCHMARKS.md
    embcore bench --quick               # a smoke test at CI size: no speed is reported
    embcore bench --device cuda         # GPU mode: W1/W2/W3 at batch 65,536, bandwidth
    embcore bench --gpu-mode --quick    # the GPU mode's smoke run on the CPU (Triton's
                                        # interpreter; scripts/gpu_check.sh --dry-run)
    embcore bench --mainjob --repeats 3 # the main job's DLRM against it in plain PyTorch,
                                        # eager and compiled (--write-benchmarks: its
                                        # BENCHMARKS.md section)
    embcore bench --disk /mnt/scratch   # W4: tables larger than memory, files there, in a
                                        # memory cgroup (--write-benchmarks: its section)

The harness lives in the repository's ``benchmarks/sidebyside`` (benchmarks are not part of
the installed package), so the command needs a source checkout.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

__all__ = ["find_benchmarks", "register"]


def find_benchmarks() -> Path | None:
    """The repository's ``benchmarks/`` folder (source checkout or editable install)."""
    for root in (Path(__file__).resolve().parents[3], Path.cwd()):
        if (root / "benchmarks" / "sidebyside" / "__init__.py").is_file():
            return root / "benchmarks"
    return None


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "bench",
        help="benchmark embcore against plain PyTorch and FBGEMM TBE, side by side",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="a smoke test at tiny CI sizes (W1-quick, W2-quick, W3-quick): every system runs; "
        "its timings are start-up noise, so no speed or speed-up is printed",
    )
    p.add_argument(
        "--workloads", nargs="+", help="names (default W1 W2 W3 W3-evict, or the quick ones)"
    )
    p.add_argument(
        "--optimizers",
        nargs="+",
        default=["adagrad", "rowwise_adagrad"],
        choices=["adagrad", "rowwise_adagrad"],
    )
    p.add_argument(
        "--systems",
        nargs="+",
        choices=[
            "embcore_engine",
            "embcore_prepared",
            "embcore_dict",
            "embcore_pipelined",
            "plain_torch",
            "fbgemm_tbe",
            "embcore_dynamic",
            "embcore_dynamic_w1init",
            "embcore_dynamic_capacity",
            "torch_dict",
            "torchrec_mc",
        ],
        help="default: all that are installed",
    )
    p.add_argument("--repeats", type=int, default=1, help="run the whole suite N times")
    p.add_argument(
        "--warmup", type=int, default=2, help="untimed steps before the timed ones (default 2)"
    )
    p.add_argument("--steps", type=int, default=8, help="timed steps (median reported)")
    p.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's)")
    p.add_argument("--out", type=Path, default=Path("bench-results"), help="JSON + markdown")
    p.add_argument(
        "--write-benchmarks",
        action="store_true",
        help="regenerate the checkout's BENCHMARKS.md from this run (full runs; --mainjob: "
        "its section, without --set)",
    )
    p.add_argument("--markdown", type=Path, help="regenerate this markdown file instead")
    p.add_argument(
        "--no-markdown",
        action="store_true",
        help="write no markdown (the default; kept for old scripts)",
    )
    p.add_argument(
        "--mainjob",
        action="store_true",
        help="run only the main job (embcore train's default DLRM) against the same model in "
        "plain PyTorch, eager and through torch.compile, and TorchRec's own DLRM (eager, where "
        "torchrec is installed); writes mainjob.json and mainjob.md to --out (and with "
        "--write-benchmarks, without --set, BENCHMARKS.md's main-job section)",
    )
    p.add_argument(
        "--no-compile",
        action="store_true",
        help="--mainjob: the eager systems only (compiling takes about a minute per model)",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="--mainjob: a config override, as for embcore train",
    )
    p.add_argument(
        "--disk",
        type=Path,
        metavar="DIR",
        help="run only W4, tables larger than memory, with their files in DIR (local disk, "
        "--disk-cap rows capped: about 512 bytes a row); writes w4.json to --out and, with "
        "--write-benchmarks, "
        "BENCHMARKS.md's W4 section",
    )
    p.add_argument(
        "--disk-cap", type=int, default=2_700_000, help="--disk: rows per table, at most"
    )
    p.add_argument("--disk-cache-mib", type=int, default=512, help="--disk: the tables' cache")
    p.add_argument("--disk-limit-mib", type=int, default=1024, help="--disk: the memory cgroup")
    p.add_argument("--disk-depth", type=int, default=16, help="--disk: requests in flight")
    p.add_argument(
        "--disk-warm", type=int, default=64, help="--disk: training steps that warm the cache"
    )
    p.add_argument(
        "--device",
        default="cpu",
        help="cpu (default), or cuda for the GPU mode (benchmarks/sidebyside/gpu.py; writes "
        "only --out)",
    )
    p.add_argument(
        "--gpu-mode",
        action="store_true",
        help="the GPU mode on --device even when it is the CPU (a smoke run with the Triton "
        "backend in its interpreter; implied by --device cuda)",
    )
    p.add_argument(
        "--storage-dtype",
        default="float32",
        choices=["float32", "float16", "bfloat16"],
        help="GPU mode: embcore's table storage dtype",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    root = find_benchmarks()
    if root is None:
        print(
            "embcore bench: benchmarks/sidebyside not found; run it from a source checkout of "
            "embcore (the harness is not part of the installed package)",
            file=sys.stderr,
        )
        return 2
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    import sidebyside

    if args.device != "cpu" or args.gpu_mode:
        return _run_gpu(args)
    if args.mainjob:
        return _run_mainjob(args)
    if args.disk is not None:
        return _run_disk(args)
    quick = ["W1-quick", "W2-quick", "W3-quick"]
    workloads = args.workloads or (quick if args.quick else ["W1", "W2", "W3", "W3-evict"])
    options = sidebyside.Options(
        workloads=workloads,
        optimizers=args.optimizers,
        systems=args.systems,
        repeats=args.repeats,
        warmup=args.warmup,
        steps=args.steps,
        threads=args.threads,
    )
    if args.quick:
        options.gather_table_rows, options.gather_rows, options.copy_megabytes = 200_000, 8192, 32
        options.index_keys = 200_000
    results = sidebyside.run(options, log=lambda line: print(line, flush=True))
    sidebyside.write(results, args.out)
    if args.quick:
        print(
            "smoke test passed: every system ran the tiny workloads. Their timings are start-up "
            "noise, not speed; run embcore bench (minutes) for speeds and speed-ups."
        )
    else:
        print(sidebyside.markdown(results))
        print(sidebyside.dynamic_markdown(results))
    markdown = args.markdown
    if markdown is None and args.write_benchmarks and not args.quick:
        markdown = root.parent / "BENCHMARKS.md"
    if markdown is not None and not args.no_markdown:
        # the main-job section comes from its own command (--mainjob): kept as it is
        from sidebyside import disk, mainjob

        document = markdown.read_text() if markdown.is_file() else ""
        text = mainjob.with_section(
            sidebyside.benchmarks_md(results, _command()), mainjob.current_section(document)
        )  # the main-job and W4 sections come from their own commands: kept as they are
        w4 = mainjob.current_section(document, disk.SECTION)
        markdown.write_text(mainjob.with_section(text, w4, disk.SECTION))
        print(f"wrote {markdown}")
    print(f"wrote {args.out / 'results.json'} and {args.out / 'results.md'}")
    return 0


def _command() -> str:
    """The command line that ran, as ``embcore bench ...``."""
    return (
        "embcore bench " + shlex.join(sys.argv[2:] if sys.argv[1:2] == ["bench"] else [])
    ).strip()


def _run_gpu(args: argparse.Namespace) -> int:
    """The GPU mode: results.json and results.md in ``--out`` (BENCHMARKS.md is edited by
    hand from them)."""
    import json
    import os

    if args.device == "cpu":  # the smoke run: Triton's interpreter, read at its first import
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import torch
    from sidebyside import gpu

    quick = ["W1-gpu-quick", "W2-gpu-quick", "W3-gpu-quick"]
    workloads = args.workloads or (quick if args.quick else ["W1-gpu", "W2-gpu", "W3-gpu"])
    unknown = [w for w in workloads if w not in gpu.GPU_WORKLOADS]
    if unknown:
        print(
            f"embcore bench: unknown GPU workload(s) {unknown}; expected some of "
            f"{sorted(gpu.GPU_WORKLOADS)}",
            file=sys.stderr,
        )
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    done: dict[str, dict] = {}

    def write(partial: dict) -> None:  # after every workload: a cut-short run keeps its rows
        done[partial["optimizer"]] = partial
        (args.out / "results.json").write_text(json.dumps(done, indent=1))
        (args.out / "results.md").write_text("\n".join(map(gpu.markdown, done.values())))

    for optimizer in args.optimizers:
        results = gpu.run(
            workloads,
            device=args.device,
            backend="triton" if args.gpu_mode and args.device == "cpu" else "auto",
            storage_dtype=getattr(torch, args.storage_dtype),
            warmup=0 if args.quick and args.device == "cpu" else args.warmup,
            steps=1 if args.quick and args.device == "cpu" else args.steps,
            copy_megabytes=32 if args.quick else 1024,
            log=lambda line: print(line, flush=True),
            optimizer=optimizer,
            write=write,
        )
        print(gpu.markdown(results))
    print(f"wrote {args.out / 'results.json'} and {args.out / 'results.md'}")
    return 0


def _run_mainjob(args: argparse.Namespace) -> int:
    """The main job against plain PyTorch: mainjob.json and mainjob.md in ``--out``."""
    import json

    from sidebyside import mainjob

    from embcore.ops.cpu.malloc import keep_freed_memory

    keep_freed_memory()  # as embcore train does
    options = mainjob.MainJobOptions(
        repeats=args.repeats,
        warmup=args.warmup,
        steps=args.steps,
        overrides=args.set,
        compile=not args.no_compile,
    )
    try:
        results = mainjob.run(options, log=lambda line: print(line, flush=True))
    except ValueError as exc:  # a bad --set
        print(f"embcore bench: {exc}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    results["summary"] = mainjob.summarize(results)
    (args.out / "mainjob.json").write_text(json.dumps(results, indent=1))
    table = mainjob.markdown(results)
    (args.out / "mainjob.md").write_text(table)
    print(table)
    markdown = args.markdown
    if markdown is None and args.write_benchmarks and not args.set:  # the default job only
        markdown = find_benchmarks().parent / "BENCHMARKS.md"  # type: ignore[union-attr]
    if markdown is not None and not args.no_markdown:
        document = markdown.read_text() if markdown.is_file() else "# BENCHMARKS\n"
        markdown.write_text(mainjob.with_section(document, mainjob.section(results, _command())))
        print(f"wrote the main-job section of {markdown}")
    print(f"wrote {args.out / 'mainjob.json'} and {args.out / 'mainjob.md'}")
    return 0


def _run_disk(args: argparse.Namespace) -> int:
    """W4, tables larger than memory: w4.json in ``--out`` and BENCHMARKS.md's W4 section."""
    import json
    import os

    from sidebyside import disk, mainjob

    mib = 1 << 20
    options = {
        "dir": str(args.disk),
        "cap": args.disk_cap,
        "cache_bytes": args.disk_cache_mib * mib,
        "limit": args.disk_limit_mib * mib,
        "depth": args.disk_depth,
        "warm": args.disk_warm,
        "warmup": args.warmup,
        "steps": args.steps,
        "threads": args.threads or 2,
    }
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    results = disk.run(options, log=lambda line: print(line, flush=True))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "w4.json").write_text(json.dumps(results, indent=1))
    text = disk.section(results, _command(), load)
    print(text)
    markdown = args.markdown
    if markdown is None and args.write_benchmarks:
        markdown = find_benchmarks().parent / "BENCHMARKS.md"  # type: ignore[union-attr]
    if markdown is not None and not args.no_markdown and results.get("exit_code") == 0:
        document = markdown.read_text() if markdown.is_file() else "# BENCHMARKS\n"
        markdown.write_text(mainjob.with_section(document, text, disk.SECTION))
        print(f"wrote the W4 section of {markdown}")
    return 0 if results.get("exit_code") == 0 else 1
