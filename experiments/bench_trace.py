"""Trace time and peak memory of the frontend, each trace in a fresh process, cache off.

    .venv/bin/python experiments/bench_trace.py [--cores 2]

1. llama3-405b (zoo) at seq 2048: wall time of ``trace()`` and the process's peak RSS
   (targets: < 20 s, < 1.5 GB on 2 cores).
2. A llama-405b-width model at 32 and at 126 layers: trace time should be nearly flat
   in depth (one block per kind is traced).

``--cores N`` pins each child process to N cores with ``os.sched_setaffinity``; each figure
is the fastest of ``--repeat`` fresh processes (the machine may be shared).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

CHILD = """
import json, resource, time
from autoplan.frontend import trace
start = time.perf_counter()
g = trace({model!r}, seq={seq})
print(json.dumps({{"seconds": time.perf_counter() - start,
                  "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                  "params": g.param_count, "layers": g.num_layers}}))
"""

WIDTH_405B = "llama:hidden=16384,heads=128,kv_heads=8,ffn=53248,vocab=128256,layers={layers}"


def run_child(model: str, seq: int, cores: int, repeat: int) -> dict:
    """The fastest of ``repeat`` traces, each in a fresh process with the cache off."""
    env = dict(os.environ, AUTOPLAN_NO_CACHE="1")
    cpus = sorted(os.sched_getaffinity(0))[:cores]
    runs = []
    for _ in range(repeat):
        out = subprocess.run([sys.executable, "-c", CHILD.format(model=model, seq=seq)], env=env,
                             capture_output=True, text=True, check=True,
                             preexec_fn=lambda: os.sched_setaffinity(0, cpus))
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    return min(runs, key=lambda r: r["seconds"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    r = run_child("llama3-405b", args.seq, args.cores, args.repeat)
    print(f"llama3-405b seq {args.seq} on {args.cores} cores: {r['seconds']:.2f} s, "
          f"peak RSS {r['peak_rss_bytes'] / 1e9:.2f} GB, {r['params'] / 1e9:.1f} B params "
          f"(targets < 20 s, < 1.5 GB)")
    times = {}
    for layers in (32, 126):
        times[layers] = run_child(WIDTH_405B.format(layers=layers), args.seq, args.cores, args.repeat)
        t = times[layers]
        print(f"405b width, {layers:3d} layers: {t['seconds']:.2f} s, peak RSS {t['peak_rss_bytes'] / 1e9:.2f} GB")
    ratio = times[126]["seconds"] / times[32]["seconds"]
    print(f"126 / 32 layers: time ratio {ratio:.2f} (depth ratio {126 / 32:.2f})")


if __name__ == "__main__":
    main()
