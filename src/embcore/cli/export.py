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
    from embcore.train.bundle import export_checkpoint
    from embcore.train.run_state import latest_checkpoint

    checkpoint = args.checkpoint or latest_checkpoint(Path(args.run) / "checkpoints")
    if checkpoint is None:
        where = Path(args.run) / "checkpoints"
        print(f"embcore export: no checkpoint in {where}; run embcore train first")
        return 2
    out = export_checkpoint(checkpoint, args.out or Path(args.run) / "export")
    files = ", ".join(p.name for p in sorted(out.iterdir()))
    print(f"exported {checkpoint} -> {out}/ ({files})")
    return 0
