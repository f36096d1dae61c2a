"""The architecture holds: imports flow one way, torch stays in its four packages, no function
runs past 60 lines, and the cost model and the search run on an interpreter where ``import torch``
fails.

Layers, bottom first (a module may import its own layer and those below, never above):
topologies ← costmodels ← the IR and vocabulary (errors, ir, axes, opkinds, plan, mesh, rules,
layout, frontend, zoo) ← sharding ← cost ← search, workload ← baselines, explain, export, apply,
bench, calibrate, study ← commands, cli.
"""
from __future__ import annotations

import ast
import json
import pathlib
import subprocess
import sys

import networkx as nx

REPO = pathlib.Path(__file__).resolve().parents[1]
LAYERS = [
    ("topologies",),
    ("costmodels",),
    ("autoplan", "autoplan.errors", "autoplan.ir", "autoplan.axes", "autoplan.opkinds", "autoplan.gc_pause",
     "autoplan.atomic", "autoplan.plan", "autoplan.mesh", "autoplan.rules", "autoplan.layout", "autoplan.frontend",
     "autoplan.zoo"),
    ("autoplan.sharding",),
    ("autoplan.cost",),
    ("autoplan.search", "autoplan.workload"),
    ("autoplan.baselines", "autoplan.explain", "autoplan.export", "autoplan.apply", "autoplan.bench",
     "autoplan.calibrate", "autoplan.study"),
    ("autoplan.commands", "autoplan.cli", "autoplan.__main__"),
]
TORCH_PACKAGES = ("autoplan.frontend", "autoplan.apply", "autoplan.calibrate", "autoplan.zoo")


def _modules():
    for top in ("autoplan", "costmodels", "topologies"):
        for path in sorted((REPO / top).rglob("*.py")):
            rel = path.relative_to(REPO).with_suffix("")
            parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
            yield ".".join(parts), ast.parse(path.read_text())


def _imports(tree: ast.AST, module: str, *, top_level_only: bool):
    nodes = tree.body if top_level_only else ast.walk(tree)
    for n in nodes:
        if isinstance(n, ast.Import):
            yield from (a.name for a in n.names)
        elif isinstance(n, ast.ImportFrom) and n.module and not n.level:
            yield n.module


def _layer(module: str) -> int:
    best = (-1, -1)
    for i, names in enumerate(LAYERS):
        for name in names:
            if module == name or module.startswith(name + "."):
                best = max(best, (len(name), i))
    assert best[1] >= 0, f"{module} is in no layer: add it to LAYERS"
    return best[1]


def _ours(name: str) -> bool:
    return name.split(".")[0] in ("autoplan", "costmodels", "topologies")


def test_no_import_runs_up_a_layer():
    bad = [f"{m} (layer {_layer(m)}) imports {i} (layer {_layer(i)})"
           for m, tree in _modules() for i in _imports(tree, m, top_level_only=False)
           if _ours(i) and _layer(i) > _layer(m)]
    assert not bad, "\n".join(bad)


def _room(module: str) -> str:
    """A package counts as one room (``autoplan.cost.tp`` → ``autoplan.cost``); a module of
    ``autoplan`` itself is its own room."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "autoplan" else parts[0]


def test_no_import_cycle_between_rooms():
    g = nx.DiGraph()
    for m, tree in _modules():
        g.add_edges_from((_room(m), _room(i)) for i in _imports(tree, m, top_level_only=False)
                         if _ours(i) and _room(i) != _room(m) and _room(i) != "autoplan")
    cycles = list(nx.simple_cycles(g))
    assert not cycles, cycles[:5]


def test_torch_only_in_its_packages():
    bad = [m for m, tree in _modules() for i in _imports(tree, m, top_level_only=False)
           if i.split(".")[0] == "torch" and not m.startswith(TORCH_PACKAGES)]
    assert not bad, sorted(set(bad))


MAX_FUNCTION_LINES = 60      # def line to last line, docstring included: one screen


def test_no_function_over_60_lines_in_autoplan_costmodels_or_topologies():
    long = [f"{m}.{n.name}: {n.end_lineno - n.lineno + 1} lines" for m, tree in _modules() for n in ast.walk(tree)
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            and n.end_lineno - n.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, long


BLOCK_TORCH = "import sys; sys.modules['torch'] = None\n"   # `import torch` now raises ImportError


def test_cost_model_and_search_run_without_torch(tmp_path):
    from autoplan.frontend import trace

    graph = trace("llama:layers=4,hidden=64,heads=4,kv_heads=2,ffn=128,vocab=256", seq=64)
    (tmp_path / "graph.json").write_text(graph.to_json())
    code = BLOCK_TORCH + f"""
import json
from autoplan.ir import BlockGraph
from autoplan.cost import Estimator
from autoplan.plan import Plan
from autoplan.search import SearchOptions, search
import autoplan.explain, autoplan.baselines, autoplan.export, autoplan.sharding, topologies
g = BlockGraph.from_json(open({str(tmp_path / 'graph.json')!r}).read())
c = topologies.load("h100x8")
e = Estimator(g, c).estimate(Plan.parse("tp=2,pp=2", num_gpus=8), 16)
r = search(g, c, global_batch=16, options=SearchOptions(top_k=2, workers=1))
print(json.dumps([e.step_time_s, len(r.candidates), 'torch' in sys.modules and sys.modules['torch'] is not None]))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    step, n, torch_loaded = json.loads(proc.stdout.strip().splitlines()[-1])
    assert step > 0 and n == 2 and not torch_loaded
