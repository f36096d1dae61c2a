"""vTrain's single-node step times split into a per-layer and a per-micro-batch part, measured
and predicted, and which configuration's per-layer error costs the ranking its groups.

Read by ``experiments/validate_published.py --misses``.  Every pp = 1 vTrain run of one
configuration (hidden h, tp, micro-batch b) with m = B / (dp · b) micro-batches of l layers is
fitted, by least squares over all its rows, to

    step = F[dp, l] + m · (l · layer_s + rest_s)

``layer_s``: one transformer layer's forward and backward per micro-batch (host floor, kernels,
tp all-reduces); ``rest_s``: the rest of a micro-batch (embedding, LM head and loss);
``F[dp, l]``: once per step (gradient all-reduce, optimizer), one intercept per (dp, l).  The
measured rows follow this form to within 0.1 ms (their slopes agree across dp and l), so the
split is a measurement, not a model.  The same fit of the predicted seconds gives the model's
two parts.  A configuration whose rows do not identify the split (one m per (dp, l)) is left out.

``ranked_with_measured_layer``: the group ranking (``published_regimes.group_ranking``) when the
rows of one configuration are re-priced with its measured per-layer time in place of the
predicted one, every pipeline stage running l / pp layers over m + pp - 1 micro-batch slots
(1F1B's fill and drain): how many groups that one configuration's per-layer error costs.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

import published_regimes as pr

Config = tuple[int, int, int]        # (hidden, tp, micro-batch)


@dataclass(frozen=True)
class LayerSplit:
    """One configuration's per-layer and per-micro-batch seconds, measured and predicted."""

    config: Config
    rows: int
    measured_layer_s: float
    measured_rest_s: float
    predicted_layer_s: float
    predicted_rest_s: float

    @property
    def layer_error(self) -> float:
        return self.predicted_layer_s / self.measured_layer_s - 1.0


def hidden(p: pr.Priced) -> int:
    """The model's hidden size, from its spec (``gpt:...,hidden=H,...``)."""
    return int(p.row.model.split("hidden=", 1)[1].split(",", 1)[0])


def layers(p: pr.Priced) -> int:
    return int(p.row.model.split("layers=", 1)[1].split(",", 1)[0])


def config(p: pr.Priced) -> Config:
    return hidden(p), pr.knob(p.row.plan, "tp"), pr.knob(p.row.plan, "mbs")


def micro_batches(p: pr.Priced) -> int:
    return p.row.global_batch // (pr.knob(p.row.plan, "dp") * pr.knob(p.row.plan, "mbs"))


def _fit(members: list[pr.Priced]) -> tuple[tuple[float, float], tuple[float, float]] | None:
    """((layer_s, rest_s) measured, (layer_s, rest_s) predicted) of one configuration's pp = 1
    rows; None when the rows do not identify them."""
    cells = sorted({(pr.knob(p.row.plan, "dp"), layers(p)) for p in members})
    design = np.array([[micro_batches(p) * layers(p), micro_batches(p)]
                       + [float((pr.knob(p.row.plan, "dp"), layers(p)) == c) for c in cells] for p in members])
    if np.linalg.matrix_rank(design) < design.shape[1]:
        return None
    measured = np.linalg.lstsq(design, np.array([p.row.published_s for p in members]), rcond=None)[0]
    predicted = np.linalg.lstsq(design, np.array([p.predicted_s for p in members]), rcond=None)[0]
    return (float(measured[0]), float(measured[1])), (float(predicted[0]), float(predicted[1]))


def layer_splits(priced: list[pr.Priced]) -> list[LayerSplit]:
    """The split of every identified configuration of the vTrain rows in ``priced``, in config order."""
    by_config: dict[Config, list[pr.Priced]] = {}
    for p in priced:
        if p.row.group and pr.knob(p.row.plan, "pp") == 1:
            by_config.setdefault(config(p), []).append(p)
    out = []
    for key in sorted(by_config):
        fit = _fit(by_config[key])
        if fit is not None:
            (ml, mr), (pl, prest) = fit
            out.append(LayerSplit(key, len(by_config[key]), ml, mr, pl, prest))
    return out


def with_measured_layer(p: pr.Priced, split: LayerSplit) -> pr.Priced:
    """``p`` re-priced with ``split``'s measured per-layer seconds in place of the predicted ones."""
    pp = pr.knob(p.row.plan, "pp")
    slots = micro_batches(p) + pp - 1
    delta = slots * layers(p) / pp * (split.measured_layer_s - split.predicted_layer_s)
    return dataclasses.replace(p, predicted_s=p.predicted_s + delta)


def ranked_with_measured_layer(priced: list[pr.Priced], split: LayerSplit) -> int:
    """Groups ranked right when the rows of ``split.config`` take its measured per-layer time."""
    fixed = [with_measured_layer(p, split) if p.row.group and config(p) == split.config else p for p in priced]
    return pr.group_ranking(fixed)[0]


def report(priced: list[pr.Priced]) -> str:
    """Markdown table: per configuration, the two parts measured and predicted, and the groups
    ranked right with that configuration's measured per-layer time."""
    lines = ["| hidden | tp | mbs | rows | layer ms measured | predicted | error | rest of micro-batch ms "
             "measured | predicted | groups ranked right with the measured layer |", "|" + "---|" * 10]
    for s in layer_splits(priced):
        h, tp, mbs = s.config
        lines.append(f"| {h} | {tp} | {mbs} | {s.rows} | {s.measured_layer_s * 1e3:.3f} | "
                     f"{s.predicted_layer_s * 1e3:.3f} | {s.layer_error:+.1%} | {s.measured_rest_s * 1e3:.2f} | "
                     f"{s.predicted_rest_s * 1e3:.2f} | {ranked_with_measured_layer(priced, s)} |")
    return "\n".join(lines) + "\n"
