"""``embcore export``: turn a training checkpoint into a serving bundle."""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "export",
        help="write a serving bundle (safetensors + JSON) from a training run",
        description="Export the latest checkpoint of a run (or a given one) as a serving "
        "bundle: tables.safetensors, dense.safetensors and config.json.",
    )
    parser.add_argument("--run", default="runs/dlrm", help="the run's out_dir (default runs/dlrm)")
    parser.add_argument("--checkpoint", metavar="FILE", help="a checkpoint (default: the latest)")
    parser.add_argument("--out", metavar="DIR", help="bundle directory (default RUN/export)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from embcore.errors import UserError, reading
    from embcore.train.bundle import export_checkpoint
    from embcore.train.run_state import latest_checkpoint

    checkpoint = args.checkpoint or latest_checkpoint(Path(args.run) / "checkpoints")
    if checkpoint is None:
        where = Path(args.run) / "checkpoints"
        raise UserError(f"no checkpoint in {where}; run embcore train first")
    if not Path(checkpoint).is_file():
        what = "is a directory" if Path(checkpoint).is_dir() else "no such file"
        raise UserError(f"{checkpoint}: {what}; expected a checkpoint written by embcore train")
    target = Path(args.out or Path(args.run) / "export")
    if target.exists() and not target.is_dir():
        raise UserError(f"--out {target}: is a file, expected a directory for the bundle")
    with reading(checkpoint, "a checkpoint written by embcore train"):
        out = export_checkpoint(checkpoint, target)
    files = ", ".join(p.name for p in sorted(out.iterdir()))
    print(f"exported {checkpoint} -> {out}/ ({files})")
    return 0
