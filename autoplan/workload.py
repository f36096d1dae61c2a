"""What a pricing run is about: a traced model, a cluster, a sequence length and a global batch.

    w = Workload.load("gpt3-175b", "h100x1024", seq=2048, global_batch=1536)
    est = w.estimator()                        # autoplan.cost.Estimator on w.model, w.cluster

Commands, the benchmark harness and the experiments share this one entry point, so every one of
them validates input the same way: the cluster is loaded first (a bad name fails before a slow
trace), then the global batch is checked, then the model is traced at ``seq``.
"""
from __future__ import annotations

from dataclasses import dataclass

import topologies
from autoplan.cost import EstimateOptions, Estimator
from autoplan.errors import UserError
from autoplan.ir import BlockGraph
from topologies import Cluster

DEFAULT_SEQ = 2048
DEFAULT_GLOBAL_BATCH = 1024


def load_cluster(name_or_path: str | Cluster) -> Cluster:
    """A cluster by name, shorthand or YAML path; the one place where ``topologies.TopologyError``
    (the hardware layer cannot import ``autoplan``) becomes a ``UserError`` (exit 2)."""
    if isinstance(name_or_path, Cluster):
        return name_or_path
    try:
        return topologies.load(name_or_path)
    except topologies.TopologyError as err:
        raise UserError(err.problem, err.fix) from None


@dataclass(frozen=True)
class Workload:
    model: BlockGraph          # traced at ``seq``
    cluster: Cluster
    seq: int
    global_batch: int
    spec: str = ""             # what the user named the model by (zoo name, family spec, model.py)

    @staticmethod
    def load(model: str, cluster: str | Cluster, *, seq: int = DEFAULT_SEQ,
             global_batch: int = DEFAULT_GLOBAL_BATCH, trace_timeout_s: float | None = None) -> Workload:
        """``trace_timeout_s``: how long the model's import, build and trace may take (None: the
        tracer's default; 0: no limit)."""
        c = load_cluster(cluster)
        if global_batch < 1:
            raise UserError(f"--global-batch must be ≥ 1, got {global_batch}", "pass --global-batch N with N ≥ 1")
        from autoplan.frontend import trace  # torch: imported only when a model is traced
        graph = trace(model, seq=seq) if trace_timeout_s is None else trace(model, seq=seq, timeout_s=trace_timeout_s)
        _check_stack(graph, model)
        return Workload(graph, c, seq, global_batch, model)

    def estimator(self, options: EstimateOptions = EstimateOptions(), *, enforce_rules: bool = False) -> Estimator:
        return Estimator(self.model, self.cluster, options, enforce_rules=enforce_rules)


def _check_stack(graph: BlockGraph, name: str) -> None:
    """Plans cut and shard a stack of repeated blocks: a model without one (the tracer's note says
    what it found instead) is a UserError here rather than a misleading "0 layers" plan error."""
    if graph.num_layers:
        return
    note = next((n for n in graph.model.notes if n.startswith("no repeated block")), "no repeated block found")
    found = note.split("): ", 1)[0] + ")" if "): " in note else note
    raise UserError(f"{name}: {found}; autoplan plans a model built as a stack of identical layers",
                    "build the model around an nn.ModuleList of identical blocks (e.g. transformer layers)")
