"""Does a refactor change any number?  The JSON of the README's examples, the bench's quick suite
and the worst search rows, byte for byte, against another commit, and the worst rows' search time.

    python experiments/check_identical.py --base REV [--only readme,quick,worst] [--time] [--repeat N] [--write]

The commit ``REV`` is checked out into a temporary git worktree; every command runs in a fresh
process, once on ``REV`` and once on the working tree, each with its own trace cache (a cold
trace is not timed: ``--time`` runs the search in-process after tracing).  A row is "same" when
the two outputs are identical bytes; timing fields of the bench record (``*_s``, ``cpus``) are
dropped before comparing.  With ``--time``, each worst row's search seconds (wall and CPU of the
search process and its workers) on both trees, interleaved ``--repeat`` times (default 3), the
ratio of medians new / old.  ``--write`` puts the rows and the timing table into
experiments/RESULTS.md (section ``check_identical``).  Exit status 1 when any output differs.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

from bench_search import WORST_CASES as WORST  # (model, cluster, seq, global batch) rows

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

README = [
    ("search gpt3-175b h100x1024", ["search", "gpt3-175b", "--cluster", "h100x1024", "--json"]),
    ("search nic.yaml", ["search", "gpt3-175b", "--cluster", "h100x1024", "--params",
                         "experiments/perturbations/nic.yaml", "--json"]),
    ("estimate gpt3-175b interleaved", ["estimate", "gpt3-175b", "--cluster", "h100x1024", "--plan",
                                        "tp=8,pp=8,vpp=3,schedule=interleaved,recompute=selective", "--json"]),
    ("search llama3-8b 32K", ["search", "llama3-8b", "--cluster", "h100x256", "--seq", "32768",
                              "--global-batch", "256", "--json"]),
    ("search point objective", ["search", "gpt3-175b", "--cluster", "h100x1024", "--samples", "0",
                                "--objective", "point", "--json"]),
    ("search workers 1", ["search", "llama3-8b", "--cluster", "h100x64", "--workers", "1", "--json"]),
]
# what a bench record measures of the machine or the run rather than computes (seconds, cores, its --out)
TIMING_KEYS = {"cpus", "command", "trace_s", "search_s", "case_s", "recipe_s", "seconds", "ilp_seconds",
               "solve_seconds", "wall_s", "total_s"}

_TIMED = """
import json, os, resource, sys, time
from autoplan.frontend import trace
from autoplan.workload import load_cluster
from autoplan.search import search
model, cluster, seq, batch = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
g = trace(model, seq=seq)
cpu0 = os.times()
t0 = time.perf_counter()
r = search(g, load_cluster(cluster), global_batch=batch)
wall = time.perf_counter() - t0
cpu1 = os.times()
cpu = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system) + (cpu1.children_user - cpu0.children_user) \
    + (cpu1.children_system - cpu0.children_system)
print(json.dumps({"wall_s": wall, "cpu_s": cpu, "best": r.candidates[0].plan.to_string()}))
"""


def _env(tree: str, cache: str) -> dict:
    env = dict(os.environ, PYTHONPATH=tree, AUTOPLAN_CACHE_DIR=cache, PYTHONHASHSEED="0")
    env.pop("AUTOPLAN_NO_CACHE", None)
    return env


def _cli(tree: str, cache: str, args: list[str]) -> bytes:
    proc = subprocess.run([sys.executable, "-m", "autoplan", *args], cwd=tree, env=_env(tree, cache),
                          capture_output=True, timeout=1800)
    return proc.stdout + f"\n[exit {proc.returncode}]".encode() + (proc.stderr[-2000:] if proc.returncode else b"")


def _strip_timing(x):
    if isinstance(x, dict):
        return {k: _strip_timing(v) for k, v in x.items() if k not in TIMING_KEYS}
    if isinstance(x, list):
        return [_strip_timing(v) for v in x]
    return x


def _bench_quick(tree: str, cache: str) -> bytes:
    with tempfile.TemporaryDirectory() as out:
        proc = subprocess.run([sys.executable, "-m", "autoplan", "bench", "--suite", "quick", "--out", out,
                               "--force", "--json"], cwd=tree, env=_env(tree, cache), capture_output=True,
                              timeout=3600)
        records = []
        for name in sorted(os.listdir(out)):
            if name.endswith(".json"):
                with open(os.path.join(out, name)) as f:
                    records.append((name, _strip_timing(json.load(f))))
        return json.dumps(records, sort_keys=True, indent=1).encode() + f"\n[exit {proc.returncode}]".encode()


def _rows(only: set[str]) -> list[tuple[str, object]]:
    rows: list[tuple[str, object]] = []
    if "readme" in only:
        rows += [(name, args) for name, args in README]
    if "quick" in only:
        rows.append(("bench --suite quick", "bench-quick"))
    if "worst" in only:
        rows += [(f"worst {m}@{c}", ["search", m, "--cluster", c, "--seq", str(s), "--global-batch", str(b),
                                     "--json"]) for m, c, s, b in WORST]
    return rows


def _run(tree: str, cache: str, what) -> bytes:
    return _bench_quick(tree, cache) if what == "bench-quick" else _cli(tree, cache, what)


def _timed(tree: str, cache: str, row: tuple) -> dict:
    m, c, s, b = row
    proc = subprocess.run([sys.executable, "-c", _TIMED, m, c, str(s), str(b)], cwd=tree, env=_env(tree, cache),
                          capture_output=True, text=True, timeout=1800)
    if proc.returncode:
        raise SystemExit(proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _slug(name: str) -> str:
    """A row's name as a file name."""
    return name.replace(" ", "_").replace("/", "_")


def _old(sha: str, name: str, run) -> bytes:
    """``run()`` on the base commit, remembered under its full hash ``sha`` (a commit's output
    does not change)."""
    path = os.path.join(tempfile.gettempdir(), "autoplan-identical", sha, _slug(name))
    if os.path.exists(path) and os.path.getmtime(path) > os.path.getmtime(__file__):
        with open(path, "rb") as f:
            return f.read()
    out = run()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(out)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="the commit to compare against (e.g. HEAD~3)")
    ap.add_argument("--only", default="readme,quick,worst", help="comma-separated: readme, quick, worst")
    ap.add_argument("--time", action="store_true", help="also time the worst rows' search, old vs new")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--keep", metavar="DIR", help="write each output as DIR/{old,new}/<row>.txt")
    ap.add_argument("--write", action="store_true", help="record the result in experiments/RESULTS.md")
    args = ap.parse_args(argv)
    only = set(args.only.split(","))
    base = tempfile.mkdtemp(prefix="autoplan-base-")
    caches = {tree: tempfile.mkdtemp(prefix="autoplan-cache-") for tree in ("old", "new")}
    subprocess.run(["git", "-C", REPO, "worktree", "add", "--detach", base, args.base], check=True,
                   capture_output=True)
    trees = {"old": base, "new": REPO}
    sha = subprocess.run(["git", "-C", REPO, "rev-parse", args.base], capture_output=True, text=True).stdout.strip()
    differ = 0
    lines: list[str] = []
    try:
        for name, what in _rows(only):
            outs = {"old": _old(sha, name, lambda: _run(base, caches["old"], what)),  # noqa: B023 - _old runs it now
                    "new": _run(REPO, caches["new"], what)}
            same = outs["old"] == outs["new"]
            differ += not same
            lines.append(f"{'same   ' if same else 'DIFFERS'} {name}")
            print(lines[-1], flush=True)
            if args.keep:
                for k, out in outs.items():
                    os.makedirs(os.path.join(args.keep, k), exist_ok=True)
                    with open(os.path.join(args.keep, k, _slug(name) + ".txt"),
                              "wb") as f:
                        f.write(out)
        if args.time:
            lines += ["", "| row | old wall s | new wall s | new/old wall | old CPU s | new CPU s | new/old CPU |",
                      "|---|---|---|---|---|---|---|"]
            print("\n".join(lines[-3:]))
            for row in WORST:
                runs: dict[str, list[dict]] = {"old": [], "new": []}
                for _ in range(args.repeat):
                    for k in ("old", "new"):
                        runs[k].append(_timed(trees[k], caches[k], row))
                med = {k: (statistics.median(r["wall_s"] for r in v), statistics.median(r["cpu_s"] for r in v))
                       for k, v in runs.items()}
                lines.append(f"| {row[0]}@{row[1]} | {med['old'][0]:.2f} | {med['new'][0]:.2f} | "
                             f"{med['new'][0] / med['old'][0]:.3f} | {med['old'][1]:.2f} | {med['new'][1]:.2f} | "
                             f"{med['new'][1] / med['old'][1]:.3f} |")
                print(lines[-1], flush=True)
    finally:
        subprocess.run(["git", "-C", REPO, "worktree", "remove", "--force", base], capture_output=True)
        for d in caches.values():
            shutil.rmtree(d, ignore_errors=True)
    print(f"\n{differ} differ" if differ else "\nall identical")
    if args.write:
        _write(args, lines, differ)
    return 1 if differ else 0


def _write(args: argparse.Namespace, lines: list[str], differ: int) -> None:
    from results_md import write_section

    head = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    cmd = " ".join(["python experiments/check_identical.py", f"--base {args.base}", f"--only {args.only}",
                    *(["--time", f"--repeat {args.repeat}"] if args.time else []), "--write"])
    text = (f"`{cmd}` at {head} ({os.cpu_count()} cores; each output byte for byte, each search in a fresh "
            f"process; times: medians of the interleaved repeats, search only, the trace excluded; the "
            f"machine is shared, so wall seconds vary and CPU seconds are the steadier figure): "
            f"{'all identical' if not differ else f'{differ} differ'}.\n\n```\n" + "\n".join(
                x for x in lines if not x.startswith("|") and x) + "\n```\n\n" + "\n".join(
                x for x in lines if x.startswith("|")) + "\n")
    write_section("check_identical", "A refactor against its base (`experiments/check_identical.py`)", text)


if __name__ == "__main__":
    sys.exit(main())
