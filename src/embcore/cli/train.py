"""``embcore train``: train DLRM on the built-in synthetic data (or Criteo files)."""

from __future__ import annotations

import argparse

__all__ = ["register"]

EPILOG = """\
examples:
  embcore train                                   # built-in data, about 1.5 min on 2 cores
  embcore train --set train.steps=300 --set model.interaction=dcn
  embcore train --config job.toml --resume        # continue after an interruption
config keys (section.key): see docs/main_job.md, or embcore.train.config"""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "train",
        help="train a DLRM click model (built-in data by default)",
        description="Train DLRM with the embedding engine: progress bar, periodic evaluation, "
        "checkpoints, a summary table and curves.png in train.out_dir (default runs/dlrm).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", metavar="FILE", help="a TOML file with [data], [model], ...")
    parser.add_argument(
        "--set",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        dest="overrides",
        help="override one key, e.g. --set train.steps=100 (repeatable)",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue from the latest checkpoint in train.out_dir (start afresh if none)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from embcore.ops.cpu.malloc import keep_freed_memory
    from embcore.train.config import load_config
    from embcore.train.loop import train

    keep_freed_memory()  # reuse each step's freed batch-sized blocks (docs/cpu_backend.md)

    try:
        config = load_config(args.config, args.overrides)
    except (ValueError, OSError) as e:
        print(f"embcore train: {e}")
        return 2
    try:
        train(config, resume=args.resume)
    except (ValueError, FileNotFoundError) as e:  # bad data files, a mismatched --resume
        print(f"embcore train: {e}")
        return 2
    return 0
