"""The matched-scale benchmark, writing its results into this folder and RESULTS.md.

    .venv/bin/python experiments/bench.py [--suite quick] [--force] [--cases NAME,...] [...]

A thin script over ``autoplan bench`` (the harness is ``autoplan.bench``): for the default
suite it adds ``--out experiments/bench --results-md experiments/RESULTS.md`` unless given,
so that the tables, the answer and the plots land in the repository; another suite goes to
``experiments/bench-SUITE`` and leaves RESULTS.md alone.  Every other option is
``autoplan bench``'s (``--help``).
"""
from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from autoplan.cli import main  # noqa: E402


def with_repo_defaults(argv: list[str]) -> list[str]:
    """``argv`` plus the repository's output folder and RESULTS.md when not given."""
    args = list(argv)
    suite = "default"
    for i, a in enumerate(args):
        if a == "--suite" and i + 1 < len(args):
            suite = args[i + 1]
        elif a.startswith("--suite="):
            suite = a.split("=", 1)[1]
    if not any(a == "--out" or a.startswith("--out=") for a in args):
        args += ["--out", os.path.relpath(os.path.join(HERE, "bench" if suite == "default" else f"bench-{suite}"))]
    if suite == "default" and not any(a == "--results-md" or a.startswith("--results-md=") for a in args):
        args += ["--results-md", os.path.relpath(os.path.join(HERE, "RESULTS.md"))]
    return ["bench"] + args


if __name__ == "__main__":
    sys.exit(main(with_repo_defaults(sys.argv[1:])))
