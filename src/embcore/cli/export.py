"""``embcore export``: turn a training checkpoint into a serving bundle."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "export",
        help="write a serving bundle (safetensors + JSON) from a training run",
        description="Export the latest checkpoint of a run (or a given one) as a serving "
        "bundle: tables.safetensors, dense.safetensors and config.json; with --format pt2 also "
        "model.pt2, the model as a torch.export program that serves with PyTorch alone; with "
        "--format aoti also model.aoti.pt2, that program compiled by AOTInductor (needs a C++ "
        "compiler; minutes).",
    )
    parser.add_argument("--run", default="runs/dlrm", help="the run's out_dir (default runs/dlrm)")
    parser.add_argument("--checkpoint", metavar="FILE", help="a checkpoint (default: the latest)")
    parser.add_argument("--out", metavar="DIR", help="bundle directory (default RUN/export)")
    parser.add_argument(
        "--format",
        choices=("safetensors", "pt2", "aoti"),
        default="safetensors",
        help="safetensors (default); pt2: also model.pt2; aoti: also model.aoti.pt2",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from embcore.errors import UserError, reading
    from embcore.train.bundle import checkpoint_model, export_bundle
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
        model, config, extra = checkpoint_model(checkpoint)
    out = export_bundle(model, config, target, extra, args.format)
    files = ", ".join(p.name for p in sorted(out.iterdir()))
    print(f"exported {checkpoint} -> {out}/ ({files})")
    manifest = json.loads((out / "config.json").read_text())
    if manifest["programs"]:
        sizes = [
            f"{p['file']} {(out / p['file']).stat().st_size / 1e6:.1f} MB"
            for p in manifest["programs"].values()
        ]
        took = ", ".join(f"{k} {v:.1f} s" for k, v in manifest["program_seconds"].items())
        print(f"{'; '.join(sizes)} ({took})")
    return 0
