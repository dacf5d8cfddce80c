"""``embcore train``: train DLRM on the built-in synthetic data (or Criteo files)."""

from __future__ import annotations

import argparse

__all__ = ["register"]

EPILOG = """\
examples:
  embcore train                                   # built-in data, ~40 s on 2 idle cores
  embcore train --set train.steps=300 --set model.interaction=dcn
  embcore train --set data.source=movielens --set data.path=data/ml-100k   # real ratings
  embcore train --config job.toml --resume        # continue after an interruption
  embcore train --overwrite                       # replace the run in train.out_dir
config keys (section.key): see docs/main_job.md, or embcore.train.config"""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "train",
        help="train a DLRM click model (built-in data by default)",
        description="Train DLRM with the embedding engine: progress (a bar on a terminal, "
        "one line at a time in a log), periodic evaluation, checkpoints, a summary table and "
        "curves.png in train.out_dir (default runs/dlrm). A train.out_dir that holds an "
        "earlier run is refused unless --resume or --overwrite says what to do with it.",
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
    again = parser.add_mutually_exclusive_group()
    again.add_argument(
        "--resume",
        action="store_true",
        help="continue from the latest checkpoint in train.out_dir (start afresh if none)",
    )
    again.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the run in train.out_dir; its checkpoints are deleted only once this "
        "run has written its first checkpoint",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from embcore.ops.cpu.malloc import keep_freed_memory
    from embcore.train.config import load_config
    from embcore.train.loop import train

    keep_freed_memory()  # reuse each step's freed batch-sized blocks (docs/cpu_backend.md)

    config = load_config(args.config, args.overrides)  # errors: see embcore.cli.main
    train(config, resume=args.resume, overwrite=args.overwrite)
    return 0
