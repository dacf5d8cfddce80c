"""``embcore``: the command-line entry point.

Each subcommand lives in its own module under ``embcore.cli`` and defines
``register(subparsers)``, which adds its parser and sets ``func`` to a function taking the parsed
arguments and returning an exit code. Adding a command adds one line to :data:`COMMANDS`.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

import embcore

__all__ = ["COMMANDS", "main"]

#: Modules under ``embcore.cli`` that register a subcommand, in help order.
COMMANDS: list[str] = ["train", "export", "predict", "stats", "plan", "bench", "kernels"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="embcore",
        description="TPU-style embedding training for PyTorch on CPUs and GPUs.",
    )
    parser.add_argument("--version", action="version", version=f"embcore {embcore.__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"embcore.cli.{name}").register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
