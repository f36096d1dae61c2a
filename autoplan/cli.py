"""The ``autoplan`` command line.

Each sub-command lives in ``autoplan/commands/<name>.py`` and exposes
``add_parser(subparsers)`` and ``run(args) -> int``.  Bad input raises
``UserError``: printed as one message, exit code 2, no traceback.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from autoplan.errors import UserError

COMMANDS = ("search", "trace", "estimate", "clusters", "baseline", "explain", "export", "run",
            "bench", "calibrate")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="autoplan",
        description="Auto-parallel planner for large-model training.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"autoplan.commands.{name}")
        except ModuleNotFoundError as e:
            if e.name == f"autoplan.commands.{name}":
                continue  # command not built yet
            raise
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
