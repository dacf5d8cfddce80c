"""``embcore predict``: score rows with a serving bundle on CPU; report speed and metrics."""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

import numpy as np

from embcore._atomic import write_atomic
from embcore.errors import UserError, reading

if TYPE_CHECKING:
    from embcore.data.batch import Batch
    from embcore.train.bundle import ServingModel
    from embcore.train.predict import PredictReport

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "predict",
        help="score a Criteo TSV/Parquet file or the built-in data with a serving bundle",
        description="Load a bundle written by embcore export on CPU, score rows, and report "
        "rows/s, the per-batch latency (median, p99) and, when labels are known, AUC and log "
        "loss. Without --input it scores the built-in held-out rows of the training run. "
        "By default it reads tensors and JSON only, never code from the bundle; a program "
        "file (--format pt2 or aoti) is loaded only with --trusted-program.",
    )
    parser.add_argument("--bundle", default="runs/dlrm/export", help="default runs/dlrm/export")
    parser.add_argument(
        "--input", metavar="FILE", help="Criteo TSV (plain or gzip) or .parquet file"
    )
    parser.add_argument("--rows", type=int, default=0, help="score at most this many rows")
    parser.add_argument("--batch-size", type=int, default=1024, help="rows per call (1024)")
    parser.add_argument(
        "--output", metavar="FILE", help="write scores: .npy (logits) or CSV label,logit,prob"
    )
    parser.add_argument("--threads", type=int, default=1, help="PyTorch threads (1)")
    parser.add_argument(
        "--format",
        choices=("safetensors", "pt2", "aoti"),
        default="safetensors",
        help="serve from the safetensors files (default: a model embcore builds from tensors "
        "and JSON, fixed or dynamic tables), model.pt2 (the torch.export program) or "
        "model.aoti.pt2 (its AOTInductor build); the scores are the same. The programs need "
        "--trusted-program",
    )
    parser.add_argument(
        "--trusted-program",
        action="store_true",
        help="allow --format pt2 or aoti: loading a program file can run code it carries (a "
        ".pt2's pickles and expressions, an AOTInductor shared library), and the bundle's "
        "checksums detect damage, not tampering; pass it only for bundles from someone you "
        "trust",
    )
    parser.set_defaults(func=run)


def _batches(args: argparse.Namespace, serving: ServingModel) -> Iterator[Batch]:
    from embcore.data.batch import rebatch
    from embcore.data.criteo_tsv import read_criteo_tsv
    from embcore.data.parquet import read_criteo_parquet
    from embcore.train.sources import SyntheticSource

    vocab = serving.vocab_sizes
    if args.input:
        if args.input.endswith((".parquet", ".pq")):
            batches = read_criteo_parquet(args.input, batch_size=args.batch_size, vocab_sizes=vocab)
        else:  # labeled (40 columns) or not (39), as the first row says
            batches = read_criteo_tsv(
                args.input, batch_size=args.batch_size, vocab_sizes=vocab, labeled=None
            )
    else:
        data = serving.config.data
        if data.source != "synthetic":
            raise UserError("the bundle was trained on files: pass --input FILE")
        batches = rebatch(SyntheticSource(data).eval_set().batches, args.batch_size)
    if args.rows:
        return _first_rows(batches, args.rows)
    return batches


def _first_rows(batches: Iterable[Batch], rows: int) -> Iterator[Batch]:
    left = rows
    for batch in batches:
        if left <= 0:
            return
        yield batch.slice(0, min(left, batch.size))
        left -= batch.size


def _write(path: str, report: PredictReport) -> None:
    """Write the scores to a temporary file beside ``path``, then rename: never half a file."""
    target = Path(path)
    if target.is_dir():
        raise UserError(f"--output {path}: is a directory, expected a .npy or CSV file name")

    def scores(f: BinaryIO) -> None:
        if path.endswith(".npy"):
            np.save(f, report.logits)
        else:
            prob = 1.0 / (1.0 + np.exp(-report.logits.astype(np.float64)))
            f.write(b"label,logit,probability\n")
            for y, z, p in zip(report.labels, report.logits, prob, strict=True):
                label = "" if np.isnan(y) else str(int(y))
                f.write(f"{label},{z:.9g},{p:.9g}\n".encode())

    write_atomic(target, scores)


def _check_bundle_files(root: Path, fmt: str) -> None:
    """Read each file of a bundle that ``fmt`` uses once, so that a damaged one is named in
    the error."""
    import json

    from safetensors import safe_open

    from embcore._files import open_regular, read_regular
    from embcore.train.config import Config
    from embcore.train.program import PROGRAM_FILES

    if not root.is_dir():
        what = "no such directory" if not root.exists() else "is a file"
        raise UserError(f"--bundle {root}: {what}; expected a directory written by embcore export")
    tensors = ("tables.safetensors", "dense.safetensors") if fmt == "safetensors" else ()
    program = PROGRAM_FILES.get(fmt)
    for name in ("config.json", *tensors):
        if not (root / name).exists():
            raise UserError(f"{root / name}: missing; not a serving bundle (embcore export)")
    if program and not (root / program).exists():
        raise UserError(
            f"{root / program}: missing; write it with embcore export --format {fmt}, or "
            "predict with --format safetensors"
        )
    config = root / "config.json"
    for name in ("config.json", *tensors):  # a link, a FIFO or a device: refused, never read
        with reading(root / name, "a file of a serving bundle"):
            os.close(open_regular(root / name)[0])
    if config.exists():
        with reading(config, "the JSON manifest of a serving bundle"):
            manifest = json.loads(read_regular(config, 1 << 26))
            if not isinstance(manifest, dict) or not isinstance(manifest.get("config"), dict):
                raise UserError(f'{config}: expected a JSON object with a "config" object')
            Config.from_dict(manifest["config"])
    for name in tensors:
        if (root / name).exists():
            with reading(root / name, "a safetensors file"), safe_open(root / name, "pt") as f:
                for key in f.keys():  # noqa: SIM118 (safe_open is no dict)
                    f.get_slice(key)


def run(args: argparse.Namespace) -> int:
    import torch

    from embcore.train.bundle import load_bundle, untrusted_program
    from embcore.train.predict import score
    from embcore.train.program import PROGRAM_FILES

    if args.batch_size < 1 or args.rows < 0:
        raise UserError("--batch-size must be >= 1 and --rows >= 0")
    if args.input and not Path(args.input).is_file():
        given = Path(args.input)
        what = (
            "is a directory"
            if given.is_dir()
            else "is not a regular file"
            if given.exists()
            else "no such file"
        )
        raise UserError(f"--input {args.input}: {what}")
    if args.format in PROGRAM_FILES and not args.trusted_program:
        raise UserError(untrusted_program(Path(args.bundle) / PROGRAM_FILES[args.format]))
    _check_bundle_files(Path(args.bundle), args.format)
    with reading(args.bundle, "a serving bundle written by embcore export"):
        serving = load_bundle(args.bundle, args.format, trusted_program=args.trusted_program)
    threads = torch.get_num_threads()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    try:
        report = score(serving, _batches(args, serving))  # readers raise UserError
    finally:
        torch.set_num_threads(threads)
    source = args.input or "built-in held-out rows"
    if report.rows == 0:
        raise UserError(f"{source}: no rows to score")
    served = Path(args.bundle) / PROGRAM_FILES.get(args.format, "")
    print(f"scored {report.rows:,} rows of {source} with {served}")
    print(
        f"throughput {report.rows_per_second:,.0f} rows/s; per-batch latency "
        f"(batch {args.batch_size}) median {report.latency_ms(0.5):.2f} ms, "
        f"p99 {report.latency_ms(0.99):.2f} ms over {report.latencies.size} batches"
    )
    metrics = report.metrics()
    if metrics:
        print(f"AUC {metrics['auc']:.4f}, log loss {metrics['log_loss']:.4f}")
    if args.output:
        _write(args.output, report)
        print(f"scores written to {args.output}")
    return 0
