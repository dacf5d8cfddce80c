"""``embcore``: the command-line entry point.

Each subcommand lives in its own module under ``embcore.cli`` and defines
``register(subparsers)``, which adds its parser and sets ``func`` to a function taking the parsed
arguments and returning an exit code. Adding a command adds one line to :data:`COMMANDS`.

Errors: a :class:`~embcore.errors.UserError` (a bad file, config value or flag) ends the
command with one line ``embcore <command>: error: ...`` and exit status 2; Ctrl-C ends it with
status 130 and no traceback; an ``OSError`` (a missing file, a full disk) is reported in one
line too. Any other exception is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

import embcore
from embcore.errors import UserError

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
    if args.command is None:  # a usage error, as argparse's own (exit status 2)
        parser.print_help(sys.stderr)
        print("embcore: error: give a command (embcore train, embcore --help)", file=sys.stderr)
        return 2
    try:
        return int(args.func(args) or 0)
    except UserError as error:
        print(f"embcore {args.command}: error: {error}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `embcore plan ... | head`: the reader has gone, that is fine
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except OSError as error:  # the environment (a missing file, a full disk), not a bug
        where = (
            f"{error.filename}: "
            if error.filename and str(error.filename) not in str(error)
            else ""
        )
        print(f"embcore {args.command}: error: {where}{error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as error:  # Ctrl-C; embcore.train.loop.Interrupted says more
        print(f"embcore {args.command}: {str(error) or 'interrupted'}", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
