"""``embcore export``: turn a training checkpoint into a serving bundle."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

__all__ = ["MAX_TABLE_BYTES", "register"]

#: the most bytes of table rows (float32, every fixed table) one exported program holds;
#: a bigger model, or one with tables in DiskStorage, serves from a lookup-only engine
MAX_TABLE_BYTES = 8 << 30


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
    too_big = _too_big(checkpoint)
    if too_big:
        raise UserError(
            f"{checkpoint}: this model's tables are too big for one exported program "
            f"({too_big}): embcore export writes every row into the bundle and holds them all "
            "in memory. Serve it with a lookup-only engine (optimizer=None) whose tables are "
            "in DiskStorage, loaded from an embcore.checkpoint of the tables: see "
            "docs/disk_tables.md, section Serving"
        )
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


def _too_big(checkpoint: str | Path) -> str | None:
    """Why ``checkpoint``'s model is too big to export (its tables in DiskStorage, or more
    than :data:`MAX_TABLE_BYTES` of rows), read from its metadata alone (no table is loaded);
    ``None`` otherwise, or when the metadata is unreadable (the load then says why)."""
    from safetensors import SafetensorError, safe_open

    from embcore.train.config import Config
    from embcore.train.contract import vocab_sizes_for

    try:
        with safe_open(str(checkpoint), framework="pt") as f:
            meta = json.loads((f.metadata() or {}).get("embcore") or "null")
        config = Config.from_dict(meta["config"])
    except (SafetensorError, OSError, ValueError, KeyError, TypeError):
        return None
    if config.model.storage == "disk":
        return f'model.storage="disk", a cache of {config.model.cache_bytes:,} bytes'
    if config.model.tables != "fixed":
        return None
    rows = sum(vocab_sizes_for(config))
    size = 4 * rows * config.model.embedding_dim
    if size > MAX_TABLE_BYTES:
        return f"{rows:,} rows of dim {config.model.embedding_dim}: {size / 2**30:.1f} GiB"
    return None
