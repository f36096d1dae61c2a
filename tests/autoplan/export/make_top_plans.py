"""Write ``data/top_plans.json``: the top-5 plans of the six searches the export tests load into
the engines (issue 37: the README's main job, the bench suite's dense, MoE and 128K cases).

    PYTHONPATH=. python tests/autoplan/export/make_top_plans.py   # about 2 min on 2 cores

The fast tier exports these committed plans; the slow tier (``test_engine_loaders.py``, marked
slow) searches again and exports what the search returns today.  Rerun this script when the
search's top plans change so the fixture keeps covering the plans users get.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURE = os.path.join(HERE, "data", "top_plans.json")

# (model, cluster, seq, global batch): README's main command (defaults 2048 × 1024), then the
# bench suite's cases (autoplan/bench/suite.py) for the other five
CASES = (
    ("gpt3-175b", "h100x1024", 2048, 1024),
    ("llama3-70b", "h100x1024", 8192, 1024),
    ("llama3-405b", "h100x16384", 8192, 2048),
    ("mixtral-8x22b", "h100x512", 4096, 1024),
    ("deepseek-v3", "h100x2048", 4096, 15360),
    ("llama3-8b", "h100x256", 131072, 64),
)
TOP = 5


def search_args(model: str, cluster: str, seq: int, global_batch: int, out: str) -> list[str]:
    return ["search", model, "--cluster", cluster, "--seq", str(seq), "--global-batch", str(global_batch),
            "--top", str(TOP), "--json", "-o", out]


def top_plans(model: str, cluster: str, seq: int, global_batch: int) -> list[str]:
    """The plan strings ``autoplan search`` returns for the case, best first."""
    from autoplan.cli import main

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "plans.json")
        if main(search_args(model, cluster, seq, global_batch, out)) != 0:
            raise RuntimeError(f"search {model} on {cluster} failed")
        with open(out) as f:
            return [entry["plan"] for entry in json.load(f)]


def main() -> int:
    cases = []
    for model, cluster, seq, global_batch in CASES:
        cases.append({"model": model, "cluster": cluster, "seq": seq, "global_batch": global_batch,
                      "plans": top_plans(model, cluster, seq, global_batch)})
        print(f"{model} on {cluster}: {len(cases[-1]['plans'])} plans", file=sys.stderr)
    with open(FIXTURE, "w") as f:
        json.dump(cases, f, indent=1)
        f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
