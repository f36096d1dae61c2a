"""How long the command line takes before it does anything: ``autoplan --help``, a usage error and
a command's ``--help``, beside ``python -c pass`` (the interpreter's own start) in the same run.

    python experiments/bench_startup.py                  # median of 7 runs each
    python experiments/bench_startup.py --base adfe7ab   # also the same commands at that revision
    python experiments/bench_startup.py --write          # into experiments/RESULTS.md

Each run is a fresh ``python -m autoplan ...`` (the way the console script starts), wall and CPU
seconds (the child's user + system time), the median of ``-n`` runs, the runs of every command
interleaved so that a change in the machine's load touches them alike.  Issue 37's target: the
help and a usage error under 1 s on an idle 2-core machine.
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from readme_figures import machine  # noqa: E402
from results_md import write_section  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CASES = {   # name -> argv after `python`
    "python -c pass": ["-c", "pass"],
    "autoplan --help": ["-m", "autoplan", "--help"],
    "autoplan search --help": ["-m", "autoplan", "search", "--help"],
    "usage error (--seq abc)": ["-m", "autoplan", "search", "gpt3-175b", "--cluster", "h100x1024", "--seq", "abc"],
    "usage error (--to torchtitian)": ["-m", "autoplan", "export", "tp=2", "--to", "torchtitian"],
}


def timed(argv: list[str], root: str) -> tuple[float, float]:
    """(wall s, CPU s) of one ``python ARGV`` run from ``root``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, *argv], cwd=root, env=dict(os.environ, PYTHONPATH=root),
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def measure(roots: dict[str, str], runs: int) -> dict[tuple[str, str], tuple[float, float]]:
    """Median (wall, CPU) per (revision, case), the runs interleaved."""
    samples: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for _ in range(runs):
        for rev, root in roots.items():
            for name, argv in CASES.items():
                if rev != "working tree" and name == "python -c pass":
                    continue
                samples.setdefault((rev, name), []).append(timed(argv, root))
    return {k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v)) for k, v in samples.items()}


def report(medians: dict[tuple[str, str], tuple[float, float]], runs: int) -> str:
    base = medians[("working tree", "python -c pass")][0]
    lines = [f"Median of {runs} fresh processes each, {machine()}, load average {os.getloadavg()[0]:.1f} at the "
             f"end (`python experiments/bench_startup.py{' --base ' + REV if REV else ''} --write`).", "",
             "| revision | command | wall s | CPU s | × `python -c pass` |", "|---|---|---|---|---|"]
    for (rev, name), (wall, cpu) in medians.items():
        lines.append(f"| {rev} | `{name}` | {wall:.3f} | {cpu:.3f} | {wall / base:.1f} |")
    worst = max(w for (rev, name), (w, _) in medians.items() if rev == "working tree" and name != "python -c pass")
    lines += ["", f"Slowest help or usage error of the working tree: {worst:.2f} s "
              f"({'under' if worst < 1 else 'OVER'} the 1 s target)."]
    return "\n".join(lines) + "\n"


REV = ""


def main() -> None:
    global REV
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", "--runs", type=int, default=7, help="runs per command (default 7)")
    parser.add_argument("--base", metavar="REV", help="also time the commands at this git revision")
    parser.add_argument("--write", action="store_true", help="write the table into experiments/RESULTS.md")
    args = parser.parse_args()
    roots = {"working tree": REPO}
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
        if args.base:
            REV = args.base
            archive = subprocess.run(["git", "archive", args.base], cwd=REPO, capture_output=True, check=True)
            subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
            roots = {args.base: tmp, **roots}
        text = report(measure(roots, args.runs), args.runs)
    print(text)
    if args.write:
        write_section("bench_startup", "Start-up: help and usage errors (`python experiments/bench_startup.py`)",
                      text)


if __name__ == "__main__":
    main()
